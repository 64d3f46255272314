"""Launch real torchrun workers from tests, and the worker tasks themselves.

From a test::

    from trainer_harness import torchrun_json
    out = torchrun_json("layouts", nproc=2, spec={...})   # rank 0's JSON result

``python -m torch.distributed.run ... tests/trainer_harness.py TASK SPEC_JSON OUT_JSON`` runs
``TASK`` on every rank; rank 0 writes the result. Several layouts run inside one launch
(``parallel.reinit`` rebuilds megatron's groups), since process start-up dominates on CPU.
Other engineers may add tasks: a function ``task_<name>(spec) -> dict`` in their own module,
named ``module:function`` as TASK.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def learning_run(tmp_path: Path, model: str, steps: int, **trainer) -> list[dict]:
    """The learning tests' run: a real `grpo-tune train` of ``model`` on the shipped synthetic task
    (one CPU process, 16 prompts x 8 responses of at most 4 tokens, lr 3e-3, no KL); returns the
    rows of its metrics.jsonl. ``trainer`` adds TrainerOptions fields (e.g. the MoE aux loss)."""
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    cfg = RunConfig(
        model=load_model(model),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy.of(mbs=32, recompute="none"),
        workload=Workload(prompts=16, n=8, prompt_len=8, response_len=4, mini_batch=16, kl=False, dtype="fp32"),
        trainer=TrainerOptions(
            steps=steps,
            lr=3e-3,
            dataset="synthetic",
            reward="math",
            out_dir=str(tmp_path / "run"),
            checkpoint_every=steps,
            rollout_engine="megatron",
            **trainer,
        ),
    )
    return train_run(cfg, tmp_path, timeout=420)


def train_run(cfg, tmp_path: Path, *, timeout: float) -> list[dict]:
    """`grpo-tune train --config` on ``cfg`` in a fresh process (saved under ``tmp_path``): asserts that it
    exits 0 and returns the rows of the run's metrics.jsonl."""
    from grpo_tune.core.config import save

    path = tmp_path / "train.yaml"
    save(cfg, path)
    r = subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "train", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return [json.loads(x) for x in (Path(cfg.trainer.out_dir) / "metrics.jsonl").read_text().splitlines()]


def torchrun(
    args: list[str], *, nproc: int, timeout: float = 180, env: dict | None = None, script: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``script args`` (default: this file) under torchrun with ``nproc`` CPU processes."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=path)
    e.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        f"--master-port={free_port()}",
        "--master-addr=127.0.0.1",
        script or str(Path(__file__).resolve()),
        *args,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)


def torchrun_json(task: str, *, nproc: int, spec: dict, timeout: float = 180) -> dict:
    """Run a task on ``nproc`` ranks; return rank 0's JSON result (raises with the log on failure)."""
    return _cached(task, nproc, json.dumps(spec, sort_keys=True), timeout)


@functools.lru_cache(maxsize=32)
def _cached(task: str, nproc: int, spec_json: str, timeout: float) -> dict:
    """One launch per (task, nproc, spec) per test run, shared by pytest-xdist workers through a
    locked file under the run's id (two test files can then assert on the same launch)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return _launch(task, nproc, spec_json, timeout)
    import fcntl
    import hashlib

    d = Path(tempfile.gettempdir()) / f"grpo-tune-harness-{uid}"
    d.mkdir(exist_ok=True)
    key = hashlib.sha1(f"{task}|{nproc}|{spec_json}".encode()).hexdigest()
    with open(d / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = d / f"{key}.json"
        if done.exists():
            return json.loads(done.read_text())
        result = _launch(task, nproc, spec_json, timeout)
        done.write_text(json.dumps(result))
        return result


def _launch(task: str, nproc: int, spec_json: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        p = torchrun([task, spec_json, str(out)], nproc=nproc, timeout=timeout)
        if p.returncode != 0 or not out.exists():
            tail = "\n".join((p.stdout + p.stderr).splitlines()[-60:])
            raise RuntimeError(f"torchrun {task} x{nproc} failed (rc={p.returncode}):\n{tail}")
        return json.loads(out.read_text())


# --- worker side ---------------------------------------------------------------------------------


def run_config(
    model: Any, strategy: dict, world: int, *, dtype: str = "fp32", overrides: dict | None = None, **trainer
):
    """A RunConfig for a tiny CPU run (fp32) of ``model`` (a preset name or a ModelSpec); ``overrides`` replace
    model-spec fields."""
    import dataclasses

    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate

    m = load_model(model) if isinstance(model, str) else model
    if overrides:
        m = dataclasses.replace(m, **overrides)
    s = validate(m, Strategy.from_dict(strategy), world)
    return RunConfig(
        model=m,
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=world),
        strategy=s,
        workload=Workload(dtype=dtype),
        trainer=TrainerOptions(**{"lr": 1e-3, **trainer}),
    )


def task_layouts(spec: dict) -> dict:
    """For each layout: param count per rank, forward log-probs and a few training steps' losses.

    spec: {"layouts": [{"model": "tiny", "strategy": {...}}, ...], "steps": 3, "batch": 8,
    "seq": 20, "mbs": 2}. Every layout sees the same tokens and the same (layout-free) init.
    """
    import torch
    import torch.distributed as dist

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.engine import Engine
    from grpo_tune.trainer.model import use_transformer_engine

    parallel.init_distributed()
    world = dist.get_world_size()
    results = []
    for lay in spec["layouts"]:
        cfg = run_config(
            lay["model"], lay["strategy"], world, dtype=spec.get("dtype", "fp32"), overrides=lay.get("overrides")
        )
        layout = parallel.reinit(cfg.strategy, seed=cfg.trainer.seed)
        eng = Engine(cfg)
        g = torch.Generator().manual_seed(spec.get("data_seed", 0))
        tokens = torch.randint(0, cfg.model.vocab, (spec.get("batch", 8), spec.get("seq", 20)), generator=g)
        lp, ent = eng.logprobs(tokens, micro_batch_size=spec.get("mbs", 2), with_entropy=True)
        responses = None
        if spec.get("generate"):
            from types import SimpleNamespace

            from grpo_tune.trainer.rollout.base import SamplingParams
            from grpo_tune.trainer.rollout.megatron import MegatronRollout

            ro = MegatronRollout(engine=eng, tokenizer=SimpleNamespace(pad_id=0, eos_id=1), max_seq_len=64)
            prompts = [t[: 3 + i].tolist() for i, t in enumerate(tokens[:5])]
            responses = ro.generate(prompts, SamplingParams(max_tokens=spec["generate"], seed=5))

        def loss_fn(logp, entropy, mb):
            return -logp.mean(), {"entropy": entropy.mean()}

        losses, norms = [], []
        for _ in range(spec.get("steps", 3)):
            met = eng.train_step({"tokens": tokens}, loss_fn, micro_batch_size=spec.get("mbs", 2), with_entropy=True)
            losses.append(met["loss"])
            norms.append(met["grad_norm"])
        counts = [None] * world
        coords = [None] * world
        dist.all_gather_object(counts, eng.param_count())
        dist.all_gather_object(
            coords, {"pp_rank": layout.pp_rank, "tp_rank": layout.tp_rank, "ep_rank": layout.ep_rank}
        )
        results.append(
            {
                "model": lay["model"],
                "overrides": lay.get("overrides"),
                "strategy": lay["strategy"],
                "losses": losses,
                "grad_norms": norms,
                "logprob_sum": float(lp.sum()),
                "responses": responses,
                "entropy_mean": float(ent.mean()),
                "param_counts": counts,
                "coords": coords,
                "dtype": str(eng.dtype),
                "transformer_engine": use_transformer_engine(),
            }
        )
        del eng
    parallel.destroy()
    return {"world": world, "results": results}


def _main(argv: list[str]) -> None:
    task, spec_json, out = argv[:3]
    if ":" in task:
        import importlib

        mod, fn = task.split(":")
        func = getattr(importlib.import_module(mod), fn)
    else:
        func = globals()[f"task_{task}"]
    result = func(json.loads(spec_json))
    if int(os.environ.get("RANK", "0")) == 0:
        tmp = Path(out + ".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(out)


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    _main(sys.argv[1:])
