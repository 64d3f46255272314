"""Defaults within noise: a knob whose searched value beats the framework's default by less than :data:`NOISE` of
the predicted step is emitted at that default.

The cost model's error is several percent (``grpo-tune validate --grpo``), so a 0.04% win for
``enforce_eager=True`` (verl's default is false) or 0.5% for offloading the optimizer on top of param/grad is
not a finding: it departs from what the framework's users run for nothing the model can show. Each knob of
:data:`KNOBS` the user did not pin is tried at the default the caller gives (the framework's, as the registry
states it: :func:`grpo_tune.frameworks.search_defaults`, verl 0.9.1's read from its config snapshot), in order;
the variant is kept when it still fits with the search's headroom and its step is within :data:`NOISE` of the
searched winner's (every comparison is against that winner, so the kept plan is at most :data:`NOISE` slower in
all). The notes say what was kept, for the search output and report.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.strategy import Strategy
from grpo_tune.costmodel.results import DEFAULTS_NOISE as NOISE
from grpo_tune.costmodel.results import Estimate

if TYPE_CHECKING:
    from grpo_tune.autotune.search.driver import SearchResult

KNOBS = (
    "enforce_eager",
    "offload",
    "cpu_optimizer",
    "recompute",
    "vpp",
    "sequence_parallel",
    "distributed_optimizer",
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunked_prefill",
    "gpu_memory_utilization",
    "sync_bucket_mb",
)
"""Strategy fields with a framework default that the search may move away from it (degrees other than VPP and the
batch size have no default worth keeping: they follow the model and the GPUs)."""


def _seq(v: object) -> tuple[object, ...]:
    """An offload set (a tuple, or a list as read back) as a tuple; anything else is the TypeError ``tuple`` raises."""
    if isinstance(v, Iterable):
        return tuple(v)
    raise TypeError(f"{type(v).__name__!r} object is not iterable")


def _candidates(knob: str, have: object, default: object) -> list[object]:
    """Values to try for ``knob``, the default first; for offload also each of verl's two keys alone
    (param_offload moves params and grads, optimizer_offload the optimizer)."""
    if knob != "offload":
        return [default]
    have = _seq(have)
    out: list[object] = [_seq(default)]
    for drop in (("optimizer",), ("param", "grad")):
        part = tuple(o for o in have if o not in drop)
        if part != have and part not in out:
            out.append(part)
    return out


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return ",".join(o[0] for o in v) if v else "none"
    return "none" if v is None else str(v)


def prefer_defaults(
    best: Estimate,
    price: Callable[[Strategy], Estimate],
    ok: Callable[[Estimate], bool],
    pins: Mapping[str, object],
    *,
    defaults: Mapping[str, object],
    owner: str,
    noise: float = NOISE,
) -> tuple[Estimate, list[str]]:
    """``best`` (an Estimate) with each unpinned knob of :data:`KNOBS` moved to its default (``defaults``:
    Strategy field -> value, as the framework ``owner`` sets it) when that costs less than ``noise`` of its
    predicted step and the plan still passes ``ok``; and one note per knob moved."""
    from grpo_tune.costmodel.results import step_s

    base = step_s(best)
    if not base or base == float("inf"):
        return best, []
    cur, notes = best, []
    for knob in KNOBS:
        if knob in pins or knob not in defaults:
            continue
        have = cur.strategy.knob(knob)
        default = defaults[knob]
        if knob == "offload" and set(_seq(have)) == set(_seq(default or ())):
            continue
        if have == default:
            continue
        for value in _candidates(knob, have, default):
            try:
                est = price(cur.strategy.replace(**{knob: value}))
            except GrpoTuneError:
                continue
            t = step_s(est)
            if ok(est) and t <= base * (1.0 + noise):
                full = knob != "offload" or _seq(value) == _seq(default or ())
                dropped = set(_seq(have)) - set(_seq(value)) if knob == "offload" else set()
                what = (
                    f"{owner}'s default"
                    if full
                    else ("optimizer_offload" if "optimizer" in dropped else "param_offload")
                    + f"=false, {owner}'s default"
                )
                pct = 100.0 * (t - step_s(cur)) / step_s(cur)
                notes.append(
                    f"{knob} {_fmt(value)} ({what}) instead of the searched {_fmt(have)}: "
                    + (
                        f"{pct:.2f}% slower predicted, within the model's noise ({noise:.0%})"
                        if pct > 0
                        else "no slower predicted"
                    )
                )
                cur = est
                break
    return cur, notes


def with_defaults(
    result: SearchResult,
    *,
    pins: Mapping[str, object],
    defaults: Mapping[str, object],
    owner: str,
    calibration: dict[str, float] | None = None,
    min_headroom: float = 0.0,
) -> SearchResult:
    """A search result whose winner keeps the default (``defaults``, the framework ``owner``'s) for every knob
    within :data:`NOISE` (what ``search`` prints and emits): ``ranked[0]`` is that plan and ``defaults_kept`` says
    what moved; unchanged if nothing."""
    import dataclasses

    from grpo_tune.costmodel.estimate import estimate

    best = result.best

    def price(s: Strategy) -> Estimate:
        return estimate(
            model=best.model,
            hardware=best.hardware,
            cluster=best.cluster,
            strategy=s,
            workload=best.workload,
            calibration=calibration,
        )

    if best.workload.kind != "grpo":  # a pretraining step has no rollout: its engine's defaults change nothing
        from grpo_tune.core.knobs import knob

        defaults = {k: v for k, v in defaults.items() if knob(k).concern != "rollout"}
    margin = min_headroom * best.hardware.rank_memory_bytes(best.cluster.ranks_per_node)
    chosen, kept = prefer_defaults(
        best, price, lambda x: x.fits and x.headroom_bytes >= margin, pins, defaults=defaults, owner=owner
    )
    if not kept:
        return result
    ranked = [chosen] + [e for e in result.ranked if e.strategy != chosen.strategy]
    return dataclasses.replace(result, ranked=ranked, defaults_kept=kept)
