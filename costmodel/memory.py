"""Bytes per rank, per GRPO phase: ``phase_memory(model, hardware, cluster, strategy, workload)``.

Every figure is the most loaded rank of the worst pipeline stage, per phase. Phases:

- ``update``: the actor's forward/backward/step. Model state follows Megatron's rule
  (docs/source/api-guide/dist_optimizer.md, "bf16 param, fp32 grads": 18 B/param, or 6 + 12/d with
  the distributed optimizer, d the data-parallel group *with* context parallel, since Megatron shards
  the optimizer over the DP x CP group). Activations follow Korthikanti et al. 2022
  (arXiv 2205.05198) per tensor; see :func:`layer_activation_bytes` for our variant.
- ``old_logprob`` / ``ref_logprob``: forward only (one layer's working set + logits).
- ``rollout``: verl's colocated hybrid engine: vLLM takes ``gpu_memory_utilization`` x HBM for its
  weights, its working set and the KV cache; training state that is not offloaded stays resident.
  A profile with ``rollout_engine = "megatron-native"`` (``cpu``) samples with the trainer's own
  Megatron model instead: the actor's weights and one forward's activations, no second copy, no KV cache.
- ``weight_sync``: training weights + the rollout copy + one gathered tensor (verl reshards per tensor).

Offloaded state lives in host memory outside the phase that needs it; the host total per node is
checked against the profile. On the ``cpu`` profile the activations follow the trainer's CPU build
(megatron's local spec, fp32), measured with autograd's saved-tensor hooks to within 1%.
``reserved_memory_bytes`` (CUDA context, NCCL, fragmentation) is already subtracted from the
capacity, so no framework overhead is added here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .results import PhaseMemory, Violation
from .params import padded_vocab, per_stage_params
from core.specs import HardwareSpec, ModelSpec
from core.rules import micro_batches
from core.strategy import Cluster, Strategy, Workload, stage_layers

GiB = 1024**3
BF16 = 2
FP32 = 4

# Log-prob / entropy over the vocabulary, per token per local vocab entry: the output layer's bf16
# logits (2 B), the fp32 copy that verl's log-prob/entropy kernels work on (4 B) and the fp32
# softmax kept for backward (4 B). Korthikanti sec. 4.3 counts 4 B (fp32 cross-entropy) alone.
LOGITS_BYTES = 2 + 4 + 4
# vLLM's max_num_batched_tokens / max_num_seqs (Strategy fields; verl 0.9.1 defaults 8192 / 256,
# rollout.yaml l.78/l.84) size vLLM's profiling run, whose peak is kept out of the KV cache.
SYNC_BUCKET_BYTES = 2048 * 2**20  # verl's update_weights_bucket_megabytes default (rollout.yaml l.296)
ADAM_STEP_TEMP = 4 / 12  # Adam step temporaries over optimizer-state bytes (one fp32 per param of 12 B of state)
CUDA_GRAPH_BYTES = 0.5 * 2**30
"""vLLM's captured CUDA graphs (decode batches up to 512), kept outside the KV cache; an assumption
of the size vLLM logs for 7-8B models ("Graph capturing finished ... took ~0.5 GiB"), not measured here."""


# ---------------------------------------------------------------------------------------------
# Model state
# ---------------------------------------------------------------------------------------------

# docs/source/api-guide/dist_optimizer.md, bytes per parameter as (weights, grads, optimizer):
# bf16 params + fp32 grads: 2 + 4 + 12 (fp32 master, m, v) = 18; fp16 params + fp16 grads:
# 2 + 2 + 16 (fp32 master params and grads, m, v) = 20; fp32: 4 + 4 + 8 (m, v) = 16.
STATE_BYTES = {"bf16": (2, 4, 12), "fp16": (2, 2, 16), "fp32": (4, 4, 8)}


def model_state_bytes_per_param(d: int, distributed_optimizer: bool, dtype: str = "bf16") -> float:
    """Megatron's rule: 18 B/param for bf16, or 6 + 12/d with the distributed optimizer (which
    shards only the optimizer part over the d data-parallel ranks)."""
    w, g, o = STATE_BYTES[dtype]
    return w + g + (o / d if distributed_optimizer else o)


@dataclass(frozen=True)
class ModelState:
    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def model_state_bytes(
    dense: int,
    expert: int,
    *,
    dp: int,
    cp: int,
    tp: int,
    ep: int,
    etp: int,
    distributed_optimizer: bool,
    dtype: str = "bf16",
) -> ModelState:
    """Weights, main grads (Megatron's DDP grad buffer) and optimizer state on one rank.

    The distributed optimizer shards dense state over DP x CP and expert state over expert-DP =
    tp*cp*dp/(ep*etp) (Megatron's MoE parallel folding, arXiv 2504.14960).
    """
    w, g, o = STATE_BYTES[dtype]
    n = dense + expert
    if distributed_optimizer:
        edp = max(1, tp * cp * dp // (ep * etp))
        opt = o * (dense / (dp * cp) + expert / edp)
    else:
        opt = float(o * n)
    return ModelState(weights=float(w * n), grads=float(g * n), optimizer=opt)


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
) -> LayerCoeffs:
    """Per-tensor activation bytes of one layer, after Korthikanti sec. 4.1.

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
        expert = m.top_k * (h * etp + 3 * m.expert_ffn_hidden) / tp
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
    kw = dict(flash=k.flash, fused=k.fused, act_bytes=k.act_bytes)
    dense = layer_coeffs(m, False, s.tp, s.etp_, s.sp, **kw)
    moe = layer_coeffs(m, True, s.tp, s.etp_, s.sp, **kw) if m.is_moe else None
    return dense, moe


def train_activation_bytes(
    m: ModelSpec, s: Strategy, *, seq_len: int, mbs: float, microbatches: int, kernels: Kernels = GPU_KERNELS
) -> list[float]:
    """Per stage: activations held at the peak of 1F1B (logits not included)."""
    stages = tuple(stage_layers(m, s))
    layout = _stage_layout(m, stages)
    cd, cm = _stage_coeffs(m, s, kernels)
    s_local = -(-seq_len // s.cp)  # CP splits the sequence (Megatron context parallel)
    out = []
    for i, ((nd, nm), n) in enumerate(zip(layout, stages)):

        def per_layer(c, rc):
            return layer_activation_bytes(c, s_local, seq_len, mbs, rc)

        if s.recompute == "full":
            r = n if s.recompute_layers is None else min(s.recompute_layers, n)
            # Megatron's "block" method: the first r layers keep their input only, the rest everything.
            keep_nm = max(0, nm - max(0, r - nd))
            keep_nd = max(0, nd - r)
            held = (nd + nm - keep_nd - keep_nm) * cd.layer_input * s_local * mbs
            held += keep_nd * per_layer(cd, "none") + (keep_nm * per_layer(cm, "none") if cm else 0.0)
            # Recomputing a layer in backward re-materializes its full working set once.
            work = max(per_layer(cd, "none") if nd else 0.0, per_layer(cm, "none") if (cm and nm) else 0.0)
        else:
            held = nd * per_layer(cd, s.recompute) + (nm * per_layer(cm, s.recompute) if cm else 0.0)
            work = 0.0
        out.append(held * in_flight_microbatches(s.pp, s.vpp, i, microbatches) + work)
    return out


def forward_activation_bytes(
    m: ModelSpec, s: Strategy, *, seq_len: int, mbs: float, kernels: Kernels = GPU_KERNELS
) -> float:
    """Forward without grad (log-prob): the residual in and out plus one layer's working set."""
    cd, cm = _stage_coeffs(m, s, kernels)
    s_local = -(-seq_len // s.cp)
    work = layer_activation_bytes(cm if cm is not None else cd, s_local, seq_len, mbs, "none")
    if cm is not None and m.dense_layers:
        work = max(work, layer_activation_bytes(cd, s_local, seq_len, mbs, "none"))
    return work + 2 * cd.layer_input * s_local * mbs


def logits_bytes(m: ModelSpec, s: Strategy, *, seq_len: int, mbs: float, act_bytes: int = BF16) -> float:
    """Last stage: the output layer's input (final norm in/out, h each) and the vocab-parallel logits."""
    tokens = -(-seq_len // s.cp) * mbs
    d_sp = s.tp if s.sp else 1
    per_vocab = LOGITS_BYTES - BF16 + act_bytes  # the output layer writes logits in the activation dtype
    return tokens * (2 * act_bytes * m.hidden / d_sp + per_vocab * padded_vocab(m, s.tp) / s.tp)


# ---------------------------------------------------------------------------------------------
# Rollout (vLLM, colocated)
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def rollout_weight_bytes(m: ModelSpec, rollout_tp: int) -> float:
    """bf16 weights on one vLLM rank: linears and vocab split by TP, norms/router replicated.

    With rollout_tp > kv_heads, vLLM replicates each KV head, so K/V weights do not shrink below one head.
    """
    st = per_stage_params(m, Strategy(tp=rollout_tp, etp=rollout_tp))[0]
    n = float(st.total)
    if not m.is_mla and rollout_tp > m.kv_heads:
        kv_w = 2 * m.hidden * m.kv_heads * m.head_dim + (2 * m.kv_heads * m.head_dim if m.qkv_bias else 0)
        n += m.layers * kv_w * (1 / m.kv_heads - 1 / rollout_tp)
    return BF16 * n


@lru_cache(maxsize=1024)
def kv_bytes_per_token(m: ModelSpec, rollout_tp: int) -> float:
    """KV-cache bytes per token on one rollout rank (bf16).

    GQA/MHA: 2 (K, V) x layers x kv heads per rank x head_dim x 2 B, kv heads replicated when
    rollout_tp > kv_heads. MLA (DeepSeek-V2 sec. 2.1.2): the latent (kv_lora_rank + rope dim) per
    layer, which vLLM keeps whole on every TP rank.
    """
    if m.is_mla:
        return float(m.layers * (m.kv_lora_rank + m.qk_rope_head_dim) * BF16)
    heads = max(1, m.kv_heads // rollout_tp)
    return float(2 * m.layers * heads * m.head_dim * BF16)


@lru_cache(maxsize=1024)
def rollout_working_bytes(
    m: ModelSpec, rollout_tp: int, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192
) -> float:
    """vLLM's profiled peak outside weights and KV: one layer's forward at max_num_batched_tokens
    (no score matrix, paged/flash attention) plus the sampler's fp32 logits for max_num_seqs."""
    c = layer_coeffs(m, m.is_moe, rollout_tp, rollout_tp, False, flash=True)
    return max_num_batched_tokens * (c.linear + 2 * 2 * m.hidden) + max_num_seqs * m.vocab * FP32


@dataclass(frozen=True)
class KvCapacity:
    budget_bytes: float
    """gpu_memory_utilization x HBM: what vLLM takes."""
    weights_bytes: float
    working_bytes: float
    kv_bytes: float
    """What is left for the KV cache (can be <= 0: vLLM would fail to start)."""
    bytes_per_token: float
    tokens: int
    sequences: int
    """Sequences of prompt_len + response_len that fit at once, per rollout replica."""
    replicas: int

    def to_info(self) -> dict[str, float]:
        return {
            "kv_cache_tokens": self.tokens,
            "max_concurrent_sequences": self.sequences,
            "rollout_replicas": self.replicas,
            "kv_bytes_per_token": self.bytes_per_token,
        }


def kv_cache_capacity(
    model: ModelSpec, hardware: HardwareSpec, strategy: Strategy, workload: Workload, gpus: int | None = None
) -> KvCapacity:
    """The KV cache that ``gpu_memory_utilization`` leaves, and the concurrent sequences it holds."""
    budget = strategy.gpu_memory_utilization * hardware.hbm_bytes
    w = rollout_weight_bytes(model, strategy.rollout_tp)
    work = rollout_working_bytes(model, strategy.rollout_tp, strategy.max_num_seqs, strategy.max_num_batched_tokens)
    if not strategy.enforce_eager:
        work += CUDA_GRAPH_BYTES
    kv = budget - w - work
    per_tok = kv_bytes_per_token(model, strategy.rollout_tp)
    tokens = int(kv // per_tok) if kv > 0 else 0
    seq = workload.prompt_len + workload.response_len
    return KvCapacity(
        budget_bytes=budget,
        weights_bytes=w,
        working_bytes=work,
        kv_bytes=kv,
        bytes_per_token=per_tok,
        tokens=tokens,
        sequences=tokens // seq,
        replicas=(gpus // strategy.rollout_tp) if gpus else 0,
    )


@lru_cache(maxsize=1024)
def sync_bucket_bytes(m: ModelSpec, ep: int) -> float:
    """The largest tensor gathered whole while verl reshards training weights for vLLM
    (verl.utils.megatron_utils.per_tensor_generator gathers one tensor at a time over TP/EP)."""
    biggest = max(m.vocab * m.hidden, 2 * m.ffn_hidden * m.hidden, (m.heads + 2 * m.kv_heads) * m.head_dim * m.hidden)
    if m.is_moe:
        biggest = max(biggest, ep * 2 * m.expert_ffn_hidden * m.hidden)
    return float(BF16 * biggest)


# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------


def _microbatches(s: Strategy, w: Workload) -> int:
    seqs = w.mini_batch * w.n if w.kind == "grpo" else w.gbs
    dp = s.dp
    assert dp is not None, "phase_memory takes a resolved strategy (validate fills dp)"
    if s.max_tokens_per_gpu:
        return max(1, -(-int(seqs * w.mean_seq_len) // (dp * s.max_tokens_per_gpu * s.cp)))
    return micro_batches(seqs, dp=dp, mbs=s.mbs)


def micro_batch_shape(s: Strategy, w: Workload, cap: int | None) -> tuple[int, float]:
    """(sequence length, sequences) of the largest micro-batch a rank holds: ``mbs`` sequences of
    the maximum length, or with dynamic batching a token cap filled by sequences of up to the
    maximum length (verl asserts the cap holds the longest sequence)."""
    seq = w.train_seq_len
    if not cap:
        return seq, float(s.mbs)
    cap_rank = cap  # per CP rank (verl scales the cap by the CP size, and CP splits the sequence)
    seq_eff = min(seq, cap_rank * s.cp)
    return seq_eff, cap_rank * s.cp / seq_eff


def phase_memory(
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    strategy: Strategy,
    workload: Workload,
    *,
    kernels: Kernels | None = None,
) -> tuple[dict[str, PhaseMemory], float, list[Violation]]:
    """Bytes per phase on the most loaded rank, host bytes per node, and coded violations.

    ``strategy`` must be resolved (``validate`` fills dp/etp/sequence_parallel). ``kernels``: what
    the layers run (default: :func:`kernels_for`, from the profile's attention kernel and
    activation layout).
    """
    m, s, w = model, strategy, workload
    k = kernels or kernels_for(hardware, w)
    dtype = "fp32" if k.act_bytes == FP32 else w.dtype
    stages = per_stage_params(m, s)
    seq, mbs = micro_batch_shape(s, w, s.max_tokens_per_gpu)
    acts = train_activation_bytes(m, s, seq_len=seq, mbs=mbs, microbatches=_microbatches(s, w), kernels=k)
    logit = logits_bytes(m, s, seq_len=seq, mbs=mbs, act_bytes=k.act_bytes)
    last = len(stages) - 1
    # Stages with the same parameters differ only in activations: per (params, last?) keep the
    # stage that holds the most. Two or three candidates instead of pp, for speed.
    best: dict[tuple[int, int, bool], int] = {}
    for i, p in enumerate(stages):
        key = (p.dense, p.expert, i == last)
        j = best.get(key)
        if j is None or acts[i] > acts[j]:
            best[key] = i
    full = {
        i: model_state_bytes(
            stages[i].dense,
            stages[i].expert,
            dp=s.dp or 1,
            cp=s.cp,
            tp=s.tp,
            ep=s.ep,
            etp=s.etp_,
            distributed_optimizer=s.distributed_optimizer,
            dtype=dtype,
        )
        for i in sorted(best.values())
    }
    # Megatron's hybrid CPU optimizer keeps only the GPU share of the optimizer state on the GPU.
    gpu_share = 1.0 - (s.cpu_optimizer or 0.0)
    states = {i: ModelState(st.weights, st.grads, st.optimizer * gpu_share) for i, st in full.items()}
    kvc = (
        kv_cache_capacity(m, hardware, s, w, cluster.gpus)
        if (w.kind == "grpo" and not hardware.native_rollout)
        else None
    )
    out = _phases(m, hardware, s, w, k, states, acts, logit, last, kvc)
    violations = _violations(out, hardware, w, kvc)
    host = _host_bytes(s, w, full, cluster)
    if host > hardware.host_memory_bytes:
        violations.append(
            Violation(
                "OOM_RISK",
                f"offloaded state needs {host / GiB:.1f} GiB of host memory per node "
                f"> {hardware.host_memory_bytes / GiB:.1f} GiB",
                phase="host",
                bytes_over=host - hardware.host_memory_bytes,
            )
        )
    return out, host, violations


def _phases(m, hardware, s, w, k, states, acts, logit, last, kvc) -> dict[str, PhaseMemory]:
    """Per phase, the worst candidate stage's parts. Offload follows verl 0.9.1
    (verl/utils/megatron_utils.py): param_offload moves weights to the host and frees the gradient
    buffers outside the update; optimizer_offload brings the optimizer back for the whole update
    (all mini-batches), so it adds to the activations' peak rather than replacing it."""
    off = set(s.offload)
    kl = w.kind == "grpo" and w.kl
    p_off, o_off = "param" in off, "optimizer" in off
    g_off = "grad" in off or p_off
    native = hardware.native_rollout
    resident = kvc.budget_bytes if (kvc is not None and not s.free_cache_engine) else 0.0
    # A sleeping vLLM (free_cache_engine) releases its weights and KV cache but keeps its captured
    # CUDA graphs' memory pool through the training phases (vllm-project/vllm#56373: "Level-1 cuMem
    # sleep releases weights and KV cache, but leaves graph executables and native CUDA graph pools
    # resident"; #45648 shows the same at level 2 on H20).
    graphs = CUDA_GRAPH_BYTES if (kvc is not None and s.free_cache_engine and not s.enforce_eager) else 0.0
    ref = ("ref_weights",) if kl else ()
    state_keys = ("weights", "grads", "optimizer") + ref
    extra = ("vllm_resident",) if resident else (("vllm_cuda_graphs",) if graphs else ())
    resident = resident or graphs

    def res(st: ModelState, weights_needed: bool) -> tuple[float, ...]:
        r = (
            st.weights if (weights_needed or not p_off) else 0.0,
            0.0 if g_off else st.grads,
            0.0 if o_off else st.optimizer,
        )
        return r + ((0.0 if p_off else st.weights),) if kl else r

    rows: dict[str, tuple[tuple[str, ...], list[tuple[float, ...]]]] = {}
    upd = []
    for i, st in states.items():
        refw = (0.0 if p_off else st.weights,) if kl else ()
        tail = (resident,) if resident else ()
        fb = (st.weights, st.grads, st.optimizer) + refw + (acts[i], logit if i == last else 0.0, 0.0) + tail
        # The optimizer step, after the activations are freed: torch's foreach Adam (what Megatron
        # falls back to, verl#3124's traceback) allocates sqrt(exp_avg_sq) for the whole shard, one
        # fp32 value per parameter (torch/optim/adam.py _multi_tensor_adam): a third of the 12 B of state.
        step = (st.weights, st.grads, st.optimizer) + refw + (0.0, 0.0, st.optimizer * ADAM_STEP_TEMP) + tail
        upd.append(fb if sum(fb) >= sum(step) else step)
    if w.kind == "grpo":
        fseq, fmbs = micro_batch_shape(s, w, s.log_prob_max_tokens_per_gpu or s.max_tokens_per_gpu)
        fwd = forward_activation_bytes(m, s, seq_len=fseq, mbs=fmbs, kernels=k)
        flog = logits_bytes(m, s, seq_len=fseq, mbs=fmbs, act_bytes=k.act_bytes)
        olp, rlp, ws, ro = [], [], [], []
        bucket = min(SYNC_BUCKET_BYTES, BF16 * float(per_stage_params(m, Strategy())[0].total)) + sync_bucket_bytes(
            m, s.ep
        )
        for i, st in states.items():
            lg = flog if i == last else 0.0
            need = res(st, True)
            olp.append(need + (fwd, lg) + ((resident,) if resident else ()))
            if kl:
                rlp.append(res(st, False)[:3] + (st.weights, fwd, lg) + ((resident,) if resident else ()))
            if native:  # the trainer's own sampler: live actor weights, one forward, no KV cache
                ws.append(need + (0.0, 0.0))
                ro.append(need + (0.0, fwd + lg, 0.0))
            else:  # verl wakes vLLM's weights first, the KV cache only after the sync
                ws.append(need + (kvc.weights_bytes, bucket))
                ro.append(res(st, False) + (kvc.weights_bytes, kvc.working_bytes, max(0.0, kvc.kv_bytes)))
        rows["rollout"] = (state_keys + ("rollout_weights", "rollout_activations", "rollout_kv_cache"), ro)
        rows["weight_sync"] = (state_keys + ("rollout_weights", "sync_bucket"), ws)
        rows["old_logprob"] = (state_keys + ("activations", "logits") + extra, olp)
        if kl:
            rows["ref_logprob"] = (state_keys + ("activations", "logits") + extra, rlp)
    rows["update"] = (state_keys + ("activations", "logits", "optimizer_step") + extra, upd)
    out: dict[str, PhaseMemory] = {}
    for name, (keys, vals) in rows.items():
        worst = vals[0] if len(vals) == 1 else max(vals, key=sum)
        info: dict[str, float] = {}
        if name == "rollout":
            info = {"native_rollout": 1.0} if native else kvc.to_info()
        out[name] = PhaseMemory(name, dict(zip(keys, map(float, worst))), info)
    return out


def _violations(
    out: dict[str, PhaseMemory], hardware: HardwareSpec, w: Workload, kvc: KvCapacity | None
) -> list[Violation]:
    cap = hardware.hbm_bytes - hardware.reserved_memory_bytes
    violations: list[Violation] = []
    for name, pm in out.items():
        tot = pm.total_bytes
        if tot > cap:
            violations.append(
                Violation(
                    "OOM_RISK",
                    f"phase {name} needs {tot / GiB:.1f} GiB > {cap / GiB:.1f} GiB capacity "
                    f"({(tot - cap) / GiB:.1f} GiB over; largest part: {max(pm.parts, key=lambda k: pm.parts[k])})",
                    phase=name,
                    bytes_over=tot - cap,
                )
            )
    if kvc is not None:
        if kvc.kv_bytes <= 0:
            violations.append(
                Violation(
                    "OOM_RISK",
                    f"gpu_memory_utilization gives vLLM {kvc.budget_bytes / GiB:.1f} GiB, less than its "
                    f"weights + working set ({(kvc.weights_bytes + kvc.working_bytes) / GiB:.1f} GiB): no KV cache",
                    phase="rollout",
                    bytes_over=-kvc.kv_bytes,
                )
            )
        elif kvc.sequences < 1:
            need = (w.prompt_len + w.response_len) * kvc.bytes_per_token
            violations.append(
                Violation(
                    "OOM_RISK",
                    f"the KV cache ({kvc.tokens} tokens) cannot hold one sequence of "
                    f"{w.prompt_len + w.response_len} tokens; raise gpu_memory_utilization or rollout_tp",
                    phase="rollout",
                    bytes_over=need - kvc.kv_bytes,
                )
            )
    return violations


def _host_bytes(s: Strategy, w: Workload, states: dict[int, ModelState], cluster: Cluster) -> float:
    """Host memory per node: every rank keeps its offloaded state there (worst stage), and the
    CPU optimizer's share of the optimizer state (fp32 master + moments) plus its fp32 grad copy."""
    off = set(s.offload)
    kl = w.kind == "grpo" and w.kl
    host_rank = 0.0
    f = s.cpu_optimizer or 0.0
    for st in states.values():
        h = (st.weights * (2 if kl else 1) if "param" in off else 0.0) + (st.grads + st.optimizer) * f
        if "optimizer" in off:
            h += st.optimizer * (1.0 - f)
        host_rank = max(host_rank, h)
    return host_rank * min(cluster.gpus_per_node, cluster.gpus)


__all__ = [
    "CPU_KERNELS",
    "GPU_KERNELS",
    "Kernels",
    "KvCapacity",
    "LayerCoeffs",
    "ModelState",
    "forward_activation_bytes",
    "in_flight_microbatches",
    "kernels_for",
    "kv_bytes_per_token",
    "kv_cache_capacity",
    "layer_activation_bytes",
    "layer_coeffs",
    "logits_bytes",
    "model_state_bytes",
    "model_state_bytes_per_param",
    "paper_layer_activation_bytes",
    "phase_memory",
    "rollout_weight_bytes",
    "sync_bucket_bytes",
    "train_activation_bytes",
]
