"""Megatron-LM ``pretrain_gpt.py`` flags for a run config (``megatron_args.txt`` of a run folder).

Every flag written here is checked against the flags declared in Megatron-LM's
``megatron/training/arguments.py`` (``data/`` beside this module) in tests/test_export_megatron.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from grpo_tune.core.config import RunConfig
from grpo_tune.core.strategy import stage_layers


DATA_DIR = Path(__file__).resolve().parent / "data"
FLAGS_FILE = DATA_DIR / "megatron-lm-arguments-flags.txt"


def megatron_args(cfg: RunConfig) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` flags for the same plan (training side only).

    Rollout settings have no Megatron-LM equivalent, nor have offload between phases (verl's
    param/optimizer offload) and dynamic batching (verl's token-budget micro-batches): the text form
    says so in comments. Megatron's hybrid CPU optimizer is ``--optimizer-cpu-offload``.
    """
    m, s, w = cfg.model, cfg.strategy, cfg.workload
    a: list[str] = [
        "--tensor-model-parallel-size",
        str(s.layout.tp),
        "--pipeline-model-parallel-size",
        str(s.layout.pp),
        "--context-parallel-size",
        str(s.layout.cp),
    ]
    if s.layout.vpp > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", str(s.layout.vpp)]
    if s.layout.first_stage_layers is not None:
        a += ["--decoder-first-pipeline-num-layers", str(s.layout.first_stage_layers)]
    if s.layout.last_stage_layers is not None:
        a += ["--decoder-last-pipeline-num-layers", str(s.layout.last_stage_layers)]
    if m.is_moe:
        a += ["--expert-model-parallel-size", str(s.layout.ep), "--expert-tensor-parallel-size", str(s.layout.etp_)]
    if s.layout.sp:
        a.append("--sequence-parallel")
    # DP gradient reduce-scatter overlapped with backward, and (distributed optimizer) the parameter all-gather
    # with the next forward: what verl's Megatron engine turns on (overlap_grad_reduce/overlap_param_gather);
    # Megatron-LM requires the second to come with the first and the distributed optimizer (validate_args)
    a.append("--overlap-grad-reduce")
    if s.memory.distributed_optimizer:
        a += ["--use-distributed-optimizer", "--overlap-param-gather"]
    if s.memory.cpu_optimizer is not None:  # Megatron's hybrid CPU optimizer (training group of arguments.py)
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", repr(float(s.memory.cpu_optimizer))]
    if s.memory.overlap_cpu_optimizer:
        a.append("--overlap-cpu-optimizer-d2h-h2d")
    if s.memory.precision_aware_optimizer:
        a.append("--use-precision-aware-optimizer")
    if s.memory.recompute == "selective":
        a += ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]
    elif s.memory.recompute == "full":
        method, n = ("uniform", 1) if s.memory.recompute_layers is None else ("block", s.memory.recompute_layers)
        a += ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", str(n)]
    # GRPO: one optimizer step per PPO mini-batch of mini_batch prompts x n responses.
    gbs = w.mini_batch * w.n if w.kind == "grpo" else w.gbs
    a += [
        "--micro-batch-size",
        str(s.batching.mbs),
        "--global-batch-size",
        str(gbs),
        "--seq-length",
        str(w.train_seq_len),
        "--max-position-embeddings",
        str(max(m.max_seq_len, w.train_seq_len)),
    ]
    if w.dtype in ("bf16", "fp16"):  # fp32 is Megatron's default: no flag
        a.append(f"--{w.dtype}")
    if cfg.strategy.precision.precision == "fp8":  # TE FP8 GEMMs, e4m3 with block scaling (docs/precision.md)
        a += ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"]
    # the model's own tokenizer (Hugging Face id); a model without one (tiny, a local config) gets Megatron's
    # NullTokenizer over --vocab-size
    if m.hf_id:
        a += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", m.hf_id]
    else:
        a += ["--tokenizer-type", "NullTokenizer"]
    return a + _model_args(cfg)


def _model_args(cfg: RunConfig) -> list[str]:
    """The model's shape, attention and MoE flags."""
    m = cfg.model
    a = [
        "--num-layers",
        str(m.layers),
        "--hidden-size",
        str(m.hidden),
        "--num-attention-heads",
        str(m.heads),
        "--vocab-size",
        str(m.vocab),
        "--make-vocab-size-divisible-by",
        "128",
        "--normalization",
        "RMSNorm",
        "--norm-epsilon",
        repr(m.norm_eps),
        "--swiglu",
        "--position-embedding-type",
        "rope",
        "--rotary-base",
        str(int(m.rope_theta)),
        "--disable-bias-linear",
    ]
    if m.ffn_hidden:
        a += ["--ffn-hidden-size", str(m.ffn_hidden)]
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if m.qkv_bias:
        a.append("--add-qkv-bias")
    if m.qk_norm:
        a.append("--qk-layernorm")
    if m.is_mla:
        a += [
            "--multi-latent-attention",
            "--kv-lora-rank",
            str(m.kv_lora_rank),
            "--qk-head-dim",
            str(m.qk_nope_head_dim),
            "--qk-pos-emb-head-dim",
            str(m.qk_rope_head_dim),
            "--v-head-dim",
            str(m.v_head_dim),
        ]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
    else:
        a += ["--kv-channels", str(m.head_dim)]
        if m.kv_heads != m.heads:
            a += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.is_moe:
        a += [
            "--num-experts",
            str(m.experts),
            "--moe-router-topk",
            str(m.top_k),
            "--moe-ffn-hidden-size",
            str(m.expert_ffn_hidden),
            "--moe-grouped-gemm",
            "--moe-token-dispatcher-type",
            "alltoall",
        ]
        if m.shared_experts:
            a += ["--moe-shared-expert-intermediate-size", str(m.shared_experts * m.expert_ffn_hidden)]
        if m.dense_layers:
            # Megatron's list pattern: 0 = dense layer, 1 = MoE layer
            a += ["--moe-layer-freq", f"([0]*{m.dense_layers}+[1]*{m.layers - m.dense_layers})"]
        t = cfg.trainer
        a += [
            "--moe-router-load-balancing-type",
            t.moe_router_load_balancing_type,
            "--moe-aux-loss-coeff",
            repr(float(t.moe_aux_loss_coeff)),
        ]
        if m.router_bias:  # DeepSeek-V3 aux-loss-free balancing with sigmoid scores (arXiv 2412.19437 §2.1.2)
            a += ["--moe-router-enable-expert-bias", "--moe-router-score-function", "sigmoid"]
    return a


def megatron_args_text(cfg: RunConfig) -> str:
    """``megatron_args`` as a file: one flag (with its value) per line, with a header."""
    s = cfg.strategy
    pool = cfg.cluster.gpus - cfg.placement.rollout_gpus if cfg.placement.separate else cfg.cluster.gpus
    where = (
        f"the training pool's {pool} GPUs (of {cfg.cluster.gpus}; {cfg.placement.rollout_gpus} generate)"
        if cfg.placement.separate
        else f"{pool} GPUs"
    )
    out = [
        f"# Megatron-LM flags for {cfg.model.name} on {where} (emitted by grpo-tune).",
        f"# Pipeline stages (layers): {stage_layers(cfg.model, s)}",
    ]
    if {"param", "grad"} & set(s.memory.offload):
        out.append("# param/grad offload between phases is verl's (param_offload); Megatron-LM has no flag for it.")
    if "optimizer" in s.memory.offload:
        out.append("# optimizer offload between phases is verl's (optimizer_offload); Megatron-LM has no flag for it.")
    if s.batching.max_tokens_per_gpu is not None:
        out.append(
            f"# dynamic batching ({s.batching.max_tokens_per_gpu} tokens per GPU) is verl's use_dynamic_bsz; "
            "Megatron-LM's pretrain_gpt.py has no flag for it."
        )
    args = megatron_args(cfg)
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return "\n".join(out) + "\n"
