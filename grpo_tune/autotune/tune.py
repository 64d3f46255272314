"""``grpo-tune tune``: price the plan of the user's own launch, config or recipe, search the same workload for
faster plans that its framework runs, and hand back only the keys that change.

The file is read back by its framework (:func:`grpo_tune.frameworks.read_plan`), and edited through the same
contract (:class:`grpo_tune.frameworks.base.Framework`: ``tune_keys`` writes a plan as the file's keys,
``tune_reread`` reads the edited file back, ``tuned_file`` writes it). Each candidate of the search is re-read
from the edited keys and priced again, so the plan tune prints is the plan the edited file runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from grpo_tune.core.errors import ConfigError, GrpoTuneError
from grpo_tune.core.knobs import names
from grpo_tune.core.strategy import Strategy
from grpo_tune.costmodel.estimate import Estimate
from grpo_tune.frameworks import named
from grpo_tune.frameworks.base import Framework
from grpo_tune.frameworks.base.plan import PINNED, SEARCHED, USER_FIELDS, LaunchPlan

__all__ = ["MIN_GAIN", "PINNED", "SEARCHED", "USER_FIELDS", "TuneResult", "tune"]

MIN_GAIN = 0.01
"""A plan must be this much faster (fraction of step time) to be proposed: below it the cost model cannot
tell the plans apart (`grpo-tune validate`: a few %), and proposing it would break the fixed point."""


# ---------------------------------------------------------------------------------------------
# Tuning
# ---------------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


@dataclass
class TuneResult:
    plan: LaunchPlan
    current: Estimate
    """Estimate of the launch as it is."""
    best: Estimate
    """Estimate of the tuned launch (re-read from the edited overrides): ``current`` when nothing changes."""
    changes: dict[str, tuple[object, object]]
    """Framework key -> (old value, new value) for the keys that change."""
    ranked: list[Estimate]
    """The search's plans that fit, re-priced with the launch's own engine knobs, fastest first (at most ``top``)."""
    nearest_fit: list[Estimate]
    """When the launch does not fit: the plans that fit with the fewest changed keys (at most 3)."""
    search_stats: dict[str, object]
    """The search's counters (``SearchResult.stats``; empty when no plan fits)."""
    pins: dict[str, object]
    """The pins the search ran under (the user's, the launch's kept fields, the framework's)."""

    def gain(self) -> float | None:
        from grpo_tune.costmodel.results import step_s

        a, b = step_s(self.current), step_s(self.best)
        return a / b if math.isfinite(a) and b > 0 and math.isfinite(b) else None


def _fits(est) -> bool:
    return not any(v.code == "OOM_RISK" for v in est.violations)


def _tune_pins(
    plan: LaunchPlan, keep: Sequence[str], pins: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check ``keep`` and ``pins``; return (all pins for the search, the user's own pins)."""
    bad = [k for k in keep if k not in SEARCHED]
    if bad:
        raise ConfigError(
            f"--keep {bad[0]}: not a strategy field tune changes", hint=f"choose from {', '.join(SEARCHED)}"
        )
    s0 = plan.strategy
    extra = dict(pins or {})
    bad = [k for k in extra if k not in SEARCHED]
    if bad:
        raise ConfigError(
            f"--{bad[0].replace('_', '-')}: tune keeps that setting as the launch has it",
            hint=f"pin one of {', '.join(SEARCHED)}",
        )
    pins = {k: s0.knob(k) for k in keep} | extra
    # The engine knobs are the user's and tuned.sh keeps them, so the search prices its plans with them too:
    # left free, it would rank plans that only fit with, say, Megatron's CPU optimizer, which tune then drops.
    pins |= {k: s0.knob(k) for k in PINNED if k not in extra}  # log_prob_mbs may be pinned
    if "offload" in pins:
        pins["offload"] = tuple(cast(Sequence[str], pins["offload"]))
    if "etp" in pins and not plan.model.is_moe:
        pins.pop("etp")
    if s0.batching.max_tokens_per_gpu is not None:
        pins["mbs"] = s0.batching.mbs  # with verl's dynamic batching the token caps make the micro-batches, not mbs
    return pins, extra


def _overflowing_log_prob_mbs(plan: LaunchPlan, cur: Any, keep: Sequence[str], extra: dict[str, Any]) -> int | None:
    """The launch's log-prob micro-batch when it is what does not fit (an old/ref log-prob phase over capacity)
    and the user did not pin it (--keep, --log-prob-mbs): the search then chooses one up to it, instead of
    keeping it (autotune/search/log_prob.py). None: tune keeps the launch's, pinned."""
    s0 = plan.strategy
    if (
        s0.batching.log_prob_mbs is None
        or s0.batching.max_tokens_per_gpu is not None
        or "log_prob_mbs" in (*keep, *extra)
    ):
        return None
    over = any(v.code == "OOM_RISK" and v.phase in ("old_logprob", "ref_logprob") for v in cur.violations)
    return s0.batching.log_prob_mbs if over else None


def _tune_search(
    plan: LaunchPlan,
    pins: dict[str, Any],
    top: int,
    calibration: dict[str, float] | None,
    min_headroom: float,
    log_prob_mbs_max: int | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """The search's ranked plans and statistics (none when no plan fits)."""
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.core.errors import NoFeasiblePlanError

    try:
        res = search(
            plan.model,
            plan.hardware,
            plan.cluster,
            plan.workload,
            pins=pins,
            top=max(top, 40),
            calibration=calibration,
            allow_cross_node_tp=True,
            min_headroom=min_headroom,
            log_prob_mbs_max=log_prob_mbs_max,
        )
        ranked = res.ranked
        stats = res.stats()
    except NoFeasiblePlanError:
        ranked, stats = [], {}
    return ranked, stats


def _repriced(
    plan: LaunchPlan,
    fw: Framework,
    ranked: list[Any],
    price: Callable[[Strategy], Any],
    min_headroom: float,
) -> list[tuple[Any, dict[str, Any]]]:
    """The search's plans re-priced with the launch's own engine knobs, those that fit, fastest first."""
    from grpo_tune.autotune.search.rank import rank_key

    s0 = plan.strategy
    # log_prob_mbs and sync_bucket_mb are in the search's plans already: the launch's (pinned) or the user's pin
    user = {k: s0.knob(k) for k in names(tune=("user", "reapply"))}
    candidates = []
    for est in ranked:
        new = fw.tune_keys(plan, est.strategy.replace(**user))
        try:
            s_new = fw.tune_reread(plan, new)
            e = price(s_new)
        except GrpoTuneError:
            continue
        if _fits(e) and _headroom_ok(e, min_headroom):
            candidates.append((e, new))
    candidates.sort(key=lambda t: rank_key(t[0]))
    return candidates


def _choose(
    plan: LaunchPlan,
    cur: Any,
    candidates: list[tuple[Any, dict[str, object]]],
    extra: dict[str, Any],
) -> tuple[Any, dict[str, tuple[Any, Any]]]:
    """The best plan and its changed overrides (the current plan and none when nothing is worth changing)."""
    from grpo_tune.costmodel.results import step_s

    s0 = plan.strategy
    launch = plan.launch
    assert launch is not None
    best, changes = cur, {}
    if candidates:
        e, new = candidates[0]
        better = step_s(e) < step_s(cur) * (1 - MIN_GAIN)
        # a value the user pinned that the launch does not have is a change asked for, faster or not
        asked = any(_pinned_differs(s0, k, v) for k, v in extra.items())
        if better or not _fits(cur) or asked:
            changes = {k: (launch.get(k), v) for k, v in new.items() if not _same(launch.get(k), v)}
            best = e if changes else cur
    return best, changes


def _nearest_fit(plan: LaunchPlan, fw: Framework, candidates: list[tuple[Any, dict[str, object]]]) -> list[Any]:
    """Plans that fit, nearest to the current one: fewest changed overrides, then fastest (at most 3)."""
    from grpo_tune.costmodel.results import step_s

    nearest: list[Any] = []
    cur_ov = fw.tune_keys(plan, plan.strategy)
    scored = [(sum(1 for k, v in new.items() if not _same(cur_ov.get(k), v)), step_s(e), e) for e, new in candidates]
    seen: set[str] = set()
    for _, _, e in sorted(scored, key=lambda t: (t[0], t[1])):
        key = repr(sorted(e.strategy.to_dict().items()))
        if key not in seen and len(nearest) < 3:
            seen.add(key)
            nearest.append(e)
    return nearest


def tune(
    plan: LaunchPlan,
    *,
    keep: Sequence[str] = (),
    calibration: dict[str, float] | None = None,
    min_headroom: float = 0.05,
    top: int = 10,
    pins: dict[str, object] | None = None,
) -> TuneResult:
    """``keep``: fields held at the launch's values; ``pins``: fields set to given values (estimate's flags)."""
    from grpo_tune.costmodel.estimate import estimate

    def price(s: Strategy):
        return estimate(
            model=plan.model,
            hardware=plan.hardware,
            cluster=plan.cluster,
            strategy=s,
            workload=plan.workload,
            calibration=calibration,
        )

    cur = price(plan.strategy)
    pins, extra = _tune_pins(plan, keep, pins)
    fw = named(plan.framework) if plan.launch is not None else None
    if fw is not None:
        pins.update(fw.tune_constraints())
    lp_max = _overflowing_log_prob_mbs(plan, cur, keep, extra)
    if lp_max is not None:
        pins.pop("log_prob_mbs", None)  # the search chooses it, up to the launch's
    ranked, stats = _tune_search(plan, pins, top, calibration, min_headroom, lp_max)
    # The search prices the engine knobs at their defaults; re-price its plans with the user's own
    # (dynamic-batching caps, CPU optimizer, vLLM engine) so that current and best compare like for like.
    if fw is None:
        raise ConfigError(
            "tune needs a verl launch (script or override list), not a run config",
            hint="for a best.yaml, `grpo-tune search` with its model and workload is the same search",
        )
    candidates = _repriced(plan, fw, ranked, price, min_headroom)
    lp = pins.get("log_prob_mbs")
    if candidates and lp is not None and lp_max is None and "log_prob_mbs" not in (*keep, *extra):
        from grpo_tune.autotune.search.rank import rank_key

        if candidates[0][0].strategy.batching.mbs == lp:
            # The launch's log-prob micro-batch (kept: it differs from the launch's mbs) equals the best plan's
            # mbs, so the tuned file reads back as one whose log-prob micro-batch follows mbs: tune those plans
            # too, or tuning the tuned file would find the faster ones among them.
            more, _ = _tune_search(plan, {**pins, "log_prob_mbs": None}, top, calibration, min_headroom, None)
            candidates = sorted(
                [*candidates, *_repriced(plan, fw, more, price, min_headroom)], key=lambda c: rank_key(c[0])
            )
    best, changes = _choose(plan, cur, candidates, extra)
    nearest: list[Any] = []
    if not _fits(cur):
        nearest = _nearest_fit(plan, fw, candidates)
    return TuneResult(
        plan=plan,
        current=cur,
        best=best,
        changes=changes,
        ranked=[e for e, _ in candidates[:top]],
        nearest_fit=nearest,
        search_stats=stats,
        pins=pins,
    )


def _pinned_differs(s: Strategy, key: str, value: Any) -> bool:
    have = s.knob(key)
    if key == "offload":
        return tuple(cast(Sequence[str], have)) != tuple(value)
    return not _same(have, value)


def _headroom_ok(est, min_headroom: float) -> bool:
    cap = est.capacity_bytes
    return est.peak_bytes <= cap - min_headroom * est.hardware.rank_memory_bytes(est.cluster.ranks_per_node)
