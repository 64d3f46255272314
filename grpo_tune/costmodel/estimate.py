"""``estimate(model, hardware, cluster, strategy, workload) -> Estimate``: the cost model's one entry point.

Pure and stateless. It validates the degrees (raising InvalidDegreesError for a plan that cannot
exist), then asks :mod:`costmodel.memory` for bytes per rank per phase and :mod:`costmodel.timing`
for seconds per phase, and gathers violations. A plan that does not fit is data, not an error.
The results are the frozen dataclasses of :mod:`costmodel.results`.
"""

from __future__ import annotations

from grpo_tune.core.hardware import with_rollout_engine
from grpo_tune.core.rules import check_batches, check_log_prob_batches
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate

from . import memory, timing
from .params import active_params, max_rank_params, total_params
from .results import Estimate, PhaseMemory, PhaseTimes, Throughput, TrainParts, Violation

__all__ = ["Estimate", "PhaseMemory", "PhaseTimes", "Throughput", "TrainParts", "Violation", "estimate"]


def _token_budget(s: Strategy, w: Workload) -> list[Violation]:
    """verl's rearrange_micro_batches asserts that a token budget holds the longest sequence
    (the budget is per CP rank and multiplied by the CP size)."""
    lay = s.layout
    if w.kind != "grpo":
        return []
    longest = w.prompt_len + w.response_len
    out = []
    for name in ("max_tokens_per_gpu", "log_prob_max_tokens_per_gpu"):
        cap = getattr(s.batching, name)
        if cap and cap * lay.cp < longest:
            out.append(
                Violation(
                    "BATCH_DIVISIBILITY",
                    f"{name}={cap} (x cp {lay.cp}) is below the longest sequence "
                    f"({longest} tokens): verl refuses it; raise it to at least {-(-longest // lay.cp)}",
                )
            )
    return out


def _batches(s: Strategy, w: Workload) -> list[Violation]:
    """verl's (and megatron's) batch-split rules, as the trainer and diagnose apply them
    (core/rules.check_batches); with a token budget mbs is unused, so only the DP split counts."""
    lay = s.layout
    bat = s.batching
    fixed = bat.max_tokens_per_gpu is None
    found = check_batches(w, dp=lay.dp or 1, mbs=bat.mbs if fixed else None, pp=lay.pp, vpp=lay.vpp)
    if fixed and bat.log_prob_mbs is not None:
        found += check_log_prob_batches(w, dp=lay.dp or 1, log_prob_mbs=bat.log_prob_mbs, pp=lay.pp, vpp=lay.vpp)
    return [Violation(f.code, f"{f.message}; {f.hint}" if f.hint else f.message) for f in found]


def estimate(
    *,
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    strategy: Strategy,
    workload: Workload,
    calibration: dict[str, float] | None = None,
    colocated: bool = True,
) -> Estimate:
    """``colocated`` False: a separate placement's training pool (costmodel.pools.train_pool), whose ranks hold no
    rollout engine through training (memory.phase_memory)."""
    s = validate(model, strategy, cluster.gpus, gpus_per_node=cluster.gpus_per_node, allow_cross_node_tp=True)
    hardware = with_rollout_engine(hardware, s.rollout.engine)  # the plan's engine's stack costs (cpu + vllm)
    params = {"total": total_params(model), "active": active_params(model), "per_rank_max": max_rank_params(model, s)}
    mem, host_bytes, violations = memory.phase_memory(model, hardware, cluster, s, workload, colocated=colocated)
    violations += _token_budget(s, workload) + _batches(s, workload)
    time, throughput, details = timing.step_time(model, hardware, cluster, s, workload, cal=calibration)
    return Estimate(
        model=model,
        hardware=hardware,
        cluster=cluster,
        strategy=s,
        workload=workload,
        params=params,
        memory=mem,
        capacity_bytes=hardware.rank_capacity_bytes(cluster.ranks_per_node),
        time=time,
        throughput=throughput,
        violations=tuple(violations),
        host_bytes_per_node=host_bytes,
        details=details,
    )
