"""The log-prob passes' own micro-batch (``Strategy.log_prob_mbs``), chosen per plan where it matters.

The search proposes ``log_prob_mbs=None`` (= mbs): with the update's micro-batch, the forward-only log-prob
phases hold less than the update (no gradients or optimizer state, no activations kept for a backward), so
they never bind, and the cost model gains little from a larger one (on the 7B example, 4 -> 8 saves 1 s of a
49 s log-prob pass). It matters when a launch runs a larger log-prob micro-batch and that overflows the
old/ref log-prob phases: ``tune`` then lets the search choose one up to the launch's (``search``'s
``log_prob_mbs_max``) instead of keeping it, so that the tuned launch stays as close to the user's as fits.
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_tune.core.rules import check_log_prob_batches
from grpo_tune.core.strategy import Strategy, Workload, divisors
from grpo_tune.costmodel.estimate import Estimate

from grpo_tune.autotune.search.rank import rank_key

NEIGHBOURS = 2
"""Fitting values below the largest that fits also priced: with pp > 1, fewer micro-batches lengthen the
pipeline fill of the forward passes, so the largest is not always the fastest."""


def log_prob_choices(s: Strategy, w: Workload, most: int, gpus: int) -> list[int]:
    """The log-prob micro-batches above ``s.batching.mbs`` and at most ``most`` that verl 0.9.1 accepts for plan ``s``
    (core.rules.check_log_prob_batches: divisors of a DP rank's step batch, with vpp a multiple of pp
    micro-batches), ascending; none for a plan with dynamic batching or a log-prob micro-batch already set."""
    if s.batching.log_prob_mbs is not None or s.batching.max_tokens_per_gpu is not None or w.kind != "grpo":
        return []
    dp = s.layout.dp or gpus // (s.layout.tp * s.layout.pp * s.layout.cp)
    if dp < 1 or (w.prompts * w.n) % dp:
        return []
    per_rank = w.prompts * w.n // dp
    return [
        v
        for v in divisors(per_rank)
        if s.batching.mbs < v <= most
        and not check_log_prob_batches(w, dp=dp, log_prob_mbs=v, pp=s.layout.pp, vpp=s.layout.vpp)
    ]


def with_log_prob_mbs(
    est: Estimate, price: Callable[[Strategy], Estimate], ok: Callable[[Estimate], bool], most: int
) -> Estimate:
    """``est`` (a plan that fits with log_prob_mbs None) or its variant with a log-prob micro-batch of at most
    ``most`` that ranks first (:func:`autotune.search.rank.rank_key`; ``est`` wins ties) among those ``ok`` accepts.

    The log-prob phases' memory grows with the micro-batch (activations and logits are linear in it,
    costmodel/memory.py), so a bisection finds the largest that fits in about log2(choices) estimates; the
    :data:`NEIGHBOURS` fitting values below it are priced too."""
    vals = log_prob_choices(est.strategy, est.workload, most, est.cluster.gpus)
    priced: dict[int, Estimate] = {}

    def variant(i: int) -> Estimate:
        if i not in priced:
            priced[i] = price(est.strategy.replace(log_prob_mbs=vals[i]))
        return priced[i]

    lo, hi = 0, len(vals)  # vals[:lo] fit, vals[hi:] do not
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(variant(mid)):
            lo = mid + 1
        else:
            hi = mid
    tried = [est] + [variant(i) for i in range(lo - 1, max(lo - 1 - NEIGHBOURS, -1), -1)]
    return min((e for e in tried if e is est or ok(e)), key=rank_key)
