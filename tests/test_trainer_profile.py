"""`grpo-tune profile`: a real short run writes the profile JSON contract; failures keep the contract.

ok: 2 ranks (TP2), 3 steps, checked key by key against the contract in trainer/profile.py.
error: a checkpoint folder whose weights cannot be read fails inside the workers (after the
pre-start checks pass) -> status "error", exit 4.
oom: one process under a 3 GiB address-space limit (RLIMIT_AS; torch's import alone takes ~1.5 GiB)
building qwen2.5-0.5b in fp32 (2 GiB of weights, then grads and Adam state) -> the allocator fails
-> status "oom", exit 3.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_tune.core.config import RunConfig, TrainerOptions, save
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.trainer.profile import PHASES

ROOT = Path(__file__).resolve().parent.parent


def _cfg(path: Path, *, model="tiny", gpus=2, strategy=None, trainer=None, workload=None) -> Path:
    cfg = RunConfig(
        model=load_model(model),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus),
        strategy=Strategy.of(**(strategy or {"tp": 2, "mbs": 4})),
        workload=Workload(
            **(
                {"prompts": 2, "n": 4, "prompt_len": 12, "response_len": 6, "mini_batch": 2, "dtype": "fp32"}
                | (workload or {})
            )
        ),
        trainer=TrainerOptions(**({"rollout_engine": "megatron", "lr": 1e-4} | (trainer or {}))),
    )
    save(cfg, path)
    return path


def _profile(cfg: Path, out: Path, steps: int = 3, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from grpo_tune.cli.main import run; run()",
            "profile",
            "--config",
            str(cfg),
            "--steps",
            str(steps),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
    )


@pytest.mark.slow
def test_profile_writes_the_contract(tmp_path):
    out = tmp_path / "p.json"
    r = _profile(_cfg(tmp_path / "c.yaml"), out)
    assert r.returncode == 0, r.stdout + r.stderr
    p = json.loads(out.read_text())
    assert p["status"] == "ok" and p["message"] is None and p["steps"] == 3 and p["world_size"] == 2
    assert p["config"].endswith("c.yaml")
    assert set(p["phases_s"]) == set(PHASES)
    assert all(v >= 0 for v in p["phases_s"].values())
    assert p["phases_s"]["rollout"] > 0 and p["phases_s"]["update"] > 0 and p["phases_s"]["ref_logprob"] > 0
    assert sum(p["phases_s"].values()) <= p["step_s"] * 1.05  # medians of parts, roughly within the whole
    assert p["tokens_per_s"] > 0 and p["tokens_per_s_per_gpu"] == pytest.approx(p["tokens_per_s"] / 2)
    # 2 prompts x 4 responses x (12 + 6) tokens per step over the step time
    assert p["tokens_per_s"] == pytest.approx(8 * 18 / p["step_s"], rel=0.3)
    mem = p["peak_memory_bytes"]
    assert len(mem["per_rank"]) == 2 and mem["max"] == max(mem["per_rank"]) > 50 * 2**20
    assert len(p["loss"]) == 3 and len(p["reward"]) == 3
    assert p["response_len"] == [6.0, 6.0, 6.0]  # EOS ignored: the config's full length
    # per-phase memory: on CPU the live tensor bytes at each phase's end, which hold at least the
    # actor's parameters and optimizer state (tensor_bytes_per_rank)
    by_phase = p["peak_bytes_by_phase"]
    assert {"rollout", "old_logprob", "ref_logprob", "update"} <= set(by_phase)
    assert min(by_phase.values()) >= min(mem["tensor_bytes_per_rank"]) > 0, (by_phase, mem)


@pytest.mark.slow
def test_profile_crash_in_the_workers_is_status_error_exit_4(tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    # passes the pre-start check (trainer/launch.py reads files and headers, not their contents); the workers crash
    (ck / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (ck / "tokenizer.json").write_text("{}")
    (ck / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    out = tmp_path / "p.json"
    r = _profile(_cfg(tmp_path / "c.yaml", gpus=1, strategy={"mbs": 4}, trainer={"hf_checkpoint": str(ck)}), out, 2)
    assert r.returncode == 4, r.stdout + r.stderr
    p = json.loads(out.read_text())
    assert p["status"] == "error" and p["message"] and p["step_s"] is None and p["loss"] == []


@pytest.mark.slow
def test_profile_out_of_memory_is_status_oom_exit_3(tmp_path):
    limit = 3 * 2**30

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    out = tmp_path / "p.json"
    cfg = _cfg(
        tmp_path / "c.yaml",
        model="qwen2.5-0.5b",
        gpus=1,
        strategy={"mbs": 1},
        workload={"prompts": 1, "n": 2, "prompt_len": 8, "response_len": 2, "mini_batch": 1},
    )
    r = _profile(cfg, out, 2, preexec=cap)
    assert r.returncode == 3, r.stdout + r.stderr
    p = json.loads(out.read_text())
    assert p["status"] == "oom" and p["message"]
