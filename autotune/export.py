"""Export a run config as a verl 0.9.1 launch (Hydra overrides + bash script) and as Megatron-LM flags.

Every verl key emitted here is composed against verl 0.9.1's real ``ppo_megatron_trainer`` config
in tests/test_verl_compose.py, and every Megatron flag is checked against the flags declared in
Megatron-LM's ``megatron/training/arguments.py`` (autotune/data/megatron-lm-arguments-flags.txt)
in tests/test_export_megatron.py.
"""
from __future__ import annotations

import shlex

from core.config import RunConfig
from autotune.verl import CONFIG_NAME, VERL_VERSION
from core.strategy import stage_layers

ARO = "actor_rollout_ref"
ACTOR = f"{ARO}.actor"
REF = f"{ARO}.ref"
ROLLOUT = f"{ARO}.rollout"
OTC = f"{ACTOR}.megatron.override_transformer_config"

# verl's engine dtype names (engine/megatron.yaml: dtype ["bfloat16", "float16"]).
VERL_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}

ENV_DEFAULTS = {
    "TRAIN_FILES": "$HOME/data/gsm8k/train.parquet",
    "VAL_FILES": "$HOME/data/gsm8k/test.parquet",
}


def _b(v: bool) -> str:
    return "True" if v else "False"


def verl_overrides(cfg: RunConfig, *, model_path: str = "$MODEL_PATH", train_files: str = "$TRAIN_FILES",
                   val_files: str = "$VAL_FILES") -> list[str]:
    """Hydra overrides for ``python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer``.

    The reference model gets the actor's degrees, written out explicitly (verl would default them
    to the actor's, but an explicit line is what a reader checks). ``+`` marks keys that verl's
    schema does not declare (they go to Megatron's TransformerConfig).
    """
    s, w, t, m = cfg.strategy, cfg.workload, cfg.trainer, cfg.model
    etp = s.etp_
    ov: list[str] = [
        "algorithm.adv_estimator=grpo",
        f"algorithm.norm_adv_by_std_in_grpo={_b(t.norm_adv_by_std)}",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train_files}",
        f"data.val_files={val_files}",
        f"data.train_batch_size={w.prompts}",
        f"data.max_prompt_length={w.prompt_len}",
        f"data.max_response_length={w.response_len}",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"{ARO}.model.path={model_path}",
        f"{ACTOR}.optim.lr={t.lr}",
        f"{ACTOR}.ppo_mini_batch_size={w.mini_batch}",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu={s.mbs}",
        f"{ACTOR}.use_dynamic_bsz=False",
        f"{ACTOR}.ppo_epochs={w.ppo_epochs}",
        f"{ACTOR}.use_kl_loss={_b(w.kl)}",
        f"{ACTOR}.kl_loss_coef={t.kl_coef}",
        f"{ACTOR}.kl_loss_type={t.kl_type}",
        f"{ACTOR}.clip_ratio={t.clip_ratio}",
        f"{ACTOR}.entropy_coeff={t.entropy_coef}",
        f"{ACTOR}.loss_agg_mode={t.loss_agg_mode}",
    ]
    if t.clip_ratio_high is not None:
        ov.append(f"{ACTOR}.clip_ratio_high={t.clip_ratio_high}")
    for role in (ACTOR, REF):
        meg = f"{role}.megatron"
        ov += [
            f"{meg}.tensor_model_parallel_size={s.tp}",
            f"{meg}.pipeline_model_parallel_size={s.pp}",
            f"{meg}.virtual_pipeline_model_parallel_size={s.vpp if s.vpp > 1 else 'null'}",
            f"{meg}.context_parallel_size={s.cp}",
            f"{meg}.expert_model_parallel_size={s.ep}",
            f"{meg}.expert_tensor_parallel_size={etp if m.is_moe else 'null'}",
            f"{meg}.sequence_parallel={_b(s.sp)}",
            # verl 0.9.1 has no grad_offload: param_offload also releases the gradient buffers
            # while the actor is inactive (engine/megatron.yaml), so param or grad offload map here.
            f"{meg}.param_offload={_b(bool({'param', 'grad'} & set(s.offload)))}",
        ]
        if w.dtype in VERL_DTYPE:  # fp32 has no verl engine dtype; verl's default (bfloat16) stays
            ov.append(f"{meg}.dtype={VERL_DTYPE[w.dtype]}")
    ov += [
        f"{ACTOR}.megatron.optimizer_offload={_b('optimizer' in s.offload)}",
        f"{ACTOR}.megatron.use_distributed_optimizer={_b(s.distributed_optimizer)}",
    ]
    # Recompute goes to Megatron's TransformerConfig (verl declares these four keys, null by default).
    if s.recompute == "selective":
        ov += [f"{OTC}.recompute_granularity=selective", f"{OTC}.recompute_modules=[core_attn]"]
    elif s.recompute == "full":
        if s.recompute_layers is None:  # uniform, 1 layer per chunk = every layer recomputed
            ov += [f"{OTC}.recompute_granularity=full", f"{OTC}.recompute_method=uniform",
                   f"{OTC}.recompute_num_layers=1"]
        else:  # block: the first N layers of each stage are recomputed
            ov += [f"{OTC}.recompute_granularity=full", f"{OTC}.recompute_method=block",
                   f"{OTC}.recompute_num_layers={s.recompute_layers}"]
    # Uneven pipeline stages: TransformerConfig fields that verl's schema does not declare.
    if s.first_stage_layers is not None:
        ov.append(f"+{OTC}.num_layers_in_first_pipeline_stage={s.first_stage_layers}")
    if s.last_stage_layers is not None:
        ov.append(f"+{OTC}.num_layers_in_last_pipeline_stage={s.last_stage_layers}")
    ov += [
        f"{REF}.log_prob_micro_batch_size_per_gpu={s.mbs}",
        f"{ROLLOUT}.name=vllm",
        f"{ROLLOUT}.n={w.n}",
        f"{ROLLOUT}.tensor_model_parallel_size={s.rollout_tp}",
        f"{ROLLOUT}.gpu_memory_utilization={s.gpu_memory_utilization}",
        *([f"{ROLLOUT}.dtype={VERL_DTYPE[w.dtype]}"] if w.dtype in VERL_DTYPE else []),
        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu={s.mbs}",
        # vLLM schedules at most this many tokens per step; one whole sequence must fit
        f"{ROLLOUT}.max_num_batched_tokens={max(8192, w.prompt_len + w.response_len)}",
        f"{ROLLOUT}.temperature={t.temperature}",
        f"{ROLLOUT}.top_p={t.top_p}",
        f"trainer.n_gpus_per_node={cfg.cluster.gpus_per_node}",
        f"trainer.nnodes={cfg.cluster.nnodes}",
        f"trainer.total_training_steps={t.steps}",
        "trainer.critic_warmup=0",
        "trainer.logger=[console]",
        "trainer.project_name=grpo_tune",
        f"trainer.experiment_name={m.name}-{cfg.cluster.gpus}gpu",
    ]
    return ov


def _quote(arg: str) -> str:
    """Shell-quote an override, keeping ``$VAR`` expandable."""
    if "$" in arg:
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return shlex.quote(arg)


def verl_script(cfg: RunConfig) -> str:
    """A bash launch for verl 0.9.1. ``MODEL_PATH``, ``TRAIN_FILES`` and ``VAL_FILES`` may be set by
    the caller; extra overrides can be appended as arguments (``"$@"``)."""
    s, c, m = cfg.strategy, cfg.cluster, cfg.model
    plan = (f"tp={s.tp} pp={s.pp} vpp={s.vpp} cp={s.cp} ep={s.ep} etp={s.etp_} dp={s.dp} mbs={s.mbs} "
            f"recompute={s.recompute} offload={','.join(s.offload) or 'none'} rollout_tp={s.rollout_tp} "
            f"gpu_memory_utilization={s.gpu_memory_utilization}")
    lines = [
        "#!/usr/bin/env bash",
        f"# GRPO for {m.name} on {c.gpus} x {cfg.hardware.name} ({c.nnodes} node(s) of {c.gpus_per_node}), "
        f"verl {VERL_VERSION} + Megatron.",
        f"# Emitted by grpo-tune. Plan: {plan}",
        "# Check it before a run: grpo-tune diagnose THIS_FILE",
        "set -euo pipefail",
        "",
        f"MODEL_PATH=${{MODEL_PATH:-{m.hf_id or m.name}}}",
    ]
    for k, v in ENV_DEFAULTS.items():
        lines.append(f"{k}=${{{k}:-{v}}}")
    lines += [
        "# Megatron overlaps TP communication only with one hardware queue (Megatron-LM README)",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        "",
        f"python3 -m verl.trainer.main_ppo --config-name={CONFIG_NAME} \\",
    ]
    for o in verl_overrides(cfg):
        lines.append(f"    {_quote(o)} \\")
    lines.append('    "$@"')
    return "\n".join(lines) + "\n"


def megatron_args(cfg: RunConfig) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` flags for the same plan (training side only).

    Rollout settings have no Megatron-LM equivalent. Offload between phases (verl's
    param/optimizer offload) has none either; ``--optimizer-cpu-offload`` (Megatron's CPU optimizer
    step) is emitted for optimizer offload as the nearest flag.
    """
    m, s, w = cfg.model, cfg.strategy, cfg.workload
    a: list[str] = [
        "--tensor-model-parallel-size", str(s.tp),
        "--pipeline-model-parallel-size", str(s.pp),
        "--context-parallel-size", str(s.cp),
    ]
    if s.vpp > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", str(s.vpp)]
    if s.first_stage_layers is not None:
        a += ["--decoder-first-pipeline-num-layers", str(s.first_stage_layers)]
    if s.last_stage_layers is not None:
        a += ["--decoder-last-pipeline-num-layers", str(s.last_stage_layers)]
    if m.is_moe:
        a += ["--expert-model-parallel-size", str(s.ep), "--expert-tensor-parallel-size", str(s.etp_)]
    if s.sp:
        a.append("--sequence-parallel")
    if s.distributed_optimizer:
        a.append("--use-distributed-optimizer")
    if "optimizer" in s.offload:
        a.append("--optimizer-cpu-offload")
    if s.recompute == "selective":
        a += ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]
    elif s.recompute == "full":
        method, n = ("uniform", 1) if s.recompute_layers is None else ("block", s.recompute_layers)
        a += ["--recompute-granularity", "full", "--recompute-method", method, "--recompute-num-layers", str(n)]
    # GRPO: one optimizer step per PPO mini-batch of mini_batch prompts x n responses.
    gbs = w.mini_batch * w.n if w.kind == "grpo" else w.gbs
    a += ["--micro-batch-size", str(s.mbs), "--global-batch-size", str(gbs),
          "--seq-length", str(w.train_seq_len), "--max-position-embeddings", str(max(m.max_seq_len, w.train_seq_len))]
    if w.dtype in ("bf16", "fp16"):  # fp32 is Megatron's default: no flag
        a.append(f"--{w.dtype}")
    # model shape
    a += ["--num-layers", str(m.layers), "--hidden-size", str(m.hidden), "--num-attention-heads", str(m.heads),
          "--vocab-size", str(m.vocab), "--make-vocab-size-divisible-by", "128",
          "--normalization", "RMSNorm", "--norm-epsilon", repr(m.norm_eps), "--swiglu",
          "--position-embedding-type", "rope", "--rotary-base", str(int(m.rope_theta)),
          "--disable-bias-linear"]
    if m.ffn_hidden:
        a += ["--ffn-hidden-size", str(m.ffn_hidden)]
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if m.qkv_bias:
        a.append("--add-qkv-bias")
    if m.qk_norm:
        a.append("--qk-layernorm")
    if m.is_mla:
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank),
              "--qk-head-dim", str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim),
              "--v-head-dim", str(m.v_head_dim)]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
    else:
        a += ["--kv-channels", str(m.head_dim)]
        if m.kv_heads != m.heads:
            a += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.is_moe:
        a += ["--num-experts", str(m.experts), "--moe-router-topk", str(m.top_k),
              "--moe-ffn-hidden-size", str(m.expert_ffn_hidden), "--moe-grouped-gemm",
              "--moe-token-dispatcher-type", "alltoall"]
        if m.shared_experts:
            a += ["--moe-shared-expert-intermediate-size", str(m.shared_experts * m.expert_ffn_hidden)]
        if m.dense_layers:
            # Megatron's list pattern: 0 = dense layer, 1 = MoE layer
            a += ["--moe-layer-freq", f"([0]*{m.dense_layers}+[1]*{m.layers - m.dense_layers})"]
        if m.router_bias:  # DeepSeek-V3 aux-loss-free balancing with sigmoid scores (arXiv 2412.19437 §2.1.2)
            a += ["--moe-router-enable-expert-bias", "--moe-router-score-function", "sigmoid"]
    return a


def megatron_args_text(cfg: RunConfig) -> str:
    """``megatron_args`` as a file: one flag (with its value) per line, with a header."""
    s = cfg.strategy
    out = [f"# Megatron-LM flags for {cfg.model.name} on {cfg.cluster.gpus} GPUs (emitted by grpo-tune).",
           f"# Pipeline stages (layers): {stage_layers(cfg.model, s)}"]
    if {"param", "grad"} & set(s.offload):
        out.append("# param/grad offload between phases is verl's (param_offload); Megatron-LM has no flag for it.")
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
