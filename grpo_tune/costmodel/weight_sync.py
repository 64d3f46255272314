"""Weight sync and offload, as verl 0.9.1 runs them (the hybrid CPU optimizer is priced with the
update, in costmodel.train_time), and every transport of the cross-pool weight sync (separate pools: the bucketed
broadcast :func:`cross_pool_sync`, NeMo-RL's NCCL reshard :func:`reshard_sync`, the tensor-by-tensor
:func:`per_tensor_sync`, and the links they run on), which share the colocated refit's export (:func:`hf_export_s`).

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

from grpo_tune.core.placement import Pools, train_strategy
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload

from grpo_tune import engines

from . import comm
from .memory import sleeps
from .timing_base import OPT_STATE_BYTES, PARAM_BYTES, model_consts
from .train_time import rank_params


def sleep_s(hw: HardwareSpec, s: Strategy) -> float:
    """The rollout engine's sleep after generation (inside verl's gen timer; engines.sleep_wake_s: the stack's figure
    or the engine's own); none without free_cache_engine, nor where the engine cannot sleep (memory.sleeps: vLLM's
    CPU build)."""
    return engines.sleep_wake_s(s, hw)[0] if sleeps(hw, s.rollout.free_cache_engine) else 0.0


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
    # the bridge's export, the same code path as the cross-pool sync's (costmodel.pools)
    gather = hf_export_s(m, hw, cluster, s, cal)
    # Each colocated vLLM worker receives the whole model (HF tensors) and copies its rollout-TP slice.
    copy = total / eng.rollout_tp / (hw.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    buckets = math.ceil(total / eng.sync_bucket_bytes)
    overhead = c["hf_tensors"] * export_tensor_overhead_s(hw, s) + buckets * e.sync_bucket_overhead_s
    onload = 0.0
    if "param" in s.memory.offload:  # loaded for the export, offloaded after it (pinned, synchronous)
        dense, expert = rank_params(m, s)
        onload = 2 * (dense + expert) * PARAM_BYTES / hw.host_to_device_bandwidth_bytes_per_s
    wake = engines.sleep_wake_s(s, hw)[1] if sleeps(hw, eng.free_cache_engine) else 0.0
    return {
        "wake_s": wake,
        "onload_s": onload,
        "gather_s": gather,
        "copy_s": copy,
        "overhead_s": overhead,
        "buckets": float(buckets),
    }


# ---------------------------------------------------------------------------------------------
# Cross-pool weight sync (separate pools): the transports that move the trained weights to the rollout pool
# ---------------------------------------------------------------------------------------------


def sync_link(
    hw_train: HardwareSpec, hw_roll: HardwareSpec, shared_nodes: bool, cal: Mapping[str, float]
) -> tuple[float, float]:
    """(bandwidth per GPU, latency) of a point-to-point transfer between the pools, each GPU on its own
    link: NVLink when the pools share nodes, the GPU's NIC otherwise; the slower of the two profiles' when
    they differ. The NCCL reshard's shard-to-shard bulk runs at it (each rollout GPU receives its own shard);
    a broadcast of the same buffer to every rollout GPU runs at :func:`broadcast_link`."""
    scale = cal["comm_efficiency_scale"]
    if shared_nodes:
        bw = min(hw_train.intra_node_bandwidth_bytes_per_s, hw_roll.intra_node_bandwidth_bytes_per_s)
        lat = max(hw_train.efficiency.intra_node_latency_s, hw_roll.efficiency.intra_node_latency_s)
    else:
        bw = min(hw_train.inter_node_bandwidth_bytes_per_s, hw_roll.inter_node_bandwidth_bytes_per_s)
        lat = max(hw_train.efficiency.inter_node_latency_s, hw_roll.efficiency.inter_node_latency_s)
    ce = min(hw_train.efficiency.comm_efficiency, hw_roll.efficiency.comm_efficiency) * scale
    return bw * ce, lat / scale


def node_nic_bandwidth(hw: HardwareSpec, gpus_per_node: int) -> float:
    """Bytes/s (one direction) all the NICs of a node of ``gpus_per_node`` GPUs carry together: the
    profile's ``inter_node_bandwidth_bytes_per_s`` is per GPU (NICs per node x line rate / GPUs per node),
    so the node's aggregate is ``gpus_per_node`` times it (8 x 50 GB/s on a DGX H100 with its eight
    400 Gb/s NICs)."""
    return gpus_per_node * hw.inter_node_bandwidth_bytes_per_s


def broadcast_link(
    hw_train: HardwareSpec, hw_roll: HardwareSpec, ps: Pools, cal: Mapping[str, float]
) -> tuple[float, float]:
    """(bandwidth, latency) of an NCCL broadcast of one buffer from the training pool to every rollout GPU.

    Pools sharing nodes: NVLink, as :func:`sync_link`. Pools on different nodes: NCCL runs a broadcast as a
    pipelined ring (its only broadcast algorithm) split over several channels, and across nodes the channels
    are rail-aligned: each enters a node on one NIC, crosses the node's GPUs over NVLink and leaves it on
    another NIC, so the channels together use every NIC of the node (NVIDIA/nccl issue #412: NCCL aggregates
    the NICs of a node where NVLink carries at least their sum; flows enter from a NIC, go through every GPU
    over NVLink and exit through a NIC, several at once). Every GPU of the ring receives and forwards the
    whole buffer once (nccl-tests PERFORMANCE.md: a broadcast's bus bandwidth is its algorithm bandwidth), so
    the throughput is the nodes' aggregate NIC bandwidth (:func:`node_nic_bandwidth`, the smaller of the two
    pools' nodes), bounded by the NVLink rate each GPU forwards at; the comm efficiency applies to both.
    verl 0.9.1's NCCL checkpoint engine admits actor rank 0's node-local peers into the group as relays for
    exactly this (``NCCLCheckpointEngine._multi_sender_ranks``, verl/checkpoint_engine/nccl_checkpoint_engine.py:
    "fan a bucket out to over NVLink, from which it can push on over each peer's own NIC"); NeMo-RL's
    collective update puts every training worker in the group (``init_collective``,
    nemo_rl/models/policy/workers/base_policy_worker.py). One latency per buffer (bucket)."""
    if ps.shared_nodes:
        return sync_link(hw_train, hw_roll, True, cal)
    scale = cal["comm_efficiency_scale"]
    nic = min(
        node_nic_bandwidth(hw_train, ps.train.gpus_per_node), node_nic_bandwidth(hw_roll, ps.rollout.gpus_per_node)
    )
    nvlink = min(hw_train.intra_node_bandwidth_bytes_per_s, hw_roll.intra_node_bandwidth_bytes_per_s)
    lat = max(hw_train.efficiency.inter_node_latency_s, hw_roll.efficiency.inter_node_latency_s)
    ce = min(hw_train.efficiency.comm_efficiency, hw_roll.efficiency.comm_efficiency) * scale
    return min(nic, nvlink) * ce, lat / scale


def double_buffered(produce: float, wire: float, consume: float, buckets: float) -> tuple[float, float]:
    """(seconds, hidden seconds) of a bucketed stream with two buffers: while bucket i is on the wire the
    producer fills bucket i+1 and the consumer loads bucket i-1, so the stream takes its slowest stage plus the
    other stages of one bucket (the fill and the drain); ``hidden`` is what the overlap saves against running
    the three in sequence."""
    parts = (produce, wire, consume)
    n = max(1.0, buckets)
    slow = max(parts)
    t = slow + (sum(parts) - slow) / n
    return t, sum(parts) - t


def cross_pool_sync(
    m: ModelSpec,
    hw_train: HardwareSpec,
    hw_roll: HardwareSpec,
    ps: Pools,
    s: Strategy,
    cal: dict[str, float],
) -> dict[str, float]:
    """Seconds of one cross-pool weight sync by bucketed broadcast, by part: ``export_s`` (the training side's
    PP/TP/EP gathers into HF tensors, :func:`hf_export_s`, and the onload of offloaded parameters),
    ``transfer_s`` (the whole bf16 model to every rollout GPU: a pipelined NCCL broadcast costs the bytes over
    :func:`broadcast_link`'s bandwidth, a node's NICs together bounded by NVLink, plus a latency per bucket),
    ``copy_s`` (each vLLM worker loads its rollout-TP slice), ``overhead_s`` (the stack's cost per HF tensor on
    the producing side and per bucket on the consuming side), ``overlap_s`` (what the double buffering hides)
    and ``sync_s``.

    Both engines this prices keep two buffers: verl 0.9.1's NCCL checkpoint engine fills one bucket while the
    other is broadcast and yields the last bucket's tensors while receiving the next
    (``NCCLCheckpointEngine.send_weights`` / ``_receive_weight_chunks``); NeMo-RL's packed collective update packs
    the next bucket on a second stream while the last is broadcast, and unpacks and loads on a second stream
    while receiving (``packed_broadcast_producer`` / ``packed_broadcast_consumer``, nemo_rl/utils/packed_tensor.py;
    NeMo-RL pull request #1379 measured DeepSeek-V3 at 34 s before this overlap and 14 s after). So the stream is
    priced as its slowest stage, producing (export and per-tensor costs), the wire, or consuming (copies and
    per-bucket costs), plus one bucket of the other two (:func:`double_buffered`); the onload of offloaded
    parameters precedes it and the calibration's fixed cost follows."""
    c = model_consts(m)
    nbytes = c["total_params"] * PARAM_BYTES
    ws = weight_sync_s(m, hw_train, ps.train, train_strategy(s), cal)
    bw, lat = broadcast_link(hw_train, hw_roll, ps, cal)
    buckets = math.ceil(nbytes / s.rollout.sync_bucket_bytes)
    transfer = nbytes / bw + buckets * lat
    e = hw_roll.efficiency
    copy = nbytes / s.rollout.rollout_tp / (hw_roll.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    per_tensor = c["hf_tensors"] * export_tensor_overhead_s(hw_train, s)
    per_bucket = buckets * e.sync_bucket_overhead_s
    gathers = ws["gather_s"]  # hf_export_s, as weight_sync_s prices the export
    stream, hidden = double_buffered(gathers + per_tensor, transfer, copy + per_bucket, buckets)
    total = ws["onload_s"] + stream + cal["weight_sync_overhead_s"]
    return {
        "export_s": gathers + ws["onload_s"],
        "transfer_s": transfer,
        "copy_s": copy,
        "overhead_s": per_tensor + per_bucket,
        "overlap_s": hidden,
        "sync_s": total,
        "bytes_per_rollout_gpu": float(nbytes),
        "link_bytes_per_s": bw,
        "buckets": float(buckets),
    }


REFIT_TRANSPORTS = ("broadcast", "nccl_reshard", "per_tensor")
"""How the cross-pool weight sync moves the weights: ``broadcast`` (every full tensor to every rollout GPU in
buckets: verl's checkpoint engine, NeMo-RL's default collective transport; :func:`cross_pool_sync`),
``nccl_reshard`` (NeMo-RL's ``policy.generation.refit_transport=nccl_reshard``: each destination shard moved
once; :func:`reshard_sync`) or ``per_tensor`` (verl's separate-pool sync without the checkpoint engine, as its
fully-async recipe ran it before the engine: one broadcast and one vLLM ``load_weights`` per HF tensor;
:func:`per_tensor_sync`). grpo-tune emits none of these choices (its verl launches keep verl 0.9.1's checkpoint
engine, which the broadcast prices); ``validate --grpo`` prices the published runs that used each."""


def vllm_param_count(m: ModelSpec) -> int:
    """Parameters vLLM's model holds, which its ``load_weights`` rebuilds into a dict on every call: the HF
    tensors, with each MoE layer's routed experts as vLLM's two fused tensors (``w13_weight``, ``w2_weight``).
    vLLM also fuses q/k/v and gate/up, which this count keeps apart (it is high by up to a third; the fitted
    per-parameter cost absorbs a constant factor)."""
    from .timing_base import hf_tensor_count

    fused = (3 * m.experts - 2) * m.moe_layers if m.is_moe else 0
    return hf_tensor_count(m) - fused


def per_tensor_sync(
    m: ModelSpec,
    hw_train: HardwareSpec,
    hw_roll: HardwareSpec,
    ps: Pools,
    s: Strategy,
    cal: dict[str, float],
) -> dict[str, float]:
    """Seconds of one cross-pool weight sync tensor by tensor (the ``per_tensor`` refit transport), in the keys
    of :func:`cross_pool_sync`. verl's fully-async recipe without its checkpoint engine (``sync_rollout_weights``,
    recipe/fully_async_policy/megatron_worker.py, verl 2025-12) walks the HF tensors in order: the bridge exports
    one (the TP/PP/EP gathers), every actor and rollout rank allocates it, actor rank 0 fills it, one NCCL
    broadcast over the group of every actor and rollout rank sends it, and each rollout rank passes it alone to
    vLLM's ``load_weights`` (which rebuilds its parameter dict and expert mapping on every call), before the next
    tensor starts: nothing overlaps and nothing is packed.

    - ``export_s``: the gathers and the onload of offloaded parameters, as :func:`cross_pool_sync`;
    - ``transfer_s``: the whole bf16 model over :func:`broadcast_link`'s bandwidth, plus one broadcast latency
      per HF tensor (there are no buckets);
    - ``copy_s``: each vLLM worker copies its rollout-TP slice;
    - ``overhead_s``: per HF tensor, the stack's per-tensor cost (``sync_tensor_overhead_s``, as in the bucketed
      path) and one ``load_weights`` call, which walks every vLLM parameter (:func:`vllm_param_count`) at the
      stack's ``load_weights_scan_s``."""
    c = model_consts(m)
    nbytes = c["total_params"] * PARAM_BYTES
    tensors = c["hf_tensors"]
    ws = weight_sync_s(m, hw_train, ps.train, train_strategy(s), cal)
    bw, lat = broadcast_link(hw_train, hw_roll, ps, cal)
    transfer = nbytes / bw + tensors * lat
    e = hw_roll.efficiency
    copy = nbytes / s.rollout.rollout_tp / (hw_roll.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    overhead = tensors * (export_tensor_overhead_s(hw_train, s) + vllm_param_count(m) * e.load_weights_scan_s)
    export = ws["gather_s"] + ws["onload_s"]  # hf_export_s, as weight_sync_s prices the export
    total = export + transfer + copy + overhead + cal["weight_sync_overhead_s"]
    return {
        "export_s": export,
        "transfer_s": transfer,
        "copy_s": copy,
        "overhead_s": overhead,
        "sync_s": total,
        "bytes_per_rollout_gpu": float(nbytes),
        "link_bytes_per_s": bw,
        "buckets": 0.0,
    }


def reshard_bulk_params(m: ModelSpec) -> float:
    """Parameters NeMo-RL's NCCL reshard moves shard to shard (its bulk path, ``is_nccl_reshard_param`` in
    nemo_rl/weight_sync/nccl_reshard_utils.py): the FFN projections (gate, up, down) of the dense MLP layers
    and of every routed expert. Shared experts, attention, norms, router, embeddings and the LM head are the
    rest (its misc path)."""
    h = m.hidden
    dense_layers = m.layers - m.moe_layers
    dense = dense_layers * (3 if m.gated_mlp else 2) * h * m.ffn_hidden
    routed = m.moe_layers * m.experts * 3 * h * m.expert_ffn_hidden if m.is_moe else 0
    return float(dense + routed)


def reshard_entries(m: ModelSpec) -> tuple[int, int]:
    """(bulk entries, misc tensors) one NCCL-reshard refit walks: a bulk entry per FFN projection of each
    layer (a MoE layer's experts grouped into one ``[experts, ...]`` entry per projection, as
    ``build_nccl_reshard_refit_info`` groups them), and every other HF tensor one by one."""
    from .timing_base import hf_tensor_count

    per = 3 if m.gated_mlp else 2
    dense_layers = m.layers - m.moe_layers
    bulk = dense_layers * per + m.moe_layers * 3
    misc = hf_tensor_count(m) - dense_layers * per - m.moe_layers * 3 * m.experts
    return bulk, misc


def reshard_sync(
    m: ModelSpec,
    hw_train: HardwareSpec,
    hw_roll: HardwareSpec,
    ps: Pools,
    s: Strategy,
    cal: dict[str, float],
) -> dict[str, float]:
    """Seconds of one cross-pool weight sync by NCCL reshard (NeMo-RL's ``nccl_reshard`` refit transport),
    by part, in the keys of :func:`cross_pool_sync`:

    - ``transfer_s``: the bulk (:func:`reshard_bulk_params`) moves shard to shard: each rollout GPU receives
      exactly its rollout-TP shard once and each training GPU sends its share of the bulk once (the shards
      striped over the training replicas), over the pools' link (:func:`sync_link`), whichever is larger,
      plus a latency per bulk entry; the rest (misc) is broadcast whole to every rollout GPU in buckets of
      ``sync_bucket_mb`` at :func:`broadcast_link`'s bandwidth, as the broadcast transport moves everything;
    - ``export_s``: only the misc tensors are gathered across the training TP group (the bulk leaves as
      each rank holds it), and the onload of offloaded parameters;
    - ``copy_s``: each rollout GPU copies what it received into its fused parameters;
    - ``overhead_s``: the stack's cost per bulk entry (``reshard_entry_overhead_s``: one xferdtensor call with its
      receive-buffer and fused-copy hooks), per misc tensor (``sync_tensor_overhead_s``, as every tensor of the
      packed broadcast) and per misc bucket (:func:`reshard_entries` counts them);
    - ``overlap_s``: the misc tensors travel by NeMo-RL's double-buffered packed broadcast, priced as
      :func:`cross_pool_sync` prices it (:func:`double_buffered`); the bulk runs entry by entry, in sequence."""
    c = model_consts(m)
    total = c["total_params"] * PARAM_BYTES
    bulk = min(reshard_bulk_params(m) * PARAM_BYTES, total)
    misc = total - bulk
    lay = s.layout
    rtp = s.rollout.rollout_tp
    bw, lat = sync_link(hw_train, hw_roll, ps.shared_nodes, cal)
    bw_b, lat_b = broadcast_link(hw_train, hw_roll, ps, cal)
    entries, misc_tensors = reshard_entries(m)
    dst = bulk / rtp
    src = bulk / ps.train.gpus
    buckets = math.ceil(misc / s.rollout.sync_bucket_bytes) if misc > 0 else 0
    transfer = max(dst, src) / bw + entries * lat + misc / bw_b + buckets * lat_b
    gather = 0.0
    if lay.tp > 1:
        gather = comm.all_gather_s(misc / lay.pp, lay.tp, *comm.link(hw_train, lay.tp, ps.train.gpus_per_node, cal))
    ws = weight_sync_s(m, hw_train, ps.train, train_strategy(s), cal)
    e = hw_roll.efficiency
    copy = (dst + misc / rtp) / (hw_roll.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    per_entry = entries * e.reshard_entry_overhead_s
    per_misc = misc_tensors * e.sync_tensor_overhead_s
    per_bucket = buckets * e.sync_bucket_overhead_s
    bulk_s = max(dst, src) / bw + entries * lat + dst / (hw_roll.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    misc_copy = misc / rtp / (hw_roll.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    misc_s, hidden = double_buffered(gather + per_misc, misc / bw_b + buckets * lat_b, misc_copy + per_bucket, buckets)
    export = gather + ws["onload_s"]
    total_s = ws["onload_s"] + bulk_s + per_entry + misc_s + cal["weight_sync_overhead_s"]
    return {
        "export_s": export,
        "transfer_s": transfer,
        "copy_s": copy,
        "overhead_s": per_entry + per_misc + per_bucket,
        "overlap_s": hidden,
        "sync_s": total_s,
        "bytes_per_rollout_gpu": float(dst + misc),
        "link_bytes_per_s": bw,
        "buckets": float(buckets),
        "bulk_fraction": bulk / total if total > 0 else 0.0,
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
