"""Weight sync and offload, as verl 0.9.1 runs them (the hybrid CPU optimizer is priced with the
update, in costmodel.train_time).

Weight sync (verl's colocated "naive" checkpoint engine; verl/workers/engine_workers.py
``update_weights``, verl/workers/rollout/vllm_rollout/vllm_rollout.py): wake vLLM's weights,
load the actor's parameters if they were offloaded, export every tensor in HF layout (the bridge
gathers TP shards, broadcasts pipeline stages, gathers experts), pack the tensors into buckets of
``update_weights_bucket_megabytes`` MiB (the plan's ``Strategy.sync_bucket_mb``; verl's default 2048)
shipped to the colocated vLLM worker by CUDA IPC, each worker copying its rollout-TP slice; offload
the parameters again; re-allocate the KV cache.
vLLM's sleep after generation is inside verl's ``timing_s/gen`` (ray_trainer.py), so it is
priced in the rollout phase (:func:`sleep_s`).

Offload (verl/utils/megatron_utils.py): parameters go to pinned host buffers synchronously and
come back from them; gradient buffers are freed and re-zeroed, not copied; optimizer state goes
to pageable memory and comes back once for the whole update.
"""

from __future__ import annotations

import math

from collections.abc import Mapping

from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload

from grpo_tune import engines

from . import comm
from .timing_base import OPT_STATE_BYTES, PARAM_BYTES, model_consts
from .train_time import rank_params


def sleep_s(hw: HardwareSpec, s: Strategy) -> float:
    """The rollout engine's sleep after generation (inside verl's gen timer; engines.sleep_wake_s: the stack's figure
    or the engine's own); none without free_cache_engine."""
    return engines.sleep_wake_s(s, hw)[0] if s.rollout.free_cache_engine else 0.0


def hf_export_s(m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, cal: Mapping[str, float]) -> float:
    """Seconds the training ranks take to materialise every HF tensor whole (the colocated refit and the
    cross-pool sync alike), as the Megatron bridge's ``export_hf_weights`` does tensor by tensor: the owning
    pipeline stage broadcasts its local shard to the other stages, then the TP group gathers the dense weights
    and the expert group (EP x ETP) gathers the routed experts.
    Bytes each rank receives: (p-1)/p of the rank-local shard (dense / tp + routed experts / (ep x etp)) from the
    other stages, (tp-1)/tp of the dense weights, (e-1)/e of the routed experts, each over its group's ring
    (:func:`comm.ring_link`: a group on one node runs over NVLink; across nodes at the NICs of its ranks on each
    node). Megatron orders ranks tp, cp, dp/ep, pp (fastest first): a TP group is ``tp`` consecutive ranks, an
    expert group ``ep x etp`` consecutive ranks, a pipeline group strided by ``gpus / pp``."""
    from .params import layer_params

    lay = s.layout
    gpn = cluster.gpus_per_node
    c = model_consts(m)
    total = c["total_params"] * PARAM_BYTES
    routed = m.moe_layers * layer_params(m, m.layers - 1).expert * PARAM_BYTES if m.is_moe else 0.0
    dense = total - routed
    e = lay.ep * lay.etp_ if m.is_moe else 1
    t = 0.0
    if lay.pp > 1:
        stride = max(1, cluster.gpus // lay.pp)
        per_node = max(1, gpn // stride) if stride < gpn else 1
        bw, lat = comm.ring_link(hw, cluster.gpus, per_node, gpn, cal)
        t += (lay.pp - 1) / lay.pp * (dense / lay.tp + routed / e) / bw
    if lay.tp > 1:
        bw, lat = comm.ring_link(hw, lay.tp, min(lay.tp, gpn), gpn, cal)
        t += comm.all_gather_s(dense, lay.tp, bw, lat)
    if e > 1 and routed > 0:
        bw, lat = comm.ring_link(hw, e, min(e, gpn), gpn, cal)
        t += comm.all_gather_s(routed, e, bw, lat)
    return t


def export_tensor_overhead_s(hw: HardwareSpec, s: Strategy) -> float:
    """The stack's host cost per HF tensor the training pool exports: ``sync_tensor_overhead_s``, and with
    pipeline parallelism ``pp_export_tensor_overhead_s`` more (verl 0.9.1's ``per_tensor_generator``,
    verl/utils/megatron_utils.py: each tensor's name goes through ``broadcast_str_from_megatron_pp`` and its shape
    through ``broadcast_from_megatron_pp``, an ``all_gather_object`` and a ``broadcast_object_list`` over the
    pipeline group, before the tensor itself is broadcast)."""
    e = hw.efficiency
    return e.sync_tensor_overhead_s + (e.pp_export_tensor_overhead_s if s.layout.pp > 1 else 0.0)


def weight_sync_s(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, cal: dict[str, float]
) -> dict[str, float]:
    """Seconds of one refit by part: ``wake_s``, ``onload_s``, ``gather_s``, ``copy_s``, ``overhead_s``."""
    eng = s.rollout
    e = hw.efficiency
    c = model_consts(m)
    total = c["total_params"] * PARAM_BYTES
    # the bridge's export, the same code path as the cross-pool sync's (costmodel.placement)
    gather = hf_export_s(m, hw, cluster, s, cal)
    # Each colocated vLLM worker receives the whole model (HF tensors) and copies its rollout-TP slice.
    copy = total / eng.rollout_tp / (hw.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    buckets = math.ceil(total / eng.sync_bucket_bytes)
    overhead = c["hf_tensors"] * export_tensor_overhead_s(hw, s) + buckets * e.sync_bucket_overhead_s
    onload = 0.0
    if "param" in s.memory.offload:  # loaded for the export, offloaded after it (pinned, synchronous)
        dense, expert = rank_params(m, s)
        onload = 2 * (dense + expert) * PARAM_BYTES / hw.host_to_device_bandwidth_bytes_per_s
    wake = engines.sleep_wake_s(s, hw)[1] if eng.free_cache_engine else 0.0
    return {
        "wake_s": wake,
        "onload_s": onload,
        "gather_s": gather,
        "copy_s": copy,
        "overhead_s": overhead,
        "buckets": float(buckets),
    }


def offload_s(m: ModelSpec, hw: HardwareSpec, s: Strategy, wl: Workload) -> float:
    """Host<->device copies per step outside weight sync. Parameters (pinned) make a round trip
    around each phase that needs them on the GPU: old log-prob and the update (the reference model,
    offloaded with the actor's param_offload, around its log-prob, from pageable memory). Gradients
    are freed, not copied. Optimizer state (pageable) makes one round trip around the whole update."""
    lay = s.layout
    smem = s.memory
    if not smem.offload:
        return 0.0
    dense, expert = rank_params(m, s)
    p = dense + expert
    dp = lay.dp or 1
    h2d = hw.host_to_device_bandwidth_bytes_per_s
    pageable = h2d * hw.efficiency.pageable_copy_fraction
    t = 0.0
    if "param" in smem.offload:
        grpo = wl.kind == "grpo"
        t += 2 * (2 if grpo else 1) * p * PARAM_BYTES / h2d
        if grpo and wl.kl:
            t += 2 * p * PARAM_BYTES / pageable
    if "optimizer" in smem.offload:
        gpu_part = 1.0 - (smem.cpu_optimizer or 0.0)
        shard = p / (dp * lay.cp) if smem.distributed_optimizer else p
        t += 2 * gpu_part * shard * OPT_STATE_BYTES / pageable
    return t
