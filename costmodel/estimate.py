"""``estimate(model, hardware, cluster, strategy, workload) -> Estimate``: the cost model's one entry point.

Pure and stateless. It validates the degrees (raising InvalidDegreesError for a plan that cannot
exist), then asks :mod:`costmodel.memory` for bytes per rank per phase and :mod:`costmodel.timing`
for seconds per phase, and gathers violations. A plan that does not fit is data, not an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .params import active_params, max_rank_params, total_params
from core.specs import HardwareSpec, ModelSpec
from core.strategy import Cluster, Strategy, Workload, validate


@dataclass
class Violation:
    code: str
    message: str
    phase: str | None = None
    bytes_over: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.phase is not None:
            d["phase"] = self.phase
        if self.bytes_over is not None:
            d["bytes_over"] = int(self.bytes_over)
        return d


@dataclass
class PhaseMemory:
    """Bytes on the most loaded rank during one phase, by part (``weights``, ``grads``, ...)."""

    name: str
    parts: dict[str, float]
    info: dict[str, float] = field(default_factory=dict)
    """Figures that are not bytes (rollout: kv_cache_tokens, max_concurrent_sequences, ...)."""

    @property
    def total_bytes(self) -> float:
        return float(sum(self.parts.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"total_bytes": int(self.total_bytes), **{f"{k}_bytes": int(v) for k, v in self.parts.items()},
                **self.info}


@dataclass
class Estimate:
    model: ModelSpec
    hardware: HardwareSpec
    cluster: Cluster
    strategy: Strategy
    """Resolved: dp, etp and sequence_parallel filled in."""
    workload: Workload
    params: dict[str, int]
    memory: dict[str, PhaseMemory]
    capacity_bytes: float
    """HBM minus the profile's reserved bytes."""
    time: dict[str, Any] | None = None
    """``{"step_s": float, "phases": {"<phase>_s": float}}``, filled by costmodel.timing."""
    throughput: dict[str, float] | None = None
    """``{"tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu"}``."""
    violations: list[Violation] = field(default_factory=list)
    host_bytes_per_node: float = 0.0

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
        return self.capacity_bytes - self.peak_bytes

    @property
    def step_s(self) -> float | None:
        return None if self.time is None else self.time["step_s"]

    def to_dict(self) -> dict[str, Any]:
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
            "time": self.time,
            "throughput": self.throughput,
        }


def estimate(*, model: ModelSpec, hardware: HardwareSpec, cluster: Cluster, strategy: Strategy,
             workload: Workload, calibration: dict[str, float] | None = None) -> Estimate:
    from . import memory, timing

    s = validate(model, strategy, cluster.gpus, gpus_per_node=cluster.gpus_per_node, allow_cross_node_tp=True)
    params = {"total": total_params(model), "active": active_params(model), "per_rank_max": max_rank_params(model, s)}
    mem, host_bytes, violations = memory.phase_memory(model, hardware, cluster, s, workload)
    est = Estimate(model=model, hardware=hardware, cluster=cluster, strategy=s, workload=workload, params=params,
                   memory=mem, capacity_bytes=hardware.hbm_bytes - hardware.reserved_memory_bytes,
                   violations=violations, host_bytes_per_node=host_bytes)
    est.time, est.throughput = timing.step_time(model, hardware, cluster, s, workload, calibration=calibration)
    return est
