"""Read a training run's per-step log into records: verl's file logger, verl's console, or our metrics.jsonl.

Three formats are read (detected from the content, not the file name):

- ``verl-jsonl``: verl's file logger (``trainer.logger=['console','file']``), one JSON object per step,
  ``{"step": N, "data": {key: value, ...}}`` (verl 0.9.1 ``verl/utils/tracking.py`` ``FileLogger.log``;
  orjson writes NaN as ``null``).
- ``verl-console``: verl's console logger, one line per step, ``step:N - key:value - key:value ...``
  (``verl/utils/logger/aggregate_logger.py`` ``concat_dict_to_str``; values are ``pprint.pformat`` of
  numbers, so numpy scalars appear as ``np.float64(1.5)``). Lines may carry a Ray prefix such as
  ``(TaskRunner pid=12) `` and colour codes; every other line is ignored.
- ``grpo-tune``: our trainer's ``metrics.jsonl`` (trainer/loop.py: ``step``, ``step_s``, ``phases_s``,
  ``response_len``, ``response_len_max``, ``tokens``, ...).

verl's timers map to our phases as below (verl 0.9.1 ``ray_trainer.py``: ``marked_timer("gen")`` wraps
``generate_sequences`` *and* ``sleep_replicas``, so vLLM's sleep is inside ``gen``; offload moves happen
inside the phase that needs them, so verl has no separate offload timer).

Other frameworks' logs are read by the framework that writes them (the registry, :func:`grpo_tune.frameworks.read_log`:
NeMo-RL's TensorBoard events and console table), and calibrated with the phase fold it states.

Reads are bounded (regular files only, at most :data:`MAX_LOG_BYTES`). A last line without its newline
(a run killed mid-write) is skipped with a warning. A log in which no step has a timing key is a
coded error.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from grpo_tune.core.target import inputs_of
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.phases import MEASURED_PHASES
from grpo_tune.core.units import GiB
from grpo_tune.frameworks.base.runlog import RunLog, StepRecord

MAX_LOG_BYTES = 256 * 1024 * 1024
"""Largest log read (a 10,000-step verl JSONL with ~300 keys per step is ~50 MB)."""

VERL_PHASES: dict[str, str] = {
    "timing_s/gen": "rollout",  # includes vLLM sleep (verl 0.9.1 ray_trainer.py l.1510-1514)
    "timing_s/update_weights": "weight_sync",
    "timing_s/old_log_prob": "old_logprob",
    "timing_s/ref": "ref_logprob",
    "timing_s/update_actor": "update",
}
"""verl 0.9.1 timer key -> our phase name (costmodel.timing.PHASES)."""

PHASES = tuple(p.value for p in MEASURED_PHASES)  # named once, in core/phases.py

# verl's metric -> StepRecord field (the step time comes from the timers, see _verl_record)
_VERL_KEYS = {
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
# grpo-tune's own metrics.jsonl key -> StepRecord field
_OURS_KEYS = {
    "step_s": "step_s",
    "response_len": "response_len_mean",
    "response_len_max": "response_len_max",
    "tokens": "total_tokens",
    "tokens_per_s_per_gpu": "throughput_tok_s_gpu",
}

_CONSOLE_STEP = re.compile(r"(?:^|[\s)\]])step:(\d+)((?: - .*)?)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_WRAPPED = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$")  # np.float64(1.5), tensor(2.0)


def _resolve(path: Path) -> Path:
    """A run folder stands for its metrics.jsonl."""
    return path / "metrics.jsonl" if path.is_dir() and (path / "metrics.jsonl").is_file() else path


def _read_bounded(path: Path, max_bytes: int) -> tuple[str, bool]:
    """The file's text and whether it ends with a newline; only regular files, at most ``max_bytes``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(
            f"no log file at {path}", hint="pass verl's console log, its file-logger JSONL, or our metrics.jsonl"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"{path}: not a regular file", hint="pass a log file (a folder only if it holds metrics.jsonl)"
        )
    if st.st_size > max_bytes:
        raise ConfigError(
            f"{path}: {st.st_size:,} bytes is larger than the {max_bytes:,}-byte limit for a log",
            hint="cut the log to the steps you want (e.g. `tail -n 500`)",
        )
    with open(path, "rb") as fh:
        raw = fh.read(max_bytes + 1)
    text = raw.decode("utf-8", errors="replace")
    return text, text.endswith("\n")


def _as_float(v: Any) -> float | None:
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


def _num(v: Any) -> float | None:
    """A logged value as a finite float, or None (null, NaN, a string, a list)."""
    f = _as_float(v)
    return f if f is not None and math.isfinite(f) else None


def _non_finite(v: Any) -> bool:
    """A logged number that is NaN or infinite (``nan``, ``inf``, ``np.float64(nan)``): a broken timer, not a
    missing key."""
    f = _as_float(v)
    return f is not None and not math.isfinite(f)


def _bad_timings(fmt: str, obj: dict[str, Any]) -> list[str]:
    """The timing keys of one record whose value is NaN or infinite (verl's timing_s/*, our phases_s)."""
    if fmt == "grpo-tune":
        ph = obj.get("phases_s")
        return [f"phases_s/{k}" for k, v in ph.items() if _non_finite(v)] if isinstance(ph, dict) else []
    return [k for k, v in obj.items() if isinstance(k, str) and k.startswith("timing_s/") and _non_finite(v)]


MAX_TIMING_S = 1e6
"""Largest believable timing in a log (11.6 days for one phase of one step)."""


def _implausible(fmt: str, obj: dict[str, Any]) -> tuple[str, Any] | None:
    """A timing key whose value is no duration: a boolean, a negative number, or one beyond :data:`MAX_TIMING_S`
    (``true``, ``-5.0``, ``1e300``). NaN/inf are warned about separately."""
    if fmt == "grpo-tune":
        ph = obj.get("phases_s")
        items = [(f"phases_s/{k}", v) for k, v in ph.items()] if isinstance(ph, dict) else []
        items += [(k, obj[k]) for k in ("step_s",) if k in obj]
    else:
        items = [(k, v) for k, v in obj.items() if isinstance(k, str) and k.startswith("timing_s/")]
    for k, v in items:
        if isinstance(v, bool):
            return k, v
        f = _as_float(v)
        if f is not None and math.isfinite(f) and not 0 <= f <= MAX_TIMING_S:
            return k, v
    return None


def _refuse_implausible(p: Path, line: int, fmt: str, obj: dict[str, Any]) -> None:
    bad = _implausible(fmt, obj)
    if bad is not None:
        raise ConfigError(
            f"{p}:{line}: {bad[0]} is {json.dumps(bad[1]) if not isinstance(bad[1], str) else bad[1]!r}, which is "
            f"not a duration in seconds (0 to {MAX_TIMING_S:g})",
            hint="the log is damaged or not a training log; fix or drop that line",
        )


def _non_finite_warnings(p: Path, bad: list[tuple[int, list[str], bool]]) -> list[str]:
    """One warning per step with a NaN/inf timing (the first three), and a count past those."""
    out = []
    for step, keys, dropped in bad[:3]:
        what = "the step is skipped" if dropped else "left out of that step"
        out.append(f"{p}: step {step}: {', '.join(keys)} {'is' if len(keys) == 1 else 'are'} NaN or infinite; {what}")
    if len(bad) > 3:
        out.append(f"{p}: {len(bad)} steps in all had a NaN or infinite timing")
    return out


def _fields(obj: dict[str, Any], keys: dict[str, str]) -> dict[str, float | None]:
    """StepRecord field -> the logged number (None where the log lacks it), for ``keys``' log keys."""
    return {ours: _num(obj.get(k)) for k, ours in keys.items()}


def _verl_record(step: int, data: dict[str, Any]) -> StepRecord | None:
    timing = {
        k: f for k, v in data.items() if isinstance(k, str) and k.startswith("timing_s/") and (f := _num(v)) is not None
    }
    phases = {VERL_PHASES[k]: v for k, v in timing.items() if k in VERL_PHASES}
    if not phases:
        return None  # a validation-only step (val-core/*) or a step without timers
    step_s = timing.get("timing_s/step")
    if step_s is None:
        step_s = _num(data.get("perf/time_per_step"))
    return StepRecord(step=step, phases_s=phases, step_s=step_s, **_fields(data, _VERL_KEYS), timing_s=timing)


def _ours_record(obj: dict[str, Any]) -> StepRecord | None:
    ph = obj.get("phases_s")
    if not isinstance(ph, dict):
        return None
    phases = {k: f for k, v in ph.items() if k in PHASES and (f := _num(v)) is not None}
    if not phases:
        return None
    step = obj.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    timing = {f"phases_s/{k}": v for k, v in phases.items()}
    if (off := _num(obj.get("offload_s"))) is not None:
        timing["phases_s/offload"] = off
    return StepRecord(step=step, phases_s=phases, **_fields(obj, _OURS_KEYS), timing_s=timing)


def json_object(text: str) -> dict[str, object] | None:
    """``text`` parsed as a JSON object; None when it is not JSON, or JSON of another kind."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):  # a line of 5,000 brackets is not a log record either
        return None
    return obj if isinstance(obj, dict) else None


def _detect(lines: list[str]) -> str:
    for line in lines[:200]:
        s = line.strip()
        obj = json_object(s) if s.startswith("{") else None
        if obj is None:
            continue
        if isinstance(obj.get("data"), dict) and "step" in obj:
            return "verl-jsonl"
        if "phases_s" in obj:
            return "grpo-tune"
    for line in lines:
        if _CONSOLE_STEP.search(_ANSI.sub("", line)):
            return "verl-console"
    return "unknown"


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


def read_log(path: str | os.PathLike, *, max_bytes: int = MAX_LOG_BYTES) -> RunLog:
    """Parse one log file into per-step records, oldest first (a re-logged step keeps its last record)."""
    from grpo_tune.frameworks import read_log as framework_log

    p = _resolve(Path(path))
    own = framework_log(p, None)  # a framework's log that is not one text file (NeMo-RL's TensorBoard events)
    if own is not None:
        return own
    text, ends_nl = _read_bounded(p, max_bytes)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    warnings: list[str] = []
    if lines and not ends_nl:
        warnings.append(
            f"{p}: the last line ({len(lines[-1])} characters) has no newline (a run killed while writing?); skipped"
        )
        lines.pop()
    fmt = _detect(lines)
    if fmt == "unknown" and (own := framework_log(p, text)) is not None:  # a framework's own text log
        return own
    by_step: dict[int, StepRecord] = {}
    nan_steps: list[tuple[int, list[str], bool]] = []  # (step, keys, whole step dropped): warned, never silent
    if fmt in ("verl-jsonl", "grpo-tune"):
        bad = 0
        for i, line in enumerate(lines, 1):
            s = line.strip()
            if not s:
                continue
            try:
                obj = json.loads(s)
            except ValueError:
                bad += 1
                if bad <= 3:
                    warnings.append(f"{p}:{i}: not a JSON object; skipped")
                continue
            if not isinstance(obj, dict):
                continue
            if fmt == "verl-jsonl":
                step, data = obj.get("step"), obj.get("data")
                if not isinstance(step, int) or isinstance(step, bool) or not isinstance(data, dict):
                    continue
                _refuse_implausible(p, i, fmt, data)
                rec = _verl_record(step, data)
                if keys := _bad_timings(fmt, data):
                    nan_steps.append((step, keys, rec is None))
            else:
                _refuse_implausible(p, i, fmt, obj)
                rec = _ours_record(obj)
                if keys := _bad_timings(fmt, obj):
                    nan_steps.append((obj.get("step", i), keys, rec is None))
            if rec is not None:
                by_step[rec.step] = rec
        if bad > 3:
            warnings.append(f"{p}: {bad} lines in all were not JSON")
    elif fmt == "verl-console":
        for i, line in enumerate(lines, 1):
            got = _parse_console_line(line)
            if got is None:
                continue
            _refuse_implausible(p, i, fmt, got[1])
            rec = _verl_record(*got)
            if keys := _bad_timings(fmt, got[1]):
                nan_steps.append((got[0], keys, rec is None))
            if rec is not None:
                by_step[rec.step] = rec
    else:
        raise ConfigError(
            f"{p}: not a training log grpo-tune reads (no `step:N - key:value` line, no "
            '`{"step": N, "data": {...}}` object, no metrics.jsonl record)',
            hint="pass verl's console output, its file logger's JSONL (trainer.logger=['console','file']), "
            "or the metrics.jsonl of `grpo-tune train`",
        )
    if not by_step and nan_steps:
        raise ConfigError(
            f"{p}: every step with timings has a NaN or infinite one ({len(nan_steps)} step(s), e.g. step "
            f"{nan_steps[0][0]}: {', '.join(nan_steps[0][1])}): nothing to calibrate on",
            hint="pass a log of a run whose timers worked (verl logs timing_s/* as seconds)",
        )
    warnings += _non_finite_warnings(p, nan_steps)
    if not by_step:
        raise ConfigError(
            f"{p}: no step in this {fmt} log has a timing key ("
            + ", ".join(VERL_PHASES if fmt != "grpo-tune" else ("phases_s",))
            + ")",
            hint="verl logs timing_s/* on every training step; was the run stopped before its first step?",
        )
    records = [by_step[k] for k in sorted(by_step)]
    return RunLog(path=str(p), format=fmt, records=records, warnings=warnings)


class LogSummary(TypedDict):
    """A run log summarised (:func:`summary`): the kept steps, medians of the phases, step and lengths, and the
    largest lengths and memory; None where the log has no such key."""

    steps: list[int]
    phases_s: dict[str, float]
    step_s: float | None
    response_len_mean: float | None
    prompt_len_mean: float | None
    total_tokens: float | None
    throughput_tok_s_gpu: float | None
    response_len_max: float | None
    prompt_len_max: float | None
    max_memory_allocated_gib: float | None
    max_memory_reserved_gib: float | None


def summary(log: RunLog, *, skip_warmup: int = 0) -> LogSummary:
    """Medians over the kept steps: phases, step, lengths, peak memory (what calibrate fits to)."""
    import statistics

    recs = log.steps(skip_warmup=skip_warmup) or log.records

    def med(vals: list[float | None]) -> float | None:
        v = [x for x in vals if x is not None]
        return float(statistics.median(v)) if v else None

    phases = {ph: m for ph in PHASES if (m := med([r.phases_s.get(ph) for r in recs])) is not None}

    def top(vals: list[float | None]) -> float | None:
        v = [x for x in vals if x is not None]
        return max(v) if v else None

    return LogSummary(
        steps=[r.step for r in recs],
        phases_s=phases,
        step_s=med([r.step_s for r in recs]),
        response_len_mean=med([r.response_len_mean for r in recs]),
        prompt_len_mean=med([r.prompt_len_mean for r in recs]),
        total_tokens=med([r.total_tokens for r in recs]),
        throughput_tok_s_gpu=med([r.throughput_tok_s_gpu for r in recs]),
        response_len_max=top([r.response_len_max for r in recs]),
        prompt_len_max=top([r.prompt_len_max for r in recs]),
        max_memory_allocated_gib=top([r.max_memory_allocated_gib for r in recs]),
        max_memory_reserved_gib=top([r.max_memory_reserved_gib for r in recs]),
    )


# ---------------------------------------------------------------------------------------------
# Calibrating the time model from logs (grpo-tune calibrate --from-log)
# ---------------------------------------------------------------------------------------------

ANOTHER_MODEL_RATIO = 10.0
"""A log whose training phases take over 10x more or less than the launch's model predicts is taken for a log
of another model (the uncalibrated model is within a few x of real runs; 7B vs 0.5B is ~9-15x)."""
ANOTHER_MODEL_MEMORY_RATIO = 3.0
"""Nor can a log whose peak allocated memory is over 3x above or below the predicted training peak (the memory
model is within 1% of autograd on CPU; allocator and framework extras stay well under 3x)."""


TRAIN_MEMORY_PHASES = ("old_logprob", "ref_logprob", "update")
"""Phases whose memory verl's perf/max_memory_allocated_gb sees (the training engine's, not vLLM's)."""
VLLM_PARTS = ("vllm_resident", "vllm_cuda_graphs")
"""Parts of the training phases' memory that vLLM holds. verl 0.9.1 runs vLLM only as an async server in its own
process (rollout mode "async", workers/rollout/vllm_rollout/vllm_async_server.py), so the trainer's torch
allocator, which perf/max_memory_allocated_gb reads, does not see them."""


def train_peak_bytes(est) -> tuple[str, float] | None:
    """(phase, bytes) of the training engine's own peak, as verl's logged allocator peak measures it."""
    train = {
        k: v.total_bytes - sum(v.parts.get(p, 0.0) for p in VLLM_PARTS)
        for k, v in est.memory.items()
        if k in TRAIN_MEMORY_PHASES
    }
    if not train:
        return None
    phase = max(train, key=lambda k: train[k])
    return phase, train[phase]


@dataclass
class LogPoint:
    """One log matched with the launch that produced it."""

    log: RunLog
    plan: Any
    """frameworks.base.plan.LaunchPlan, with the logged mean lengths in its workload."""
    point: Any
    """autotune.calibrate.fit.Point."""
    summary: LogSummary
    kept_steps: int
    fold: dict[str, str] | None = None
    """How the log's framework folds our phases into its timers (None: verl's, :data:`VERL_FOLD`)."""


VERL_FOLD = {"offload": "update"}
"""Predicted phase -> the measured phase verl times it in (verl has no offload timer)."""


def predict_folded(params: dict[str, float], pt, fold: dict[str, str] | None = None) -> tuple[float, dict[str, float]]:
    """The cost model's step and phases as the log's framework times them (``fold``: predicted phase -> the
    measured phase holding it). verl's (the default) has no offload timer (its offloads run inside
    old_log_prob, update_actor and update_weights), so the predicted offload seconds are added to ``update``."""
    from grpo_tune.autotune.calibrate.fit import predict_estimate

    step, phases = predict_estimate(params, pt)
    for src, dst in (VERL_FOLD if fold is None else fold).items():
        v = phases.pop(src, 0.0)
        if v:
            phases[dst] = phases.get(dst, 0.0) + v
    return step, phases


def log_point(
    log: RunLog,
    launch: str | os.PathLike,
    *,
    model: str | None = None,
    hardware: str | None = None,
    skip_warmup: int = 1,
    label: str = "",
) -> LogPoint:
    """Match a log with its launch: the launch gives the plan, the log the lengths and the measured seconds."""
    from grpo_tune.autotune.calibrate.fit import Point
    from grpo_tune.frameworks import read_plan

    recs = log.records
    if skip_warmup > 0 and len(recs) <= skip_warmup:
        # Keeping them (with a warning) fitted the model to warm-up steps while the summary said they were dropped.
        raise ConfigError(
            f"--warmup {skip_warmup} drops every step of {log.path}: it logged {len(recs)} training step(s)",
            hint=f"give --warmup below {len(recs)} (--warmup 0 keeps every step, warm-up included), or a longer log",
        )
    kept = recs[skip_warmup:]
    sub = RunLog(path=log.path, format=log.format, records=kept)
    s = summary(sub)
    rmean = s.get("response_len_mean")
    pmean = s.get("prompt_len_mean")
    plan = read_plan(Path(launch), model=model, hardware=hardware)
    if plan.placement is not None:
        raise ConfigError(
            f"{launch}: separate rollout and training pools: calibrate --from-log fits colocated runs (the time model "
            "of separate pools is priced, not fitted on logs, yet)",
            hint="pass the launch and log of a colocated run",
        )
    wl = plan.workload
    rmax = s.get("response_len_max")
    if rmax is not None and rmax > wl.response_len * 1.001 + 1:
        raise ConfigError(
            f"{log.path}: responses of up to {rmax:.0f} tokens, but the launch {launch} allows "
            f"{wl.response_len} (data.max_response_length): this log is not a run of that launch",
            hint="pass the launch each log ran (--launch once per --from-log, in the same order)",
        )
    lens = {}
    if rmean:
        lens["response_len_mean"] = max(1, min(wl.response_len, round(rmean)))
    if pmean:
        lens["prompt_len_mean"] = max(1, min(wl.prompt_len, round(pmean)))
    if lens:
        import dataclasses

        plan = dataclasses.replace(plan, workload=wl.replace(**lens))
    phases = dict(s["phases_s"])
    step = s.get("step_s")
    if step is None:
        step = sum(phases.values())
    pt = Point(
        **inputs_of(plan),
        measured_step_s=float(step),
        measured_phases_s=phases,
        label=label or Path(log.path).name,
    )
    from grpo_tune.frameworks import log_fold

    return LogPoint(log=log, plan=plan, point=pt, summary=s, kept_steps=len(kept), fold=log_fold(log.format))


def check_same_model(lp: LogPoint, params: dict[str, float] | None = None) -> None:
    """A log that cannot come from the launch's model (training phases 10x, or peak memory 3x, off the
    prediction) is an error."""
    from grpo_tune.autotune.calibrate.fit import defaults

    mem = memory_check(lp)
    if mem and mem["logged_gib"] > 0 and mem["predicted_gib"] > 0:
        r = mem["logged_gib"] / mem["predicted_gib"]
        what = (
            f"it allocated at most {mem['logged_gib']:.1f} GiB per GPU, {r:.2g}x the {mem['predicted_gib']:.1f} GiB "
            f"that {lp.plan.model.name} with this plan needs for training"
        )
        _not_that_run(lp, r, ANOTHER_MODEL_MEMORY_RATIO, what, "another model or another plan", "--model")
    _, pred = predict_folded(params or defaults(), lp.point, lp.fold)
    meas = lp.point.measured_phases_s
    keys = [k for k in ("old_logprob", "ref_logprob", "update") if meas.get(k) and pred.get(k)]
    if not keys:
        return
    ratio = sum(meas[k] for k in keys) / sum(pred[k] for k in keys)
    what = (
        f"its training phases ({', '.join(keys)}) took {ratio:.3g}x what {lp.plan.model.name} on "
        f"{lp.plan.cluster.gpus} x {lp.plan.hardware.name} predicts"
    )
    _not_that_run(lp, ratio, ANOTHER_MODEL_RATIO, what, "another model or other hardware", "--model/--hardware")


def _not_that_run(lp: LogPoint, ratio: float, limit: float, what: str, other: str, flags: str) -> None:
    """A log ``ratio`` off its launch's prediction, beyond ``limit`` either way, is of another run."""
    if not 1 / limit <= ratio <= limit:
        raise ConfigError(
            f"{lp.log.path}: {what}: this log looks like a run of {other}",
            hint=f"pass the launch (and {flags}) the logged run used",
        )


class MemoryCheck(TypedDict):
    """A log's peak allocated memory against the predicted peak of its plan's training phases."""

    log: str
    logged_gib: float
    predicted_gib: float
    phase: str
    optimistic: bool
    error_pct: float | None


def memory_check(lp: LogPoint) -> MemoryCheck | None:
    """Logged peak allocated memory (training side) against the predicted peak of the training phases."""
    from grpo_tune.costmodel.estimate import estimate

    logged = lp.summary.get("max_memory_allocated_gib")
    if logged is None:
        return None
    p = lp.plan
    est = estimate(model=p.model, hardware=p.hardware, cluster=p.cluster, strategy=p.strategy, workload=p.workload)
    # verl's perf/max_memory_allocated_gb is torch's allocator peak in the trainer process (engine_workers.py
    # l.219); vLLM's weights, KV cache and CUDA graphs are allocated by the rollout server, so compare the
    # training engine's own bytes only.
    peak = train_peak_bytes(est)
    if peak is None:
        return None
    phase, pred_gib = peak[0], peak[1] / GiB
    return {
        "log": lp.log.path,
        "logged_gib": round(logged, 2),
        "predicted_gib": round(pred_gib, 2),
        "phase": phase,
        "optimistic": logged > pred_gib * 1.05,
        "error_pct": round(100.0 * (pred_gib - logged) / logged, 1) if logged else None,
    }


def calibrate_logs(points: list[LogPoint], *, names: list[str] | None = None):
    """Fit the calibration to every log jointly (autotune.calibrate.fit.fit, with offload folded as verl times it)."""
    from grpo_tune.autotune.calibrate.fit import defaults, fit
    from grpo_tune.costmodel.timing import CALIBRATION_BOUNDS

    pts = [lp.point for lp in points]
    folds = {id(lp.point): lp.fold for lp in points}
    if len(pts) == 1:
        # fit() wants two points; one log's phases still pin the per-phase knobs, so count it twice
        pts = pts * 2

    def predict(params: dict[str, float], pt) -> tuple[float, dict[str, float]]:
        return predict_folded(params, pt, folds.get(id(pt)))

    return fit(pts, base=defaults(), predict=predict, names=names, bounds=dict(CALIBRATION_BOUNDS))


def phase_mape(points: list[LogPoint], params: dict[str, float]) -> dict[str, float]:
    """Per-phase mean absolute percentage error of the prediction with ``params`` over the logs."""
    errs: dict[str, list[float]] = {}
    for lp in points:
        step, pred = predict_folded(params, lp.point, lp.fold)
        for k, m in lp.point.measured_phases_s.items():
            if m > 0 and k in pred:
                errs.setdefault(k, []).append(abs(pred[k] - m) / m)
        errs.setdefault("step", []).append(abs(step - lp.point.measured_step_s) / lp.point.measured_step_s)
    return {k: round(100.0 * sum(v) / len(v), 2) for k, v in errs.items()}
