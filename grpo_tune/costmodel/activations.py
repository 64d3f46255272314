"""Activation and logit bytes per rank (Korthikanti et al. 2022, arXiv 2205.05198), split out of
:mod:`costmodel.memory`, which adds model state, the rollout engine and the phases on top.

Per tensor, with recompute (none / selective / full), sequence and context parallelism, the 1F1B
and interleaved micro-batches in flight, GQA, SwiGLU, MLA and MoE, and the fp32 vocabulary work of
log-probs and entropy. The kernels a profile states (flash attention, fused TE layers or megatron's
local fp32 spec on CPU) decide what autograd keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .params import padded_vocab
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Strategy, Workload, stage_layers

BF16 = 2
FP32 = 4

# Log-prob / entropy over the vocabulary, bytes per token per local vocab entry, as verl 0.9.1 runs them
# on megatron-core 0.16.1 (logits_bytes_per_logit says which applies when):
# - megatron-core tensor_parallel/cross_entropy.py VocabParallelCrossEntropy.forward: the bf16 logits are
#   upcast (calculate_logits_max: .float(), 4 B), exponentiated in place (calculate_predicted_logits:
#   torch.exp(out=)), and only that fp32 exp_logits is saved for backward;
# - verl workers/engine/megatron/transformer_impl.py (the log-prob post-processing) clones the logits
#   (2 B) when it computes the entropy, and verl utils/megatron/tensor_parallel.py
#   _VocabParallelEntropy.forward saves the logits and their softmax (2 B + 2 B, the logits' dtype);
# - verl computes the entropy in every old-log-prob pass (ray_trainer.py _compute_old_log_prob:
#   calculate_entropy=True) and in the update only when entropy_coeff != 0 (_update_actor);
# - use_fused_kernels (verl utils/kernel/linear_cross_entropy.py): log-probs and entropy from the hidden
#   states in vocab splits of 1024, so the logits are never materialised: a few fp32 partials per split.
LOGITS_BYTES = 2 + 4 + 4
"""The update with entropy: bf16 logits (kept by the entropy) + their softmax (2 + 2) and the clone the
cross-entropy upcasts and saves (2 + 4) = 10 B; kept as the figure of the worst case."""
LOGITS_UPDATE_BYTES = 2 + 4
"""The update without entropy (entropy_coeff 0): the bf16 logits until the loss upcasts them, and the fp32
exp_logits the cross-entropy saves."""
LOGITS_FORWARD_BYTES = 2 + 2 + 4
"""A forward-only log-prob pass (with entropy, as verl's old log-prob always is): logits, their clone, and
one fp32 working copy at a time (no_grad: nothing is saved)."""
MOE_IMBALANCE = 1.1
"""Busiest expert rank's routed tokens over the mean: the time model's default (timing_base
CALIBRATION_DEFAULTS moe_imbalance; a test keeps the two equal)."""
FUSED_SPLIT = 1024
"""verl's linear_cross_entropy vocab split (vocab_per_split); three fp32 partials per token per split."""


def logits_bytes_per_logit(*, grad: bool, entropy: bool, fused: bool, act_bytes: int = BF16) -> float:
    """Bytes per token per local vocab entry of the loss path (the table above). A profile whose layers
    run in another dtype (the CPU trainer's local fp32 spec) runs grpo-tune's own loss (trainer/engine.py,
    measured in tests/test_costmodel_memory.py): LOGITS_BYTES with the logits in that dtype, as before."""
    if act_bytes != BF16:
        return LOGITS_BYTES - BF16 + act_bytes
    if fused:
        return 3 * FP32 / FUSED_SPLIT
    if not grad:
        return LOGITS_FORWARD_BYTES
    return LOGITS_BYTES if entropy else LOGITS_UPDATE_BYTES


# ---------------------------------------------------------------------------------------------
# Activations (Korthikanti et al. 2022)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernels:
    """How the trainer's layers run, which decides what autograd keeps."""

    flash: bool = True
    """Flash/fused attention (no score matrix)."""
    fused: bool = True
    """Fused SwiGLU/norm kernels (TransformerEngine); False: megatron's local torch spec."""
    act_bytes: int = BF16
    """Bytes per activation element."""


GPU_KERNELS = Kernels()
# The trainer on CPU: megatron's local spec, unfused attention, everything fp32 (trainer/model.py).
CPU_KERNELS = Kernels(flash=False, fused=False, act_bytes=FP32)


def kernels_for(hardware: HardwareSpec, workload: Workload) -> Kernels:
    """What the trainer's layers keep, from the profile's stated attention kernel and activation
    layout (the same attention kernel the time model prices)."""
    flash = hardware.attention_kernel == "flash"
    if hardware.activation_layout == "local-fp32":
        return Kernels(flash=flash, fused=False, act_bytes=FP32)
    return Kernels(flash=flash, act_bytes=FP32 if workload.dtype == "fp32" else BF16)


def paper_layer_activation_bytes(
    s: int, b: int, h: int, a: int, t: int = 1, *, sp: bool = False, recompute: str = "none"
) -> float:
    """Korthikanti et al. 2022, Table 2: activation bytes of one GPT-3-style layer.

    none: sbh(10 + 24/t + 5as/(ht)), with SP sbh/t (34 + 5as/h) (eqs. 1-4); selective drops the
    5as/h term (sec. 5); full keeps the layer input, 2sbh (/t when SP shards it).
    """
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    quad = 0.0 if recompute == "selective" else 5 * a * s / h
    if sp:
        return sbh / t * (34 + quad)
    return sbh * (10 + 24 / t + quad / t)


@dataclass(frozen=True)
class LayerCoeffs:
    """Bytes stored per token of one micro-batch (per CP rank) for one layer on one rank."""

    linear: float
    """No recompute: everything linear in the tokens."""
    quad: float
    """Bytes per (query token x key token) for the attention scores (0 with flash attention)."""
    layer_input: float
    """The layer input kept by full recompute."""
    selective: float
    """Selective recompute (core attention recomputed): linear bytes kept."""


@lru_cache(maxsize=4096)
def layer_coeffs(
    m: ModelSpec,
    moe: bool,
    tp: int,
    etp: int,
    sp: bool,
    *,
    flash: bool = True,
    paper: bool = False,
    fused: bool = True,
    act_bytes: int = BF16,
    imbalance: float = 1.0,
) -> LayerCoeffs:
    """Per-tensor activation bytes of one layer, after Korthikanti sec. 4.1. ``imbalance``: the busiest
    expert rank's routed tokens over the mean (MoE), as the time model prices them.

    ``paper=True`` is the paper's bookkeeping (LayerNorm, GeLU MLP of 4f bytes, dropout masks after
    attention and MLP, softmax + dropout mask + dropout output = 5 B per score); for a GPT-3 shape
    it reproduces Table 2 exactly. Our variant (default) for today's models, in elements of
    ``act_bytes`` each:
    - no dropout (verl/Megatron GRPO run with dropout 0): no masks, 1 element per score (softmax out);
    - RMSNorm stores its input like LayerNorm (h each), the linear after it its input (h each);
    - GQA: Q heads*hd, K and V kv_heads*hd each, the core-attention output heads*hd;
    - SwiGLU (fused, Megatron's bias_activation_fusion): fc1 writes gate and up (2f), fc2 keeps its
      input (f): 3f instead of GeLU's 2f;
    - flash attention (the GPU default): no score matrix, an fp32 log-sum-exp per head and token;
    - MLA: the down-projections and their norms (replicated, SP-sharded) + Q, K, the kv_b output
      (of which V is a view) and the attention output (TP-sharded);
    - MoE: per routed copy (top_k per token) the expert's fc1 input h (gathered over ETP) plus 3f_e
      split by ETP, spread evenly over the expert grid (balanced routing); the router's fp32 probs
      E per token; shared experts as a TP-sharded SwiGLU.
    ``fused=False`` is megatron-core's local (pure torch) spec, which the trainer runs on CPU; its
    layout was measured with autograd's saved-tensor hooks (tests/test_costmodel_memory.py): torch
    RMSNorm also keeps the normalized input (3h per norm), unfused SwiGLU keeps silu's input,
    output, an add and the product (5f), RoPE's q/k copies keep the whole fused QKV output alive
    under selective recompute (3q + 3kv), and unfused attention without recompute keeps Q, K and V
    expanded to all heads plus the context (4q) and the softmax.
    Under SP the replicated tensors are split by TP too (Korthikanti sec. 4.2.2).
    """
    h = m.hidden
    d_sp = tp if sp else 1
    a = m.heads
    if paper:  # bytes, exactly as the paper counts them
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        rep = 2 * h + 2 * h + 2 * h + 2 * h + h + h  # 2 LN inputs, QKV and fc1 inputs, 2 dropout masks
        shard = 2 * q + 2 * kv * 2 + 2 * q + 4 * m.ffn_hidden  # Q K V, attention out, GeLU in + out
        lin = rep / d_sp + shard / tp
        return LayerCoeffs(linear=lin, quad=5.0 * a / tp, layer_input=2 * h / d_sp, selective=lin)
    fp32 = 0.0  # bytes per token that stay fp32 whatever the activation dtype, already per rank
    expert = 0.0  # elements per token, already per rank
    if m.is_mla:
        rep = 2 * h  # input norm in/out (the down-projections' input)
        if m.q_lora_rank:
            rep += 2 * m.q_lora_rank  # q_a output and its norm output
        rep += (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # kv_a out + norm out
        attn = 2 * a * m.q_head_dim + a * (m.qk_nope_head_dim + m.v_head_dim) + a * m.v_head_dim
        attn_sel = attn
    else:
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        rep = (3 if not fused else 2) * h  # input norm (input[, normalized]) + QKV linear's input
        if fused:
            attn = attn_sel = q + 2 * kv + q  # Q, K, V into core attention; its output into the projection
        else:
            attn_sel = 3 * q + 3 * kv  # fused QKV output (V is a view), RoPE'd Q and K, context
            attn = 4 * q  # without recompute: Q, K and V expanded to all heads, the context
    rep += (3 if not fused else 2) * h  # pre-MLP norm, fc1 (or router/shared-expert) input
    if moe:
        fp32 += FP32 * m.experts / d_sp  # router probabilities
        mlp = 3 * m.shared_experts * m.expert_ffn_hidden
        # Each (token, expert) pair runs on the etp ranks of its expert: h of input each, 3f_e split.
        # A TP group owns T*k distinct pairs (with SP or not), spread over its tp ranks.
        expert = imbalance * m.top_k * (h * etp + 3 * m.expert_ffn_hidden) / tp
    else:
        f = m.ffn_hidden
        mlp = (3 if fused else 5) * f if m.gated_mlp else 2 * f  # SwiGLU 3f (fused) or 5f; GeLU 2f
    lse = 0.0
    if flash:
        lse = FP32 * a / tp  # log-sum-exp per head
        score = 0.0
    else:
        score = 1.0
    lin = act_bytes * (rep / d_sp + (attn + mlp) / tp + expert) + fp32 + lse
    sel = act_bytes * (rep / d_sp + (attn_sel + mlp) / tp + expert) + fp32
    return LayerCoeffs(linear=lin, quad=act_bytes * score * a / tp, layer_input=act_bytes * h / d_sp, selective=sel)


def layer_activation_bytes(c: LayerCoeffs, s_local: int, s_keys: int, b: float, recompute: str) -> float:
    """One layer, one micro-batch: ``s_local`` query tokens per CP rank attending to ``s_keys`` keys."""
    tokens = s_local * b
    if recompute == "full":
        return c.layer_input * tokens
    if recompute == "selective":  # Megatron's default selective recompute is core attention
        return c.selective * tokens
    return c.linear * tokens + c.quad * s_local * s_keys * b


def in_flight_microbatches(pp: int, vpp: int, stage: int, microbatches: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the stage's layers.

    1F1B (Narayanan et al. 2021): stage i holds pp - i. Interleaved: megatron-core's warm-up of
    2(pp-i-1) + (v-1)pp chunk micro-batches plus the one in flight, each 1/v of the stage; on the
    first stage that is pp(1 + (pp-1)/(pp v)), Korthikanti sec. 4.2.3.
    """
    if pp == 1:
        return 1.0
    if vpp == 1:
        return float(min(pp - stage, microbatches))
    chunks = min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, microbatches * vpp)
    return chunks / vpp


@lru_cache(maxsize=4096)
def _stage_layout(m: ModelSpec, stages: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(dense layers, MoE layers) on each stage."""
    out, start = [], 0
    for n in stages:
        moe = sum(1 for i in range(start, start + n) if m.is_moe and i >= m.dense_layers)
        out.append((n - moe, moe))
        start += n
    return tuple(out)


def _stage_coeffs(m: ModelSpec, s: Strategy, k: Kernels) -> tuple[LayerCoeffs, LayerCoeffs | None]:
    lay = s.layout
    kw = dict(flash=k.flash, fused=k.fused, act_bytes=k.act_bytes)
    dense = layer_coeffs(m, False, lay.tp, lay.etp_, lay.sp, **kw)
    # Routing is not balanced: the busiest expert rank holds the time model's imbalance share of the routed
    # tokens (costmodel.timing_base CALIBRATION_DEFAULTS moe_imbalance); with one expert rank (ep 1) it
    # holds them all, exactly.
    imb = MOE_IMBALANCE if lay.ep > 1 else 1.0
    moe = layer_coeffs(m, True, lay.tp, lay.etp_, lay.sp, imbalance=imb, **kw) if m.is_moe else None
    return dense, moe


def train_activation_bytes(
    m: ModelSpec, s: Strategy, *, seq_len: int, mbs: float, microbatches: int, kernels: Kernels = GPU_KERNELS
) -> list[float]:
    """Per stage: activations held at the peak of 1F1B (logits not included)."""
    lay = s.layout
    smem = s.memory
    stages = tuple(stage_layers(m, s))
    layout = _stage_layout(m, stages)
    cd, cm = _stage_coeffs(m, s, kernels)
    s_local = -(-seq_len // lay.cp)  # CP splits the sequence (Megatron context parallel)
    out = []
    for i, ((nd, nm), n) in enumerate(zip(layout, stages)):

        def per_layer(c: LayerCoeffs, rc: str) -> float:
            return layer_activation_bytes(c, s_local, seq_len, mbs, rc)

        if smem.recompute == "full":
            r = n if smem.recompute_layers is None else min(smem.recompute_layers, n)
            # Megatron's "block" method: the first r layers keep their input only, the rest everything.
            keep_nm = max(0, nm - max(0, r - nd))
            keep_nd = max(0, nd - r)
            held = (nd + nm - keep_nd - keep_nm) * cd.layer_input * s_local * mbs
            held += keep_nd * per_layer(cd, "none") + (keep_nm * per_layer(cm, "none") if cm else 0.0)
            # Recomputing a layer in backward re-materializes its full working set once.
            work = max(per_layer(cd, "none") if nd else 0.0, per_layer(cm, "none") if (cm and nm) else 0.0)
        else:
            held = nd * per_layer(cd, smem.recompute) + (nm * per_layer(cm, smem.recompute) if cm else 0.0)
            work = 0.0
        out.append(held * in_flight_microbatches(lay.pp, lay.vpp, i, microbatches) + work)
    return out


def forward_activation_bytes(
    m: ModelSpec, s: Strategy, *, seq_len: int, mbs: float, kernels: Kernels = GPU_KERNELS
) -> float:
    """Forward without grad (log-prob): the residual in and out plus one layer's working set."""
    cd, cm = _stage_coeffs(m, s, kernels)
    s_local = -(-seq_len // s.layout.cp)
    work = layer_activation_bytes(cm if cm is not None else cd, s_local, seq_len, mbs, "none")
    if cm is not None and m.dense_layers:
        work = max(work, layer_activation_bytes(cd, s_local, seq_len, mbs, "none"))
    return work + 2 * cd.layer_input * s_local * mbs


def logits_bytes(
    m: ModelSpec,
    s: Strategy,
    *,
    seq_len: int,
    mbs: float,
    act_bytes: int = BF16,
    grad: bool = True,
    entropy: bool = True,
) -> float:
    """Last stage: the output layer's input (final norm in/out, h each) and the loss path over the
    vocab-parallel logits (:func:`logits_bytes_per_logit`: ``grad`` for the update, ``entropy`` whether
    it is computed, the plan's ``fused_kernels``)."""
    lay = s.layout
    tokens = -(-seq_len // lay.cp) * mbs
    d_sp = lay.tp if lay.sp else 1
    per_vocab = logits_bytes_per_logit(grad=grad, entropy=entropy, fused=s.memory.fused_kernels, act_bytes=act_bytes)
    return tokens * (2 * act_bytes * m.hidden / d_sp + per_vocab * padded_vocab(m, lay.tp) / lay.tp)
