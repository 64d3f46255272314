"""What grpo-tune's megatron-core trainer can run: one torch-free check shared by the search,
``train --dry-run`` / ``profile`` (before any process starts) and the workers.

:func:`check_supported` returns every refusal as a :class:`core.rules.Finding` with a stable code
(empty list = the trainer runs it), so the search can drop the plans the trainer would refuse
and the trainer refuses exactly those. Each rule says where megatron-core 0.16.1 (or the
trainer) stops. Degree rules live in core/rules.py (``check_degrees``) and batch rules there too
(``check_batches``, reused here).
"""

from __future__ import annotations

from .rules import Finding, check_batches, check_lengths, check_log_prob_batches, errors
from .specs import HardwareSpec, ModelSpec
from .strategy import Strategy, Workload

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")
CODE = "TRAINER_UNSUPPORTED"


def check_supported(
    model: ModelSpec, strategy: Strategy, hardware: HardwareSpec | None = None, *, workload: Workload | None = None
) -> list[Finding]:
    """Reasons why the trainer would refuse this (degree-validated) plan; [] if it runs it:
    :func:`trainer_only` + :func:`check_plan`.

    ``hardware`` None means "any machine" (no rule reads it today: the CPU optimizer, offload and
    precision-aware state are no-ops on the CPU build, and say so). ``workload`` None skips the
    batch and length rules.
    """
    return trainer_only(model, strategy) + check_plan(model, strategy, workload=workload)


def trainer_only(model: ModelSpec, strategy: Strategy) -> list[Finding]:
    """Refusals of grpo-tune's own trainer that verl's Megatron backend does not share (CP, model
    families it does not build). The search still prices these plans for the verl export;
    refinement and ``train`` drop them."""
    m, s = model, strategy
    out: list[Finding] = []
    if m.family not in SUPPORTED_FAMILIES:
        out.append(
            Finding(
                CODE,
                f"model {m.name} ({m.family}) is not built by the trainer",
                f"the trainer builds {', '.join(SUPPORTED_FAMILIES)} models",
            )
        )
    if not m.gated_mlp:
        out.append(
            Finding(
                CODE,
                f"model {m.name} has a plain (non-SwiGLU) MLP, which the trainer does not build",
                "use a SwiGLU model (Llama / Qwen / DeepSeek)",
            )
        )
    if s.layout.cp > 1:
        # megatron-core's local attention (DotProductAttention) asserts context_parallel_size == 1;
        # only TransformerEngine's attention runs CP, and the trainer does not split GRPO's
        # variable-length sequences per CP rank.
        out.append(
            Finding(
                CODE,
                f"cp={s.layout.cp}: context parallelism is not implemented in the trainer",
                "set strategy.cp: 1 (the search keeps CP only where each CP rank holds >= 4k tokens)",
            )
        )
    if s.rollout.engine not in ("vllm", "megatron"):
        out.append(
            Finding(
                CODE,
                f"engine {s.rollout.engine}: the trainer samples with vLLM (or its own sampler on CPU), it has no "
                f"{s.rollout.engine} adapter (engines/{s.rollout.engine})",
                "set strategy.engine: vllm to run it here (verl runs it as emitted in verl.sh)",
            )
        )
    if not s.precision.default:
        out.append(
            Finding(
                CODE,
                f"precision {s.precision.precision}, rollout {s.precision.rollout_precision}, KV cache "
                f"{s.precision.kv_cache_dtype}: the trainer trains and samples in bf16",
                "drop strategy.precision / rollout_precision / kv_cache_dtype to run it here (verl and NeMo-RL run "
                "it as emitted)",
            )
        )
    if s.memory.fused_kernels:
        # verl's linear_cross_entropy kernel; the trainer's loss (trainer/engine.py) reads materialised logits
        out.append(
            Finding(
                CODE,
                "fused_kernels: the trainer computes log-probs from the output layer's logits, not fused",
                "set strategy.fused_kernels: false to run it here (verl runs it as is)",
            )
        )
    return out


def check_plan(model: ModelSpec, strategy: Strategy, *, workload: Workload | None = None) -> list[Finding]:
    """Refusals any megatron-core backend makes (ours and verl's): the search applies these."""
    out = _moe_findings(model, strategy) + _optimizer_findings(strategy)
    for name in ("max_tokens_per_gpu", "log_prob_max_tokens_per_gpu"):
        v = getattr(strategy.batching, name)
        if v is not None and v < 1:
            out.append(
                Finding(
                    "BAD_CONFIG",
                    f"strategy.{name} must be >= 1 tokens (None turns it off), got {v}",
                    f"set strategy.{name} to a token budget or leave it unset",
                )
            )
    if strategy.batching.log_prob_mbs is not None and strategy.batching.log_prob_mbs < 1:
        out.append(
            Finding(
                "BAD_CONFIG",
                f"strategy.log_prob_mbs must be >= 1 sequences (None = mbs), got {strategy.batching.log_prob_mbs}",
                "set strategy.log_prob_mbs to a micro-batch size or leave it unset",
            )
        )
    if strategy.rollout.sync_bucket_mb < 1:  # verl packs tensors into buckets of this many MiB: 0 is no bucket at all
        out.append(
            Finding(
                "BAD_CONFIG",
                f"strategy.sync_bucket_mb must be >= 1 MiB, got {strategy.rollout.sync_bucket_mb}",
                "set strategy.sync_bucket_mb to a bucket size in MiB (verl's default 2048) or leave it unset",
            )
        )
    if workload is not None and workload.kind == "grpo":
        out += _workload_findings(model, strategy, workload)
    elif workload is not None:
        # a pretraining step (Megatron-LM's pretrain_gpt.py): the global batch's split and megatron-core's
        # interleaving rule, which its schedule enforces whatever framework drives it
        lay = strategy.layout
        out += check_batches(workload, dp=lay.dp or 1, mbs=strategy.batching.mbs, pp=lay.pp, vpp=lay.vpp)
    return errors(out)


def _moe_findings(m: ModelSpec, s: Strategy) -> list[Finding]:
    out: list[Finding] = []
    if m.is_moe and s.layout.tp > 1 and s.layout.ep > 1 and not s.layout.sp:
        # TransformerConfig.__post_init__: sequence parallelism must be used with EP and TP
        out.append(
            Finding(
                CODE,
                "MoE with tp > 1 and ep > 1 needs sequence parallelism (megatron-core)",
                "leave strategy.sequence_parallel unset or true",
            )
        )
    if m.is_moe and m.router_groups > 1:
        if m.experts % m.router_groups or not 0 < m.router_group_topk <= m.router_groups:
            out.append(
                Finding(
                    "BAD_CONFIG",
                    f"{m.name}: {m.experts} experts do not split into {m.router_groups} "
                    f"router groups with topk_group {m.router_group_topk}",
                    "fix router_groups / router_group_topk",
                )
            )
        elif m.router_group_topk * (m.experts // m.router_groups) < m.top_k:
            out.append(
                Finding(
                    "BAD_CONFIG",
                    f"{m.name}: top_k={m.top_k} exceeds the experts of {m.router_group_topk} groups",
                    "raise router_group_topk",
                )
            )
    return out


def _optimizer_findings(s: Strategy) -> list[Finding]:
    out: list[Finding] = []
    if s.memory.cpu_optimizer is not None:
        if not 0.0 < s.memory.cpu_optimizer <= 1.0:
            out.append(
                Finding(
                    "BAD_CONFIG",
                    f"cpu_optimizer={s.memory.cpu_optimizer} is not a fraction in (0, 1]",
                    "give the share of optimizer state on the host, e.g. 0.5 (0 turns it off)",
                )
            )
        if not s.memory.distributed_optimizer:
            out.append(
                Finding(
                    CODE,
                    "Megatron's hybrid CPU optimizer runs on the distributed optimizer's shards",
                    "set strategy.distributed_optimizer: true or drop cpu_optimizer",
                )
            )
    if s.memory.precision_aware_optimizer and not s.memory.distributed_optimizer:
        # OptimizerConfig.__post_init__: "only supported with distributed optimizer"
        out.append(
            Finding(
                CODE,
                "precision_aware_optimizer needs the distributed optimizer (megatron-core)",
                "set strategy.distributed_optimizer: true",
            )
        )
    return out


def _workload_findings(m: ModelSpec, s: Strategy, w: Workload) -> list[Finding]:
    # verl's batch rules; megatron's interleaving rule only for a fixed mbs (with a token budget
    # the trainer pads the micro-batch count to a multiple of pp itself)
    fixed = s.batching.max_tokens_per_gpu is None
    out = check_batches(w, dp=s.layout.dp or 1, mbs=s.batching.mbs if fixed else None, pp=s.layout.pp, vpp=s.layout.vpp)
    if fixed and s.batching.log_prob_mbs is not None and s.batching.log_prob_mbs >= 1:
        out += check_log_prob_batches(
            w, dp=s.layout.dp or 1, log_prob_mbs=s.batching.log_prob_mbs, pp=s.layout.pp, vpp=s.layout.vpp
        )
    longest = w.prompt_len + w.response_len
    out += check_lengths(m, w)
    for name in ("max_tokens_per_gpu", "log_prob_max_tokens_per_gpu"):
        v = getattr(s.batching, name)
        if v is not None and 1 <= v < longest:
            # verl's rearrange_micro_batches asserts the same: one sequence must fit a micro-batch
            out.append(
                Finding(
                    "BATCH_DIVISIBILITY",
                    f"strategy.{name}={v} is below the longest sequence ({longest} tokens = prompt_len + response_len)",
                    f"raise {name} to at least {longest}",
                )
            )
    return out


def first_refusal(
    model: ModelSpec, strategy: Strategy, hardware: HardwareSpec | None = None, *, workload: Workload | None = None
) -> None:
    """Raise the first refusal of :func:`check_supported` as a coded :class:`GrpoTuneError`."""
    found = check_supported(model, strategy, hardware, workload=workload)
    if found:
        raise found[0].to_error()
