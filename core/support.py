"""What grpo-tune's megatron-core trainer can run: one torch-free check shared by the search,
``train --dry-run`` / ``profile`` (before any process starts) and the workers.

:func:`check_supported` returns every refusal as a coded :class:`GrpoTuneError` (empty list =
the trainer runs it), so the search can drop the plans the trainer would refuse and the trainer
refuses exactly those. Each rule says where megatron-core 0.16.1 (or the trainer) stops.
"""
from __future__ import annotations

from .errors import GrpoTuneError
from .specs import HardwareSpec, ModelSpec
from .strategy import Strategy, Workload

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")
CODE = "TRAINER_UNSUPPORTED"


def _no(msg: str, hint: str, code: str = CODE) -> GrpoTuneError:
    return GrpoTuneError(msg, hint=hint, code=code)


def check_supported(model: ModelSpec, strategy: Strategy, hardware: HardwareSpec | None = None, *,
                    workload: Workload | None = None) -> list[GrpoTuneError]:
    """Coded reasons why the trainer would refuse this (already degree-validated) plan; [] if none.

    ``hardware`` None means "any machine"; ``workload`` None skips the length checks.
    """
    m, s = model, strategy
    out: list[GrpoTuneError] = []
    if m.family not in SUPPORTED_FAMILIES:
        out.append(_no(f"model {m.name} ({m.family}) is not built by the trainer",
                       f"the trainer builds {', '.join(SUPPORTED_FAMILIES)} models"))
    if not m.gated_mlp:
        out.append(_no(f"model {m.name} has a plain (non-SwiGLU) MLP, which the trainer does not build",
                       "use a SwiGLU model (Llama / Qwen / DeepSeek)"))
    if s.cp > 1:
        # megatron-core's local attention (DotProductAttention) asserts context_parallel_size == 1;
        # only TransformerEngine's attention runs CP, and the trainer does not split GRPO's
        # variable-length sequences per CP rank.
        out.append(_no(f"cp={s.cp}: context parallelism is not implemented in the trainer",
                       "set strategy.cp: 1 (the search drops CP unless each CP rank keeps >= 4k tokens)"))
    if m.is_moe and s.tp > 1 and s.ep > 1 and not s.sp:
        # TransformerConfig.__post_init__: "sequence parallelism must be used" with EP and TP
        out.append(_no("MoE with tp > 1 and ep > 1 needs sequence parallelism (megatron-core)",
                       "leave strategy.sequence_parallel unset or true"))
    if m.is_moe and m.router_groups > 1:
        if m.experts % m.router_groups or not 0 < m.router_group_topk <= m.router_groups:
            out.append(_no(f"{m.name}: {m.experts} experts do not split into {m.router_groups} router groups "
                           f"with topk_group {m.router_group_topk}", "fix router_groups / router_group_topk",
                           code="BAD_CONFIG"))
        elif m.router_group_topk * (m.experts // m.router_groups) < m.top_k:
            out.append(_no(f"{m.name}: top_k={m.top_k} exceeds the experts of {m.router_group_topk} groups",
                           "raise router_group_topk", code="BAD_CONFIG"))
    if s.cpu_optimizer is not None:
        if not 0.0 < s.cpu_optimizer <= 1.0:
            out.append(_no(f"cpu_optimizer={s.cpu_optimizer} is not a fraction in (0, 1]",
                           "give the share of optimizer state on the host, e.g. 0.5 (0 turns it off)",
                           code="BAD_CONFIG"))
        if not s.distributed_optimizer:
            out.append(_no("Megatron's hybrid CPU optimizer runs on the distributed optimizer's shards",
                           "set strategy.distributed_optimizer: true or drop cpu_optimizer"))
    if s.precision_aware_optimizer and not s.distributed_optimizer:
        # OptimizerConfig.__post_init__: "only supported with distributed optimizer"
        out.append(_no("precision_aware_optimizer needs the distributed optimizer (megatron-core)",
                       "set strategy.distributed_optimizer: true"))
    for name in ("max_tokens_per_gpu", "log_prob_max_tokens_per_gpu"):
        v = getattr(s, name)
        if v is not None and v < 1:
            out.append(_no(f"strategy.{name} must be >= 1 tokens (None/0 turns it off), got {v}",
                           f"set strategy.{name} to a token budget or leave it unset", code="BAD_CONFIG"))
    if workload is not None and workload.kind == "grpo":
        out += _batch_rules(s, workload)
        if workload.prompt_len + workload.response_len > m.max_seq_len:
            out.append(_no(f"prompt_len + response_len = {workload.prompt_len + workload.response_len} exceeds "
                           f"{m.name}'s max_seq_len {m.max_seq_len}", "shorten workload.prompt_len / response_len",
                           code="BAD_CONFIG"))
    if workload is not None:
        longest = workload.prompt_len + workload.response_len
        for name in ("max_tokens_per_gpu", "log_prob_max_tokens_per_gpu"):
            v = getattr(s, name)
            if v is not None and 1 <= v < longest:
                # verl's rearrange_micro_batches asserts the same: one sequence must fit a micro-batch
                out.append(_no(f"strategy.{name}={v} is below the longest sequence ({longest} tokens = "
                               f"prompt_len + response_len)", f"raise {name} to at least {longest}",
                               code="BATCH_DIVISIBILITY"))
    return out


def _batch_rules(s: Strategy, w: Workload) -> list[GrpoTuneError]:
    """verl's and megatron's micro-batch rules for one GRPO mini-batch (fixed ``mbs`` only: with a
    token budget the trainer sets the micro-batch count itself, equal on every DP rank)."""
    out: list[GrpoTuneError] = []
    dp = s.dp or 1
    seqs = w.mini_batch * w.n
    if s.max_tokens_per_gpu is None:
        if seqs % (dp * s.mbs):
            out.append(_no(f"a mini-batch of {w.mini_batch} prompts x n={w.n} = {seqs} sequences does not split "
                           f"over dp={dp} x mbs={s.mbs}", "choose mini_batch * n divisible by dp * mbs",
                           code="BATCH_DIVISIBILITY"))
        elif s.vpp > 1:
            # megatron-core's interleaved schedule: micro-batches >= pp, and the remainder modulo the
            # group size (= pp) must be 0 or >= pp, i.e. 0
            k = seqs // (dp * s.mbs)
            if k < s.pp or k % s.pp:
                out.append(_no(f"vpp={s.vpp} needs micro-batches per mini-batch ({k}) to be a multiple of pp={s.pp}",
                               "raise mini_batch or lower mbs", code="BATCH_DIVISIBILITY"))
    return out


def first_refusal(model: ModelSpec, strategy: Strategy, hardware: HardwareSpec | None = None, *,
                  workload: Workload | None = None) -> None:
    """Raise the first refusal of :func:`check_supported` (for callers that stop at one)."""
    found = check_supported(model, strategy, hardware, workload=workload)
    if found:
        raise found[0]
