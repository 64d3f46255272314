"""A training run's per-step log, as every log reader hands it back: :class:`RunLog` of :class:`StepRecord` s.

grpo-tune's own metrics.jsonl is read in :mod:`grpo_tune.autotune.calibrate.runlog`; a framework's logs are read
by its :meth:`~grpo_tune.frameworks.base.Framework.read_log` (verl's in :mod:`grpo_tune.frameworks.verl.logs`,
NeMo-RL's in :mod:`grpo_tune.frameworks.nemo_rl.logs`). Calibrate matches a log with its launch and fits on it.
Below the types: what the readers of text logs share (the lines, logged numbers, the checks on timings, the
coded errors of a log without a usable step).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpo_tune.core.errors import ConfigError


@dataclass(frozen=True)
class StepRecord:
    """One logged training step. Seconds and GiB as logged; ``None`` where the log has no such key."""

    step: int
    phases_s: dict[str, float]
    """Our phase name -> seconds (only the phases the log timed)."""
    step_s: float | None = None
    response_len_mean: float | None = None
    response_len_max: float | None = None
    response_len_min: float | None = None
    prompt_len_mean: float | None = None
    prompt_len_max: float | None = None
    prompt_len_min: float | None = None
    max_memory_allocated_gib: float | None = None
    """verl's ``perf/max_memory_allocated_gb`` (bytes / 1024**3, engine_workers.py l.219): training side only."""
    max_memory_reserved_gib: float | None = None
    total_tokens: float | None = None
    throughput_tok_s_gpu: float | None = None
    timing_s: dict[str, float] = field(default_factory=dict)
    """Every raw ``timing_s/*`` key of the step (verl's names)."""

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class RunLog:
    path: str
    format: str
    """``verl-jsonl``, ``verl-console``, ``grpo-tune``, or a framework's own (``nemo-rl-tensorboard``, ...)."""
    records: list[StepRecord]
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)
    """Run facts the log states itself (our metrics.jsonl: nothing yet; reserved for model/plan ids)."""

    def steps(self, *, skip_warmup: int = 0) -> list[StepRecord]:
        """Records after the first ``skip_warmup`` logged steps (warm-up: CUDA graphs, allocator, compile)."""
        return self.records[skip_warmup:]


# ---------------------------------------------------------------------------------------------
# What every reader of a text log shares: the lines, logged numbers, the checks on timings, the end
# ---------------------------------------------------------------------------------------------

_WRAPPED = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$")  # np.float64(1.5), tensor(2.0)


def log_lines(path: Path, text: str) -> tuple[list[str], list[str]]:
    """The lines of a log's text, and the warning for a last line without its newline (a run killed mid-write),
    which is skipped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    warnings: list[str] = []
    if lines and not text.endswith("\n"):
        warnings.append(
            f"{path}: the last line ({len(lines[-1])} characters) has no newline (a run killed while writing?); skipped"
        )
        lines.pop()
    return lines, warnings


def json_object(text: str) -> dict[str, object] | None:
    """``text`` parsed as a JSON object; None when it is not JSON, or JSON of another kind."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # a line of 5,000 brackets is not a log record either
        return None
    return obj if isinstance(obj, dict) else None


def json_records(path: Path, lines: list[str], warnings: list[str]) -> Iterator[tuple[int, dict[str, object]]]:
    """(line number, object) for each JSON object line of a JSON-lines log; blank lines and JSON of another kind
    are skipped, lines that are not JSON warned about in ``warnings`` (the first three, then a count)."""
    bad = 0
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s:
            continue
        try:
            obj = json.loads(s)
        except (ValueError, RecursionError):  # a line of 5,000 brackets is no record either
            bad += 1
            if bad <= 3:
                warnings.append(f"{path}:{i}: not a JSON object; skipped")
            continue
        if isinstance(obj, dict):
            yield i, obj
    if bad > 3:
        warnings.append(f"{path}: {bad} lines in all were not JSON")


def as_float(v: object) -> float | None:
    """A logged number as a float, NaN and inf included (None: null, a bool, text, a list)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        m = _WRAPPED.match(s)
        if m:
            s = m.group(1).split(",")[0].strip()
        try:
            return float(s)
        except ValueError:
            return None
    return None


def num(v: object) -> float | None:
    """A logged value as a finite float, or None (null, NaN, a string, a list)."""
    f = as_float(v)
    return f if f is not None and math.isfinite(f) else None


def non_finite(v: object) -> bool:
    """A logged number that is NaN or infinite (``nan``, ``inf``, ``np.float64(nan)``): a broken timer, not a
    missing key."""
    f = as_float(v)
    return f is not None and not math.isfinite(f)


def fields(obj: Mapping[str, object], keys: Mapping[str, str]) -> dict[str, float | None]:
    """StepRecord field -> the logged number (None where the log lacks it), for ``keys``' log keys."""
    return {ours: num(obj.get(k)) for k, ours in keys.items()}


MAX_TIMING_S = 1e6
"""Largest believable timing in a log (11.6 days for one phase of one step)."""


def refuse_implausible(path: Path, line: int, timings: Sequence[tuple[str, object]]) -> None:
    """A coded error for the first timing of a record (key, logged value) that is no duration: a boolean, a
    negative number, or one beyond :data:`MAX_TIMING_S` (``true``, ``-5.0``, ``1e300``). NaN/inf are warned about
    separately (:func:`non_finite_warnings`)."""
    for k, v in timings:
        f = as_float(v)
        if isinstance(v, bool) or (f is not None and math.isfinite(f) and not 0 <= f <= MAX_TIMING_S):
            raise ConfigError(
                f"{path}:{line}: {k} is {json.dumps(v) if not isinstance(v, str) else v!r}, which is "
                f"not a duration in seconds (0 to {MAX_TIMING_S:g})",
                hint="the log is damaged or not a training log; fix or drop that line",
            )


def non_finite_warnings(path: Path, bad: list[tuple[object, list[str], bool]]) -> list[str]:
    """One warning per step with a NaN/inf timing (the first three), and a count past those."""
    out = []
    for step, keys, dropped in bad[:3]:
        what = "the step is skipped" if dropped else "left out of that step"
        out.append(
            f"{path}: step {step}: {', '.join(keys)} {'is' if len(keys) == 1 else 'are'} NaN or infinite; {what}"
        )
    if len(bad) > 3:
        out.append(f"{path}: {len(bad)} steps in all had a NaN or infinite timing")
    return out


def finish(
    path: Path,
    fmt: str,
    by_step: Mapping[int, StepRecord],
    nan_steps: list[tuple[object, list[str], bool]],
    warnings: list[str],
    timing_keys: Iterable[str],
) -> RunLog:
    """The log read: its records oldest first (a re-logged step keeps its last record), the warnings about steps
    with NaN/inf timings (``nan_steps``: step, keys, whole step dropped) after ``warnings``; a coded error when no
    step has a usable timing (``timing_keys``: what the format times, for the message)."""
    if not by_step and nan_steps:
        raise ConfigError(
            f"{path}: every step with timings has a NaN or infinite one ({len(nan_steps)} step(s), e.g. step "
            f"{nan_steps[0][0]}: {', '.join(nan_steps[0][1])}): nothing to calibrate on",
            hint="pass a log of a run whose timers worked (verl logs timing_s/* as seconds)",
        )
    warnings = warnings + non_finite_warnings(path, nan_steps)
    if not by_step:
        raise ConfigError(
            f"{path}: no step in this {fmt} log has a timing key (" + ", ".join(timing_keys) + ")",
            hint="verl logs timing_s/* on every training step; was the run stopped before its first step?",
        )
    records = [by_step[k] for k in sorted(by_step)]
    return RunLog(path=str(path), format=fmt, records=records, warnings=warnings)
