"""Read a training run's per-step log into records: our trainer's metrics.jsonl here, every other log through
the framework that writes it; and calibrate the time model on such logs.

Our trainer's ``metrics.jsonl`` (trainer/loop.py: ``step``, ``step_s``, ``phases_s``, ``response_len``,
``response_len_max``, ``tokens``, ...) is read here. Every other log is read by the framework that writes it,
asked through the registry (:func:`grpo_tune.frameworks.read_log`): verl's file logger and console
(:mod:`grpo_tune.frameworks.verl.logs`), NeMo-RL's TensorBoard events and console table
(:mod:`grpo_tune.frameworks.nemo_rl.logs`); each is calibrated with the phase fold its framework states. A
JSON-lines file is ours when the first of its first 200 lines that is a step record (``phases_s``, or one a
framework claims) is ours.

Reads are bounded (regular files only, at most :data:`MAX_LOG_BYTES`). A last line without its newline
(a run killed mid-write) is skipped with a warning. A log in which no step has a timing key is a
coded error.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from grpo_tune.core.target import inputs_of
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.phases import MEASURED_PHASES
from grpo_tune.core.units import GiB
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

if TYPE_CHECKING:
    from grpo_tune.autotune.calibrate.fit import Point
    from grpo_tune.frameworks.base.plan import LaunchPlan

MAX_LOG_BYTES = 256 * 1024 * 1024
"""Largest log read (a 10,000-step verl JSONL with ~300 keys per step is ~50 MB)."""

PHASES = tuple(p.value for p in MEASURED_PHASES)  # named once, in core/phases.py

FORMAT = "grpo-tune"
"""Our metrics.jsonl's format name (:attr:`RunLog.format`)."""

# grpo-tune's own metrics.jsonl key -> StepRecord field
_OURS_KEYS = {
    "step_s": "step_s",
    "response_len": "response_len_mean",
    "response_len_max": "response_len_max",
    "tokens": "total_tokens",
    "tokens_per_s_per_gpu": "throughput_tok_s_gpu",
}


def _resolve(path: Path) -> Path:
    """A run folder stands for its metrics.jsonl."""
    return path / "metrics.jsonl" if path.is_dir() and (path / "metrics.jsonl").is_file() else path


def _read_bounded(path: Path, max_bytes: int) -> str:
    """The file's text; only regular files, at most ``max_bytes``."""
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
    return raw.decode("utf-8", errors="replace")


def _timings(obj: dict[str, Any]) -> list[tuple[str, Any]]:
    """The timings of one metrics.jsonl record (key, logged value): its phases and its step."""
    ph = obj.get("phases_s")
    items = [(f"phases_s/{k}", v) for k, v in ph.items()] if isinstance(ph, dict) else []
    return items + [(k, obj[k]) for k in ("step_s",) if k in obj]


def _bad_timings(obj: dict[str, Any]) -> list[str]:
    """The phases of one record whose value is NaN or infinite."""
    ph = obj.get("phases_s")
    return [f"phases_s/{k}" for k, v in ph.items() if non_finite(v)] if isinstance(ph, dict) else []


def _ours_record(obj: dict[str, Any]) -> StepRecord | None:
    ph = obj.get("phases_s")
    if not isinstance(ph, dict):
        return None
    phases = {k: f for k, v in ph.items() if k in PHASES and (f := num(v)) is not None}
    if not phases:
        return None
    step = obj.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    timing = {f"phases_s/{k}": v for k, v in phases.items()}
    if (off := num(obj.get("offload_s"))) is not None:
        timing["phases_s/offload"] = off
    return StepRecord(step=step, phases_s=phases, **fields(obj, _OURS_KEYS), timing_s=timing)


def _is_ours(lines: list[str]) -> bool:
    """Whether the first step record among the first 200 lines is one of our metrics.jsonl (``phases_s``) rather
    than one a framework claims."""
    from grpo_tune.frameworks import claims_log_record

    for line in lines[:200]:
        s = line.strip()
        obj = json_object(s) if s.startswith("{") else None
        if obj is None:
            continue
        if claims_log_record(obj):
            return False
        if "phases_s" in obj:
            return True
    return False


def _read_ours(p: Path, lines: list[str], warnings: list[str]) -> RunLog:
    by_step: dict[int, StepRecord] = {}
    nan_steps: list[tuple[object, list[str], bool]] = []  # (step, keys, whole step dropped): warned, never silent
    for i, obj in json_records(p, lines, warnings):
        refuse_implausible(p, i, _timings(obj))
        rec = _ours_record(obj)
        if keys := _bad_timings(obj):
            nan_steps.append((obj.get("step", i), keys, rec is None))
        if rec is not None:
            by_step[rec.step] = rec
    return finish(p, FORMAT, by_step, nan_steps, warnings, ("phases_s",))


def read_log(path: str | os.PathLike, *, max_bytes: int = MAX_LOG_BYTES) -> RunLog:
    """Parse one log file into per-step records, oldest first (a re-logged step keeps its last record): ours here,
    any other as the framework that writes it reads it."""
    from grpo_tune.frameworks import read_log as framework_log

    p = _resolve(Path(path))
    own = framework_log(p, None)  # a framework's log that is not one text file (NeMo-RL's TensorBoard events)
    if own is not None:
        return own
    text = _read_bounded(p, max_bytes)
    lines, warnings = log_lines(p, text)
    if _is_ours(lines):
        return _read_ours(p, lines, warnings)
    if (own := framework_log(p, text)) is not None:  # a framework's text log (verl's loggers, NeMo-RL's console)
        return own
    raise ConfigError(
        f"{p}: not a training log grpo-tune reads (no `step:N - key:value` line, no "
        '`{"step": N, "data": {...}}` object, no metrics.jsonl record)',
        hint="pass verl's console output, its file logger's JSONL (trainer.logger=['console','file']), "
        "or the metrics.jsonl of `grpo-tune train`",
    )


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
    plan: LaunchPlan
    """The launch read back, with the logged mean lengths in its workload."""
    point: Point
    summary: LogSummary
    kept_steps: int
    fold: dict[str, str] | None = None
    """How the log's framework folds our phases into its timers (None: no framework states one, :data:`FOLD`)."""


FOLD = {"offload": "update"}
"""Predicted phase -> the measured phase holding it, for a log no framework states a fold for (our metrics.jsonl):
offload in update, as verl times it. Our trainer times offload apart (``offload_s``, in the step time only), so for
a run that offloads this compares update with the predicted offload added; kept as calibrate has compared it."""


def predict_folded(params: dict[str, float], pt, fold: dict[str, str] | None = None) -> tuple[float, dict[str, float]]:
    """The cost model's step and phases as the log's framework times them (``fold``: predicted phase -> the
    measured phase holding it; None: :data:`FOLD`, offload added to ``update``, as verl times it too: its offloads
    run inside old_log_prob, update_actor and update_weights)."""
    from grpo_tune.autotune.calibrate.fit import predict_estimate

    step, phases = predict_estimate(params, pt)
    for src, dst in (FOLD if fold is None else fold).items():
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
    from grpo_tune.frameworks.base.plan import ReadRequest

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
    plan = read_plan(ReadRequest(Path(launch), model=model, hardware=hardware))
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
