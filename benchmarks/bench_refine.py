"""Does refinement find the measured best? Ground truth by exhaustive measurement, then regret.

    python benchmarks/bench_refine.py --cache benchmarks/results/refine_truth.json [--seeds 40]

1. Ground truth. Every plan of a fixed space (``tiny`` on 4 CPU ranks across TP/PP/DP/VPP, micro
   batch and recompute) is profiled ``--repeats`` times with the real ``grpo-tune profile``
   (megatron-core trainer under torchrun). Repeats go round-robin over the plans in a shuffled
   order, so a burst of load on a shared machine hits different plans, not one plan's repeats.
   Each run is written to ``--cache`` as soon as it ends; a partly filled cache continues where
   it stopped, and a complete one is reused without measuring anything.
2. Strategies at equal trial budgets K: the cost model's top-1 (uncalibrated, and calibrated on K
   measured plans), ``refine`` (its real selection code, with a measuring function that draws one
   of the cached repeats instead of starting a process), random search, and Optuna TPE with no
   model seeding. Each over ``--seeds`` seeds.
3. Outputs: regret (the chosen plan's true median step time over the true best), P(within 5% of
   the best), Spearman of the model against the full truth before/after calibration, a table and
   a regret-vs-trials PNG.

The benchmark is not part of the test suite (tests/test_refine_bench.py checks its arithmetic
and cache format).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

CACHE_VERSION = 1
WITHIN = 0.05
"""A strategy 'finds the best' when its choice is within 5% of the true best median step time."""

# The measured space: tiny on 4 CPU ranks, the README's refinement workload.
MODEL, HARDWARE, GPUS = "tiny", "cpu", 4
WORKLOAD = dict(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8)
LAYOUTS = ((1, 1, 4, 1), (1, 2, 2, 1), (1, 4, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1), (1, 2, 2, 2))
"""(tp, pp, dp, vpp)."""
MBS = (1, 2, 8)
RECOMPUTE = ("none", "full")
SMALL = 4
"""Plans in ``--space small`` (a quick check of the machinery)."""


# ---------------------------------------------------------------------------------------------
# The plan space
# ---------------------------------------------------------------------------------------------

def inputs():
    from core.specs import load_hardware, load_model
    from core.strategy import Cluster, Workload

    return (load_model(MODEL), load_hardware(HARDWARE), Cluster(gpus=GPUS, gpus_per_node=GPUS),
            Workload(**WORKLOAD))


def plan_space(kind: str = "full") -> list:
    """The benchmark's plans: Estimates of every runnable plan on the grid, fastest predicted first.

    Offload (a no-op on CPU) is off, and the rollout TP follows the training TP (the native CPU
    sampler ignores it), so no two plans are the same run.
    """
    from autotune.refine import build_space, runnable
    from autotune.search import search
    from core.config import TrainerOptions

    m, hw, cl, wl = inputs()
    ranked = search(m, hw, cl, wl, top=10).ranked
    space, _ = runnable(build_space(ranked, m, hw, cl, wl), TrainerOptions())
    out = []
    for e in space:
        s = e.strategy
        if ((s.tp, s.pp, s.dp, s.vpp) in LAYOUTS and s.mbs in MBS and s.recompute in RECOMPUTE and not s.offload
                and s.rollout_tp == s.tp):
            out.append(e)
    if kind == "small":
        out = out[:: max(1, len(out) // SMALL)][:SMALL]
    return out


# ---------------------------------------------------------------------------------------------
# The cache of measurements
# ---------------------------------------------------------------------------------------------

def new_cache(space: Sequence, *, steps: int, repeats: int) -> dict[str, Any]:
    from autotune.refine import plan_key

    return {
        "version": CACHE_VERSION,
        "meta": {
            "what": f"grpo-tune profile of every plan: {MODEL} on {GPUS} CPU ranks, workload {WORKLOAD}",
            "machine": f"{os.uname().nodename}, {os.cpu_count()} CPU cores, shared with other engineers' tests "
                       "(loaded; load average recorded per run)",
            "steps": steps, "repeats": repeats, "started_utc": _now(),
            "code": os.environ.get("BENCH_CODE", "working tree"),
        },
        "plans": {plan_key(e.strategy): {"strategy": e.strategy.to_dict(), "predicted_step_s": e.step_s, "runs": []}
                  for e in space},
    }


def load_cache(path: Path) -> dict[str, Any]:
    d = json.loads(path.read_text())
    if d.get("version") != CACHE_VERSION or not isinstance(d.get("plans"), dict):
        raise SystemExit(f"{path}: not a bench_refine cache (version {CACHE_VERSION})")
    return d


def save_cache(path: Path, cache: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        json.dump(cache, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def ok_runs(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in entry["runs"] if r.get("status") == "ok" and (r.get("step_s") or 0) > 0]


def truth(cache: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per plan key: median step seconds of its ok runs, the spread ((max - min) / median) and n."""
    out = {}
    for key, entry in cache["plans"].items():
        xs = [float(r["step_s"]) for r in ok_runs(entry)]
        if not xs:
            continue
        med = statistics.median(xs)
        out[key] = {"median_s": med, "spread": (max(xs) - min(xs)) / med, "n": len(xs), "runs_s": xs}
    return out


def schedule(keys: Sequence[str], repeats: int, seed: int = 0) -> list[tuple[int, str]]:
    """(repeat, key) in measuring order: round-robin over the plans, each round shuffled."""
    rng = random.Random(seed)
    out = []
    for r in range(repeats):
        ks = list(keys)
        rng.shuffle(ks)
        out += [(r, k) for k in ks]
    return out


def measure(cache: dict[str, Any], path: Path, *, space: Sequence, steps: int, repeats: int, timeout_s: float,
            work: Path) -> None:
    """Profile every (repeat, plan) still missing from the cache; save after each run."""
    from autotune.refine import plan_key, run_profile
    from core.config import RunConfig, TrainerOptions, save

    by_key = {plan_key(e.strategy): e for e in space}
    todo = [(r, k) for r, k in schedule(sorted(by_key), repeats) if len(cache["plans"][k]["runs"]) <= r]
    print(f"{len(todo)} profiling run(s) to do ({len(by_key)} plans x {repeats} repeats)", flush=True)
    for i, (r, k) in enumerate(todo):
        e = by_key[k]
        d = work / f"r{r}-{abs(hash(k)) % 10**8:08d}"
        d.mkdir(parents=True, exist_ok=True)
        cfg = RunConfig(model=e.model, hardware=e.hardware, cluster=e.cluster, strategy=e.strategy,
                        workload=e.workload, trainer=TrainerOptions(steps=steps, out_dir=str(d / "train")))
        p = save(cfg, d / "config.yaml")
        load0 = os.getloadavg()[0]
        res = run_profile(p, steps=steps, timeout_s=timeout_s, json_path=d / "profile.json", log_path=d / "profile.log")
        data = res.data or {}
        run = {"status": res.status, "message": res.message, "duration_s": round(res.duration_s, 2),
               "step_s": data.get("step_s"), "tokens_per_s": data.get("tokens_per_s"),
               "phases_s": data.get("phases_s"), "utc": _now(), "loadavg_1m": round(load0, 2)}
        cache["plans"][k]["runs"].append(run)
        cache["meta"]["updated_utc"] = _now()
        save_cache(path, cache)
        st = "-" if run["step_s"] is None else f"{run['step_s']:.3f}"
        print(f"[{i + 1}/{len(todo)}] repeat {r} {res.status} step {st} s in {res.duration_s:.0f} s "
              f"(load {load0:.1f}) {k}", flush=True)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True, help="measurements JSON (created, continued or reused)")
    ap.add_argument("--space", choices=("full", "small"), default="full")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="profile steps per run (the first is warm-up)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--measure-only", action="store_true", help="fill the cache, do not evaluate")
    ap.add_argument("--no-measure", action="store_true", help="evaluate what the cache holds, measure nothing")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--budgets", default="2,4,8,12")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    ap.add_argument("--work", type=Path, default=None, help="scratch folder for profiling runs")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    space = plan_space(a.space)
    cache = load_cache(a.cache) if a.cache.exists() else new_cache(space, steps=a.steps, repeats=a.repeats)
    if not a.no_measure:
        work = a.work or Path(tempfile.mkdtemp(prefix="bench_refine-"))
        measure(cache, a.cache, space=space, steps=int(cache["meta"]["steps"]), repeats=a.repeats,
                timeout_s=a.timeout, work=work)
        print(f"measured in {time.monotonic() - t0:.0f} s", flush=True)
    if a.measure_only:
        return 0
    from benchmarks_eval import evaluate  # noqa: F401  (replaced below once the evaluation lands)

    return 0


if __name__ == "__main__":
    sys.exit(main())
