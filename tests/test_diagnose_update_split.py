"""diagnose reports a remainder in the update's micro-batch split as an error, as core/rules does and as
verl 0.9.1's engine asserts it.

verl 0.9.1 (wheel from PyPI): ray_trainer.py l.1352-1363 hands the actor ``ppo_mini_batch_size * n`` sequences
per mini-batch; engine_workers.py ``train_mini_batch`` (l.266-270) divides them by DP, ``train_batch`` (l.356)
passes ``ppo_micro_batch_size_per_gpu``, and workers/engine/utils.py ``prepare_micro_batches`` (l.123-127)
asserts ``total_data_size % (force_group_size * micro_batch_size_per_gpu) == 0`` (force_group_size = 1).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl.diagnose import diagnose_path
from grpo_tune.cli.main import main
from grpo_tune.core.rules import check_batches
from grpo_tune.core.strategy import Workload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples/qwen2-7b-grpo-megatron.sh"  # 1024 prompts x n=5, mini 256, micro 4, TP2 on 8 GPUs: dp 4
MKEY = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def _launch(tmp_path: Path, mini: int, micro: int) -> Path:
    text = EXAMPLE.read_text()
    for key, old, new in (("ppo_mini_batch_size", 256, mini), ("ppo_micro_batch_size_per_gpu", 4, micro)):
        assert f"{key}={old} " in text
        text = text.replace(f"{key}={old} ", f"{key}={new} ")
    p = tmp_path / f"mini{mini}-micro{micro}.sh"
    p.write_text(text)
    return p


def _split_findings(rep) -> list:
    return [f for f in rep.findings if f.code == "BATCH_DIVISIBILITY" and f.key == MKEY]


def test_an_update_micro_batch_remainder_is_an_error_as_in_core_rules(tmp_path, capsys):
    """mini 16 x n=5 = 80 sequences / dp 4 = 20 per rank; micro 8 leaves 20 % 8 = 4 (the step, 5120 sequences,
    does split over dp x micro = 32: 5120 = 160 x 32, so only the update rule fires). micro 4 (20 = 5 x 4) is
    clean. core.rules.check_batches says the same for both."""
    wl = Workload(prompts=1024, n=5, mini_batch=16)
    assert 5120 % (4 * 8) == 0 and 20 % 8 == 4 and 20 % 4 == 0
    assert [f.code for f in check_batches(wl, dp=4, mbs=8)] == ["BATCH_DIVISIBILITY"]
    assert check_batches(wl, dp=4, mbs=4) == []

    bad = diagnose_path(_launch(tmp_path, 16, 8))
    found = _split_findings(bad)
    assert [f.severity for f in found] == ["error"], [f.to_dict() for f in bad.findings]
    assert "(20 sequences)" in found[0].message and "micro-batch 8" in found[0].message
    assert bad.exit_code == 1
    good = diagnose_path(_launch(tmp_path, 16, 4))
    assert _split_findings(good) == []

    # the CLI's exit code for errors (1, as for every other error finding), in --json too
    assert main(["diagnose", str(_launch(tmp_path, 16, 8)), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    hit = [f for f in data["findings"] if f["code"] == "BATCH_DIVISIBILITY" and f.get("key") == MKEY]
    assert [f["severity"] for f in hit] == ["error"] and data["errors"] >= 1


def test_the_cited_verl_assert_is_in_the_wheel(tmp_path):
    """The assert cited above, read from verl 0.9.1's wheel (fetched as tests/test_verl_compose.py fetches it:
    no PyPI, no pass): the fixed micro-batch branch of prepare_micro_batches, which the Megatron engine's
    forward_backward_batch calls for training and for inference alike."""
    wheel = verl._download_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        utils = zf.read("verl/workers/engine/utils.py").decode().splitlines()
        engine = zf.read("verl/workers/engine/megatron/transformer_impl.py").decode()
        workers = zf.read("verl/workers/engine_workers.py").decode().splitlines()
    start = next(i for i, line in enumerate(utils) if line.startswith("def prepare_micro_batches("))
    body = "\n".join(utils[start : start + 40])
    assert "assert total_data_size % (force_group_size * micro_batch_size_per_gpu) == 0" in body
    assert "total_data_size = len(data)" in body
    # l.125 as cited in frameworks/verl/diagnose/rules_plan.py
    assert utils[124].strip().startswith("assert total_data_size % (force_group_size * micro_batch_size_per_gpu)")
    assert "micro_batches, indices = prepare_micro_batches(" in engine
    assert "mini_batch_size_per_gpu = mini_batch_size // self.engine.get_data_parallel_size()" in workers[269]


def test_a_train_batch_not_a_multiple_of_the_mini_batch_is_an_error(tmp_path):
    """1000 prompts with mini-batch 256: 1000 = 3 x 256 + 232, an uneven cut that verl 0.9.1's make_iterator
    asserts against (verl/utils/tensordict_utils.py l.588, read below from the wheel) and core's Workload
    refuses; diagnose reports it as an error (it used to be a warning: "the last mini-batch is smaller")."""
    text = EXAMPLE.read_text()
    assert "data.train_batch_size=1024 " in text
    p = tmp_path / "tb1000.sh"
    p.write_text(text.replace("data.train_batch_size=1024 ", "data.train_batch_size=1000 "))
    rep = diagnose_path(p)
    hit = [f for f in rep.findings if f.key == "actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert [(f.code, f.severity) for f in hit] == [("BATCH_DIVISIBILITY", "error")], [f.to_dict() for f in hit]
    assert "1000 is not a multiple of ppo_mini_batch_size=256" in hit[0].message
    assert rep.exit_code == 1
    with zipfile.ZipFile(verl._download_wheel(tmp_path)) as zf:
        td = zf.read("verl/utils/tensordict_utils.py").decode().splitlines()
    assert td[587].strip().startswith("assert tensordict.batch_size[0] % mini_batch_size == 0")
