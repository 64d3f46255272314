"""A training run's per-step log, as every log reader hands it back: :class:`RunLog` of :class:`StepRecord` s.

The default readers (verl's loggers, grpo-tune's metrics.jsonl) are in :mod:`grpo_tune.autotune.calibrate.runlog`;
a framework's own logs are read by its :meth:`~grpo_tune.frameworks.base.Framework.read_log` (NeMo-RL's in
:mod:`grpo_tune.frameworks.nemo_rl.logs`). Calibrate matches a log with its launch and fits on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    meta: dict[str, Any] = field(default_factory=dict)
    """Run facts the log states itself (our metrics.jsonl: nothing yet; reserved for model/plan ids)."""

    def steps(self, *, skip_warmup: int = 0) -> list[StepRecord]:
        """Records after the first ``skip_warmup`` logged steps (warm-up: CUDA graphs, allocator, compile)."""
        return self.records[skip_warmup:]
