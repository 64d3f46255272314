"""Time model: seconds per phase of a GRPO step (or of a plain pretraining step).

Everything is closed-form float math over a handful of per-model constants (cached), so the
search can rank thousands of plans per second. The parts:

- FLOPs per token: every matmul of the layer (GQA/MHA, MLA, SwiGLU or GeLU MLP, the routed
  experts a token actually visits, shared experts), causal attention and the output layer.
  Training = forward + 2x forward (backward), as in Narayanan et al. 2021 (arXiv 2104.04473)
  eq. 3; recompute adds a forward (full) or the core attention forward (selective,
  Korthikanti et al. 2022, arXiv 2205.05198 sec. 5).
- Achieved FLOP/s = peak x efficiency(GEMM shape); the curve's parameters are data in the
  hardware profile's ``[efficiency]`` table.
- Communication: TP all-reduce (or RS+AG with sequence parallel), CP ring K/V exchange, EP
  all-to-all with a load-imbalance factor, PP p2p and the 1F1B bubble, DP gradient
  reduce-scatter / all-reduce and parameter all-gather with overlap, offload over PCIe.
- Rollout (vLLM, colocated): prefill at GEMM efficiency; decode bound by max(weights + KV reads
  over HBM bandwidth, compute) at the concurrency the KV cache allows; the longest response sets
  the tail. A profile with ``native_rollout = 1`` (the ``cpu`` one) samples with the trainer's
  own Megatron model instead: no KV cache, one forward pass over every prefix per step.

Calibration: :data:`CALIBRATION_DEFAULTS` lists the knobs a least-squares fit may move.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from . import comm, memory
from core.errors import ConfigError
from .params import active_params, embedding_params, layer_params, total_params
from core.specs import HardwareSpec, ModelSpec
from core.strategy import Cluster, Strategy, Workload, stage_layers

PHASES = ("rollout", "weight_sync", "old_logprob", "ref_logprob", "update", "offload")

CALIBRATION_DEFAULTS: dict[str, float] = {
    "compute_efficiency_scale": 1.0,  # x achieved FLOP/s of training and log-prob passes
    "comm_efficiency_scale": 1.0,  # speed of every collective (bus bandwidth and latency)
    "rollout_efficiency_scale": 1.0,  # x achieved HBM bandwidth and FLOP/s of prefill/decode
    "moe_imbalance": 1.1,  # busiest expert rank's load over the mean (1 = perfect balance)
    "rollout_overhead_s": 0.0,
    "weight_sync_overhead_s": 0.0,
    "old_logprob_overhead_s": 0.0,
    "ref_logprob_overhead_s": 0.0,
    "update_overhead_s": 0.0,
    "offload_overhead_s": 0.0,
    "step_overhead_s": 0.0,
}

# Ranges a calibration fit may explore (autotune.calibrate reads this).
CALIBRATION_BOUNDS: dict[str, tuple[float, float]] = {
    "compute_efficiency_scale": (0.05, 20.0),
    "comm_efficiency_scale": (0.05, 20.0),
    "rollout_efficiency_scale": (0.05, 20.0),
    "moe_imbalance": (1.0, 4.0),
    **{k: (0.0, 3600.0) for k in CALIBRATION_DEFAULTS if k.endswith("_overhead_s")},
}

# Used when a hardware profile's [efficiency] table lacks a key (profiles should set them all).
EFFICIENCY_DEFAULTS: dict[str, float] = {
    "gemm_efficiency_max": 0.7,
    "gemm_intensity_half": 100.0,
    "attention_efficiency": 0.5,
    "comm_efficiency": 0.8,
    "hbm_efficiency": 0.8,
    "intra_node_latency_s": 10e-6,
    "inter_node_latency_s": 20e-6,
    "layer_overhead_s": 20e-6,
    "decode_step_overhead_s": 1e-3,
    "dp_overlap": 0.8,
    "causal_attention_fraction": 0.5,
}

GRAD_REDUCE_BYTES = 4  # fp32 gradient buffers (Megatron's main_grad), reduced in fp32
PARAM_BYTES = 2  # bf16 weights
ADAM_BYTES_PER_PARAM = 30  # Adam step reads p, g, m, v (fp32) and writes p, m, v + the bf16 copy
OPT_STATE_BYTES = 12  # fp32 master + exp_avg + exp_avg_sq (Megatron distributed optimizer)
VLLM_MAX_SEQS = memory.ROLLOUT_MAX_NUM_SEQS
VLLM_MAX_BATCHED_TOKENS = memory.ROLLOUT_MAX_BATCHED_TOKENS


def check_calibration(calibration: dict[str, float] | None) -> dict[str, float]:
    """Defaults overlaid with ``calibration``; an unknown key or a bad value is a BAD_CONFIG error."""
    if not calibration:
        return CALIBRATION_DEFAULTS  # read-only
    cal = dict(CALIBRATION_DEFAULTS)
    for k, v in calibration.items():
        if k not in CALIBRATION_DEFAULTS:
            from core.errors import close_matches

            near = close_matches(str(k), CALIBRATION_DEFAULTS)
            raise ConfigError(f"calibration: unknown parameter {k!r}",
                              hint=f"did you mean {near[0]!r}?" if near else "known: " + ", ".join(CALIBRATION_DEFAULTS))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"calibration.{k} must be a finite number >= 0, got {v!r}")
        if (k.endswith("_scale") or k == "moe_imbalance") and not (0 < v <= 1e3):
            raise ConfigError(f"calibration.{k} must be in (0, 1000], got {v!r}")
        if k.endswith("_overhead_s") and v > 1e6:
            raise ConfigError(f"calibration.{k} must be at most 1e6 seconds, got {v!r}")
        cal[k] = float(v)
    return cal


_EFF: dict[int, tuple[HardwareSpec, dict[str, float]]] = {}


def efficiency(hw: HardwareSpec) -> dict[str, float]:
    """The profile's [efficiency] table over the defaults (memoized by identity; read-only)."""
    hit = _EFF.get(id(hw))
    if hit is not None and hit[0] is hw:
        return hit[1]
    if len(_EFF) > 256:
        _EFF.clear()
    e = {**EFFICIENCY_DEFAULTS, **hw.efficiency}
    _EFF[id(hw)] = (hw, e)
    return e


# ---------------------------------------------------------------------------------------------
# FLOPs (forward, per token)
# ---------------------------------------------------------------------------------------------

_CONSTS: dict[int, tuple[ModelSpec, dict[str, float]]] = {}


def model_consts(m: ModelSpec) -> dict[str, float]:
    """:func:`_model_consts`, memoized by identity first: hashing a ModelSpec costs more than the
    whole lookup, and the search passes the same object thousands of times."""
    hit = _CONSTS.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    if len(_CONSTS) > 512:
        _CONSTS.clear()
    c = _model_consts(m)
    _CONSTS[id(m)] = (m, c)
    return c


@lru_cache(maxsize=512)
def _model_consts(m: ModelSpec) -> dict[str, float]:
    """Per-token forward matmul FLOPs and parameter counts that do not depend on the plan.

    A matmul with a (k x n) weight costs 2kn FLOPs per token (Narayanan et al. 2021 sec. 5.1,
    eq. 3 counts 24bsh^2 per layer forward = 2 x 12h^2 weights for GPT).
    """
    h = m.hidden
    if m.is_mla:
        qd = m.heads * m.q_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * qd) if m.q_lora_rank else h * qd
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.heads * (m.qk_nope_head_dim + m.v_head_dim)
        attn_w = q + kv + m.heads * m.v_head_dim * h
        qk_dim, v_dim = m.q_head_dim, m.v_head_dim
        kv_token_bytes = m.layers * (m.kv_lora_rank + m.qk_rope_head_dim) * PARAM_BYTES  # MLA caches the latent
    else:
        attn_w = h * (m.heads + 2 * m.kv_heads) * m.head_dim + m.heads * m.head_dim * h
        qk_dim = v_dim = m.head_dim
        kv_token_bytes = 2 * m.layers * m.kv_heads * m.head_dim * PARAM_BYTES  # K and V
    dense_mlp = (3 if m.gated_mlp else 2) * h * m.ffn_hidden
    expert_w = 3 * h * m.expert_ffn_hidden if m.is_moe else 0
    shared_w = m.shared_experts * expert_w
    moe_layers = m.moe_layers
    dense_layers = m.layers - moe_layers
    # Per layer (averaged over dense and MoE layers): TP-shardable weights and routed-expert weights.
    dense_w = attn_w + (dense_layers * dense_mlp + moe_layers * (shared_w + h * m.experts)) / m.layers
    routed_w = moe_layers * m.top_k * expert_w / m.layers
    lp0 = layer_params(m, 0)
    lpl = layer_params(m, m.layers - 1)
    layer_avg = (dense_layers * lp0.total + moe_layers * lpl.total) / m.layers if m.is_moe else lp0.total
    dense_rank_layer = (dense_layers * (lp0.sharded + lp0.replicated) + moe_layers * (lpl.sharded + lpl.replicated)) / m.layers
    return {
        "dense_flops": 2.0 * dense_w,  # per layer per token, TP-sharded
        "routed_flops": 2.0 * routed_w,  # per layer per token, top_k experts
        "attn_coef": 2.0 * m.heads * (qk_dim + v_dim),  # x context length = QK^T + AV per token per layer
        "head_flops": 2.0 * h * m.vocab,  # output layer per token
        "expert_w": float(expert_w),
        "kv_token_bytes": float(kv_token_bytes),
        "total_params": float(total_params(m)),
        "active_params": float(active_params(m)),
        "embedding_params": float(embedding_params(m)),
        "layer_params": float(layer_avg),
        "layer_dense_params": float(dense_rank_layer),
        "layer_expert_params": float(lpl.expert if m.is_moe else 0),
        "moe_fraction": moe_layers / m.layers,
    }


def forward_flops_per_token(m: ModelSpec, seq_len: float, *, causal_fraction: float = 0.5) -> float:
    """Whole-model forward FLOPs per token at context ``seq_len``; attention is causal (a fraction
    ``causal_fraction`` of the s x s scores is computed: 0.5 with FlashAttention's block skipping)."""
    c = model_consts(m)
    per_layer = c["dense_flops"] + c["routed_flops"] + c["attn_coef"] * seq_len * causal_fraction
    return m.layers * per_layer + c["head_flops"]


def gemm_efficiency(e: dict[str, float], rows: float, k: float, n: float) -> float:
    """Fraction of peak a GEMM (rows x k) @ (k x n) reaches.

    Saturating in the GEMM's arithmetic intensity I = 1/(1/rows + 1/k + 1/n) (FLOPs per element
    moved, up to a constant: the roofline argument of Williams et al. 2009): e_max * I / (I + I_half).
    e_max and I_half are fitted per GPU (profiles/hardware/*.toml [efficiency]).
    """
    if rows <= 0 or k <= 0 or n <= 0:
        return e["gemm_efficiency_max"]
    i = 1.0 / (1.0 / rows + 1.0 / k + 1.0 / n)
    return e["gemm_efficiency_max"] * i / (i + e["gemm_intensity_half"])


# ---------------------------------------------------------------------------------------------
# Training: one micro-batch on one pipeline stage
# ---------------------------------------------------------------------------------------------

def _layer_times(m: ModelSpec, hw: HardwareSpec, e: dict[str, float], cluster: Cluster, s: Strategy,
                 seq_len: float, cal: dict[str, float]) -> dict[str, float]:
    """Seconds for one (average) layer and one micro-batch on one rank: ``fwd``, ``bwd`` (without
    recompute), ``attn`` (the core-attention forward that selective recompute repeats), ``tokens``."""
    c = model_consts(m)
    gpn = cluster.gpus_per_node
    tp, cp = s.tp, s.cp
    ep, etp = s.ep, s.etp_
    tokens = s.mbs * seq_len / cp  # tokens per rank per micro-batch (CP splits the sequence)
    peak = hw.bf16_dense_flops_per_s * cal["compute_efficiency_scale"]
    ce = e["comm_efficiency"] * cal["comm_efficiency_scale"]

    # Compute. Dense weights split by TP; routed experts: each rank does tokens*top_k/tp expert
    # passes (MoE parallel folding spreads the tokens of tp*cp*dp ranks over ep*etp).
    ffn_rank = (m.ffn_hidden if m.ffn_hidden else m.expert_ffn_hidden) / tp
    eff_dense = gemm_efficiency(e, tokens, m.hidden, ffn_rank)
    t_dense = tokens * c["dense_flops"] / tp / (peak * eff_dense)
    t_expert = 0.0
    if c["routed_flops"]:
        rows_e = max(1.0, tokens * m.top_k * ep * etp / (tp * m.experts))
        eff_e = gemm_efficiency(e, rows_e, m.hidden, m.expert_ffn_hidden / etp)
        t_expert = cal["moe_imbalance"] * tokens * c["routed_flops"] / tp / (peak * eff_e)
    # Core attention: the rank's query tokens against the whole (causal) context.
    attn_flops = tokens * c["attn_coef"] * seq_len * e["causal_attention_fraction"] / tp
    t_attn = attn_flops / (peak * e["attention_efficiency"])
    # Memory-bound element-wise work per token (bf16 reads + writes): 2 layer norms and 2 fused
    # bias-dropout-add (~12h values), replicated on every TP rank unless sequence parallel splits
    # them (Korthikanti et al. 2022 sec. 4.2.2, Table 4: SP speeds the forward up); the MLP
    # activation (~4 x ffn/tp values: read and write of the up-projection and its gate/GeLU).
    ffn_act = m.ffn_hidden if not m.is_moe else m.top_k * m.expert_ffn_hidden * cal["moe_imbalance"]
    elem = tokens * (12 * m.hidden / (tp if s.sp else 1) + 4 * ffn_act / tp) * PARAM_BYTES
    t_elem = elem / (hw.hbm_bandwidth_bytes_per_s * e["hbm_efficiency"])
    t_comp_f = t_dense + t_expert + t_attn + t_elem

    # TP: 2 all-reduces per layer forward and 2 backward (Narayanan et al. 2021 sec. 3.2); with
    # sequence parallel each becomes RS + AG of the same total volume (Korthikanti et al. 2022 sec. 4.2.2).
    act_bytes = tokens * m.hidden * PARAM_BYTES
    t_tp = 0.0
    if tp > 1:
        bw = comm.link_bw(hw, tp, gpn, ce)
        lat = comm.link_latency(hw, tp, gpn) / cal["comm_efficiency_scale"]
        if s.sp:
            t_tp = 2 * (comm.reduce_scatter_s(act_bytes, tp, bw, lat) + comm.all_gather_s(act_bytes, tp, bw, lat))
        else:
            t_tp = 2 * comm.all_reduce_s(act_bytes, tp, bw, lat)
    # CP: ring exchange of the K/V chunk, cp-1 hops, overlapped with the attention compute
    # (Megatron/TE context parallel, P2P ring). Backward moves K, V and their gradients: 2x.
    t_cp_f = t_cp_b = 0.0
    if cp > 1:
        kv_w = (m.kv_lora_rank + m.qk_rope_head_dim) if m.is_mla else 2 * m.kv_heads * m.head_dim / tp
        chunk = tokens * kv_w * PARAM_BYTES
        span = tp * cp
        hop = comm.p2p_s(chunk, comm.link_bw(hw, span, gpn, ce), comm.link_latency(hw, span, gpn) / cal["comm_efficiency_scale"])
        t_cp_f = max(0.0, (cp - 1) * hop - t_attn)
        t_cp_b = max(0.0, 2 * (cp - 1) * hop - 2 * t_attn)
    # EP: dispatch + combine all-to-all forward, the same backward (Megatron-core MoE token dispatcher).
    t_ep = 0.0
    if c["routed_flops"] and ep > 1:
        span = etp * ep
        a2a_bytes = tokens / (tp if s.sp else 1) * m.top_k * m.hidden * PARAM_BYTES * cal["moe_imbalance"]
        t_ep = 2 * comm.all_to_all_s(a2a_bytes, ep, comm.link_bw(hw, span, gpn, ce), comm.link_latency(hw, span, gpn) / cal["comm_efficiency_scale"])
    t_ep *= c["moe_fraction"]
    ovh = e["layer_overhead_s"] / cal["compute_efficiency_scale"]  # launch/dispatch cost speeds up with the rest
    fwd = t_comp_f + t_tp + t_cp_f + t_ep + ovh
    # Backward: Megatron overlaps the TP all-reduce with the weight-gradient GEMMs (about half of
    # the backward compute); Korthikanti et al. 2022 Table 4 notes this overlap.
    bwd = 2 * t_comp_f + max(0.0, t_tp - t_comp_f) + t_cp_b + t_ep + 2 * ovh
    return {"fwd": fwd, "bwd": bwd, "attn": t_attn, "tokens": tokens}


def _recompute_s(lt: dict[str, float], s: Strategy, layers: int) -> float:
    """Extra forward work in the backward pass of one micro-batch on a stage of ``layers`` layers."""
    if s.recompute == "full":
        n = layers if s.recompute_layers is None else min(layers, s.recompute_layers)
        return n * lt["fwd"]
    if s.recompute == "selective":  # core attention only (Korthikanti et al. 2022 sec. 5)
        return layers * lt["attn"]
    return 0.0


def _head_s(m: ModelSpec, hw: HardwareSpec, e: dict[str, float], s: Strategy, tokens: float,
            cal: dict[str, float]) -> float:
    """Output layer forward on the last stage (vocab split by TP)."""
    c = model_consts(m)
    peak = hw.bf16_dense_flops_per_s * cal["compute_efficiency_scale"]
    eff = gemm_efficiency(e, tokens, m.hidden, m.vocab / s.tp)
    return tokens * c["head_flops"] / s.tp / (peak * eff)


def _stage_counts(m: ModelSpec, s: Strategy) -> tuple[int, int, int]:
    """(first, middle max, last) stage layer counts."""
    if s.pp == 1:
        return m.layers, m.layers, m.layers
    if s.first_stage_layers is None and s.last_stage_layers is None:
        n = m.layers // s.pp
        return n, n, n
    st = stage_layers(m, s)
    mid = max(st[1:-1]) if len(st) > 2 else 0
    return st[0], mid, st[-1]


def pipeline_s(t_mb: float, m_micro: int, pp: int, vpp: int, share: float = 1.0) -> float:
    """1F1B: m micro-batches plus a bubble of (p-1)/v micro-batch times
    (Narayanan et al. 2021 sec. 2.2.1: bubble fraction (p-1)/m; sec. 2.2.2 interleaved: (p-1)/(v m)).

    ``share`` > 1 means ranks share cores (the cpu profile: ranks / max_parallel_ranks). A stage
    idle in its bubble then hands its core to the others, so the wall time is the larger of the
    critical path and the busy time x share. step_time scales every phase by ``share`` at the end,
    hence the division here."""
    crit = m_micro + (pp - 1) / vpp
    return t_mb * max(crit, m_micro * share) / share


def core_share(e: dict[str, float], cluster: Cluster) -> float:
    """Ranks per core when a profile has fewer cores than ranks (``max_parallel_ranks``), else 1."""
    return max(1.0, cluster.gpus / e.get("max_parallel_ranks", float("inf")))


def rank_params(m: ModelSpec, s: Strategy) -> tuple[float, float]:
    """(dense, expert) parameters on the most loaded rank, from cached per-layer averages (the
    exact per-stage count is costmodel.params.per_stage_params; this is its cheap O(1) twin)."""
    c = model_consts(m)
    layers = max(_stage_counts(m, s))
    dense = layers * c["layer_dense_params"] / s.tp + c["embedding_params"] / s.tp * (1 if s.pp > 1 else (1 if m.tied_embeddings else 2))
    expert = layers * c["moe_fraction"] * c["layer_expert_params"] / (s.ep * s.etp_)
    return dense, expert


def train_s(m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, *, sequences: int, seq_len: float,
            cal: dict[str, float], forward_only: bool = False, _lt: dict | None = None) -> dict[str, float]:
    """Seconds to run ``sequences`` sequences of ``seq_len`` tokens through the training layout:
    one optimizer step (or forward only, for log-probs). Returns the parts (and ``_lt``, the
    per-layer times, which a second call at the same length may pass back to skip recomputing)."""
    e = efficiency(hw)
    gpn = cluster.gpus_per_node
    dp = s.dp or 1
    if _lt is None:
        lt = _layer_times(m, hw, e, cluster, s, seq_len, cal)
        lt["head"] = _head_s(m, hw, e, s, lt["tokens"], cal)
    else:
        lt = _lt
    first, mid, last = _stage_counts(m, s)
    head_f = lt["head"]
    m_micro = max(1, -(-sequences // (dp * s.mbs)))
    ce = e["comm_efficiency"] * cal["comm_efficiency_scale"]
    # p2p: the stage's output activation per micro-batch and chunk, forward and backward
    # (Narayanan et al. 2021 sec. 4.1: bsh/t with the scatter/gather optimization).
    t_p2p = 0.0
    if s.pp > 1:
        span = cluster.gpus
        nbytes = lt["tokens"] * m.hidden * PARAM_BYTES / s.tp
        t_p2p = s.vpp * comm.p2p_s(nbytes, comm.link_bw(hw, span, gpn, ce), comm.link_latency(hw, span, gpn) / cal["comm_efficiency_scale"])
    if forward_only:
        stages = [first * lt["fwd"], mid * lt["fwd"], last * lt["fwd"] + head_f]
        t_mb = max(stages) + t_p2p
        return {"compute_s": pipeline_s(t_mb, m_micro, s.pp, s.vpp, core_share(e, cluster)), "dp_s": 0.0, "optimizer_s": 0.0,
                "micro_batches": m_micro, "fwd_mb_s": t_mb, "bwd_mb_s": 0.0, "_lt": lt}

    def stage(n: int, head: float) -> tuple[float, float]:
        return n * lt["fwd"] + head, n * lt["bwd"] + _recompute_s(lt, s, n) + 2 * head

    sf = [stage(first, 0.0 if s.pp > 1 else head_f), stage(mid, 0.0), stage(last, head_f)]
    tf, tb = max(sf, key=lambda x: x[0] + x[1])
    t_mb = tf + tb + 2 * t_p2p
    compute = pipeline_s(t_mb, m_micro, s.pp, s.vpp, core_share(e, cluster))

    # DP: gradients reduce-scattered (distributed optimizer) or all-reduced, updated parameters
    # all-gathered; Megatron overlaps the reduce with the last micro-batch's backward and the
    # gather with the first forward (overlap_grad_reduce / overlap_param_gather), up to dp_overlap.
    dense, expert = rank_params(m, s)
    t_dp = 0.0
    groups = [(dense, dp * s.cp, s.tp * s.cp * dp)]
    if expert:
        edp = s.tp * s.cp * dp // (s.ep * s.etp_)
        groups.append((expert, edp, s.tp * s.cp * dp))
    for nparams, n, span in groups:
        if n <= 1:
            continue
        bw = comm.link_bw(hw, span, gpn, ce)
        lat = comm.link_latency(hw, span, gpn) / cal["comm_efficiency_scale"]
        if s.distributed_optimizer:
            t_dp += max(comm.reduce_scatter_s(nparams * GRAD_REDUCE_BYTES, n, bw, lat) - tb * e["dp_overlap"],
                        comm.reduce_scatter_s(nparams * GRAD_REDUCE_BYTES, n, bw, lat) * (1 - e["dp_overlap"]))
            ag = comm.all_gather_s(nparams * PARAM_BYTES, n, bw, lat)
            t_dp += max(ag - tf * e["dp_overlap"], ag * (1 - e["dp_overlap"]))
        else:
            ar = comm.all_reduce_s(nparams * GRAD_REDUCE_BYTES, n, bw, lat)
            t_dp += max(ar - tb * e["dp_overlap"], ar * (1 - e["dp_overlap"]))
    # Optimizer step: memory-bound Adam over this rank's shard.
    shard = (dense / dp + expert / max(1, s.tp * s.cp * dp // (s.ep * s.etp_))) if s.distributed_optimizer else dense + expert
    t_opt = shard * ADAM_BYTES_PER_PARAM / (hw.hbm_bandwidth_bytes_per_s * e["hbm_efficiency"])
    return {"compute_s": compute, "dp_s": t_dp, "optimizer_s": t_opt, "micro_batches": m_micro,
            "fwd_mb_s": tf, "bwd_mb_s": tb, "_lt": lt}


def _total(parts: dict[str, float]) -> float:
    return parts["compute_s"] + parts["dp_s"] + parts["optimizer_s"]


# ---------------------------------------------------------------------------------------------
# Rollout (vLLM, colocated)
# ---------------------------------------------------------------------------------------------

def rollout_s(m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload,
              cal: dict[str, float]) -> dict[str, float]:
    e = efficiency(hw)
    c = model_consts(m)
    rtp = s.rollout_tp
    gpn = cluster.gpus_per_node
    replicas = max(1, cluster.gpus // rtp)
    seqs = wl.prompts * wl.n / replicas  # per replica
    mean, longest, prompt = wl.mean_response_len, float(wl.response_len), float(wl.prompt_len)
    peak = hw.bf16_dense_flops_per_s * cal["rollout_efficiency_scale"]
    hbm = hw.hbm_bandwidth_bytes_per_s * e["hbm_efficiency"] * cal["rollout_efficiency_scale"]
    ce = e["comm_efficiency"] * cal["comm_efficiency_scale"]
    bw, lat = comm.link_bw(hw, rtp, gpn, ce), comm.link_latency(hw, rtp, gpn) / cal["comm_efficiency_scale"]
    causal = e["causal_attention_fraction"]
    body_flops = m.layers * (c["dense_flops"] + c["routed_flops"])

    # Prefill: the n copies of a prompt share it through prefix caching, so each unique prompt is
    # computed once, in chunks of VLLM_MAX_BATCHED_TOKENS.
    pre_tokens = seqs / wl.n * prompt
    pre_rows = min(VLLM_MAX_BATCHED_TOKENS, max(1.0, pre_tokens))
    pre_flops = pre_tokens * (body_flops + m.layers * c["attn_coef"] * prompt * causal) / rtp \
        + seqs * c["head_flops"] / rtp
    t_pre = pre_flops / (peak * gemm_efficiency(e, pre_rows, m.hidden, (m.ffn_hidden or m.expert_ffn_hidden) / rtp))
    if rtp > 1:
        t_pre += 2 * m.layers * comm.all_reduce_s(pre_tokens * m.hidden * PARAM_BYTES, rtp, bw, lat)

    # Decode: concurrency limited by the KV cache (costmodel.memory's capacity; vLLM allocates
    # blocks as sequences grow, so a sequence holds prompt + mean response tokens at its end), by
    # max_num_seqs and by the sequences this replica has.
    per_seq = prompt + mean
    kv_tokens = memory.kv_cache_capacity(m, hw, s, wl).tokens
    conc = min(seqs, VLLM_MAX_SEQS, max(1.0, kv_tokens / per_seq))
    ctx = prompt + mean / 2  # average context while decoding
    # Weight bytes read per step: dense part always; routed experts only those some token visits.
    all_expert = (m.moe_layers * m.experts * c["expert_w"] * PARAM_BYTES / rtp) if m.is_moe else 0.0
    dense_bytes = memory.rollout_weight_bytes(m, rtp) - all_expert
    expert_bytes = 0.0
    if m.is_moe:
        touched = m.experts * (1 - (1 - m.top_k / m.experts) ** conc)
        expert_bytes = all_expert * touched / m.experts
    kv_read = conc * ctx * memory.kv_bytes_per_token(m, rtp)
    t_mem = (dense_bytes + expert_bytes + kv_read) / hbm
    flops = conc * (body_flops + m.layers * c["attn_coef"] * ctx + c["head_flops"]) / rtp
    t_comp = flops / (peak * gemm_efficiency(e, conc, m.hidden, (m.ffn_hidden or m.expert_ffn_hidden) / rtp))
    t_comm = 2 * m.layers * comm.all_reduce_s(conc * m.hidden * PARAM_BYTES, rtp, bw, lat) if rtp > 1 else 0.0
    t_step = max(t_mem, t_comp) + t_comm + e["decode_step_overhead_s"] / cal["rollout_efficiency_scale"]
    # Continuous batching keeps ``conc`` sequences running; the longest response drains alone.
    steps = seqs * mean / conc + (longest - mean)
    return {"prefill_s": t_pre, "decode_s": steps * t_step, "decode_step_s": t_step, "concurrency": conc,
            "memory_bound": float(t_mem >= t_comp)}


def native_rollout_s(m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload,
                     cal: dict[str, float]) -> dict[str, float]:
    """The CPU trainer's sampler (trainer/rollout/megatron.py): no KV cache, so each of the
    ``response_len`` steps is a forward-only pass of the training layout over every prefix (each DP
    rank splits its rows into ``pp`` micro-batches, as Engine.next_token_logits does, so the
    pipeline bubble is (p-1)/p), then the last token's fp32 logits are summed over the world."""
    e = efficiency(hw)
    seqs = wl.prompts * wl.n
    dp = s.dp or 1
    rows = -(-seqs // (dp * s.pp))
    s1 = s.replace(mbs=rows)
    ctx = wl.prompt_len + wl.response_len / 2  # padded prefix length, averaged over the steps
    fwd = _total(train_s(m, hw, cluster, s1, sequences=seqs, seq_len=ctx, cal=cal, forward_only=True))
    ce = e["comm_efficiency"] * cal["comm_efficiency_scale"]
    gpn = cluster.gpus_per_node
    gather = comm.all_reduce_s(seqs * m.vocab * 4, cluster.gpus, comm.link_bw(hw, cluster.gpus, gpn, ce),
                               comm.link_latency(hw, cluster.gpus, gpn) / cal["comm_efficiency_scale"])
    t_step = fwd + gather + e["decode_step_overhead_s"] / cal["rollout_efficiency_scale"]
    return {"prefill_s": 0.0, "decode_s": wl.response_len * t_step, "decode_step_s": t_step,
            "concurrency": float(seqs), "memory_bound": 0.0}


def weight_sync_s(m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, cal: dict[str, float]) -> float:
    """Training layout -> rollout TP. verl's Megatron exporter walks every parameter: TP shards are
    all-gathered, pipeline stages broadcast theirs, EP gathers experts; then vLLM copies its slice."""
    e = efficiency(hw)
    c = model_consts(m)
    gpn = cluster.gpus_per_node
    ce = e["comm_efficiency"] * cal["comm_efficiency_scale"]
    total = c["total_params"] * PARAM_BYTES
    t = 0.0
    if s.tp > 1:
        t += comm.all_gather_s(total / s.pp, s.tp, comm.link_bw(hw, s.tp, gpn, ce), comm.link_latency(hw, s.tp, gpn) / cal["comm_efficiency_scale"])
    if s.pp > 1:
        span = cluster.gpus
        t += (s.pp - 1) / s.pp * total / comm.link_bw(hw, span, gpn, ce)
    if m.is_moe and s.ep > 1:
        span = s.ep * s.etp_
        t += comm.all_gather_s(total * (1 - c["active_params"] / c["total_params"]), s.ep,
                               comm.link_bw(hw, span, gpn, ce), comm.link_latency(hw, span, gpn) / cal["comm_efficiency_scale"])
    t += total / s.rollout_tp / (hw.hbm_bandwidth_bytes_per_s * e["hbm_efficiency"])
    return t


def offload_s(m: ModelSpec, hw: HardwareSpec, s: Strategy, wl: Workload) -> float:
    """Host<->device transfers per step (verl offloads between phases): parameters make one round
    trip per phase that needs them (weight sync, old log-prob, update; the reference model too),
    gradients and optimizer state one round trip around the update."""
    if not s.offload:
        return 0.0
    dense, expert = rank_params(m, s)
    p = dense + expert
    dp = s.dp or 1
    nbytes = 0.0
    if "param" in s.offload:
        trips = 3 + (1 if (wl.kind == "grpo" and wl.kl) else 0) if wl.kind == "grpo" else 1
        nbytes += 2 * trips * p * PARAM_BYTES
    if "grad" in s.offload:
        nbytes += 2 * p * GRAD_REDUCE_BYTES
    if "optimizer" in s.offload:
        nbytes += 2 * p * OPT_STATE_BYTES / (dp if s.distributed_optimizer else 1)
    return nbytes / hw.host_to_device_bandwidth_bytes_per_s


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------

def step_time(model: ModelSpec, hardware: HardwareSpec, cluster: Cluster, strategy: Strategy, workload: Workload,
              *, calibration: dict[str, float] | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """``(time, throughput)`` for a resolved strategy (dp filled in by strategy.validate)."""
    cal = check_calibration(calibration)
    m, hw, s, wl = model, hardware, strategy, workload
    if s.dp is None:
        s = s.replace(dp=cluster.gpus // (s.tp * s.pp * s.cp))
    e = efficiency(hw)
    causal = e["causal_attention_fraction"]
    gpus = cluster.gpus
    if wl.kind == "pretrain":
        parts = train_s(m, hw, cluster, s, sequences=wl.gbs, seq_len=wl.seq_len, cal=cal)
        upd = _total(parts) + cal["update_overhead_s"]
        off = offload_s(m, hw, s, wl) + (cal["offload_overhead_s"] if s.offload else 0.0)
        step = upd + off + cal["step_overhead_s"]
        tokens = wl.gbs * wl.seq_len
        model_flops = 3 * tokens * forward_flops_per_token(m, wl.seq_len, causal_fraction=causal)
        phases = {"update_s": upd, "offload_s": off}
    else:
        seq_len = wl.prompt_len + wl.mean_response_len
        seqs = wl.prompts * wl.n
        native = hw.native_rollout  # the profile's trainer samples with Megatron itself
        ro = (native_rollout_s if native else rollout_s)(m, hw, cluster, s, wl, cal)
        rollout = ro["prefill_s"] + ro["decode_s"] + cal["rollout_overhead_s"]
        sync = (0.0 if native else weight_sync_s(m, hw, cluster, s, cal)) + cal["weight_sync_overhead_s"]
        fparts = train_s(m, hw, cluster, s, sequences=seqs, seq_len=seq_len, cal=cal, forward_only=True)
        fwd = _total(fparts)
        old = fwd + cal["old_logprob_overhead_s"]
        ref = (fwd + cal["ref_logprob_overhead_s"]) if wl.kl else 0.0
        mini = train_s(m, hw, cluster, s, sequences=wl.mini_batch * wl.n, seq_len=seq_len, cal=cal, _lt=fparts["_lt"])
        upd = wl.ppo_epochs * (wl.prompts // wl.mini_batch) * _total(mini) + cal["update_overhead_s"]
        off = offload_s(m, hw, s, wl) + (cal["offload_overhead_s"] if s.offload else 0.0)
        step = rollout + sync + old + ref + upd + off + cal["step_overhead_s"]
        tokens = seqs * seq_len
        f_tok = forward_flops_per_token(m, seq_len, causal_fraction=causal)
        passes = 1 + 1 + (1 if wl.kl else 0) + 3 * wl.ppo_epochs  # generate, old, ref, update
        model_flops = passes * tokens * f_tok
        phases = {"rollout_s": rollout, "weight_sync_s": sync, "old_logprob_s": old, "ref_logprob_s": ref,
                  "update_s": upd, "offload_s": off}
    # Ranks sharing fewer cores than there are ranks (the cpu profile) run that much slower.
    slow = core_share(e, cluster)
    if slow > 1.0:
        phases = {k: v * slow for k, v in phases.items()}
        step *= slow
    tflops = model_flops / step / gpus
    time = {"step_s": step, "phases": phases}
    throughput = {"tokens_per_s_per_gpu": tokens / step / gpus, "model_tflops_per_gpu": tflops / 1e12,
                  "mfu": tflops / hw.bf16_dense_flops_per_s}
    return time, throughput


def explain(model: ModelSpec, hardware: HardwareSpec, cluster: Cluster, strategy: Strategy, workload: Workload,
            *, calibration: dict[str, float] | None = None) -> dict[str, float]:
    """The figures behind the phase times, for people (``grpo-tune estimate`` prints them)."""
    cal = check_calibration(calibration)
    s, wl = strategy, workload
    if s.dp is None:
        s = s.replace(dp=cluster.gpus // (s.tp * s.pp * s.cp))
    seqs = wl.mini_batch * wl.n if wl.kind == "grpo" else wl.gbs
    seq_len = wl.prompt_len + wl.mean_response_len if wl.kind == "grpo" else wl.seq_len
    tr = train_s(model, hardware, cluster, s, sequences=seqs, seq_len=seq_len, cal=cal)
    m_micro = tr["micro_batches"]
    out = {"micro_batches": m_micro, "bubble_fraction": (s.pp - 1) / (s.vpp * m_micro),
           "dp_exposed_s": tr["dp_s"], "optimizer_s": tr["optimizer_s"]}
    if wl.kind == "grpo":
        native = hardware.native_rollout
        ro = (native_rollout_s if native else rollout_s)(model, hardware, cluster, s, wl, cal)
        out.update(prefill_s=ro["prefill_s"], decode_s=ro["decode_s"], decode_step_s=ro["decode_step_s"],
                   decode_concurrency=ro["concurrency"], decode_memory_bound=ro["memory_bound"])
    return out
