"""Streaming within a step: separate pools at staleness 0 that overlap generation and training.

With separate rollout and training pools, an on-policy (staleness 0) step need not run its stages strictly in
sequence: the training pool can take the first finished *units* (mini-batches of whole prompt groups, as verl's
fully-async trainer fetches ``require_batches x ppo_mini_batch_size`` samples at a time) while the rollout pool
generates the rest. Every sample of the step is still produced by the weights of the step's start (the rollout
pool gets new weights only at the sync after the last unit is trained), so the update is exactly the colocated
step's mini-batch sequence: on-policy in the same sense, with no staleness.

The step is a two-stage pipeline over ``units`` items. Unit ``i`` (1-based) is ready at ``a_i`` seconds (its
*arrival*: when its last response ends); the training pool processes units in order, each for ``t`` seconds;
after the last unit the training pool runs what cannot stream (``serial_s``: later PPO epochs, offload, the
step's fixed overhead). So the step ends at ``max_i(a_i + (units - i + 1) x t) + serial_s``.

- With evenly spaced arrivals (``a_i = i x g``) this is the pipeline formula ``g + t + (units - 1) x max(g, t)``:
  one unit of warm-up plus the slower side per unit (RLinf's ``toolkits/auto_placement/placement.py``
  ``DisaggregatedScheduleResult`` with one warm-up group; StreamRL's stream generation).
- The tail: the last unit ends with the batch's longest response, ``tail_s`` after the even spacing would put it.
- Bounds (for non-decreasing arrivals whose last is the generation's end ``G``): the step is never more than the
  sequential ``G + units x t + serial_s`` and never less than the slower pool alone, ``max(G, units x t)``.

:func:`unit_arrivals` turns the rollout's own physics (costmodel.rollout: a steady phase while queued sequences
refill the freed slots, then a drain through the length distribution) into arrival times: during the steady
phase units complete at an even rate; in the drain a prompt group completes when its longest response does, so
the fraction of the in-flight groups done by response position ``j`` is ``(1 - S(j))^n``. A batch whose responses
all have the maximum length and all run at once completes at one instant, and then nothing streams. A native
rollout pool (the CPU trainer's sampler, no continuous batching) streams in waves of its replicas' ``max_num_seqs``
(:func:`native_wave_arrivals`): each wave's units arrive at its end, and the waves may take longer than the batch
in one call.

Pure float math, no torch; nothing here reads a profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from grpo_tune.core.specs import HardwareSpec, ModelSpec
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    from .estimate import Estimate


class StreamShape(TypedDict, total=False):
    """A streamed step's shape, as ``costmodel.pools.compose_step`` takes it (empty: the step does not stream)."""

    arrivals: list[float]
    """Each unit's arrival, seconds from the step's start (non-decreasing, the last at the generation's end)."""
    serial_s: float
    """Training-pool seconds that wait for the last unit (later PPO epochs, offload, the fixed overhead)."""
    bubble_s: float
    """Training-pool seconds the stream adds: the pipeline fill and drain of each unit's own log-prob passes
    (:func:`pass_bubbles_s`; 0 at PP 1)."""


__all__ = [
    "StreamShape",
    "even_arrivals",
    "stage_through",
    "streamed_step",
    "streamed_step_at",
    "units_of",
    "unit_arrivals",
    "train_split",
    "pass_bubbles_s",
    "rollout_arrivals",
    "cheaper_stream",
    "native_waves",
    "native_wave_arrivals",
]


def streamed_step_at(arrivals: Sequence[float], train_unit_s: float, serial_s: float = 0.0) -> float:
    """Seconds of a streamed step: units arriving at ``arrivals`` (seconds from the step's start, non-decreasing),
    each trained for ``train_unit_s`` in order, then ``serial_s`` of work that waits for every unit."""
    n = len(arrivals)
    if n == 0:
        return serial_s
    end = 0.0
    for a in arrivals:  # the training pool takes unit i when it has arrived and unit i-1 is done
        end = max(end, a) + train_unit_s
    return end + serial_s


def stage_through(arrivals: Sequence[float], unit_s: float) -> list[float]:
    """Completion times of units arriving at ``arrivals`` through one more in-order stage of ``unit_s`` each:
    the arrivals of the stage after it (a chain of pools, each taking the previous one's units as they end)."""
    out, end = [], 0.0
    for a in arrivals:
        end = max(end, a) + unit_s
        out.append(end)
    return out


def even_arrivals(gen_unit_s: float, units: int, tail_s: float = 0.0, warmup_s: float | None = None) -> list[float]:
    """Arrivals of ``units`` units generated ``gen_unit_s`` apart, the first at ``warmup_s`` (default one unit),
    the last ``tail_s`` late (the batch's longest response)."""
    first = gen_unit_s if warmup_s is None else warmup_s
    out = [first + i * gen_unit_s for i in range(units)]
    if out:
        out[-1] += tail_s
    return out


def streamed_step(
    gen_unit_s: float, train_unit_s: float, units: int, tail_s: float = 0.0, serial_s: float = 0.0
) -> float:
    """The streamed step of evenly generated units: ``max(g + n t, n g + tail + t) + serial``, which is one unit of
    warm-up plus the slower side per unit, ``g + t + (n - 1) max(g, t)``, when there is no tail."""
    if units < 1:
        raise ValueError(f"units must be >= 1, got {units}")
    return streamed_step_at(even_arrivals(gen_unit_s, units, tail_s), train_unit_s, serial_s)


def units_of(prompts: int, mini_batch: int, require_batches: int = 1) -> int:
    """Units a step streams in: the trainer fetches ``require_batches`` mini-batches of whole prompt groups at a
    time (verl's ``required_samples = ppo_mini_batch_size x require_batches``)."""
    per = max(1, mini_batch * max(1, require_batches))
    return max(1, prompts // per)


def train_split(phases: dict[str, float], step_s: float, ppo_epochs: int) -> tuple[float, float]:
    """(streamable seconds, serial seconds) of a training pool's step: the log-prob passes and the first epoch
    of the update stream with the units; later epochs need every unit, and what is not a pass (offload, the
    step's fixed overhead) runs after the last. ``phases``: the pool's phases (costmodel.timing names)."""
    logprob = phases.get("old_logprob", 0.0) + phases.get("ref_logprob", 0.0)
    upd = phases.get("update", 0.0)
    first = upd / max(1, ppo_epochs)
    streamable = logprob + first
    return streamable, max(0.0, step_s - streamable)


def pass_bubbles_s(pass_s: float, micro_batches: float, pp: int, vpp: int, units: int) -> float:
    """Seconds a streamed step adds to one forward-only pass (the old or the reference log-probs) by running it
    once per unit instead of once over the step's batch.

    A pipeline of ``pp`` stages (``vpp`` model chunks per stage) runs ``m`` micro-batches per DP rank in
    ``(m + (pp - 1) / vpp)`` micro-batch times: one fill and drain per pass (Narayanan et al. 2021 sec. 2.2, as
    costmodel.train_time.pipeline_s prices it). Split into ``units`` passes of ``ceil(m / units)`` micro-batches,
    each pays its own fill and drain: ``units x (ceil(m / units) + (pp - 1) / vpp)`` micro-batch times. The
    micro-batch time is the whole pass's, ``pass_s / (m + (pp - 1) / vpp)`` (``pass_s``: the pass without its
    fixed overhead). The update needs no such term: it already runs one pipeline per mini-batch (an optimizer
    step each), streamed or not. 0 at ``pp = 1`` or one unit."""
    if pp <= 1 or units <= 1 or micro_batches <= 0 or pass_s <= 0:
        return 0.0
    bubble = (pp - 1) / max(1, vpp)
    t_micro = pass_s / (micro_batches + bubble)
    per_unit = math.ceil(micro_batches / units - 1e-9)
    return max(0.0, units * (per_unit + bubble) * t_micro - pass_s)


def unit_arrivals(
    *,
    gen_s: float,
    start_s: float,
    steady_s: float,
    steady_fraction: float,
    survival: Callable[[float], float],
    longest: float,
    n: int,
    units: int,
) -> list[float]:
    """Arrival times of ``units`` equal units of prompt groups from a synchronous rollout.

    ``start_s``: before any response can end (prefill, the engine's fixed overhead); ``steady_s``: the steady
    phase, during which ``steady_fraction`` of the groups complete at an even rate; then the drain, to
    ``gen_s``, through which the rest complete as ``(1 - S(j))^n`` of them by response position ``j`` (``S`` =
    ``survival``, ``j`` running from 0 to ``longest`` over the drain). The last unit arrives at ``gen_s``."""
    if units < 1:
        raise ValueError(f"units must be >= 1, got {units}")
    q = min(max(steady_fraction, 0.0), 1.0)
    drain_s = max(0.0, gen_s - start_s - steady_s)
    out = []
    for i in range(1, units):
        f = i / units
        if q > 0 and f <= q:
            out.append(start_s + steady_s * f / q)
            continue
        want = (f - q) / (1.0 - q) if q < 1 else 1.0
        lo, hi = 0.0, longest
        if (1.0 - survival(hi)) ** n < want:
            out.append(gen_s)  # the groups still running hold the rest until the end
            continue
        for _ in range(40):  # bisection: (1 - S(j))^n is non-decreasing in j
            mid = 0.5 * (lo + hi)
            if (1.0 - survival(mid)) ** n >= want:
                hi = mid
            else:
                lo = mid
        frac = hi / longest if longest > 0 else 1.0
        out.append(start_s + steady_s + drain_s * frac)
    out.append(gen_s)
    return [min(a, gen_s) for a in out]


def native_waves(units: int, unit_rows: int, max_num_seqs: int, replicas: int) -> list[int]:
    """Units per wave of a streaming native rollout pool (trainer/separate.py ``wave_units``): as many whole units
    of ``unit_rows`` sequences as its ``replicas`` hold at once (``max_num_seqs`` each), at least one, the last
    wave what is left. The native sampler has no continuous batching: a wave decodes to the maximum length and
    the next starts after it."""
    per = max(1, min(units, max_num_seqs * max(1, replicas) // max(1, unit_rows)))
    return [min(per, units - lo) for lo in range(0, units, per)]


def native_wave_arrivals(
    m: ModelSpec,
    hw: HardwareSpec,
    cluster: Cluster,
    s: Strategy,
    wl: Workload,
    cal: dict[str, float],
    gen_s: float,
    units: int,
) -> list[float]:
    """Arrivals of a streaming native rollout pool's units: the pool samples the step in waves
    (:func:`native_waves`), each decoding ``response_len`` steps of its own rows (costmodel.rollout
    ``native_rollout_s`` on the wave's prompts), and a wave's units arrive together at its end. One wave (the
    batch fits the replicas' ``max_num_seqs``): every unit at ``gen_s``, the unstreamed call. Otherwise the
    waves run one after the other after the unstreamed generation's fixed part (``gen_s`` less its decode), so
    the last arrival (the streamed generation's end) is later than ``gen_s`` when small waves decode less
    efficiently than the whole batch."""
    import dataclasses

    from .rollout import native_rollout_s, native_strategy

    replicas = cluster.gpus // max(1, s.rollout.rollout_tp)
    waves = native_waves(units, wl.mini_batch * wl.n, s.rollout.max_num_seqs, replicas)
    if len(waves) <= 1:
        return [gen_s] * units
    ns = native_strategy(m, s, cluster)
    whole = native_rollout_s(m, hw, cluster, ns, wl, cal)["decode_s"]
    end, out = gen_s - whole, []
    for size in waves:
        part = dataclasses.replace(wl, prompts=size * wl.mini_batch)
        end += native_rollout_s(m, hw, cluster, ns, part, cal)["decode_s"]
        out += [end] * size
    return out


def sequential_step(gen_s: float, train_s: float) -> float:
    """The unstreamed step of two pools at staleness 0 (before the sync): generation, then training."""
    return gen_s + train_s


def check_bounds(step: float, gen_s: float, train_s: float) -> bool:
    """The streamed step lies between the slower pool alone and the sequential sum (a tolerance of 1e-9 s)."""
    return max(gen_s, train_s) - 1e-9 <= step <= gen_s + train_s + 1e-9 and math.isfinite(step)


def rollout_arrivals(
    m: ModelSpec,
    hw: HardwareSpec,
    cluster: Cluster,
    s: Strategy,
    wl: Workload,
    cal: dict[str, float],
    gen_s: float,
    units: int,
) -> list[float]:
    """:func:`unit_arrivals` of a rollout pool's synchronous batch (costmodel.rollout's phases: prefill, the
    steady phase while queued sequences refill the slots, the drain to the batch's longest response). On a
    profile that samples natively (the CPU trainer's forward-only engine) every response runs to the maximum:
    :func:`native_wave_arrivals`."""
    from .rollout import response_dist, rollout_s

    if units <= 1:
        return [gen_s] * max(1, units)
    if s.rollout.native:
        return native_wave_arrivals(m, hw, cluster, s, wl, cal, gen_s, units)
    rs = rollout_s(m, hw, cluster, s, wl, cal)
    replicas = max(1, cluster.gpus // s.rollout.rollout_tp)
    seqs = wl.prompts * wl.n / replicas
    d = response_dist(wl)
    conc = rs["concurrency"]
    steady = max(0.0, seqs - conc) * d.mean_len / conc * rs["decode_step_s"]
    start = max(0.0, gen_s - rs["decode_s"])
    return unit_arrivals(
        gen_s=gen_s,
        start_s=start,
        steady_s=steady,
        steady_fraction=max(0.0, seqs - conc) / seqs if seqs > 0 else 0.0,
        survival=d.survival,
        longest=rs["longest_response"],
        n=wl.n,
        units=units,
    )


TIE_REL = 1e-9
"""A stream within this fraction of the sequential step ties with it (at PP 1 with every unit arriving at the
generation's end the two are equal but for rounding)."""


def cheaper_stream(price: Callable[[bool], Estimate]) -> Estimate:
    """The cheaper of a separate plan streamed and in sequence, where the user forced neither (``price(stream)``:
    the plan's estimate with ``placement.stream`` set so). Streamed, a staleness-0 step costs at most the
    sequential sum plus the stream's own pipeline bubbles (:func:`pass_bubbles_s`: at PP > 1 each unit's log-prob
    passes fill and drain the pipeline), so at PP > 1 a stream that overlaps little can cost more than the same
    plan in sequence; then the plan runs in sequence and carries the streamed step it declined
    (``streamed_step_s``). Ties (within :data:`TIE_REL`) stream. A plan that does not stream when asked
    (staleness > 0, one unit) is priced once."""
    import dataclasses

    on = price(True)
    f = on.placement
    if not f or not f.get("stream_units") or on.step_s is None or on.step_s <= f["unstreamed_step_s"] * (1 + TIE_REL):
        return on
    off = price(False)
    assert off.placement is not None
    return dataclasses.replace(off, placement={**off.placement, "streamed_step_s": on.step_s})
