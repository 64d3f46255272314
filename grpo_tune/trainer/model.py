"""A megatron-core GPTModel from a costmodel ModelSpec and Strategy.

Llama / Qwen2 / Qwen3 / Qwen3-MoE map onto megatron's GPT with RMSNorm, SwiGLU, RoPE, GQA
(``num_query_groups``), optional QKV bias (Qwen2) and qk-norm (Qwen3), and MoE layers with
softmax-over-top-k routing (Qwen3-MoE's ``norm_topk_prob``, megatron's default
``moe_router_pre_softmax=False``). DeepSeek-V3 / Moonlight map onto megatron's MLA
(``MLATransformerConfig``, local spec ``multi_latent_attention=True``) and DeepSeek-style MoE
(:func:`moe_kwargs`: shared experts, dense first layers, sigmoid routing with an expert bias,
group-limited top-k). The layer spec is TransformerEngine's when TE is installed and
CUDA is present, else megatron's local (pure torch) spec.

Weights start layout-independent (see :func:`trainer.hf.init_random`): every rank draws the full
tensor from a per-name seed and keeps its shard, so a model has the same weights under any
TP/PP/EP, which is what makes the parity tests meaningful.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from grpo_tune.core.specs import ModelSpec
from grpo_tune.core.strategy import Strategy
from grpo_tune.core.support import SUPPORTED_FAMILIES, first_refusal  # noqa: F401  (re-exported)
from grpo_tune.costmodel.params import padded_vocab

from . import compat
from .parallel import megatron_degrees


def use_transformer_engine() -> bool:
    if compat.active() or not torch.cuda.is_available():
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def compute_dtype(dtype: str) -> torch.dtype:
    """The parameter/compute dtype. On CPU everything runs in fp32 (bf16 is a GPU feature here)."""
    if compat.active():
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]


def check_supported(m: ModelSpec, s: Strategy | None = None) -> None:
    """Raise the first coded refusal of :func:`core.support.check_supported` (the same rules the
    pre-start check and the search apply)."""
    first_refusal(m, s or Strategy())


def transformer_config(
    m: ModelSpec,
    s: Strategy,
    *,
    dtype: str = "fp32",
    aux_loss_coeff: float = 0.0,
    load_balancing_type: str = "aux_loss",
):
    """megatron TransformerConfig for the model under the strategy's degrees."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_supported(m, s)
    dt = compute_dtype(dtype)
    kw = dict(
        num_layers=m.layers,
        hidden_size=m.hidden,
        ffn_hidden_size=m.ffn_hidden or m.expert_ffn_hidden,
        num_attention_heads=m.heads,
        num_query_groups=m.kv_heads,
        kv_channels=m.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=m.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=m.qkv_bias,
        qk_layernorm=m.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        **megatron_degrees(s),
        sequence_parallel=s.layout.sp,
        params_dtype=dt,
        pipeline_dtype=dt,
        bf16=dt == torch.bfloat16,
        fp16=dt == torch.float16,
        # The p2p trap: batched isend/irecv over gloo swaps VPP tensors between the same
        # two peers; unbatched ops pair up in order.
        batch_p2p_comm=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        use_cpu_initialization=compat.active(),
        # True even though weights are overwritten: megatron marks TP-sharded params only while
        # initializing them, and the grad norm skips unmarked params on TP ranks > 0.
        perform_initialization=True,
    )
    if s.layout.first_stage_layers is not None:
        kw["num_layers_in_first_pipeline_stage"] = s.layout.first_stage_layers
    if s.layout.last_stage_layers is not None:
        kw["num_layers_in_last_pipeline_stage"] = s.layout.last_stage_layers
    if s.memory.recompute == "selective":
        kw.update(recompute_granularity="selective")
    elif s.memory.recompute == "full":
        # Strategy.recompute_layers = layers per stage recomputed (None = all): megatron's "block"
        # method recomputes the first N layers of each stage; "uniform" with 1 recomputes every layer.
        if s.memory.recompute_layers is None:
            kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        else:
            kw.update(
                recompute_granularity="full", recompute_method="block", recompute_num_layers=s.memory.recompute_layers
            )
    if m.is_moe:
        kw.update(moe_kwargs(m, aux_loss_coeff=aux_loss_coeff, load_balancing_type=load_balancing_type))
        kw["ffn_hidden_size"] = m.ffn_hidden or m.expert_ffn_hidden  # the dense first layers' MLP
    if m.is_mla:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        kw.update(mla_kwargs(m))
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def moe_kwargs(m: ModelSpec, *, aux_loss_coeff: float = 0.0, load_balancing_type: str = "aux_loss") -> dict:
    """megatron MoE keywords for Qwen3-MoE (softmax over the top-k logits) and DeepSeek-V3
    (sigmoid scores, an expert bias that only picks experts, weights renormalized over the top-k
    and scaled by ``routed_scaling``, group-limited top-k, shared experts, dense first layers).

    Sources: HF ``modeling_deepseek.py`` MoEGate (``noaux_tc``: sigmoid, ``e_score_correction_bias``,
    ``n_group``/``topk_group``, ``norm_topk_prob``, ``routed_scaling_factor``) and megatron-core
    0.16.1 ``moe_utils.topk_routing_with_score_function`` (the same steps for ``sigmoid``).
    GRPO fine-tuning usually leaves the aux loss off (``aux_loss_coeff`` 0 turns it off here).
    """
    kw = dict(
        num_moe_experts=m.experts,
        moe_router_topk=m.top_k,
        moe_ffn_hidden_size=m.expert_ffn_hidden,
        moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type=load_balancing_type if aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=float(aux_loss_coeff) if aux_loss_coeff > 0 else 0.0,
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_router_dtype="fp32",
    )
    if m.family == "deepseek_v3":
        kw.update(
            moe_router_score_function="sigmoid",
            moe_router_pre_softmax=False,
            moe_router_topk_scaling_factor=m.routed_scaling if m.routed_scaling != 1.0 else None,
        )
        if m.router_bias:
            kw.update(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3)
        if m.router_groups > 1:
            kw.update(moe_router_num_groups=m.router_groups, moe_router_group_topk=m.router_group_topk)
    if m.shared_experts:
        kw.update(
            moe_shared_expert_intermediate_size=m.shared_experts * m.expert_ffn_hidden, moe_shared_expert_overlap=False
        )
    if m.dense_layers:
        kw["moe_layer_freq"] = [0] * m.dense_layers + [1] * (m.layers - m.dense_layers)
    return kw


def mla_kwargs(m: ModelSpec) -> dict:
    """megatron MLA keywords (MLATransformerConfig) for DeepSeek-V3 / Moonlight attention.

    ``qk_layernorm`` turns on MLA's two latent norms (HF ``q_a_layernorm`` / ``kv_a_layernorm``).
    Plain RoPE: the spec has no rope_scaling field, so DeepSeek-V3's YaRN (factor 40 beyond 4k
    tokens) is not applied; below 4,096 positions YaRN's low-frequency part equals plain RoPE only
    approximately, which matters for HF-logit equality, not for training on our own weights.
    """
    return dict(
        q_lora_rank=m.q_lora_rank or None,
        kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_nope_head_dim,
        qk_pos_emb_head_dim=m.qk_rope_head_dim,
        v_head_dim=m.v_head_dim,
        kv_channels=m.q_head_dim,
        qk_layernorm=True,
        rope_type="rope",
        rotary_base=m.rope_theta,
    )


def build_chunks(m: ModelSpec, s: Strategy, config) -> list:
    """One GPTModel per virtual pipeline chunk on this rank (one chunk without VPP)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    compat.fix_missing_te_symbols()
    compat.fix_shape_exchange()
    te = use_transformer_engine()
    chunks = []
    vpp = s.layout.vpp if s.layout.vpp > 1 else None
    for vp in range(s.layout.vpp):
        vp_stage = vp if vpp else None
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=te, normalization="RMSNorm", vp_stage=vp_stage)
        if getattr(config, "multi_latent_attention", False) and not te:
            spec = _local_mla_attention(spec)
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=padded_vocab(m, s.layout.tp),
            max_sequence_length=m.max_seq_len,
            pre_process=pre,
            post_process=post,
            parallel_output=True,
            share_embeddings_and_output_weights=m.tied_embeddings,
            position_embedding_type="rope",
            rotary_base=int(m.rope_theta),
            vp_stage=vp_stage,
        )
        if torch.cuda.is_available():
            model.cuda(torch.cuda.current_device())
        chunks.append(model)
    return chunks


def _local_mla_attention(block_spec):
    """Two changes to megatron-core 0.16.1's local MLA spec (on a copy; the specs are shared):

    - its DotProductAttention takes neither ``k_channels`` nor ``v_channels`` (MLA's query/key and
      value head sizes differ): a subclass that sizes the context by ``v_channels``;
    - its down-projections are column-parallel (split by TP), while TransformerEngine's spec, which
      GPUs run and the cost model prices, keeps them whole on every TP rank (``duplicated``): use
      megatron's plain ``Linear``, which MLA accepts and treats the same way (same weights per
      rank, same HF layout, gradients reduced over TP under sequence parallel).
    """
    import copy

    from megatron.core.post_training.modelopt.layers import Linear

    block_spec = copy.deepcopy(block_spec)
    for layer in block_spec.layer_specs:
        sub = layer.submodules.self_attention.submodules
        sub.core_attention = _local_mla_cls()
        sub.linear_q_down_proj = Linear
        sub.linear_kv_down_proj = Linear
    return block_spec


@functools.lru_cache(maxsize=1)
def _local_mla_cls():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class _LocalMLACoreAttention(DotProductAttention):
        """DotProductAttention with a value head size of its own (``v_channels``): the context is
        ``heads/tp x v_channels`` wide. The softmax scale comes from MLA (1/sqrt(q_head_dim))."""

        def __init__(self, *args, k_channels=None, v_channels=None, **kw):
            super().__init__(*args, **kw)
            if v_channels is not None:
                self.hidden_size_per_partition = self.num_attention_heads_per_partition * v_channels

    return _LocalMLACoreAttention


def local_param_count(chunks) -> int:
    """Parameters held by this rank (all its chunks), as stored: shards, not full tensors.

    DeepSeek's router bias counts too: megatron keeps it as a buffer (updated by rule, not by the
    optimizer), but it is a tensor of the HF checkpoint, which is what the cost model counts."""
    seen = set()
    n = 0
    for c in chunks:
        bias = [b for name, b in c.named_buffers() if name.endswith("router.expert_bias")]
        for p in [*c.parameters(), *bias]:
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
    return n
