"""Seconds of one training (or forward-only log-prob) pass through the training layout.

Per layer and micro-batch: dense GEMMs at the profile's GEMM-efficiency curve, routed experts as
grouped GEMMs at the tokens each expert gets, core attention at the profile's attention kernel,
memory-bound element-wise work, TP (all-reduce, or RS + AG with sequence parallel), CP's K/V
ring, EP all-to-all and MoE's per-layer fixed cost. Then the 1F1B pipeline over the micro-batches,
the DP gradient reduce / parameter gather with Megatron's overlap, and the optimizer step (on the
GPU, or partly on the host with Megatron's hybrid CPU optimizer: :func:`cpu_optimizer_s`).
"""

from __future__ import annotations

from collections.abc import Callable

from grpo_tune.core.specs import Efficiency, HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload, stage_layers

from . import comm
from .params import optimizer_params
from .results import TrainParts
from .timing_base import (
    ADAM_BYTES_PER_PARAM,
    PARAM_BYTES,
    attention_fraction,
    gemm_efficiency,
    model_consts,
)

CPU_ADAM_BYTES_PER_PARAM = 4 * 7  # CPU Adam reads fp32 p, g, m, v and writes p, m, v
CPU_ADAM_FLOPS_PER_PARAM = 16  # moment updates, bias corrections, sqrt, divide, weight decay


def layer_times(
    m: ModelSpec,
    hw: HardwareSpec,
    e: Efficiency,
    cluster: Cluster,
    s: Strategy,
    tokens_mb: float,
    seq_len: float,
    cal: dict[str, float],
) -> dict[str, float]:
    """Seconds for one (average) layer and one micro-batch of ``tokens_mb`` tokens (packed
    sequences of ``seq_len`` on average) on one rank: ``fwd``, ``bwd`` (without recompute),
    ``attn`` (the core-attention forward that selective recompute repeats) and ``tokens``."""
    lay = s.layout
    c = model_consts(m)
    gpn = cluster.gpus_per_node
    tp, cp, ep, etp = lay.tp, lay.cp, lay.ep, lay.etp_
    tokens = tokens_mb / cp  # CP splits every sequence
    peak = hw.peak_flops_per_s() * cal["compute_efficiency_scale"]
    fp8 = s.precision.precision == "fp8"
    # FP8 training (TransformerEngine, e4m3): the linear layers' GEMMs run at the FP8 GEMM rate; core attention, the
    # output layer and the element-wise work stay bf16 (Megatron keeps them out of the FP8 autocast)
    peak_lin = hw.gemm_flops_per_s("fp8") * cal["compute_efficiency_scale"] if fp8 else peak

    def link(span: int) -> tuple[float, float]:
        return comm.link(hw, span, gpn, cal, e)

    # Dense weights split by TP; routed experts: each rank does tokens*top_k/tp expert passes
    # (MoE parallel folding spreads the tokens of tp*cp*dp ranks over ep*etp).
    ffn_rank = (m.ffn_hidden if m.ffn_hidden else m.expert_ffn_hidden) / tp
    t_dense = tokens * c["dense_flops"] / tp / (peak_lin * gemm_efficiency(e, tokens, m.hidden, ffn_rank))
    t_expert = 0.0
    if c["routed_flops"]:
        rows_e = max(1.0, tokens * m.top_k * ep * etp / (tp * m.experts))  # tokens per local expert: grouped GEMM rows
        eff_e = gemm_efficiency(e, rows_e, m.hidden, m.expert_ffn_hidden / etp)
        t_expert = cal["moe_imbalance"] * tokens * c["routed_flops"] / tp / (peak_lin * eff_e)
    # Core attention of the rank's query tokens against their (causal) context.
    t_attn = tokens * c["attn_coef"] * seq_len * attention_fraction(hw) / tp / (peak * e.attention_efficiency)
    # Memory-bound element-wise work per token (bf16 reads + writes): norms and residual adds
    # (~12h values, split by TP only with SP: Korthikanti et al. 2022 sec. 4.2.2) and the MLP
    # activation (~4 x ffn/tp values).
    ffn_act = m.ffn_hidden if not m.is_moe else m.top_k * m.expert_ffn_hidden * cal["moe_imbalance"]
    elem = tokens * (12 * m.hidden / (tp if lay.sp else 1) + 4 * ffn_act / tp) * PARAM_BYTES
    if c["routed_flops"]:
        # The token dispatcher's copies of each routed token (megatron-core MoEAlltoAllTokenDispatcher): permute
        # reads the token and writes its top_k copies, sort_chunks_by_idxs orders the received copies by local
        # expert and back (a read and a write each; with more than one local expert over EP), unpermute reads the
        # copies into the token: 7 hidden-vectors per copy with EP, 3 without (tests/test_costmodel_transfer.py).
        copies = tokens / (tp if lay.sp else 1) * m.top_k * cal["moe_imbalance"]
        passes = 7 if ep > 1 and m.experts > ep else 3
        elem += copies * m.hidden * PARAM_BYTES * passes * c["moe_fraction"]
    if fp8:
        # each linear's input is quantized before its GEMM (read bf16, write e4m3 and its scales: 3 B per value):
        # QKV, the attention projection and fc1 read hidden-wide inputs, fc2 an ffn-wide one (per rank)
        elem += tokens * (3 * m.hidden / (tp if lay.sp else 1) + ffn_act / tp) * 3
    t_elem = elem / (hw.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    t_comp_f = t_dense + t_expert + t_attn + t_elem

    # TP: 2 all-reduces per layer forward and 2 backward (Narayanan et al. 2021 sec. 3.2); with
    # SP each is RS + AG of the same volume (Korthikanti et al. 2022 sec. 4.2.2).
    act_bytes = tokens * m.hidden * PARAM_BYTES
    t_tp, t_sp_regather = _tp_comm_s(s, act_bytes, link)
    t_cp_f, t_cp_b = _cp_comm_s(m, s, tokens, t_attn, link)
    t_ep = _ep_comm_s(m, e, s, c, tokens, link, cal)
    ovh = e.layer_overhead_s  # a host cost in fixed seconds: no GPU's (or calibration's) speed scales it
    fwd = t_comp_f + t_tp + t_cp_f + t_ep + ovh
    # Backward: Megatron overlaps the TP collectives with the weight-gradient GEMMs (about half of
    # the backward compute) up to tp_backward_overlap; SP's re-gather is exposed with the rest.
    t_tp_b = t_tp + t_sp_regather * (1.0 - e.tp_backward_overlap)
    bwd = (
        2 * t_comp_f
        + max(t_tp_b - e.tp_backward_overlap * t_comp_f, t_tp_b * (1 - e.tp_backward_overlap))
        + t_cp_b
        + t_ep
        + 2 * ovh
    )
    return {"fwd": fwd, "bwd": bwd, "attn": t_attn, "tokens": tokens}


Link = Callable[[int], tuple[float, float]]
"""Ranks in a group -> ``(bandwidth, latency_s)`` of the calibrated link its collectives use (comm.link)."""


def _tp_comm_s(s: Strategy, act_bytes: float, link: Link) -> tuple[float, float]:
    """TP collectives of one layer's forward and the backward SP re-gather, seconds."""
    lay = s.layout
    tp = lay.tp
    t_tp = t_sp_regather = 0.0
    if tp > 1:
        bw, lat = link(tp)
        if lay.sp:
            ag = comm.all_gather_s(act_bytes, tp, bw, lat)
            t_tp = 2 * (comm.reduce_scatter_s(act_bytes, tp, bw, lat) + ag)
            t_sp_regather = 2 * ag  # backward gathers the SP-sharded inputs of the two GEMM blocks again
        else:
            t_tp = 2 * comm.all_reduce_s(act_bytes, tp, bw, lat)
    return t_tp, t_sp_regather


def _cp_comm_s(m: ModelSpec, s: Strategy, tokens: float, t_attn: float, link: Link) -> tuple[float, float]:
    """Exposed CP ring exchange of one layer, forward and backward, seconds."""
    lay = s.layout
    tp, cp = lay.tp, lay.cp
    t_cp_f = t_cp_b = 0.0
    if cp > 1:  # ring exchange of the K/V chunk (cp-1 hops), overlapped with attention; backward 2x
        kv_w = (m.kv_lora_rank + m.qk_rope_head_dim) if m.is_mla else 2 * m.kv_heads * m.head_dim / tp
        hop = comm.p2p_s(tokens * kv_w * PARAM_BYTES, *link(tp * cp))
        t_cp_f = max(0.0, (cp - 1) * hop - t_attn)
        t_cp_b = max(0.0, 2 * (cp - 1) * hop - 2 * t_attn)
    return t_cp_f, t_cp_b


def _ep_comm_s(
    m: ModelSpec, e: Efficiency, s: Strategy, c: dict[str, float], tokens: float, link: Link, cal: dict[str, float]
) -> float:
    """EP dispatch + combine of one layer (averaged over the MoE layers), seconds."""
    lay = s.layout
    tp, ep, etp = lay.tp, lay.ep, lay.etp_
    t_ep = 0.0
    if c["routed_flops"]:
        if ep > 1:  # dispatch + combine all-to-all (megatron-core token dispatcher)
            a2a = tokens / (tp if lay.sp else 1) * m.top_k * m.hidden * PARAM_BYTES * cal["moe_imbalance"]
            t_ep = 2 * comm.all_to_all_s(a2a, ep, *link(etp * ep))
        t_ep = (t_ep + e.moe_layer_overhead_s) * c["moe_fraction"]
    return t_ep


def recompute_s(lt: dict[str, float], s: Strategy, layers: int) -> float:
    """Extra forward work in the backward pass of one micro-batch on a stage of ``layers`` layers."""
    smem = s.memory
    if smem.recompute == "full":
        n = layers if smem.recompute_layers is None else min(layers, smem.recompute_layers)
        return n * lt["fwd"]
    if smem.recompute == "selective":  # core attention only (Korthikanti et al. 2022 sec. 5)
        return layers * lt["attn"]
    return 0.0


def head_s(
    m: ModelSpec, hw: HardwareSpec, e: Efficiency, s: Strategy, tokens: float, cal: dict[str, float], logprob: bool
) -> float:
    """Output layer forward on the last stage (vocab split by TP), plus, for RL passes, the fp32
    log-softmax, the chosen-token gather and the entropy over the vocabulary: ~5 fp32 passes
    over tokens x vocab/tp values (memory-bound)."""
    lay = s.layout
    c = model_consts(m)
    peak = hw.peak_flops_per_s() * cal["compute_efficiency_scale"]
    t = tokens * c["head_flops"] / lay.tp / (peak * gemm_efficiency(e, tokens, m.hidden, m.vocab / lay.tp))
    if logprob:
        t += tokens * m.vocab / lay.tp * 5 * 4 / (hw.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    return t


def stage_counts(m: ModelSpec, s: Strategy) -> tuple[int, int, int]:
    """(first, middle max, last) stage layer counts."""
    lay = s.layout
    if lay.pp == 1:
        return m.layers, m.layers, m.layers
    if lay.first_stage_layers is None and lay.last_stage_layers is None:
        n = m.layers // lay.pp
        return n, n, n
    st = stage_layers(m, s)
    mid = max(st[1:-1]) if len(st) > 2 else 0
    return st[0], mid, st[-1]


def pipeline_s(t_mb: float, m_micro: int, pp: int, vpp: int, share: float = 1.0) -> float:
    """1F1B: m micro-batches plus a bubble of (p-1)/v micro-batch times (Narayanan et al. 2021
    sec. 2.2). ``share`` > 1: ranks share cores (the cpu profile); an idle stage hands its core to
    the others, so the wall time is the larger of the critical path and busy time x share
    (step_time scales every phase by ``share`` at the end, hence the division)."""
    crit = m_micro + (pp - 1) / vpp
    return t_mb * max(crit, m_micro * share) / share


def core_share(e: Efficiency, cluster: Cluster) -> float:
    """Ranks per core when a profile has fewer cores than ranks (``max_parallel_ranks``), else 1."""
    if e.max_parallel_ranks <= 0:
        return 1.0
    return max(1.0, cluster.gpus / e.max_parallel_ranks)


def rank_params(m: ModelSpec, s: Strategy) -> tuple[float, float]:
    """(dense, expert) parameters on the most loaded rank, from cached per-layer averages (the
    exact per-stage count is costmodel.params.per_stage_params; this is its cheap O(1) twin)."""
    lay = s.layout
    c = model_consts(m)
    layers = max(stage_counts(m, s))
    emb = c["embedding_params"] / lay.tp * (1 if lay.pp > 1 else (1 if m.tied_embeddings else 2))
    dense = layers * c["layer_dense_params"] / lay.tp + emb
    expert = layers * c["moe_fraction"] * c["layer_expert_params"] / (lay.ep * lay.etp_)
    return dense, expert


def optimizer_shard(m: ModelSpec, s: Strategy) -> float:
    """Parameters whose optimizer state this rank steps (the distributed optimizer's shard)."""
    return optimizer_params(*rank_params(m, s), s)


def train_s(
    m: ModelSpec,
    hw: HardwareSpec,
    cluster: Cluster,
    s: Strategy,
    *,
    tokens_mb: float,
    micro_batches: int,
    seq_len: float,
    cal: dict[str, float],
    forward_only: bool = False,
    logprob: bool = False,
    lt: dict[str, float] | None = None,
) -> tuple[TrainParts, dict[str, float]]:
    """One optimizer step (or forward-only pass) over ``micro_batches`` micro-batches of ``tokens_mb``
    tokens per DP rank. Returns the parts and the per-layer times (pass them back as ``lt`` to a
    second call with the same micro-batch shape)."""
    lay = s.layout
    smem = s.memory
    e = hw.efficiency
    gpn = cluster.gpus_per_node
    if lt is None:
        lt = layer_times(m, hw, e, cluster, s, tokens_mb, seq_len, cal)
        lt["head"] = head_s(m, hw, e, s, lt["tokens"], cal, logprob)
    first, mid, last = stage_counts(m, s)
    head_f = lt["head"]
    # Per micro-batch host work on every stage: Megatron's 1F1B schedule calls the forward step on each stage,
    # and the frameworks' forward steps (NeMo-RL's forward_step_arbitrary_loss, verl's forward_step) fetch,
    # move and pack the micro-batch on every rank, so a stage's critical path holds the whole cost, not 1/pp.
    # (Interleaved, the schedule calls it once per model chunk; how much of the cost each call repeats is not
    # measured, and no scored row interleaves: priced once per micro-batch.)
    mb_ovh = e.micro_batch_overhead_s
    t_p2p = 0.0
    if lay.pp > 1:  # the stage's output activation per micro-batch and chunk (Narayanan et al. 2021 sec. 4.1)
        nbytes = lt["tokens"] * m.hidden * PARAM_BYTES / lay.tp
        t_p2p = lay.vpp * comm.p2p_s(nbytes, *comm.link(hw, cluster.gpus, gpn, cal))
    share = core_share(e, cluster)
    if forward_only:
        t_mb = max(first * lt["fwd"], mid * lt["fwd"], last * lt["fwd"] + head_f) + t_p2p + mb_ovh
        return TrainParts(
            compute_s=pipeline_s(t_mb, micro_batches, lay.pp, lay.vpp, share),
            micro_batches=micro_batches,
            fwd_mb_s=t_mb,
            tokens_per_micro_batch=tokens_mb,
        ), lt

    def stage(n: int, head: float) -> tuple[float, float]:
        return n * lt["fwd"] + head, n * lt["bwd"] + recompute_s(lt, s, n) + 2 * head

    sf = [stage(first, 0.0 if lay.pp > 1 else head_f), stage(mid, 0.0), stage(last, head_f)]
    tf, tb = max(sf, key=lambda x: x[0] + x[1])
    t_mb = tf + tb + 2 * t_p2p + 3 * mb_ovh
    compute = pipeline_s(t_mb, micro_batches, lay.pp, lay.vpp, share)
    t_dp = _dp_s(m, hw, cluster, s, tf, tb, cal)
    shard = optimizer_shard(m, s)
    gpu_part = 1.0 - (smem.cpu_optimizer or 0.0)
    t_opt = gpu_part * shard * ADAM_BYTES_PER_PARAM / (hw.hbm_bandwidth_bytes_per_s * e.hbm_efficiency)
    if smem.cpu_optimizer:
        t_opt += cpu_optimizer_s(hw, cluster, s, shard)
    return TrainParts(
        compute_s=compute,
        dp_s=t_dp,
        optimizer_s=t_opt,
        micro_batches=micro_batches,
        fwd_mb_s=tf,
        bwd_mb_s=tb,
        tokens_per_micro_batch=tokens_mb,
    ), lt


def cpu_optimizer_s(hw: HardwareSpec, cluster: Cluster, s: Strategy, shard_params: float) -> float:
    """Megatron's HybridDeviceOptimizer: the ``cpu_optimizer`` fraction of this rank's shard is
    stepped by CPU Adam (bound by host memory bandwidth or FLOP/s, shared by the node's ranks),
    after its fp32 gradients go to the host and before its bf16 parameters come back. With
    ``overlap_cpu_optimizer`` the copies overlap the CPU step."""
    smem = s.memory
    f = smem.cpu_optimizer or 0.0
    if f <= 0:
        return 0.0
    n = f * shard_params
    ranks = cluster.ranks_per_node
    t_cpu = max(
        ranks * n * CPU_ADAM_BYTES_PER_PARAM / hw.host_memory_bandwidth_bytes_per_s,
        ranks * n * CPU_ADAM_FLOPS_PER_PARAM / hw.host_flops_per_s,
    )
    t_copy = n * (4 + PARAM_BYTES) / hw.host_to_device_bandwidth_bytes_per_s
    return max(t_cpu, t_copy) if smem.overlap_cpu_optimizer else t_cpu + t_copy


def _dp_s(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, tf: float, tb: float, cal: dict[str, float]
) -> float:
    """DP: gradients reduce-scattered (distributed optimizer) or all-reduced, updated parameters
    all-gathered; Megatron overlaps the reduce with the last backward and the gather with the
    first forward (overlap_grad_reduce / overlap_param_gather), up to dp_overlap."""
    lay = s.layout
    e = hw.efficiency
    gpn = cluster.gpus_per_node
    dp = lay.dp or 1
    dense, expert = rank_params(m, s)
    groups = [(dense, dp * lay.cp, lay.tp * lay.cp * dp)]
    if expert:
        groups.append((expert, lay.tp * lay.cp * dp // (lay.ep * lay.etp_), lay.tp * lay.cp * dp))
    t = 0.0
    ov = e.dp_overlap
    for nparams, n, span in groups:
        if n <= 1:
            continue
        bw, lat = comm.link(hw, span, gpn, cal)
        if s.memory.distributed_optimizer:
            rs = comm.reduce_scatter_s(nparams * e.grad_reduce_bytes, n, bw, lat)
            ag = comm.all_gather_s(nparams * PARAM_BYTES, n, bw, lat)
            t += max(rs - tb * ov, rs * (1 - ov)) + max(ag - tf * ov, ag * (1 - ov))
        else:
            ar = comm.all_reduce_s(nparams * e.grad_reduce_bytes, n, bw, lat)
            t += max(ar - tb * ov, ar * (1 - ov))
    return t


CONTROLLER_INT64_COLUMNS = {"rollout": (4, 4), "logprob": (4, 5), "update": (4, 5)}
"""Per phase, the int64 tensors of verl's padded batch as (columns per prompt slot, per response slot):
input_ids, attention_mask and position_ids span prompt + response, ``prompts`` the prompt, ``responses`` the
response; from the log-prob calls on, ``response_mask`` too (verl/trainer/ppo/ray_trainer.py)."""
CONTROLLER_FP32_RESPONSE = {"rollout": 0, "logprob": 2, "update": 5}
"""Per phase, the float32 [batch, response] tensors moved: the log-prob calls carry the token-level scores
in and the log-probs out; the update the scores, rewards, old log-probs, advantages and returns (and the
reference log-probs with a KL term: + 1)."""


def controller_s(hw: HardwareSpec, wl: Workload, phase: str) -> float:
    """Seconds a single-controller framework spends moving one phase's batch between its driver and the
    workers: the batch padded to the caps (``prompt_len`` + ``response_len`` columns, as verl's DataProto holds
    it), over the stack's ``controller_bytes_per_s`` (0: not priced). verl puts each DP chunk into Ray's object
    store once (``dispatch_nd_compute``: ``parallel_put``), the workers fetch it and the outputs come back
    through the driver, whatever the GPU count: a fixed cost per call that the GPUs do not divide."""
    bw = hw.efficiency.controller_bytes_per_s
    if bw <= 0:
        return 0.0
    p, r = float(wl.prompt_len), float(wl.response_len)
    a, b = CONTROLLER_INT64_COLUMNS[phase]
    fp32 = CONTROLLER_FP32_RESPONSE[phase] + (1 if phase == "update" and wl.kl else 0)
    per_seq = 8.0 * (a * p + b * r) + 4.0 * fp32 * r
    return wl.prompts * wl.n * per_seq / bw
