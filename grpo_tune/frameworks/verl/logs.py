"""verl's per-step training log, as its two loggers write it, read into records.

Two formats (detected from the content, not the file name):

- ``verl-jsonl``: verl's file logger (``trainer.logger=['console','file']``), one JSON object per step,
  ``{"step": N, "data": {key: value, ...}}`` (verl 0.9.1 ``verl/utils/tracking.py`` ``FileLogger.log``;
  orjson writes NaN as ``null``).
- ``verl-console``: verl's console logger, one line per step, ``step:N - key:value - key:value ...``
  (``verl/utils/logger/aggregate_logger.py`` ``concat_dict_to_str``; values are ``pprint.pformat`` of
  numbers, so numpy scalars appear as ``np.float64(1.5)``). Lines may carry a Ray prefix such as
  ``(TaskRunner pid=12) `` and colour codes; every other line is ignored.

verl's timers map to our phases as :data:`PHASES` says (verl 0.9.1 ``ray_trainer.py``: ``marked_timer("gen")``
wraps ``generate_sequences`` *and* ``sleep_replicas``, so vLLM's sleep is inside ``gen``; offload moves happen
inside the phase that needs them, so verl has no separate offload timer: :data:`FOLD`).

The text comes read bounded (``calibrate --from-log`` reads the file); a last line without its newline is
skipped with a warning, and a log in which no step has a timing key is a coded error. ``--lengths`` reads the
length metrics of the same two formats line by line (:func:`lengths`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from grpo_tune.frameworks.base.runlog import (
    RunLog,
    StepRecord,
    fields,
    finish,
    json_object,
    json_records,
    log_lines,
    non_finite,
    num,
    refuse_implausible,
)

FORMAT_JSONL, FORMAT_CONSOLE = "verl-jsonl", "verl-console"

PHASES: dict[str, str] = {
    "timing_s/gen": "rollout",  # includes vLLM sleep (verl 0.9.1 ray_trainer.py l.1510-1514)
    "timing_s/update_weights": "weight_sync",
    "timing_s/old_log_prob": "old_logprob",
    "timing_s/ref": "ref_logprob",
    "timing_s/update_actor": "update",
}
"""verl 0.9.1 timer key -> our phase name (costmodel.timing.PHASES)."""

FOLD: dict[str, str] = {"offload": "update"}
"""Predicted phase -> the measured phase verl times it in (verl has no offload timer)."""

TIMER = "timing_s/"
STEP_TIMER = "timing_s/step"
STEP_PERF = "perf/time_per_step"

# verl's metric -> StepRecord field (the step time comes from the timers, see _record)
_KEYS = {
    "response_length/mean": "response_len_mean",
    "response_length/max": "response_len_max",
    "response_length/min": "response_len_min",
    "prompt_length/mean": "prompt_len_mean",
    "prompt_length/max": "prompt_len_max",
    "prompt_length/min": "prompt_len_min",
    "perf/max_memory_allocated_gb": "max_memory_allocated_gib",
    "perf/max_memory_reserved_gb": "max_memory_reserved_gib",
    "perf/total_num_tokens": "total_tokens",
    "perf/throughput": "throughput_tok_s_gpu",
}
RESPONSE_MEAN, PROMPT_MEAN = "response_length/mean", "prompt_length/mean"
_LENGTHS = ((RESPONSE_MEAN, "response_len_mean"), (PROMPT_MEAN, "prompt_len_mean"))

_CONSOLE_STEP = re.compile(r"(?:^|[\s)\]])step:(\d+)((?: - .*)?)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def is_record(obj: Mapping[str, object]) -> bool:
    """Whether a JSON object is a step of verl's file logger (``{"step": N, "data": {...}}``)."""
    return isinstance(obj.get("data"), dict) and "step" in obj


def detect(lines: list[str]) -> str | None:
    """The verl log format of these lines: the file logger's when one of the first 200 lines is its record, else
    the console's when a line is a console step; None: neither."""
    for line in lines[:200]:
        s = line.strip()
        obj = json_object(s) if s.startswith("{") else None
        if obj is not None and is_record(obj):
            return FORMAT_JSONL
    for line in lines:
        if _CONSOLE_STEP.search(_ANSI.sub("", line)):
            return FORMAT_CONSOLE
    return None


def _timings(data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in data.items() if isinstance(k, str) and k.startswith(TIMER)]


def _bad_timings(data: Mapping[str, Any]) -> list[str]:
    """The timer keys of one step whose value is NaN or infinite."""
    return [k for k, v in _timings(data) if non_finite(v)]


def _record(step: int, data: Mapping[str, Any]) -> StepRecord | None:
    timing = {k: f for k, v in _timings(data) if (f := num(v)) is not None}
    phases = {PHASES[k]: v for k, v in timing.items() if k in PHASES}
    if not phases:
        return None  # a validation-only step (val-core/*) or a step without timers
    step_s = timing.get(STEP_TIMER)
    if step_s is None:
        step_s = num(data.get(STEP_PERF))
    return StepRecord(step=step, phases_s=phases, step_s=step_s, **fields(data, _KEYS), timing_s=timing)


def _parse_console_line(line: str) -> tuple[int, dict[str, Any]] | None:
    m = _CONSOLE_STEP.search(_ANSI.sub("", line).rstrip())
    if not m:
        return None
    data: dict[str, Any] = {}
    for part in m.group(2).split(" - ")[1:]:
        key, sep, val = part.partition(":")
        if sep:
            data[key.strip()] = val.strip()
    return int(m.group(1)), data


def _steps(path: Path, fmt: str, lines: list[str], warnings: list[str]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(line number, step, metrics) of each logged step, in the order logged."""
    if fmt == FORMAT_CONSOLE:
        for i, line in enumerate(lines, 1):
            if (got := _parse_console_line(line)) is not None:
                yield i, *got
        return
    for i, obj in json_records(path, lines, warnings):
        step, data = obj.get("step"), obj.get("data")
        if isinstance(step, int) and not isinstance(step, bool) and isinstance(data, dict):
            yield i, step, data


def read(path: Path, text: str) -> RunLog | None:
    """verl's log in ``text`` (the file ``path``, read bounded) as per-step records, oldest first (a re-logged step
    keeps its last record); None: neither of verl's formats."""
    lines, warnings = log_lines(path, text)
    fmt = detect(lines)
    if fmt is None:
        return None
    by_step: dict[int, StepRecord] = {}
    nan_steps: list[tuple[object, list[str], bool]] = []  # (step, keys, whole step dropped): warned, never silent
    for i, step, data in _steps(path, fmt, lines, warnings):
        refuse_implausible(path, i, _timings(data))
        rec = _record(step, data)
        if keys := _bad_timings(data):
            nan_steps.append((step, keys, rec is None))
        if rec is not None:
            by_step[rec.step] = rec
    return finish(path, fmt, by_step, nan_steps, warnings, PHASES)


_CONSOLE_NUMBER = re.compile(r"(?:^|\s-\s|\s)([A-Za-z_][\w/.]*):\s*((?:[A-Za-z_][\w.]*\()?-?[0-9.eE+-]+\)?)")
"""``key:value`` in a console line, its value a number: bare, or as pprint writes a numpy scalar (``np.float64(1)``)."""


def lengths(line: str, obj: Mapping[str, object] | None) -> dict[str, float] | None:
    """The mean lengths one line of verl's log states (``response_len_mean``, ``prompt_len_mean`` where logged:
    verl/trainer/ppo/metric_utils.py's ``response_length/mean`` and ``prompt_length/mean``); None where the line
    is no step with a response length. ``obj``: the line parsed as a JSON object (None: not one)."""
    if obj is not None:
        data = obj.get("data")
        got: Mapping[str, object] = data if isinstance(data, dict) else obj
        if RESPONSE_MEAN not in got:
            return None
        vals = {k: float(v) for k, v in got.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    else:
        if RESPONSE_MEAN not in line:
            return None
        vals = {k: f for k, v in _CONSOLE_NUMBER.findall(line) if (f := num(v)) is not None}
        if RESPONSE_MEAN not in vals:
            return None
    return {ours: vals[k] for k, ours in _LENGTHS if k in vals}
