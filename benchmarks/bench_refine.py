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
import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CACHE_VERSION = 1
WITHIN = 0.05
"""A strategy 'finds the best' when its choice is within 5% of the true best median step time."""

# The measured space: tiny on 4 CPU ranks, the README's refinement workload.
MODEL, HARDWARE, GPUS = "tiny", "cpu", 4
WORKLOAD = {"prompts": 8, "n": 4, "prompt_len": 16, "response_len": 16, "mini_batch": 8}
LAYOUTS = ((1, 1, 4, 1), (1, 2, 2, 1), (1, 4, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1), (1, 2, 2, 2))
"""(tp, pp, dp, vpp)."""
MBS = (1, 2, 8)
RECOMPUTE = ("none", "full")
SMALL = 4
"""PlanIndex in ``--space small`` (a quick check of the machinery)."""


# ---------------------------------------------------------------------------------------------
# The plan space
# ---------------------------------------------------------------------------------------------


def inputs():
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Workload

    return (load_model(MODEL), load_hardware(HARDWARE), Cluster(gpus=GPUS, gpus_per_node=GPUS), Workload(**WORKLOAD))


def plan_space(kind: str = "full") -> list:
    """The benchmark's plans: Estimates of every runnable plan on the grid, fastest predicted first.

    Offload (a no-op on CPU) is off, and the rollout TP follows the training TP (the native CPU
    sampler ignores it), so no two plans are the same run.
    """
    from grpo_tune.autotune.refine import build_space, runnable
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.core.config import TrainerOptions

    m, hw, cl, wl = inputs()
    ranked = search(m, hw, cl, wl, top=10).ranked
    space, _ = runnable(build_space(ranked, m, hw, cl, wl), TrainerOptions())
    out = []
    for e in space:
        s = e.strategy
        if (
            (s.layout.tp, s.layout.pp, s.layout.dp, s.layout.vpp) in LAYOUTS
            and s.batching.mbs in MBS
            and s.memory.recompute in RECOMPUTE
            and not s.memory.offload
            and s.rollout.rollout_tp == s.layout.tp
        ):
            out.append(e)
    if kind == "small":
        out = out[:: max(1, len(out) // SMALL)][:SMALL]
    return out


def cached_space(cache: dict[str, Any]) -> list:
    """Estimates (today's cost model) of the plans the cache measured, fastest predicted first.

    The cache, not today's search, fixes the plans: search may since propose other settings that do
    not change a CPU run (e.g. the rollout memory fraction)."""
    from grpo_tune.core.strategy import Strategy
    from grpo_tune.costmodel.estimate import estimate

    m, hw, cl, wl = inputs()
    out = [
        estimate(model=m, hardware=hw, cluster=cl, workload=wl, strategy=Strategy.from_dict(p["strategy"]))
        for p in cache["plans"].values()
    ]
    return sorted(out, key=lambda e: round(e.step_s, 9))


# ---------------------------------------------------------------------------------------------
# The cache of measurements
# ---------------------------------------------------------------------------------------------


def new_cache(space: Sequence, *, steps: int, repeats: int) -> dict[str, Any]:
    from grpo_tune.autotune.refine import plan_key

    return {
        "version": CACHE_VERSION,
        "meta": {
            "what": f"grpo-tune profile of every plan: {MODEL} on {GPUS} CPU ranks, workload {WORKLOAD}",
            "machine": f"{os.uname().nodename}, {os.cpu_count()} CPU cores, shared with other engineers' tests "
            "(loaded; load average recorded per run)",
            "steps": steps,
            "repeats": repeats,
            "started_utc": _now(),
            "code": os.environ.get("BENCH_CODE", "working tree"),
        },
        "plans": {
            plan_key(e.strategy): {"strategy": e.strategy.to_dict(), "predicted_step_s": e.step_s, "runs": []}
            for e in space
        },
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


TRUTHS = ("median", "min")
"""How a plan's repeats make its true step time. ``min``: load on a shared machine only ever slows a
run down, so the fastest repeat is the closest to the plan's time on a quiet machine."""


def truth(cache: dict[str, Any], stat: str = "median") -> dict[str, dict[str, Any]]:
    """Per plan key: its true step seconds (``true_s``, the ``stat`` of its ok runs), the median, the
    spread ((max - min) / median) and n."""
    out = {}
    for key, entry in cache["plans"].items():
        xs = [float(r["step_s"]) for r in ok_runs(entry)]
        if not xs:
            continue
        med = statistics.median(xs)
        true_s = min(xs) if stat == "min" else med
        out[key] = {"true_s": true_s, "median_s": med, "spread": (max(xs) - min(xs)) / med, "n": len(xs), "runs_s": xs}
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


def measure(
    cache: dict[str, Any], path: Path, *, space: Sequence, steps: int, repeats: int, timeout_s: float, work: Path
) -> None:
    """Profile every (repeat, plan) still missing from the cache; save after each run."""
    from grpo_tune.autotune.refine import plan_key, run_profile
    from grpo_tune.core.config import RunConfig, TrainerOptions, save
    from grpo_tune.core.target import inputs_of

    by_key = {plan_key(e.strategy): e for e in space}
    todo = [(r, k) for r, k in schedule(sorted(by_key), repeats) if len(cache["plans"][k]["runs"]) <= r]
    print(f"{len(todo)} profiling run(s) to do ({len(by_key)} plans x {repeats} repeats)", flush=True)
    for i, (r, k) in enumerate(todo):
        e = by_key[k]
        d = work / f"r{r}-{abs(hash(k)) % 10**8:08d}"
        d.mkdir(parents=True, exist_ok=True)
        cfg = RunConfig(
            **inputs_of(e),
            trainer=TrainerOptions(steps=steps, out_dir=str(d / "train")),
        )
        p = save(cfg, d / "config.yaml")
        load0 = os.getloadavg()[0]
        res = run_profile(p, steps=steps, timeout_s=timeout_s, json_path=d / "profile.json", log_path=d / "profile.log")
        data = res.data or {}
        run = {
            "status": res.status,
            "message": res.message,
            "duration_s": round(res.duration_s, 2),
            "step_s": data.get("step_s"),
            "tokens_per_s": data.get("tokens_per_s"),
            "phases_s": data.get("phases_s"),
            "utc": _now(),
            "loadavg_1m": round(load0, 2),
        }
        cache["plans"][k]["runs"].append(run)
        cache["meta"]["updated_utc"] = _now()
        save_cache(path, cache)
        st = "-" if run["step_s"] is None else f"{run['step_s']:.3f}"
        print(
            f"[{i + 1}/{len(todo)}] repeat {r} {res.status} step {st} s in {res.duration_s:.0f} s "
            f"(load {load0:.1f}) {k}",
            flush=True,
        )


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Strategies against the cached truth
# ---------------------------------------------------------------------------------------------


def regret(chosen_s: float, best_s: float) -> float:
    """The chosen plan's true (median) step time over the true best's: 1.0 is the best."""
    return chosen_s / best_s


def summarize(regrets: Sequence[float], within: float = WITHIN) -> dict[str, float]:
    """Mean and median regret, and the share of seeds within ``within`` of the best."""
    return {
        "mean": statistics.fmean(regrets),
        "median": statistics.median(regrets),
        "p_within": sum(r <= 1 + within + 1e-12 for r in regrets) / len(regrets),
        "n": len(regrets),
    }


class Draws:
    """Cached measurements as a seed sees them: the j-th measurement of a plan is one of its repeats.

    The order of a plan's repeats depends on the seed and the plan only, so every strategy sees
    the same draw for the same plan at the same seed (common random numbers).
    """

    def __init__(self, cache: dict[str, Any], seed: int):
        self.cache, self.seed, self.count = cache, seed, {}

    def run(self, key: str) -> dict[str, Any]:
        runs = ok_runs(self.cache["plans"][key])
        order = list(range(len(runs)))
        random.Random(f"{self.seed}:{key}").shuffle(order)
        j = self.count.get(key, 0)
        self.count[key] = j + 1
        return runs[order[j % len(runs)]]


def strat_model(space, draws, k, rng) -> tuple[str, int]:
    return space[0][0], 0


def strat_random(space, draws, k, rng) -> tuple[str, int]:
    keys = rng.sample([key for key, _ in space], k)
    return min(keys, key=lambda key: draws.run(key)["step_s"]), k


def strat_calibrated(space, draws, k, rng) -> tuple[str, int]:
    """Measure K random plans, fit the time model to them (autotune.calibrate.fit), take its top-1."""
    from grpo_tune.autotune.calibrate.fit import Point, fit
    from grpo_tune.core.target import inputs_of
    from grpo_tune.costmodel.estimate import estimate

    keys = rng.sample([key for key, _ in space], k)
    by = dict(space)
    pts = []
    for key in keys:
        e, r = by[key], draws.run(key)
        pts.append(
            Point(
                **inputs_of(e),
                measured_step_s=float(r["step_s"]),
                measured_phases_s=dict(r.get("phases_s") or {}),
                label=key,
            )
        )
    params = fit(pts).params
    pred = {key: estimate(**inputs_of(e), calibration=params).step_s for key, e in space}
    strat_calibrated.last_pred = pred
    return min(pred, key=pred.get), k


def strat_tpe_plain(space, draws, k, rng) -> tuple[str, int]:
    """Optuna TPE (default settings) over the plan's own dimensions, no model seeding."""
    import optuna

    from grpo_tune.autotune.refine.study import memory_study

    h = memory_study(rng.randrange(2**31))
    grid = {
        (
            e.strategy.layout.tp,
            e.strategy.layout.pp,
            e.strategy.layout.vpp,
            e.strategy.batching.mbs,
            e.strategy.memory.recompute,
        ): key
        for key, e in space
    }
    layouts = sorted({g[:3] for g in grid})
    mbs = sorted({g[3] for g in grid})
    rec = sorted({g[4] for g in grid})
    seen: dict[str, float] = {}
    for _ in range(50 * k):
        if len(seen) >= k:
            break
        t = h.study.ask()
        g = (
            *layouts[t.suggest_categorical("layout", list(range(len(layouts))))],
            t.suggest_categorical("mbs", mbs),
            t.suggest_categorical("recompute", rec),
        )
        key = grid.get(g)
        if key is None or key in seen:  # not a plan of the space, or measured already: not a trial
            h.study.tell(t, state=optuna.trial.TrialState.PRUNED)
            continue
        seen[key] = float(draws.run(key)["step_s"])
        h.study.tell(t, -seen[key])
    return min(seen, key=seen.get), len(seen)


def _refine(policy: str):
    def strat(space, draws, k, rng) -> tuple[str, int]:
        """refine's own plan-choosing loop (autotune.refine.run_trials) with cached measurements."""
        from grpo_tune.autotune.refine import (
            PlanIndex,
            ProfileOutcome,
            RefineOptions,
            memory_study,
            run_trials,
            seed_study,
        )
        from grpo_tune.autotune.refine.loop import winner_plan
        from grpo_tune.autotune.refine.study import counted

        opts = RefineOptions(
            trials=k, policy=policy, seed=rng.randrange(2**31), progress=False, emit=False, calibrate=False
        )
        plans = PlanIndex.of([e for _, e in space], opts)
        h = memory_study(opts.seed)
        seed_study(h, plans, opts)

        def measure(_h, _number, est) -> ProfileOutcome:
            from grpo_tune.autotune.refine import plan_key

            r = draws.run(plan_key(est.strategy))
            return ProfileOutcome(
                "ok",
                None,
                {"step_s": r["step_s"], "tokens_per_s": r["tokens_per_s"], "phases_s": r.get("phases_s") or {}},
                0.0,
            )

        run_trials(h, plans, opts, measure, host="bench")
        return winner_plan(h, plans), counted(h.study)

    strat.__doc__ = f"refine, policy {policy}"
    return strat


STRATEGIES: dict[str, Callable] = {
    "model top-1 (uncalibrated)": strat_model,
    "model top-1 (calibrated on K random plans)": strat_calibrated,
    "refine as shipped (top-4 seeds + TPE)": _refine("tpe"),
    "refine (model prior + GP, noise-aware)": _refine("model"),
    "random search": strat_random,
    "Optuna TPE, no model seeding": strat_tpe_plain,
}


def evaluate(
    cache: dict[str, Any],
    space: Sequence,
    *,
    budgets: Sequence[int],
    seeds: int,
    skip: Sequence[str] = (),
    drop_best: int = 0,
    truth_stat: str = "median",
) -> dict[str, Any]:
    """Every strategy at every budget over ``seeds`` seeds: regret, P(within 5%), trials used.

    ``drop_best``: leave out the N truly fastest plans first (a stress test: the space where the
    cost model's favourite is no longer the best, as on a machine the model knows less well).
    """
    from grpo_tune.autotune.refine import plan_key, spearman

    tr = truth(cache, truth_stat)
    full = [(plan_key(e.strategy), e) for e in space if plan_key(e.strategy) in tr]
    for key in sorted((k for k, _ in full), key=lambda k: tr[k]["true_s"])[:drop_best]:
        full = [(k, e) for k, e in full if k != key]
    best_s = min(tr[k]["true_s"] for k, _ in full)
    out: dict[str, Any] = {"plans": len(full), "best_s": best_s, "results": {}, "spearman": {}}
    out["spearman"]["uncalibrated"] = spearman([e.step_s for _, e in full], [tr[k]["true_s"] for k, _ in full])
    for name, strat in STRATEGIES.items():
        if name in skip:
            continue
        t0 = time.monotonic()
        out["results"][name] = {}
        for k in budgets:
            regs, used, sps = [], [], []
            for seed in range(seeds):
                rng = random.Random(f"{name}:{k}:{seed}")
                chosen, n = strat(full, Draws(cache, seed), k, rng)
                regs.append(regret(tr[chosen]["true_s"], best_s))
                used.append(n)
                if strat is strat_calibrated:
                    p = strat_calibrated.last_pred
                    sps.append(spearman([p[key] for key, _ in full], [tr[key]["true_s"] for key, _ in full]))
            out["results"][name][k] = {**summarize(regs), "trials_mean": statistics.fmean(used)}
            if sps:
                out["spearman"][f"calibrated on {k}"] = statistics.fmean(s for s in sps if s is not None)
            if strat is strat_model:  # deterministic and free of K: one seed says it all
                out["results"][name] = {kk: out["results"][name][k] for kk in budgets}
                break
        print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def noise_summary(cache: dict[str, Any]) -> dict[str, float]:
    tr = truth(cache)
    sp = [v["spread"] for v in tr.values() if v["n"] >= 2]
    return {
        "plans": len(tr),
        "runs": sum(v["n"] for v in tr.values()),
        "spread_median": statistics.median(sp) if sp else float("nan"),
        "spread_max": max(sp) if sp else float("nan"),
    }


def table(res: dict[str, Any], budgets: Sequence[int]) -> str:
    head = "| strategy | " + " | ".join(f"K={k}: regret mean / P(<=5%)" for k in budgets) + " |"
    lines = [head, "|---|" + "---|" * len(budgets)]
    for name, by_k in res["results"].items():
        cells = [f"{by_k[k]['mean']:.3f} / {by_k[k]['p_within']:.0%}" for k in budgets]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(res: dict[str, Any], budgets: Sequence[int], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, by_k in res["results"].items():
        a.plot(budgets, [by_k[k]["mean"] for k in budgets], marker="o", label=name)
        b.plot(budgets, [100 * by_k[k]["p_within"] for k in budgets], marker="o", label=name)
    a.set_xlabel("trial budget K (profiling runs)")
    a.set_ylabel("mean regret (chosen / best step time)")
    b.set_xlabel("trial budget K (profiling runs)")
    b.set_ylabel("% of seeds within 5% of the best")
    for ax in (a, b):
        ax.set_xticks(list(budgets))
        ax.grid(alpha=0.3)
    a.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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
    ap.add_argument("--drop-best", type=int, default=0, help="also evaluate without the N fastest plans (0..N)")
    ap.add_argument("--skip", action="append", default=[], help="a strategy name to leave out (repeatable)")
    ap.add_argument(
        "--truth",
        choices=TRUTHS,
        default="median",
        help="a plan's true step time: the median of its repeats, or the fastest (load only slows runs)",
    )
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    cache = (
        load_cache(a.cache) if a.cache.exists() else new_cache(plan_space(a.space), steps=a.steps, repeats=a.repeats)
    )
    space = cached_space(cache)  # the cache fixes the plans, so a partly filled cache continues with the same ones
    if not a.no_measure:
        work = a.work or Path(tempfile.mkdtemp(prefix="bench_refine-"))
        measure(
            cache,
            a.cache,
            space=space,
            steps=int(cache["meta"]["steps"]),
            repeats=a.repeats,
            timeout_s=a.timeout,
            work=work,
        )
        print(f"measured in {time.monotonic() - t0:.0f} s", flush=True)
    if a.measure_only:
        return 0
    budgets = [int(x) for x in a.budgets.split(",")]
    nz = noise_summary(cache)
    t1 = time.monotonic()
    print(
        f"{nz['plans']} plans measured {nz['runs']} times in all; spread of repeats (max-min)/median: "
        f"median {nz['spread_median']:.1%}, max {nz['spread_max']:.1%} (shared, loaded 2-core machine)"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    every = {}
    for drop in range(a.drop_best + 1):
        res = evaluate(cache, space, budgets=budgets, seeds=a.seeds, skip=a.skip, drop_best=drop, truth_stat=a.truth)
        res["noise"], res["meta"], res["drop_best"], res["truth"] = nz, cache["meta"], drop, a.truth
        every[drop] = res
        what = "the whole space" if not drop else f"the space without its {drop} truly fastest plan(s)"
        print(f"\n## {what}: {res['plans']} plans, true best {res['best_s']:.3f} s/step")
        print(
            f"Spearman, cost model vs truth: uncalibrated {res['spearman']['uncalibrated']:.3f}; "
            + ", ".join(f"{k} {v:.3f}" for k, v in res["spearman"].items() if k != "uncalibrated")
        )
        print(f"regret = chosen plan's true ({a.truth}) step time / the best's; {a.seeds} seeds; K = profiled trials")
        print(table(res, budgets))
        suffix = ("" if not drop else f"_drop{drop}") + ("" if a.truth == "median" else f"_{a.truth}")
        plot(
            res,
            budgets,
            a.out / f"refine_regret{suffix}.png",
            f"{res['plans']} plans ({what}), tiny on 4 CPU ranks (shared, loaded 2-core machine), {a.seeds} seeds",
        )
    name = "bench_refine.json" if a.truth == "median" else f"bench_refine_{a.truth}.json"
    (a.out / name).write_text(json.dumps(every, indent=1, default=str))
    print(
        f"\nwrote {a.out}/refine_regret*.png and {name}; evaluation {time.monotonic() - t1:.0f} s, "
        f"total {time.monotonic() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
