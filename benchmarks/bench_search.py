"""How long the full search takes on one core: 7B on 8 H100 (target <= 1 s) and DeepSeek-V3 on
512 H100 (target <= 15 s), with colocated plans only (default) or with separate pools in the space
too (``--placement auto``, staleness up to 1; the winner column stays the colocated best).

    python benchmarks/bench_search.py [--repeat 3] [--placement auto] [--pins engine=auto]

Prints the size of the valid space, the cost-model calls, the plans scored by combination, and
the best wall time and CPU time (this process, one thread) of ``--repeat`` runs. Pin the process
to one core with ``taskset -c 0`` to match the target's "one core"; on a shared, busy machine the
CPU time is the figure that does not depend on what else runs.
"""

from __future__ import annotations

import argparse
import inspect
import os
import time

from grpo_tune.autotune.search.placement import search_placement
from grpo_tune.autotune.search.driver import search

try:  # the step metric's home since issue 37; side_by_side.sh runs this script on older trees too
    from grpo_tune.costmodel.results import step_s
except ImportError:  # pragma: no cover - a tree before the move
    from grpo_tune.autotune.search.rank import step_s  # type: ignore[attr-defined,no-redef]
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Workload

STREAM = (
    {"stream": None} if "stream" in inspect.signature(search_placement).parameters else {}
)  # the CLI's default (neither --stream nor --no-stream: each staleness-0 split the cheaper of streamed and in
# sequence; issue 40); absent on older trees, so one script times both
CASES = [("7b", 8, "h100", 1.0), ("qwen3-30b-a3b", 64, "h100", None), ("deepseek-v3", 512, "h100", 15.0)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--placement",
        default="colocated",
        choices=("colocated", "auto"),
        help="auto: colocated and separate pools in the space (staleness up to 1), same targets",
    )
    ap.add_argument(
        "--pins",
        default="",
        help="comma list of knob=value pins for every case (engine=auto: vLLM and SGLang in the space; "
        "rollout_precision=fp8, ...)",
    )
    args = ap.parse_args()
    pins = dict(kv.split("=", 1) for kv in args.pins.split(",") if kv) or None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cores = os.cpu_count()
    print(f"cores available to this process: {cores}")
    print(
        f"{'case':<28}{'candidates':>12}{'evaluated':>11}{'combined':>11}{'layouts':>9}{'pruned':>8}"
        f"{'wall s':>8}{'cpu s':>7}{'target':>8}  winner"
    )
    for model, gpus, hw, target in CASES:
        m, h = load_model(model), load_hardware(hw)
        cl = Cluster(gpus=gpus, gpus_per_node=8)
        best_t, best_cpu, res = float("inf"), float("inf"), None
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            if args.placement == "auto":
                pres = search_placement(m, h, cl, Workload(), placement="auto", staleness=1, **STREAM)
                res = pres.colocated
            else:
                res = search(m, h, cl, Workload(), pins=pins)
            best_t = min(best_t, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        s = res.best.strategy
        lay, mem, roll = s.layout, s.memory, s.rollout
        win = (
            f"tp{lay.tp} pp{lay.pp} cp{lay.cp} ep{lay.ep} dp{lay.dp} mbs{s.batching.mbs} {mem.recompute} "
            f"off={','.join(mem.offload) or '-'} rtp{roll.rollout_tp}@{roll.gpu_memory_utilization} "
            f"step {step_s(res.best):.1f}s"
        )
        if args.placement == "auto":
            sb = pres.best_separate
            win += (
                " | separate none fits"
                if sb is None
                else f" | separate {sb.placement['rollout_gpus']}+{sb.placement['train_gpus']} "
                f"K{sb.placement['staleness']} step {sb.step_s:.1f}s ({pres.speedup():.2f}x)"
            )
        tgt = "-" if target is None else f"{target:g}"
        ok = "" if target is None else (" ok" if min(best_t, best_cpu) <= target else " SLOW")
        print(
            f"{model + f' / {gpus} x {hw}':<28}{res.candidates:>12,}{res.evaluated:>11,}{res.combined:>11,}"
            f"{res.layouts:>9,}{res.pruned_layouts:>8,}{best_t:>8.2f}{best_cpu:>7.2f}{tgt:>8}{ok}  {win}"
        )


if __name__ == "__main__":
    main()
