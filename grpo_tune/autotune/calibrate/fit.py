"""Fit the time model's efficiency parameters to measured trials; save and load calibration files.

The time model (:mod:`costmodel.timing`) exposes its tunable efficiencies as
``CALIBRATION_DEFAULTS`` (name -> value) and accepts ``calibration=`` overrides. Given measured
trials, :func:`fit` solves

    min_x  sum_i (log pred_i(p) - log meas_i)^2 + w_ph * sum_{i,phase} (...)^2 + lam * |x|^2,
    p_j = p0_j * exp(x_j)

with ``scipy.optimize.least_squares``. Log residuals make the error relative (a 10 ms and a 10 s
step weigh the same); the parameterisation keeps every parameter positive; the small ridge term
keeps parameters that the measurements cannot see at their defaults instead of drifting.

A calibration file is JSON ``{"version": 1, "hardware": name, "params": {...}, "fit": {...}}``;
``grpo-tune search --calibration FILE`` reads it with :func:`load`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TypedDict

from grpo_tune.core.target import inputs_of
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.autotune.calibrate.stats import mape, spearman

VERSION = 1
PHASE_WEIGHT = 0.5
"""Weight of each per-phase log residual relative to the step's (phases add information, the step is the objective)."""
RIDGE = 0.03
BOUND = math.log(100.0)
"""Each parameter may move by at most 100x either way from its default."""


@dataclass(frozen=True)
class Point:
    """One measured plan: what ran, and what it measured."""

    model: ModelSpec
    hardware: HardwareSpec
    cluster: Cluster
    strategy: Strategy
    workload: Workload
    measured_step_s: float
    measured_phases_s: dict[str, float] = field(default_factory=dict)
    label: str = ""


Predict = Callable[[dict[str, float], Point], "tuple[float, dict[str, float]]"]


def defaults() -> dict[str, float]:
    """The time model's calibration parameters and their defaults."""
    from grpo_tune.costmodel import timing

    d = getattr(timing, "CALIBRATION_DEFAULTS", None)
    if not d:
        raise ConfigError(
            "the time model exposes no calibration parameters (costmodel.timing.CALIBRATION_DEFAULTS)",
            hint="this grpo-tune's time model cannot be calibrated yet",
        )
    return {k: float(v) for k, v in d.items()}


def _bounds() -> dict[str, tuple[float, float]]:
    from grpo_tune.costmodel import timing

    return dict(getattr(timing, "CALIBRATION_BOUNDS", {}) or {})


def predict_estimate(params: dict[str, float], pt: Point) -> tuple[float, dict[str, float]]:
    """Predicted step and phase seconds from :func:`costmodel.estimate.estimate` with ``params``."""
    from grpo_tune.costmodel.estimate import estimate

    e = estimate(**inputs_of(pt), calibration=params)
    if e.time is None:
        raise ConfigError(
            "the time model returned no time for a measured plan", hint="calibration needs the time model"
        )
    return float(e.time.step_s), {k: float(v) for k, v in e.time.phases.items()}


class Score(TypedDict):
    """How well a set of parameters predicts the measured step times."""

    mape_pct: float
    spearman: float | None
    """None below 3 points or for constant input (stats.spearman)."""
    n: int


class FitPoint(TypedDict):
    """One measured plan, predicted with the base and the fitted parameters (step seconds)."""

    label: str
    measured_step_s: float
    predicted_before_s: float
    predicted_after_s: float


@dataclass
class CalibrationResult:
    params: dict[str, float]
    """Fitted values of every calibration parameter (unchanged ones at their default)."""
    base: dict[str, float]
    before: Score
    """``{"mape_pct", "spearman", "n"}`` of step time with the base parameters."""
    after: Score
    points: list[FitPoint]
    """Per measured plan: label, measured, predicted before and after (step seconds)."""
    cost: float = 0.0
    """Half the sum of squared residuals (step, phases, ridge) at the fitted parameters."""
    cost_before: float = 0.0
    """The same at the base parameters; least squares guarantees ``cost <= cost_before``."""
    success: bool = True
    message: str = ""
    observations: int = 0
    """Measurements the fit saw: each plan's step plus each of its measured phases."""
    at_bound: list[str] = field(default_factory=list)
    """Knobs that ended on a bound of their range: the data pushed them as far as allowed, so the
    fitted value is a limit, not an estimate (the model is missing something, or a measurement is off)."""
    warnings: list[str] = field(default_factory=list)
    """One sentence per knob at a bound, for the console and the JSON."""

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def save(self, path: str | os.PathLike, *, hardware: str) -> Path:
        return save(path, params=self.params, hardware=hardware, fit=self.to_dict())


def _score(pred: list[float], meas: list[float]) -> Score:
    return {"mape_pct": round(mape(pred, meas), 3), "spearman": spearman(pred, meas), "n": len(meas)}


def _fit_base(
    predict: Predict, base: dict[str, float] | None, bounds: dict[str, tuple[float, float]] | None
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """The starting parameters and their bounds (the cost model's own, or the caller's for a custom predict)."""
    if predict is predict_estimate:
        p0 = {**defaults(), **(base or {})}
        bounds = {**_bounds(), **(bounds or {})}
    else:
        if not base:
            raise ConfigError("fit() with a custom predict needs base parameters")
        p0 = dict(base)
        bounds = dict(bounds or {})
    return p0, bounds


def _fit_bounds(
    names: list[str],
    additive: list[bool],
    bounds: dict[str, tuple[float, float]],
    p0: dict[str, float],
    s_ref: float,
) -> tuple[list[float], list[float]]:
    """Lower and upper bounds of the fit variables (log-ratios, or multiples of ``s_ref`` for additive knobs)."""
    lo: list[float] = []
    hi: list[float] = []
    for n, add in zip(names, additive):
        b = bounds.get(n)
        if add:
            lo.append(0.0 if b is None or b[0] is None else b[0] / s_ref)
            hi.append(10.0 if b is None or b[1] is None else b[1] / s_ref)
            continue
        lo.append(-BOUND if b is None or b[0] is None else max(-BOUND, math.log(max(b[0], 1e-30) / p0[n])))
        hi.append(BOUND if b is None or b[1] is None else min(BOUND, math.log(b[1] / p0[n])))
    return lo, hi


def fit(
    points: Sequence[Point],
    *,
    base: dict[str, float] | None = None,
    predict: Predict | None = None,
    names: Sequence[str] | None = None,
    ridge: float = RIDGE,
    phase_weight: float = PHASE_WEIGHT,
    bounds: dict[str, tuple[float, float]] | None = None,
) -> CalibrationResult:
    """Fit the parameters ``names`` (default: all of ``base``) to the measured ``points``.

    ``base`` defaults to the time model's ``CALIBRATION_DEFAULTS`` (overridden by any given
    values); ``predict`` defaults to the real cost model.
    """
    import numpy as np
    from scipy.optimize import least_squares

    predict = predict or predict_estimate
    p0, bounds = _fit_base(predict, base, bounds)
    points = [p for p in points if p.measured_step_s and p.measured_step_s > 0]
    if len(points) < 2:
        raise ConfigError(f"calibration needs at least 2 measured trials, got {len(points)}")
    names = sorted(p0) if names is None else list(names)
    if not names:  # an empty selection is a mistake, not "all"
        raise ConfigError("no calibration parameter to fit", hint=f"known: {', '.join(sorted(p0))}")
    unknown = [n for n in names if n not in p0]
    if unknown:
        raise ConfigError(f"unknown calibration parameter {unknown[0]!r}", hint=f"known: {', '.join(sorted(p0))}")

    # Positive knobs move multiplicatively (p0 * e^x); knobs that default to 0 (per-phase overheads,
    # seconds) move additively in units of the median measured step (x * s_ref, x >= 0).
    s_ref = float(np.median([pt.measured_step_s for pt in points]))
    additive = [p0[n] == 0.0 for n in names]

    def params_of(x) -> dict[str, float]:
        p = dict(p0)
        for n, xi, add in zip(names, x, additive):
            p[n] = float(xi) * s_ref if add else p0[n] * math.exp(float(xi))
        return p

    def residuals(x):
        p = params_of(x)
        r = []
        for pt in points:
            step, phases = predict(p, pt)
            r.append(math.log(max(step, 1e-12)) - math.log(pt.measured_step_s))
            for ph, m in sorted(pt.measured_phases_s.items()):
                if m and m > 0 and phases.get(ph, 0) > 0:
                    r.append(phase_weight * (math.log(phases[ph]) - math.log(m)))
        r.extend(ridge * float(xi) for xi in x)
        return np.asarray(r)

    lo, hi = _fit_bounds(names, additive, bounds, p0, s_ref)
    lo_a, hi_a = np.asarray(lo), np.asarray(hi)
    x0 = np.clip(np.zeros(len(names)), lo_a, hi_a)
    x0 = np.where(x0 <= lo_a, lo_a + 1e-6 * (hi_a - lo_a), x0)  # trf wants a strictly feasible start
    observations = len(residuals(x0)) - len(names)  # the ridge rows are not data
    if len(names) > observations:
        raise ConfigError(
            f"cannot fit {len(names)} calibration knobs to {observations} measurements "
            f"({len(points)} plans, their steps and measured phases): more knobs than data points",
            hint="measure more plans (more --trials), or name fewer knobs to fit",
        )
    sol = least_squares(
        residuals, x0, bounds=(lo_a, hi_a), method="trf", diff_step=1e-4, x_scale=1.0, max_nfev=200 * (len(names) + 1)
    )
    fitted = params_of(sol.x)
    at_bound = _at_bound(names, additive, sol.x, lo, hi)
    meas = [pt.measured_step_s for pt in points]
    before = [predict(p0, pt)[0] for pt in points]
    after = [predict(fitted, pt)[0] for pt in points]
    return CalibrationResult(
        params={k: float(v) for k, v in fitted.items()},
        base=p0,
        before=_score(before, meas),
        after=_score(after, meas),
        points=[
            {"label": pt.label, "measured_step_s": m, "predicted_before_s": b, "predicted_after_s": a}
            for pt, m, b, a in zip(points, meas, before, after)
        ],
        cost=float(sol.cost),
        cost_before=float(0.5 * np.sum(residuals(x0) ** 2)),
        success=bool(sol.success),
        message=str(sol.message),
        observations=observations,
        at_bound=[n for n, _ in at_bound],
        warnings=[
            f"{n} sits at its {side} bound ({fitted[n]:.4g}): the measurements push it as far as its range "
            "allows, so it is a limit, not an estimate; the model misses something these plans measure"
            for n, side in at_bound
        ],
    )


def _at_bound(names, additive, x, lo: list[float], hi: list[float]) -> list[tuple[str, str]]:
    """(knob, "lower"/"upper") for each knob the fit left on an edge of its range. An overhead at 0 is
    its default (not needed), not a bound the data pushed against."""
    out = []
    for n, add, xi, a, b in zip(names, additive, x, lo, hi):
        tol = 1e-3 * (b - a)
        if xi >= b - tol:
            out.append((n, "upper"))
        elif xi <= a + tol and not add:
            out.append((n, "lower"))
    return out


def fit_records(
    records,
    *,
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    workload: Workload,
    base: dict[str, float] | None = None,
    **kw,
) -> CalibrationResult:
    """Fit to completed :class:`autotune.refine.TrialRecord` s of one study."""
    pts = []
    for r in records:
        if not (r.strategy and r.measured_step_s):
            continue
        pts.append(
            Point(
                model=model,
                hardware=hardware,
                cluster=cluster,
                workload=workload,
                strategy=Strategy.from_dict(r.strategy),
                measured_step_s=float(r.measured_step_s),
                measured_phases_s=dict(r.measured_phases_s or {}),
                label=f"#{r.number}",
            )
        )
    return fit(pts, base=base, **kw)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def save(
    path: str | os.PathLike, *, params: dict[str, float], hardware: str, fit: dict[str, object] | None = None
) -> Path:
    from grpo_tune.core.config import atomic_write

    doc = {
        "version": VERSION,
        "hardware": hardware,
        "params": {k: float(v) for k, v in params.items()},
        "fit": fit or {},
    }
    return atomic_write(path, json.dumps(doc, indent=2, default=str) + "\n")


def load_if_given(path: str | os.PathLike | None, *, hardware: str | None = None) -> dict[str, float] | None:
    """``--calibration``: :func:`load` when a file is given, else None (the model's own parameters)."""
    return None if path is None else load(path, hardware=hardware)


def load(path: str | os.PathLike, *, hardware: str | None = None) -> dict[str, float]:
    """Read a calibration file; returns the ``params`` for ``estimate(..., calibration=...)``.

    Every failure is a coded error: a missing or malformed file, another version, a parameter the
    time model does not have, or (when ``hardware`` is given) a file made on other hardware.
    """
    from grpo_tune.core.specfiles import (
        read_spec_bytes,
    )  # a regular file under a size cap: /dev/zero or a FIFO hung here

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no calibration file at {p}", hint="run `grpo-tune search ... --refine` to make one")
    try:
        doc = json.loads(read_spec_bytes(p, "calibration JSON").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        why = "nests too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(f"{p}: not a readable calibration file ({why})") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ConfigError(
            f"{p}: calibration version {doc.get('version') if isinstance(doc, dict) else None!r} "
            f"is not supported (this grpo-tune reads {VERSION})"
        )
    params = doc.get("params")
    if not isinstance(params, dict):
        raise ConfigError(f"{p}: 'params' must be a mapping")
    try:
        known = defaults()
    except ConfigError:
        known = None
    out = {}
    for k, v in params.items():
        if known is not None and k not in known:
            from grpo_tune.core.errors import UnknownKeyError, close_matches

            near = close_matches(k, known)
            raise UnknownKeyError(
                f"{p}: unknown calibration parameter {k!r}",
                hint=f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(known))}",
            )
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"{p}: calibration parameter {k} must be a positive number, got {v!r}")
        out[k] = float(v)
    if hardware is not None and doc.get("hardware") not in (None, hardware):
        raise ConfigError(
            f"{p} was fitted on hardware {doc.get('hardware')!r}, not {hardware!r}",
            hint="calibrate on the hardware you search for, or drop --calibration",
        )
    return out
