"""The cost model's typed results: frozen dataclasses for violations, phase memory, phase times,
throughput and training parts, and the Estimate that gathers them (``Estimate.predicted()`` is the
block best.yaml records). Phases are named by :class:`core.phases.Phase` values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Mapping, TypedDict

from grpo_tune.core.phases import Phase
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload

_EMPTY: Mapping[str, float] = MappingProxyType({})

DEFAULTS_NOISE = 0.01
"""A knob changing the predicted step by less than this fraction is left at the framework's default (search's
defaults within noise, ``autotune.search.defaults``; report.md states it)."""


class PoolFigures(TypedDict):
    """A plan's placement block: how the GPUs split, how busy each pool is, what a token costs
    (``costmodel.pools.colocated_figures`` for a colocated plan; a separate plan's extend it)."""

    mode: str
    rollout_gpus: int
    train_gpus: int
    staleness: int
    rollout_busy: float
    train_busy: float
    tokens_per_usd: float | None
    price_per_hour_usd: float | None


class SeparateFigures(PoolFigures):
    """The figures of separate pools (``costmodel.pools.estimate_separate``): each pool's shape,
    seconds, capacity and headroom, the cross-pool sync's parts (``sync``, by ``cross_pool_sync``'s keys)."""

    rollout_gpus_per_node: int
    train_gpus_per_node: int
    shared_nodes: bool
    rollout_hardware: str
    partial_rollout: bool
    sync_interval: int
    recompute_logprobs: bool
    gen_s: float
    train_s: float
    sync_s: float
    exposed_sync_s: float
    fill_s: float
    rollout_capacity_bytes: float
    train_capacity_bytes: float
    rollout_headroom_bytes: float
    train_headroom_bytes: float
    headroom_bytes: float
    sync: Mapping[str, float]
    decode_concurrency: float
    """Resident sequences per rollout replica (costmodel.pools.generation)."""
    kv_cache_tokens: float
    rollout_ahead: float
    """Batches the rollout pool may run ahead of the trainer (AsyncKnobs.ahead)."""
    concurrency_bound: str
    """What sets the resident sequences: max_num_seqs, kv_cache, feed or per_replica."""
    drain_s: float
    """The rollout pool's seconds per step lost to drains (over running at full concurrency)."""
    first_wait_s: float
    """The trainer's wait after each sync for its first fetch."""
    rollout_tokens_per_s: float
    """The rollout pool's sustained decode throughput."""
    stream_units: int
    """Units the training pool took as they arrived (costmodel.streaming); 0: the step did not stream."""
    stream_bubble_s: float
    """Training-pool seconds the stream adds at PP > 1: each unit's log-prob passes fill and drain the pipeline."""
    unstreamed_step_s: float
    """The same plan's step run in sequence (equal to the step when it did not stream)."""
    streamed_step_s: float
    """The same plan's step streamed (equal to the step when it streamed; 0: not priced, as when the plan may not
    stream; a plan that declined to stream because it costs more carries it: costmodel.streaming.cheaper_stream)."""


@dataclass(frozen=True)
class Violation:
    code: str
    message: str
    phase: str | None = None
    bytes_over: float | None = None

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"code": self.code, "message": self.message}
        if self.phase is not None:
            d["phase"] = self.phase
        if self.bytes_over is not None:
            d["bytes_over"] = int(self.bytes_over)
        return d


@dataclass(frozen=True)
class PhaseMemory:
    """Bytes on the most loaded rank during one phase, by part (``weights``, ``grads``, ...)."""

    name: str
    parts: Mapping[str, float]
    info: Mapping[str, float] = field(default_factory=dict)
    """Figures that are not bytes (rollout: kv_cache_tokens, max_concurrent_sequences, ...)."""
    total_bytes: float = field(init=False, repr=False, compare=False)
    """Sum of the parts (computed once: the search reads it for every plan and phase)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_bytes", float(sum(self.parts.values())))

    def to_dict(self) -> dict[str, float]:
        return {
            "total_bytes": int(self.total_bytes),
            **{f"{k}_bytes": int(v) for k, v in self.parts.items()},
            **self.info,
        }


@dataclass(frozen=True)
class TrainParts:
    """One training (or forward-only) pass of a batch through the training layout, in seconds."""

    compute_s: float
    dp_s: float = 0.0
    optimizer_s: float = 0.0
    """GPU Adam over this rank's shard plus, with the CPU optimizer, the host part that is not hidden."""
    micro_batches: int = 1
    fwd_mb_s: float = 0.0
    bwd_mb_s: float = 0.0
    tokens_per_micro_batch: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.dp_s + self.optimizer_s


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per phase of one step (``phases`` keyed by Phase value) and their sum."""

    step_s: float
    phases: Mapping[str, float]

    def __getitem__(self, phase: str | Phase) -> float:
        return self.phases.get(phase.value if isinstance(phase, Phase) else phase, 0.0)

    def to_dict(self) -> dict[str, object]:
        return {"step_s": float(self.step_s), "phases_s": {k: float(v) for k, v in self.phases.items()}}


@dataclass(frozen=True)
class Throughput:
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    hardware: HardwareSpec
    cluster: Cluster
    strategy: Strategy
    """Resolved: dp, etp and sequence_parallel filled in."""
    workload: Workload
    params: Mapping[str, int]
    memory: Mapping[str, PhaseMemory]
    capacity_bytes: float
    """HBM minus the profile's reserved bytes."""
    time: PhaseTimes | None = None
    throughput: Throughput | None = None
    violations: tuple[Violation, ...] = ()
    host_bytes_per_node: float = 0.0
    details: Mapping[str, float] = field(default_factory=dict)
    """Figures behind the phase times for people (decode concurrency, micro-batches, ...)."""
    placement: SeparateFigures | None = None
    """Separate pools only (costmodel.pools): the split, each pool's busy fraction and headroom,
    the sync's parts, tokens per dollar. None for a colocated plan."""

    @property
    def peak_bytes(self) -> float:
        return max((p.total_bytes for p in self.memory.values()), default=0.0)

    @property
    def peak_phase(self) -> str:
        return max(self.memory.values(), key=lambda p: p.total_bytes).name

    @property
    def fits(self) -> bool:
        return not any(v.code == "OOM_RISK" for v in self.violations)

    @property
    def headroom_bytes(self) -> float:
        """Capacity less the peak; with separate pools, the smaller of the two pools' (their GPUs may differ)."""
        h = self.placement.get("headroom_bytes") if self.placement else None
        return self.capacity_bytes - self.peak_bytes if h is None else float(h)

    @property
    def step_s(self) -> float | None:
        return None if self.time is None else self.time.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return tokens_per_s_per_gpu(self)

    def predicted(self) -> dict[str, object]:
        """The cost model's figures for ``best.yaml``'s ``predicted`` block (plain YAML types)."""
        t, thr = self.time, self.throughput
        return {
            "step_s": None if t is None else float(t.step_s),
            "phases_s": {} if t is None else {k: float(v) for k, v in t.phases.items()},
            "tokens_per_s_per_gpu": float(self.tokens_per_s_per_gpu),
            "model_tflops_per_gpu": None if thr is None else float(thr.model_tflops_per_gpu),
            "mfu": None if thr is None else float(thr.mfu),
            "peak_memory_bytes": int(self.peak_bytes),
            "peak_phase": self.peak_phase,
            "capacity_bytes": int(self.capacity_bytes),
            "headroom_bytes": int(self.headroom_bytes),
            "memory_bytes": {k: int(v.total_bytes) for k, v in self.memory.items()},
            "fits": bool(self.fits),
            **({"placement": _plain(self.placement)} if self.placement else {}),
        }

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model.name,
            "hardware": self.hardware.name,
            "cluster": {"gpus": self.cluster.gpus, "gpus_per_node": self.cluster.gpus_per_node},
            "strategy": self.strategy.to_dict(),
            "workload": self.workload.to_dict(),
            "params": dict(self.params),
            "memory": {
                "peak_bytes": int(self.peak_bytes),
                "peak_phase": self.peak_phase,
                "capacity_bytes": int(self.capacity_bytes),
                "host_bytes_per_node": int(self.host_bytes_per_node),
                "phases": {k: v.to_dict() for k, v in self.memory.items()},
            },
            "fits": self.fits,
            "violations": [v.to_dict() for v in self.violations],
            "time": None if self.time is None else self.time.to_dict(),
            "throughput": None if self.throughput is None else self.throughput.to_dict(),
            "details": dict(self.details),
            **({"placement": _plain(self.placement)} if self.placement else {}),
        }


def _plain(d: Mapping[str, object]) -> dict[str, object]:
    """A placement block as plain YAML/JSON types (nested mappings copied, floats as floats)."""
    return {
        k: (_plain(v) if isinstance(v, Mapping) else (float(v) if isinstance(v, float) else v)) for k, v in d.items()
    }


def step_s(est: Estimate) -> float:
    """The plan's predicted step in seconds; infinite when the estimate has no time model (the rank key's
    order: such a plan ranks last). The one definition of the step metric: search, rank, compare, tune and
    the run folder's report all read it here."""
    return math.inf if est.time is None else float(est.time.step_s)


def tokens_per_s_per_gpu(est: Estimate) -> float:
    """Trained tokens per second per GPU: the throughput block's figure, else the workload's tokens over the
    step (0 without a time model)."""
    if est.throughput is not None:
        return float(est.throughput.tokens_per_s_per_gpu)
    s = step_s(est)
    wl = est.workload
    return 0.0 if not math.isfinite(s) else wl.sequences * wl.train_seq_len / s / est.cluster.gpus
