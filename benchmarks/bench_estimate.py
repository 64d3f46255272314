"""How many estimates per second the cost model does on one core.

    python benchmarks/bench_estimate.py [--seconds 3] [--models 7b,70b,30b-a3b,dsv3]

Builds every valid plan (degrees, micro-batch, recompute, offload, rollout TP) for each model on a
cluster, then calls ``estimate()`` on them round-robin, pinned to one core, and counts CPU time
(process time, so other load on a shared machine does not count). It reports the whole
``estimate()`` (validation, params, memory and the time model), the same without the time model,
and the memory model alone. Plans repeat, so the per-(model, degrees) caches are warm, as they are
in a search; no whole-estimate result is cached.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

from grpo_tune.costmodel import timing
from grpo_tune.core.errors import InvalidDegreesError
from grpo_tune.costmodel.estimate import estimate
from grpo_tune.costmodel.memory import phase_memory
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate

GPUS = {"7b": 8, "8b": 8, "70b": 64, "30b-a3b": 32, "dsv3": 256, "tiny": 4}


def plans(name: str, gpus: int) -> list[Strategy]:
    m = load_model(name)
    out = []
    p2 = [1, 2, 4, 8, 16]
    for tp, pp, cp, ep, mbs, rc, off, rtp in itertools.product(
        p2[:4],
        p2,
        [1, 2],
        p2 if m.is_moe else [1],
        [1, 2],
        ["selective", "full"],
        [(), ("param", "optimizer")],
        [1, 4, 8],
    ):
        s = Strategy.of(
            tp=tp, pp=pp, cp=cp, ep=ep, etp=1 if m.is_moe else None, mbs=mbs, recompute=rc, offload=off, rollout_tp=rtp
        )
        try:
            validate(m, s, gpus, gpus_per_node=8)
        except InvalidDegreesError:
            continue
        out.append(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--models", default="7b,70b,30b-a3b,dsv3")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    hw = load_hardware("h100")
    wl = Workload()
    work = []
    for name in args.models.split(","):
        m, gpus = load_model(name), GPUS.get(name, 8)
        c = Cluster(gpus=gpus, gpus_per_node=8)
        work += [(m, c, s) for s in plans(name, gpus)]
    print(f"{len(work)} valid plans over {args.models} (grpo workload, h100), one core")

    def rate(fn) -> float:
        n, t0 = 0, time.process_time()
        while time.process_time() - t0 < args.seconds:
            for m, c, s in work:
                fn(m, c, s)
            n += len(work)
        return n / (time.process_time() - t0)

    full = rate(lambda m, c, s: estimate(model=m, hardware=hw, cluster=c, strategy=s, workload=wl))
    keep = timing.step_time
    timing.step_time = lambda *a, **k: (None, None, {})  # the same call without the time model
    try:
        no_time = rate(lambda m, c, s: estimate(model=m, hardware=hw, cluster=c, strategy=s, workload=wl))
    finally:
        timing.step_time = keep
    resolved = [(m, c, validate(m, s, c.gpus, allow_cross_node_tp=True)) for m, c, s in work]
    work = resolved
    mem = rate(lambda m, c, s: phase_memory(m, hw, c, s, wl))
    print(f"estimate(): {full:,.0f} estimates/s  ({1e6 / full:.0f} us each; validation + params + memory + time)")
    print(f"estimate() without the time model: {no_time:,.0f} /s  ({1e6 / no_time:.0f} us each)")
    print(f"memory model alone: {mem:,.0f} /s  ({1e6 / mem:.0f} us each)")


if __name__ == "__main__":
    main()
