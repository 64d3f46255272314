"""Corrupt and hostile checkpoints (issue 14, defect 7): a coded CHECKPOINT_ERROR that names the shard
and the last intact checkpoint, before any worker starts; no pickle code runs on load; latest.json
never leads outside the checkpoint folder. Each test failed before the fix."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.trainer import checkpoint, launch


def _two_rank_checkpoints(tmp_path, steps=(2, 4)):
    for step in steps:
        for rank in (1, 0):  # rank 0 swings latest.json once both shards are on disk
            checkpoint.save(tmp_path, step, {"w": torch.full((64,), float(step + rank))}, rank=rank, world_size=2)


def _corrupt(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 16] = bytes(16)  # inside the tensor record: its CRC-32 no longer matches
    path.write_bytes(bytes(data))


def test_a_corrupt_shard_names_itself_and_the_last_intact_checkpoint(tmp_path):
    _two_rank_checkpoints(tmp_path)
    bad = tmp_path / "checkpoints" / "step_00000004" / "rank_00001.pt"
    _corrupt(bad)
    with pytest.raises(GrpoTuneError) as exc:
        launch.check_resume(tmp_path, 2)  # the pre-start check, before torchrun
    e = exc.value
    assert e.code == "CHECKPOINT_ERROR" and str(bad) in e.message
    assert "step_00000002" in e.hint


def test_a_truncated_shard_is_found_before_the_workers_start(tmp_path):
    _two_rank_checkpoints(tmp_path)
    shard = tmp_path / "checkpoints" / "step_00000004" / "rank_00000.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(GrpoTuneError) as exc:
        launch.check_resume(tmp_path, 2)
    assert exc.value.code == "CHECKPOINT_ERROR" and "rank_00000.pt" in exc.value.message
    with pytest.raises(GrpoTuneError) as exc:  # and a worker that loads it anyway gets the same coded error
        checkpoint.load(tmp_path, rank=0, world_size=2)
    assert exc.value.code == "CHECKPOINT_ERROR"


def test_intact_checkpoints_verify_and_restore_every_rng(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    _two_rank_checkpoints(tmp_path, steps=(2,))
    random.random(), np.random.rand(), torch.rand(3)
    assert launch.check_resume(tmp_path, 2) == 2
    step, state = checkpoint.load(tmp_path, rank=0, world_size=2)
    assert step == 2 and (random.random(), np.random.rand(), torch.rand(1).item()) == want


class _Payload:
    """Runs code when unpickled with weights_only=False: touches a marker file."""

    marker = ""

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_shard_with_pickled_code_is_refused_unrun(tmp_path):
    _two_rank_checkpoints(tmp_path, steps=(2,))
    marker = tmp_path / "pwned"
    _Payload.marker = str(marker)
    torch.save({"w": _Payload()}, tmp_path / "checkpoints" / "step_00000002" / "rank_00000.pt")
    with pytest.raises(GrpoTuneError) as exc:
        checkpoint.load(tmp_path, rank=0, world_size=2)
    assert exc.value.code == "CHECKPOINT_ERROR" and not marker.exists()


@pytest.mark.parametrize("d", ["../../../etc", "/etc", "step_00000002/../../x", "step_2", 7, None])
def test_latest_json_never_leaves_the_checkpoint_folder(tmp_path, d):
    _two_rank_checkpoints(tmp_path, steps=(2,))
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps({"step": 2, "world_size": 2, "dir": d}))
    for call in (lambda: launch.check_resume(tmp_path, 2), lambda: checkpoint.load(tmp_path, rank=0, world_size=2)):
        with pytest.raises(GrpoTuneError) as exc:
            call()
        assert exc.value.code == "CHECKPOINT_ERROR"


def test_a_shard_with_pickled_code_fails_the_pre_start_check(tmp_path):
    """The workers refused it (weights_only), but only after torchrun started them: exit 4 and torch's
    ChildFailedError. The pre-start check reads each shard's pickle opcodes (no unpickling) and names it."""
    _two_rank_checkpoints(tmp_path, steps=(2, 4))
    marker = tmp_path / "pwned"
    _Payload.marker = str(marker)
    bad = tmp_path / "checkpoints" / "step_00000004" / "rank_00001.pt"
    torch.save({"w": _Payload()}, bad)
    with pytest.raises(GrpoTuneError) as exc:
        launch.check_resume(tmp_path, 2)
    e = exc.value
    assert e.code == "CHECKPOINT_ERROR" and str(bad) in e.message and "io.open" in e.message
    assert "step_00000002" in e.hint and not marker.exists()
