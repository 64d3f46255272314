"""Checkpoints: atomic sharded writes, and resume after kill -9 through `grpo-tune train` (real torchrun).

The kill test runs one uninterrupted 2-rank job (DP2 with the distributed optimizer, so the
optimizer state really is sharded), one job that is killed with SIGKILL (every process: CLI,
torchrun and both workers) right after it logs step 3, and a resume of the killed job. It checks:
the resume starts from the last complete checkpoint (step 2, so at most ``checkpoint_every`` steps
are lost) and its steps 3..6 reproduce the uninterrupted run's losses and rewards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo_tune.core.config import RunConfig, TrainerOptions, save
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.trainer import checkpoint

ROOT = Path(__file__).resolve().parent.parent


def test_save_load_roundtrip_and_prune(tmp_path):
    for step in (2, 4, 6):
        checkpoint.save(
            tmp_path,
            step,
            {"w": torch.full((3,), float(step)), "data": {"epoch": 0, "index": step}},
            rank=0,
            world_size=1,
        )
    assert checkpoint.latest(tmp_path) == {"step": 6, "world_size": 1, "dir": "step_00000006"}
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert kept == ["step_00000004", "step_00000006"]  # keep=2
    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    checkpoint.save(tmp_path, 8, {"w": torch.zeros(1)}, rank=0, world_size=1)
    torch.rand(5)  # move the RNG on; load must restore it
    step, st = checkpoint.load(tmp_path, rank=0, world_size=1)
    assert step == 8 and torch.equal(torch.rand(2), expected)
    with pytest.raises(Exception) as e:
        checkpoint.load(tmp_path, rank=0, world_size=2)
    assert e.value.code == "CHECKPOINT_ERROR"


def test_a_torn_shard_is_never_pointed_at(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, 2, {"w": torch.ones(2)}, rank=0, world_size=1)

    def die(*a, **k):  # the process dies while writing the next shard
        raise OSError("disk vanished")

    monkeypatch.setattr(torch, "save", die)
    with pytest.raises(Exception):
        checkpoint.save(tmp_path, 4, {"w": torch.ones(2)}, rank=0, world_size=1)
    monkeypatch.undo()
    assert checkpoint.latest(tmp_path)["step"] == 2
    assert not list((tmp_path / "checkpoints").rglob("*.tmp*"))
    step, st = checkpoint.load(tmp_path, rank=0, world_size=1)
    assert step == 2 and torch.equal(st["w"], torch.ones(2))


def _config(path: Path, out: Path, steps: int) -> Path:
    cfg = RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=2, gpus_per_node=2),
        strategy=Strategy.of(mbs=4, recompute="none", distributed_optimizer=True),
        workload=Workload(prompts=4, n=4, prompt_len=8, response_len=4, mini_batch=2, dtype="fp32"),
        trainer=TrainerOptions(
            steps=steps, lr=3e-3, kl_coef=0.01, out_dir=str(out), checkpoint_every=2, rollout_engine="megatron"
        ),
    )
    save(cfg, path)
    return path


def _cli(*args: str, **kw):
    return subprocess.Popen(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **kw,
    )


def _tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc), children first."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out[::-1]


def _metrics(out: Path) -> list[dict]:
    p = out / "metrics.jsonl"
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


@pytest.mark.slow
def test_kill_9_then_resume_loses_at_most_the_steps_since_the_checkpoint(tmp_path):
    full_out, cut_out = tmp_path / "full", tmp_path / "cut"
    cfg_full = _config(tmp_path / "full.yaml", full_out, 6)
    cfg_cut = _config(tmp_path / "cut.yaml", cut_out, 6)

    p = _cli("train", "--config", str(cfg_full))
    log, _ = p.communicate(timeout=240)
    assert p.returncode == 0, log
    ref = _metrics(full_out)
    assert [r["step"] for r in ref] == [1, 2, 3, 4, 5, 6]

    p = _cli("train", "--config", str(cfg_cut))
    deadline = time.time() + 240
    while time.time() < deadline and not any(r["step"] >= 3 for r in _metrics(cut_out)):
        assert p.poll() is None, p.stdout.read()
        time.sleep(0.2)
    victims = _tree(p.pid)
    assert len(victims) >= 4  # CLI, torchrun, 2 workers
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=30)
    time.sleep(0.5)
    logged = max(r["step"] for r in _metrics(cut_out))
    assert logged < 6, "the run finished before it could be killed"
    ck = checkpoint.latest(cut_out)
    assert ck is not None and logged - ck["step"] <= 2  # at most checkpoint_every steps lost

    p = _cli("train", "--config", str(cfg_cut))
    log, _ = p.communicate(timeout=240)
    assert p.returncode == 0, log
    assert f"resuming after step {ck['step']}" in log
    got = _metrics(cut_out)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]  # the killed run's extra lines were dropped
    for a, b in zip(ref, got):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-9), (a["step"], a["loss"], b["loss"])
        assert b["reward_mean"] == a["reward_mean"]
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-6, abs=1e-9)
    assert any(r["loss"] != 0 for r in ref[ck["step"] :])  # the compared steps carry a real gradient


@pytest.mark.slow
def test_sigkill_of_the_launcher_group_leaves_no_worker(tmp_path):
    """autotune's refinement kills a timed-out trial's process group with SIGKILL; no worker may survive
    (torchrun gives each worker its own session; the workers set PR_SET_PDEATHSIG)."""
    out = tmp_path / "run"
    cfg = _config(tmp_path / "c.yaml", out, 500)
    p = _cli("train", "--config", str(cfg))
    deadline = time.time() + 180
    while time.time() < deadline and not _metrics(out):
        assert p.poll() is None, p.stdout.read()
        time.sleep(0.2)

    def workers():
        found = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if str(cfg) in cmd and "grpo_tune.trainer.main" in cmd:
                    found.append(int(d))
        return found

    assert len(workers()) >= 3  # torchrun + 2 workers
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    deadline = time.time() + 20
    while workers() and time.time() < deadline:
        time.sleep(0.2)
    assert workers() == []
