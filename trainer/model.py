"""A megatron-core GPTModel from a costmodel ModelSpec and Strategy.

Llama / Qwen2 / Qwen3 / Qwen3-MoE map onto megatron's GPT with RMSNorm, SwiGLU, RoPE, GQA
(``num_query_groups``), optional QKV bias (Qwen2) and qk-norm (Qwen3), and MoE layers with
softmax-over-top-k routing (Qwen3-MoE's ``norm_topk_prob``, megatron's default
``moe_router_pre_softmax=False``). The layer spec is TransformerEngine's when TE is installed and
CUDA is present, else megatron's local (pure torch) spec.

Weights start layout-independent (see :func:`trainer.hf.init_random`): every rank draws the full
tensor from a per-name seed and keeps its shard, so a model has the same weights under any
TP/PP/EP, which is what makes the parity tests meaningful.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from core.errors import ConfigError
from costmodel.params import padded_vocab
from core.specs import ModelSpec
from core.strategy import Strategy

from . import compat
from .parallel import megatron_degrees

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")


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
    """Raise a coded error for what the trainer cannot build (callable before any process starts)."""
    if s is not None and s.cp > 1:
        raise ConfigError("cp > 1 is not implemented in the trainer (inputs are not split per CP rank)",
                          hint="set strategy.cp: 1 for `grpo-tune train` / `profile`")
    if m.family not in SUPPORTED_FAMILIES or m.is_mla or m.dense_layers or m.shared_experts:
        raise ConfigError(
            f"model {m.name} ({m.family}) is not supported by the trainer",
            hint=f"the trainer builds {', '.join(SUPPORTED_FAMILIES)} models (no MLA, shared or dense-first experts)",
        )


def transformer_config(m: ModelSpec, s: Strategy, *, dtype: str = "fp32"):
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
        sequence_parallel=s.sp,
        params_dtype=dt,
        pipeline_dtype=dt,
        bf16=dt == torch.bfloat16,
        fp16=dt == torch.float16,
        # The p2p trap of issue 5: batched isend/irecv over gloo swaps VPP tensors between the same
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
    if s.first_stage_layers is not None:
        kw["num_layers_in_first_pipeline_stage"] = s.first_stage_layers
    if s.last_stage_layers is not None:
        kw["num_layers_in_last_pipeline_stage"] = s.last_stage_layers
    if s.recompute == "selective":
        kw.update(recompute_granularity="selective")
    elif s.recompute == "full":
        # Strategy.recompute_layers = layers per stage recomputed (None = all): megatron's "block"
        # method recomputes the first N layers of each stage; "uniform" with 1 recomputes every layer.
        if s.recompute_layers is None:
            kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        else:
            kw.update(recompute_granularity="full", recompute_method="block", recompute_num_layers=s.recompute_layers)
    if m.is_moe:
        kw.update(
            num_moe_experts=m.experts,
            moe_router_topk=m.top_k,
            moe_ffn_hidden_size=m.expert_ffn_hidden,
            moe_token_dispatcher_type="alltoall",
            moe_router_load_balancing_type="none",  # no aux loss: GRPO fine-tuning keeps routing as is
            moe_aux_loss_coeff=0.0,
            moe_grouped_gemm=False,
            moe_permute_fusion=False,
            moe_router_dtype="fp32",
        )
    return TransformerConfig(**kw)


def build_chunks(m: ModelSpec, s: Strategy, config) -> list:
    """One GPTModel per virtual pipeline chunk on this rank (one chunk without VPP)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    compat.fix_missing_te_symbols()
    te = use_transformer_engine()
    chunks = []
    vpp = s.vpp if s.vpp > 1 else None
    for vp in range(s.vpp):
        vp_stage = vp if vpp else None
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=te, normalization="RMSNorm",
                                          vp_stage=vp_stage)
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=padded_vocab(m, s.tp),
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


def local_param_count(chunks) -> int:
    """Parameters held by this rank (all its chunks), as stored: shards, not full tensors."""
    seen = set()
    n = 0
    for c in chunks:
        for p in c.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
    return n
