"""The trainer's GPU checks, without pytest: run by benchmarks/gpu_checks.sh on a CUDA machine.

    python benchmarks/gpu_checks.py --out DIR [--only cpu_optimizer,bf16,profile]

Each check launches real torchrun workers (one GPU) and writes its figures to DIR/gpu_checks.json
(and prints them); a check that fails records why and the others still run. Exit code: the number
of failed checks.

- ``cpu_optimizer``: Megatron's hybrid CPU optimizer (strategy.cpu_optimizer 0.5) lowers the GPU
  memory held after an optimizer step by the cost model's figure (half the optimizer state,
  costmodel.memory.model_state_bytes, 12 B/param for bf16 with the distributed optimizer),
  within 15%; qwen2.5-0.5b, bf16, random weights.
- ``bf16``: world size 1, bf16 (Float16Module; TE's layer spec when installed) tracks fp32 on
  ``tiny`` within bf16's resolution (0.05 on a loss of ~4.9) and still learns.
- ``profile``: ``trainer.main --profile-json`` on qwen2.5-0.5b (bf16, native sampler) reports the
  CUDA allocator's peak per phase; written next to the cost model's per-phase bytes for the same
  plan on the h200 profile (vLLM-free native rollout, so the rollout row is not comparable).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
HALF_B = "qwen2.5-0.5b"


def _env() -> dict:
    extra = os.environ.get("PYTHONPATH")
    return dict(
        os.environ,
        PYTHONWARNINGS="ignore",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), *([extra] if extra else [])]),
    )


def _torchrun(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


# --- worker: GPU memory after one optimizer step ----------------------------------------------


def worker_state_memory(spec: dict, out: str) -> None:
    import torch

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.engine import Engine
    from trainer_harness import run_config

    parallel.init_distributed()
    cfg = run_config(spec["model"], spec["strategy"], 1, dtype="bf16")
    parallel.reinit(cfg.strategy, seed=cfg.trainer.seed)
    eng = Engine(cfg)
    tokens = torch.randint(0, cfg.model.vocab, (2, 64))

    def loss_fn(logp, entropy, mb):
        return -logp.mean(), {}

    eng.train_step({"tokens": tokens}, loss_fn, micro_batch_size=2)
    torch.cuda.synchronize()
    Path(out).write_text(
        json.dumps({"allocated_bytes": int(torch.cuda.memory_allocated()), "params": eng.param_count()})
    )
    parallel.destroy()


def check_cpu_optimizer(tmp: Path) -> dict:
    from grpo_tune.core.specs import load_model
    from grpo_tune.core.strategy import Strategy, validate
    from grpo_tune.costmodel.memory import model_state_bytes
    from grpo_tune.costmodel.params import per_stage_params

    got = {}
    for name, frac in (("off", None), ("half", 0.5)):
        out = tmp / f"mem_{name}.json"
        spec = {"model": HALF_B, "strategy": {"cpu_optimizer": frac} if frac else {}}
        p = _torchrun([__file__, "--worker", "state_memory", json.dumps(spec), str(out)], timeout=120)
        if p.returncode or not out.exists():
            raise RuntimeError(f"worker failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
        got[name] = json.loads(out.read_text())
    m = load_model(HALF_B)
    s = validate(m, Strategy(), 1)
    st = per_stage_params(m, s)[0]
    opt = model_state_bytes(st.dense, st.expert, s, "bf16").optimizer
    predicted = 0.5 * opt
    measured = got["off"]["allocated_bytes"] - got["half"]["allocated_bytes"]
    res = {
        "allocated_off_bytes": got["off"]["allocated_bytes"],
        "allocated_half_bytes": got["half"]["allocated_bytes"],
        "measured_drop_bytes": measured,
        "predicted_drop_bytes": predicted,
        "rel_error": (measured - predicted) / predicted,
    }
    res["ok"] = abs(res["rel_error"]) <= 0.15
    return res


def check_bf16(tmp: Path) -> dict:
    from trainer_harness import torchrun_json

    layouts = [{"model": "tiny", "strategy": {}}]
    fp32 = torchrun_json("layouts", nproc=1, spec={"layouts": layouts, "steps": 3}, timeout=120)["results"][0]
    bf16 = torchrun_json("layouts", nproc=1, spec={"layouts": layouts, "steps": 3, "dtype": "bf16"}, timeout=120)[
        "results"
    ][0]
    diffs = [abs(a - b) for a, b in zip(fp32["losses"], bf16["losses"])]
    return {
        "fp32_losses": fp32["losses"],
        "bf16_losses": bf16["losses"],
        "max_abs_diff": max(diffs),
        "transformer_engine": bf16["transformer_engine"],
        "dtype": bf16["dtype"],
        "ok": bf16["dtype"] == "torch.bfloat16" and max(diffs) < 0.05 and bf16["losses"][-1] < bf16["losses"][0],
    }


def check_profile(tmp: Path) -> dict:
    from grpo_tune.core.config import RunConfig, TrainerOptions, save
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate
    from grpo_tune.costmodel.estimate import estimate

    m = load_model(HALF_B)
    w = Workload(prompts=4, n=2, prompt_len=64, response_len=64, mini_batch=4, dtype="bf16")
    cfg = RunConfig(
        model=m,
        hardware=load_hardware("h200"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=validate(m, Strategy.of(mbs=2, recompute="none"), 1),
        workload=w,
        trainer=TrainerOptions(steps=3, rollout_engine="megatron", out_dir=str(tmp / "prof")),
    )
    save(cfg, tmp / "profile.yaml")
    out = tmp / "profile.json"
    p = _torchrun(
        ["-m", "grpo_tune.trainer.main", "--config", str(tmp / "profile.yaml"), "--profile-json", str(out)], timeout=150
    )
    if p.returncode or not out.exists():
        raise RuntimeError(f"profile failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    prof = json.loads(out.read_text())
    est = estimate(model=m, hardware=cfg.hardware, cluster=cfg.cluster, strategy=cfg.strategy, workload=w)
    by_phase = prof.get("peak_bytes_by_phase") or {}
    return {
        "peak_memory_bytes": prof["peak_memory_bytes"],
        "peak_bytes_by_phase": by_phase,
        "predicted_bytes_by_phase": {k: int(v.total_bytes) for k, v in est.memory.items()},
        "step_s": prof["step_s"],
        "phases_s": prof["phases_s"],
        "ok": prof["status"] == "ok"
        and prof["peak_memory_bytes"].get("kind") == "cuda_max_allocated"
        and {"rollout", "old_logprob", "update"} <= set(by_phase)
        and min(by_phase.values()) > 2 * 494e6,
    }


CHECKS = {"cpu_optimizer": check_cpu_optimizer, "bf16": check_bf16, "profile": check_profile}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        {"state_memory": worker_state_memory}[sys.argv[2]](json.loads(sys.argv[3]), sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-checks"))
    ap.add_argument("--only", default=",".join(CHECKS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, failed = {}, 0
    with tempfile.TemporaryDirectory() as d:
        for name in args.only.split(","):
            t0 = time.perf_counter()
            try:
                r = CHECKS[name](Path(d))
            except Exception as exc:  # record and go on: the other checks still say something
                r = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
            r["seconds"] = round(time.perf_counter() - t0, 1)
            results[name] = r
            failed += not r.get("ok")
            print(name, json.dumps({k: v for k, v in r.items() if k != "traceback"}), flush=True)
            (out / "gpu_checks.json").write_text(json.dumps(results, indent=2))
    return failed


if __name__ == "__main__":
    sys.exit(main())
