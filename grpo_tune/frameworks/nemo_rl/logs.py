"""NeMo-RL's step timing as it writes it: its TensorBoard event files and its console timing table.

NeMo-RL 0.7.0's synchronous ``grpo_train`` (``nemo_rl/algorithms/grpo.py``) times each step with its Timer
and, at the step's end, logs ``timer.get_timing_metrics(reduction_op="sum")`` under the prefix
``timing/train`` (``TensorboardLogger.log_metrics``: ``writer.add_scalar(f"{prefix}/{name}", value, step)``,
torch's ``SummaryWriter`` under ``<log_dir>/tensorboard``), and prints the same numbers as a table::

    ⏱️  Timing:
      • Total step time: 112.34s
      • generation: 58.00s (51.6%)
      ...

Its timers map to our phases as :data:`PHASES` says. Two of them span two of our phases, and the
calibration folds the prediction the same way (:data:`FOLD`): ``policy_and_reference_logprobs`` runs the old
and the reference log-probs back to back, and ``prepare_for_generation/total`` holds the refit and, when
colocated, the policy's offload around it (``offload_before_refit`` / ``offload_after_refit``).

The event files are read with TensorBoard's own ``EventAccumulator`` (the ``tensorboard`` package, a
maintained reader; ``pip install tensorboard``); reads are bounded (:data:`MAX_EVENT_BYTES` in all).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from grpo_tune.core.errors import ConfigError, MissingDependencyError
from grpo_tune.frameworks.base.runlog import RunLog, StepRecord

PREFIX = "timing/train/"
PHASES: dict[str, str] = {
    "generation": "rollout",
    "prepare_for_generation/total": "weight_sync",
    "policy_and_reference_logprobs": "old_logprob",
    "policy_training": "update",
}
"""NeMo-RL 0.7.0 timer label -> our phase (the measured key; see :data:`FOLD` for what it contains)."""
STEP = "total_step_time"
FOLD: dict[str, str] = {"ref_logprob": "old_logprob", "offload": "weight_sync"}
"""Predicted phase -> the measured phase NeMo-RL times it in."""
LENGTHS: dict[str, str] = {
    "train/mean_gen_tokens_per_sample": "response_len_mean",
    "train/max_gen_tokens_per_sample": "response_len_max",
    "train/mean_prompt_length": "prompt_len_mean",
}
MAX_EVENT_BYTES = 256 * 1024 * 1024
MAX_EVENT_FILES = 64
FORMAT_TB, FORMAT_CONSOLE = "nemo-rl-tensorboard", "nemo-rl-console"


def event_files(path: Path) -> list[Path]:
    """The TensorBoard event files a path stands for: the file itself, or those under the folder (NeMo-RL's
    ``<log_dir>/tensorboard/``, or any folder below), at most :data:`MAX_EVENT_FILES`."""
    if path.is_file():
        return [path] if path.name.startswith("events.out.tfevents") else []
    if not path.is_dir():
        return []
    found: list[Path] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.startswith("events.out.tfevents"):
                found.append(Path(root) / f)
                if len(found) > MAX_EVENT_FILES:
                    raise ConfigError(
                        f"{path}: more than {MAX_EVENT_FILES} TensorBoard event files",
                        hint="pass the tensorboard folder of one run",
                    )
    return found


def is_tensorboard(path: str | os.PathLike) -> bool:
    return bool(event_files(Path(path)))


def read_tensorboard(path: str | os.PathLike) -> RunLog:
    """A NeMo-RL TensorBoard log (event file or folder) -> :class:`grpo_tune.frameworks.base.runlog.RunLog`."""
    p = Path(path)
    files = event_files(p)
    total = sum(f.stat().st_size for f in files)
    if total > MAX_EVENT_BYTES:
        raise ConfigError(
            f"{p}: {total:,} bytes of event files is more than the {MAX_EVENT_BYTES:,}-byte limit",
            hint="pass one run's tensorboard folder",
        )
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
    except ImportError:
        raise MissingDependencyError(
            "reading TensorBoard event files needs the tensorboard package", hint="pip install tensorboard"
        ) from None
    series: dict[str, dict[int, float]] = {}
    for f in files:
        acc = ea.EventAccumulator(str(f), size_guidance={ea.SCALARS: 0})
        try:
            acc.Reload()
        except Exception as exc:  # noqa: BLE001 - a corrupt event file from TensorBoard's reader
            raise ConfigError(f"{f}: TensorBoard cannot read this event file ({exc})") from None
        for tag in acc.Tags().get("scalars", []):
            if tag.startswith(PREFIX) or tag in LENGTHS:
                for ev in acc.Scalars(tag):
                    series.setdefault(tag, {})[int(ev.step)] = float(ev.value)  # a re-logged step keeps the last
    steps = sorted({s for tag, v in series.items() if tag.startswith(PREFIX) for s in v})
    records, warnings = _records(steps, lambda tag, s: series.get(tag, {}).get(s), str(p))
    return RunLog(path=str(p), format=FORMAT_TB, records=records, warnings=warnings)


def _records(steps: list[int], value, where: str):
    import math

    out, warnings = [], []
    for s in steps:
        timing = {k[len(PREFIX) :]: v for k in _timing_tags() if (v := value(k, s)) is not None}
        bad = [k for k, v in timing.items() if not math.isfinite(v)]
        if bad:
            warnings.append(f"{where}: step {s}: {', '.join(bad)} not finite; step skipped")
            continue
        phases = {ph: timing[label] for label, ph in PHASES.items() if label in timing}
        if not phases:
            continue
        lens = {f: value(tag, s) for tag, f in LENGTHS.items()}
        out.append(StepRecord(step=s, phases_s=phases, step_s=timing.get(STEP), timing_s=timing, **lens))
    if not out:
        raise ConfigError(
            f"{where}: no step of this NeMo-RL log has a timing/train/* phase ({', '.join(PHASES)})",
            hint="NeMo-RL logs timing/train/* at the end of every training step (logger.tensorboard_enabled=true)",
        )
    return out, warnings


def _timing_tags() -> list[str]:
    return [PREFIX + k for k in (*PHASES, STEP)]


_STEP_HEAD = re.compile(r"=+ Step (\d+)/\d+ =+")
_TOTAL = re.compile(r"•\s*Total step time:\s*([0-9.eE+-]+|nan|inf)s")
_ROW = re.compile(r"•\s*([A-Za-z_][\w/]*):\s*([0-9.eE+-]+|nan|inf)s\s*\(")
_GEN_LEN = re.compile(r"•\s*Mean Generation Length:\s*([0-9.eE+-]+)")


def looks_like_console(text: str) -> bool:
    return "Timing:" in text and bool(_TOTAL.search(text))


def read_console(text: str, path: str) -> RunLog:
    """NeMo-RL's console output (``Step N/M`` headers, the ``⏱️  Timing:`` table) -> RunLog."""
    step: int | None = None
    by_step: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        if m := _STEP_HEAD.search(line):
            step = int(m.group(1))
            continue
        if step is None:
            continue
        d = by_step.setdefault(step, {})
        if m := _TOTAL.search(line):
            d[PREFIX + STEP] = float(m.group(1))
        elif m := _ROW.search(line):
            d[PREFIX + m.group(1)] = float(m.group(2))
        elif m := _GEN_LEN.search(line):
            d["train/mean_gen_tokens_per_sample"] = float(m.group(1))
    steps = sorted(s for s, d in by_step.items() if any(k.startswith(PREFIX) for k in d))
    records, warnings = _records(steps, lambda tag, s: by_step.get(s, {}).get(tag), path)
    return RunLog(path=path, format=FORMAT_CONSOLE, records=records, warnings=warnings)


def meta(records: Sequence[StepRecord]) -> dict[str, object]:
    return {"framework": "nemo-rl", "fold": FOLD, "steps": len(records)}
