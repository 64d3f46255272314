"""Our stage times through RLinf's published placement formula, side by side with our own streamed pricing.

RLinf's auto-placement (RLinf/RLinf, ``toolkits/auto_placement/placement.py`` at commit
a3816b596478dcd8a5c69a6ec1468c9519f77b5b,
``DisaggregatedScheduleResult._get_disaggregated_time``) prices two components on disjoint GPUs as a pipeline over
prompt groups: ``warmup = (source_per_group + sink_per_group) x warmup_groups`` and
``total = warmup + max(source_per_group, sink_per_group) x (groups - warmup_groups)``; components that share GPUs
(``CollocatedScheduleResult``) add their totals; a nested disaggregated component's warm-up is its own. It prices
no weight sync and no decode tail: its per-group cost is a stage's profiled time over the groups. This script is
our own code applying that published formula to *our* stage times (costmodel: the rollout pool's generation, the
log-prob passes, the update), so the two pickers differ only in their composition rules:

- ``rlinf``: the formula above, per group (1 warm-up group), no sync;
- ``ours``: costmodel.streaming (mini-batches of finished groups arriving as the rollout's steady phase and drain
  release them, the last with the longest response) plus the cross-pool weight sync, what ``grpo-tune search
  --placement auto --staleness 0`` prices.

Splits: rollout | training (two pools), and rollout | log-prob | actor (three pools; RLinf's rollout /
"inference" / actor). Neither verl 0.9.1 nor NeMo-RL can run a third pool (docs/placement.md), so ours prices
the three-pool rows as a what-if only and the search never proposes them.

    python benchmarks/bench_rlinf_placement.py [--model qwen3-30b-a3b] [--gpus 64] [--hardware h100]

Prints every split's step by both rules, then both picks side by side.
"""

from __future__ import annotations

import argparse
import time

from grpo_tune.autotune.search.driver import search
from grpo_tune.autotune.search.placement import best_rollout
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel import pools as P
from grpo_tune.core import placement as CP
from grpo_tune.costmodel import streaming as S
from grpo_tune.costmodel.timing_base import check_calibration


def rlinf_two(source_total: float, sink_total: float, groups: int, warmup: int = 1) -> float:
    """RLinf's DisaggregatedScheduleResult total of two single components (each priced as total / groups)."""
    src, snk = source_total / groups, sink_total / groups
    return (src + snk) * warmup + max(src, snk) * (groups - warmup)


def rlinf_three(roll: float, infer: float, actor: float, groups: int, warmup: int = 1) -> float:
    """rollout -> (inference -> actor): the sink is itself disaggregated; its warm-up is its own
    ``(infer + actor) x warmup`` and its per-group cost the slower of the two (RLinf's nesting)."""
    r, i, a = roll / groups, infer / groups, actor / groups
    sink_warm = (i + a) * warmup
    sink_per = max(i, a)
    return (r * warmup + sink_warm) * warmup + max(r, sink_per) * (groups - warmup)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hardware", default="h100")
    ap.add_argument("--step", type=int, default=8, help="pool sizes in multiples of this (default: a node)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    m, hw = load_model(args.model), load_hardware(args.hardware)
    cluster = Cluster(gpus=args.gpus, gpus_per_node=8)
    # the lengths grpo-tune search assumes when none are given (mean = 20% of the maximum, as it prints)
    wl = Workload(prompt_len_mean=205, response_len_mean=205)
    cal = check_calibration(None)
    groups = wl.prompts
    units = S.units_of(wl.prompts, wl.mini_batch)
    sizes = [g for g in range(args.step, args.gpus, args.step)]

    train_cache: dict[int, object] = {}

    def train_plan(g: int):
        """The best training plan of a pool of ``g`` GPUs (its pool's nodes as a training pool of that size gets)."""
        if g not in train_cache:
            c = CP.pools(cluster, args.gpus - g).train
            try:
                train_cache[g] = search(m, hw, c, wl, _price=P.train_pool, top=1).best
            except Exception:  # noqa: BLE001 - a pool with no plan is skipped
                train_cache[g] = None
        return train_cache[g]

    gen_cache: dict[int, tuple[dict, float, object] | None] = {}

    def gen(r: int):
        if r not in gen_cache:
            roll = CP.pools(cluster, r).rollout
            got = best_rollout(m, hw, roll, wl, {}, cal, False)
            gen_cache[r] = None if got is None else (got[0], got[1], roll)
        return gen_cache[r]

    print(f"{m.name} on {args.gpus} x {hw.name}; {groups} groups of n={wl.n}, {units} mini-batches; our stage times")
    print(f"{'split (R+L+A)':<16}{'gen':>7}{'logp':>7}{'upd':>7}{'sync':>6}{'rlinf s':>9}{'ours s':>9}")
    two, three = [], []
    for r in sizes:
        g, t = gen(r), train_plan(args.gpus - r)
        if g is None or t is None:
            continue
        opt, gen_s, roll = g
        est = P.estimate_separate(
            model=m,
            hardware=hw,
            cluster=cluster,
            strategy=t.strategy.replace(**opt),
            workload=wl,
            placement=Placement(mode="separate", rollout_gpus=r, stream=True),
            train=t,
        )
        f = est.placement
        ph = dict(t.time.phases)
        logp = ph.get("old_logprob", 0.0) + ph.get("ref_logprob", 0.0)
        upd = f["train_s"] - logp
        ours = est.step_s
        rl = rlinf_two(f["gen_s"], f["train_s"], groups)
        two.append((rl, ours, r, args.gpus - r))
        print(
            f"{f'{r}+{args.gpus - r}':<16}{f['gen_s']:>7.1f}{logp:>7.1f}{upd:>7.1f}{f['sync_s']:>6.1f}"
            f"{rl:>9.2f}{ours:>9.2f}"
        )
        arrivals = S.rollout_arrivals(
            m, hw, roll, CP.rollout_strategy(Strategy().replace(**opt)), wl, cal, gen_s, units
        )
        for i in sizes:
            a = args.gpus - r - i
            if a < args.step:
                continue
            ti, ta = train_plan(i), train_plan(a)  # the log-prob pool of i GPUs; the actor pool of a GPUs
            if ti is None or ta is None:
                continue
            pi, pa = dict(ti.time.phases), dict(ta.time.phases)
            logp_i = pi.get("old_logprob", 0.0) + pi.get("ref_logprob", 0.0)
            upd_a = pa.get("update", 0.0)
            rl3 = rlinf_three(gen_s, logp_i, upd_a, groups)
            # ours (what-if): units through the log-prob pool, then the actor pool, then the sync (both pools get
            # the new weights: the old log-probs need them; the same broadcast priced once, a lower bound)
            done = S.stage_through(S.stage_through(arrivals, logp_i / units), upd_a / units)
            ours3 = done[-1] + f["sync_s"]
            three.append((rl3, ours3, r, i, a))
            print(
                f"{f'{r}+{i}+{a}':<16}{gen_s:>7.1f}{logp_i:>7.1f}{upd_a:>7.1f}{f['sync_s']:>6.1f}{rl3:>9.2f}{ours3:>9.2f}"
            )
    print()
    rl2, our2 = min(two), min(two, key=lambda x: x[1])
    print(f"{'pick':<34}{'RLinf formula':>20}{'grpo-tune':>20}")
    print(
        f"{'two pools (R+T)':<34}{f'{rl2[2]}+{rl2[3]} {rl2[0]:.2f} s':>20}{f'{our2[2]}+{our2[3]} {our2[1]:.2f} s':>20}"
    )
    if three:
        rl3_, our3_ = min(three), min(three, key=lambda x: x[1])
        print(
            f"{'three pools (R+L+A), what-if':<34}{f'{rl3_[2]}+{rl3_[3]}+{rl3_[4]} {rl3_[0]:.2f} s':>20}"
            f"{f'{our3_[2]}+{our3_[3]}+{our3_[4]} {our3_[1]:.2f} s':>20}"
        )
    for line in (
        "RLinf's rule: (source + sink) per group of warm-up + the slower per group x (groups - 1),",
        "no sync, no tail (RLinf/RLinf toolkits/auto_placement/placement.py); ours: costmodel.streaming",
        "(mini-batches as the rollout releases them, the last with the longest response) + the weight sync.",
        "Three pools: neither verl 0.9.1 nor NeMo-RL runs them (docs/placement.md): a what-if, never proposed.",
    ):
        print(line)
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
