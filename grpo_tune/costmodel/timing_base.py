"""Shared pieces of the time model: calibration knobs, per-model constants, FLOPs per token and
the GEMM-efficiency curve (costmodel.timing assembles the step from them).

Calibration: :data:`CALIBRATION_DEFAULTS` lists the knobs a least-squares fit may move.
"""

from __future__ import annotations

import math
from functools import lru_cache

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.phases import Phase
from grpo_tune.core.specs import Efficiency, HardwareSpec, ModelSpec

from .params import active_params, embedding_params, layer_params, total_params

PHASES = tuple(p.value for p in Phase)

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

# Ranges a calibration fit may explore (autotune.calibrate.fit reads this).
CALIBRATION_BOUNDS: dict[str, tuple[float, float]] = {
    "compute_efficiency_scale": (0.05, 20.0),
    "comm_efficiency_scale": (0.05, 20.0),
    "rollout_efficiency_scale": (0.05, 20.0),
    "moe_imbalance": (1.0, 4.0),
    **{k: (0.0, 3600.0) for k in CALIBRATION_DEFAULTS if k.endswith("_overhead_s")},
}

GRAD_REDUCE_BYTES = 4  # fp32 gradient buffers (Megatron's main_grad), reduced in fp32
PARAM_BYTES = 2  # bf16 weights
ADAM_BYTES_PER_PARAM = 30  # Adam step reads p, g, m, v (fp32) and writes p, m, v + the bf16 copy
OPT_STATE_BYTES = 12  # fp32 master + exp_avg + exp_avg_sq (Megatron distributed optimizer)


def check_calibration(calibration: dict[str, float] | None) -> dict[str, float]:
    """Defaults overlaid with ``calibration``; an unknown key or a bad value is a BAD_CONFIG error."""
    if not calibration:
        return CALIBRATION_DEFAULTS  # read-only
    cal = dict(CALIBRATION_DEFAULTS)
    for k, v in calibration.items():
        if k not in CALIBRATION_DEFAULTS:
            from grpo_tune.core.errors import close_matches

            near = close_matches(str(k), CALIBRATION_DEFAULTS)
            raise ConfigError(
                f"calibration: unknown parameter {k!r}",
                hint=f"did you mean {near[0]!r}?" if near else "known: " + ", ".join(CALIBRATION_DEFAULTS),
            )
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"calibration.{k} must be a finite number >= 0, got {v!r}")
        if (k.endswith("_scale") or k == "moe_imbalance") and not (0 < v <= 1e3):
            raise ConfigError(f"calibration.{k} must be in (0, 1000], got {v!r}")
        if k.endswith("_overhead_s") and v > 1e6:
            raise ConfigError(f"calibration.{k} must be at most 1e6 seconds, got {v!r}")
        cal[k] = float(v)
    return cal


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
    dense_rank_layer = (
        dense_layers * (lp0.sharded + lp0.replicated) + moe_layers * (lpl.sharded + lpl.replicated)
    ) / m.layers
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
        "hf_tensors": float(hf_tensor_count(m)),
    }


def hf_tensor_count(m: ModelSpec) -> int:
    """Tensors of the model in Hugging Face layout: what verl's bridge exports one by one in weight sync."""
    if m.is_mla:
        attn = (3 if m.q_lora_rank else 1) + 3 + 1  # q_a, q_a_norm, q_b (or q_proj); kv_a, kv_a_norm, kv_b; o
    else:
        attn = 4 + (3 if m.qkv_bias else 0) + (2 if m.qk_norm else 0)
    dense_mlp = 3
    moe_mlp = 1 + 3 * m.experts + (3 if m.shared_experts else 0) + (1 if m.router_bias else 0)
    per_dense = attn + 2 + dense_mlp
    per_moe = attn + 2 + moe_mlp
    dense_layers = m.layers - m.moe_layers
    return dense_layers * per_dense + m.moe_layers * per_moe + 2 + (0 if m.tied_embeddings else 1)


def forward_flops_per_token(m: ModelSpec, seq_len: float, *, causal_fraction: float = 0.5) -> float:
    """Whole-model forward FLOPs per token at context ``seq_len``; attention is causal (a fraction
    ``causal_fraction`` of the s x s scores is computed: 0.5 with FlashAttention's block skipping)."""
    c = model_consts(m)
    per_layer = c["dense_flops"] + c["routed_flops"] + c["attn_coef"] * seq_len * causal_fraction
    return m.layers * per_layer + c["head_flops"]


def gemm_efficiency(e: Efficiency, rows: float, k: float, n: float) -> float:
    """Fraction of peak a GEMM (rows x k) @ (k x n) reaches.

    Saturating in the GEMM's arithmetic intensity I = 1/(1/rows + 1/k + 1/n) (FLOPs per element
    moved, up to a constant: the roofline argument of Williams et al. 2009): e_max * I / (I + I_half).
    e_max and I_half are fitted per GPU (profiles/hardware/*.toml [efficiency]).
    """
    if rows <= 0 or k <= 0 or n <= 0:
        return e.gemm_efficiency_max
    i = 1.0 / (1.0 / rows + 1.0 / k + 1.0 / n)
    return e.gemm_efficiency_max * i / (i + e.gemm_intensity_half)


def attention_fraction(hw: HardwareSpec) -> float:
    """Share of the s x s causal scores computed: the profile's figure with flash attention (block
    skipping), all of them with the unfused kernel (masked softmax over the full matrix)."""
    return hw.efficiency.causal_attention_fraction if hw.attention_kernel == "flash" else 1.0
