"""``grpo-tune calibrate``'s work: fit the time model's calibration knobs to the logs of the user's own runs and
write the calibration file.

:func:`run_calibrate` takes a :class:`CalibrateRequest` and returns a :class:`CalibrateOutcome`;
``cli/calibrate.py`` prints it (the MAPE and knob tables, or JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from grpo_tune.core.errors import ConfigError, close_matches

if TYPE_CHECKING:
    from grpo_tune.autotune.calibrate.fit import CalibrationResult
    from grpo_tune.autotune.calibrate.runlog import LogPoint, MemoryCheck


@dataclass(frozen=True)
class CalibrateRequest:
    """What ``calibrate`` was asked: the logs, the launch each ran, how to read them and what to fit."""

    logs: list[Path]
    launches: list[Path]
    """The launch each log ran: one for all logs, or one per log in order."""
    hardware: str | None = None
    """The GPUs the logs ran on (None: a best.yaml's own, else h100)."""
    model: str | None = None
    """Preset, HF id or config.json folder (None: the launch's model path)."""
    out: Path = Path("calibration.json")
    warmup: int = 1
    """Logged steps dropped at the start of each log."""
    params: str | None = None
    """``--params``: a comma list of the knobs to fit (None: all)."""


@dataclass(frozen=True)
class CalibrateOutcome:
    """The fit and what was written: the knobs before and after, the phase errors, the memory check per log."""

    out: Path
    hardware: str
    model: str
    """The model of the first log's launch (every log ran the same one)."""
    logs: int
    steps_kept: int
    """Logged steps fitted, over all logs, after the warm-up steps."""
    warmup: int
    defaults: dict[str, float]
    fit: CalibrationResult
    phase_mape_before_pct: dict[str, float]
    phase_mape_after_pct: dict[str, float]
    memory: list[MemoryCheck] = field(default_factory=list)
    log_docs: list[dict[str, object]] = field(default_factory=list)
    """What the calibration file records of each log."""

    def to_dict(self) -> dict[str, object]:
        """The outcome as ``--json`` prints it."""
        changed = {k: v for k, v in self.fit.params.items() if abs(v - self.defaults[k]) > 1e-9}
        return {
            "out": str(self.out),
            "hardware": self.hardware,
            "params": self.fit.params,
            "changed": changed,
            "at_bound": self.fit.at_bound,
            "warnings": self.fit.warnings,
            **self._mape(),
            "logs": self.log_docs,
        }

    def _mape(self) -> dict[str, object]:
        return {
            "phase_mape_before_pct": self.phase_mape_before_pct,
            "phase_mape_after_pct": self.phase_mape_after_pct,
            "memory": self.memory,
        }


def run_calibrate(req: CalibrateRequest, *, warn: Callable[[str], None] | None = None) -> CalibrateOutcome:
    """Read every log against its launch, fit the knobs, write ``req.out``; ``warn`` is told each log's warnings
    (a cut last line) as the log is read. Bad flags are coded errors before any log is read, and ``--out`` is
    checked before the fit: never over a log or a launch."""
    from grpo_tune.autotune.calibrate import runlog as R
    from grpo_tune.autotune.calibrate.fit import defaults, save
    from grpo_tune.rundir.outputs import check_output

    logs, launch, warmup, out = req.logs, req.launches, req.warmup, req.out
    if not launch:
        raise ConfigError("--launch is required", hint="the launch (verl script or override list) each log ran")
    if len(launch) not in (1, len(logs)):
        raise ConfigError(f"{len(logs)} log(s) but {len(launch)} --launch: give one launch for all logs or one per log")
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup}")
    launches = list(launch) * len(logs) if len(launch) == 1 else list(launch)
    check_output(out, "--out", inputs={"--from-log": logs, "--launch": launch})
    base = defaults()
    names = _knobs(req.params, base)
    points = _read_points(logs, launches, model=req.model, hardware=req.hardware, warmup=warmup, warn=warn)
    res = R.calibrate_logs(points, names=names)
    before, after = R.phase_mape(points, base), R.phase_mape(points, res.params)
    mem = [m for p in points if (m := R.memory_check(p)) is not None]
    hw_name = points[0].plan.hardware.name
    logs_doc = [_log_doc(p, lp) for p, lp in zip(points, launches)]
    outcome = CalibrateOutcome(
        out=out,
        hardware=hw_name,
        model=points[0].plan.model.name,
        logs=len(points),
        steps_kept=sum(p.kept_steps for p in points),
        warmup=warmup,
        defaults=base,
        fit=res,
        phase_mape_before_pct=before,
        phase_mape_after_pct=after,
        memory=mem,
        log_docs=logs_doc,
    )
    save(
        out,
        params=res.params,
        hardware=hw_name,
        fit={**res.to_dict(), "source": _source(points), "logs": logs_doc, **outcome._mape()},
    )
    return outcome


def _knobs(params: str | None, base: dict[str, float]) -> list[str] | None:
    """--params as knob names (None: all). An empty list (``--params ,``) or an unknown name is an error, not
    a fit of every knob."""
    if params is None:
        return None
    names = [n.strip() for n in params.split(",") if n.strip()]
    known = ", ".join(sorted(base))
    if not names:
        raise ConfigError(f"--params {params!r} names no calibration knob", hint=f"name some of: {known}")
    for n in names:
        if n not in base:
            near = close_matches(n, base)
            maybe = f"did you mean {', '.join(near)}? " if near else ""
            raise ConfigError(f"--params: unknown calibration knob {n!r}", hint=f"{maybe}known knobs: {known}")
    return names


def _read_points(
    logs: list[Path],
    launches: list[Path],
    *,
    model: str | None,
    hardware: str | None,
    warmup: int,
    warn: Callable[[str], None] | None,
) -> list[LogPoint]:
    """One calibration point per log (its plan from its launch); each log's warnings told to ``warn`` as it is
    read."""
    from grpo_tune.autotune.calibrate import runlog as R

    points = []
    for i, (log_path, lp) in enumerate(zip(logs, launches)):
        log = R.read_log(log_path)
        point = R.log_point(
            log, lp, model=model, hardware=hardware, skip_warmup=warmup, label=f"{i + 1}:{Path(log_path).name}"
        )
        R.check_same_model(point)
        for w in log.warnings:
            if warn is not None:
                warn(w)
        points.append(point)
    return points


def _source(points: list[LogPoint]) -> str:
    """What the fit was made on, by the logs' formats in the order given (a NeMo-RL or grpo-tune log is not a
    verl log)."""
    formats = list(dict.fromkeys(str(p.log.format) for p in points))
    return f"{len(points)} run log(s): " + ", ".join(formats)


def _log_doc(p: LogPoint, launch: Path) -> dict[str, object]:
    """What the calibration file records of one log: where it came from and what it measured."""
    return {
        "log": str(p.log.path),
        "format": p.log.format,
        "launch": str(launch),
        "steps_kept": p.kept_steps,
        "model": p.plan.model.name,
        "gpus": p.plan.cluster.gpus,
        "measured_phases_s": p.point.measured_phases_s,
        "measured_step_s": p.point.measured_step_s,
        "response_len_mean": p.plan.workload.response_len_mean,
        "prompt_len_mean": p.plan.workload.prompt_len_mean,
    }
