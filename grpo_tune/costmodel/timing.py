"""Time model: seconds per phase of a GRPO step (or of a plain pretraining step).

Closed-form float math over cached per-model constants, so the search ranks thousands of plans
per second. The parts live in:

- :mod:`costmodel.timing_base`: FLOPs per token (Narayanan et al. 2021 eq. 3 style counting of
  every matmul, causal attention, MoE active experts, the output layer), the GEMM-efficiency
  curve, calibration knobs;
- :mod:`costmodel.train_time`: training and log-prob passes (per layer, pipeline, DP, optimizer,
  the hybrid CPU optimizer);
- :mod:`costmodel.rollout`: vLLM prefill + decode over a shrinking batch (or the CPU sampler);
- :mod:`costmodel.weight_sync`: refit and offload copies.

Training and log-prob passes are priced on the tokens that exist: verl and NeMo-RL pack
sequences (THD, remove-padding), so a micro-batch of ``mbs`` sequences holds mbs x (mean prompt
+ mean response) tokens; with dynamic batching (``max_tokens_per_gpu``) a micro-batch holds up
to the token cap times the packing efficiency, and the pass has as many micro-batches as the
tokens need.
"""

from __future__ import annotations

import math
from functools import lru_cache
from types import MappingProxyType

from grpo_tune.core.phases import Phase
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload

from .results import PhaseTimes, Throughput, TrainParts
from .rollout import native_rollout_s, rollout_s
from .timing_base import (  # noqa: F401  (re-exported: the time model's public names)
    CALIBRATION_BOUNDS,
    CALIBRATION_DEFAULTS,
    PHASES,
    attention_fraction,
    check_calibration,
    forward_flops_per_token,
    gemm_efficiency,
    model_consts,
)
from .train_time import controller_s, core_share, pipeline_s, rank_params, train_s  # noqa: F401
from .weight_sync import offload_s, sleep_s, weight_sync_s

__all__ = [  # the time model's public names, some defined in timing_base and train_time
    "CALIBRATION_BOUNDS",
    "CALIBRATION_DEFAULTS",
    "PHASES",
    "attention_fraction",
    "check_calibration",
    "core_share",
    "forward_flops_per_token",
    "gemm_efficiency",
    "micro_batch_plan",
    "model_consts",
    "offload_s",
    "pipeline_s",
    "rank_params",
    "sleep_s",
    "step_time",
    "train_s",
    "weight_sync_s",
]


def micro_batch_plan(
    s: Strategy,
    wl: Workload,
    sequences: int,
    packing_efficiency: float,
    *,
    logprob: bool = False,
    pp_packed_fill: float = 0.0,
) -> tuple[float, int]:
    """(tokens per micro-batch per DP rank, micro-batches) for ``sequences`` packed sequences.

    Fixed micro-batches: ``mbs`` (log-prob passes: ``log_prob_mbs``) sequences of the mean length
    each. Dynamic batching (verl's rearrange_micro_batches): ceil(tokens / (cap x packing
    efficiency)) micro-batches, the same count on every DP rank, rounded up to a multiple of pp
    with interleaving. ``pp_packed_fill`` > 0 with PP > 1: each micro-batch computes on that share of the cap
    (the stack pads every packed micro-batch to the longest bin), the count unchanged."""
    lay = s.layout
    bat = s.batching
    dp = lay.dp or 1
    per_dp = sequences / dp
    seq = wl.mean_seq_len
    cap = (bat.log_prob_max_tokens_per_gpu or bat.max_tokens_per_gpu) if logprob else bat.max_tokens_per_gpu
    if not cap:
        mbs = bat.log_prob_mbs_ if logprob else bat.mbs
        micro = max(1, math.ceil(per_dp / mbs))
        return min(mbs, per_dp) * seq, micro
    tokens = per_dp * seq
    # verl multiplies the cap by the CP size (transformer_impl: max_token_len * sp_size).
    micro = max(1, math.ceil(tokens / (cap * lay.cp * packing_efficiency)))
    if lay.vpp > 1:
        micro = -(-micro // lay.pp) * lay.pp
    if lay.pp > 1 and pp_packed_fill > 0:
        return max(tokens / micro, cap * lay.cp * pp_packed_fill), micro
    return tokens / micro, micro


@lru_cache(maxsize=4096)
def slowest_rank_factor(wl: Workload, dp: int) -> float:
    """The expected slowest DP rank's compute over the mean rank's, per optimizer step of the update.

    Every optimizer step ends with the gradient reduction, so it waits for the DP rank with the most work. A rank's
    work is the tokens of its ``s = mini_batch x n / dp`` sequences, whose lengths vary (the response distribution,
    costmodel.lengths: standard deviation ``sqrt(E[L^2] - mean^2)``). Both frameworks balance the whole step's
    batch across the DP ranks by tokens before it splits it into mini-batches (verl's ``trainer.balance_batch``, on
    by default: Karmarkar-Karp partitions of the sequence lengths), so a mini-batch is a subset of a balanced share:
    its sum varies by the finite-population correction ``1 - f`` of the variance, ``f = mini_batch / prompts`` (one
    mini-batch per step: no spread). A stack that balances each optimizer step's sequences itself
    (``balance_per_optimizer_step``: NeMo-RL) has no spread and is not priced with it. The expected largest of ``dp``
    such sums is ``z(dp)`` standard deviations above their mean (``z`` the expected maximum of ``dp`` standard
    normals, Blom's approximation ``Phi^-1((dp - 0.375) / (dp + 0.25))``), so the factor is
    ``1 + z(dp) x cv x sqrt((1 - f) / s)`` with ``cv`` the per-sequence token spread over the mean sequence. It grows
    with the DP size (a larger ``z``, fewer sequences per rank): the efficiency a pool loses with scale. The
    log-prob passes have no per-step barrier inside them and run the balanced share whole: no factor."""
    if dp <= 1 or wl.kind != "grpo":
        return 1.0
    from statistics import NormalDist

    from .rollout import response_dist

    d = response_dist(wl)
    mean = d.mean_len
    var = max(0.0, 2.0 * mean * d.resident_len() - mean * mean)  # E[L^2] = 2 E[L] x resident_len
    seq = wl.mean_prompt_len + mean
    if seq <= 0:
        return 1.0
    f = min(1.0, wl.mini_batch / wl.prompts)
    per_rank = wl.mini_batch * wl.n / dp
    if per_rank <= 0 or f >= 1.0:
        return 1.0
    z = NormalDist().inv_cdf((dp - 0.375) / (dp + 0.25))
    return 1.0 + z * math.sqrt(var) / seq * math.sqrt((1.0 - f) / per_rank)


def step_time(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload, *, cal: dict[str, float] | None = None
) -> tuple[PhaseTimes, Throughput, MappingProxyType[str, float]]:
    """``(time, throughput, details)`` for a resolved strategy (dp filled in by strategy.validate): the inputs
    of :func:`costmodel.estimate.estimate` in this module's short names, ``cal`` its calibration overrides."""
    cal = check_calibration(cal)
    if s.layout.dp is None:
        s = s.replace(dp=cluster.gpus // (s.layout.tp * s.layout.pp * s.layout.cp))
    if wl.kind == "pretrain":
        phases, details, tokens, model_flops = _pretrain(m, hw, cluster, s, wl, cal)
    else:
        phases, details, tokens, model_flops = _grpo(m, hw, cluster, s, wl, cal)
    slow = core_share(hw.efficiency, cluster)  # ranks sharing fewer cores than ranks (the cpu profile)
    if slow > 1.0:
        phases = {k: v * slow for k, v in phases.items()}
    step = sum(phases.values()) + cal["step_overhead_s"] * slow
    gpus = cluster.gpus
    tflops = model_flops / step / gpus
    return (
        PhaseTimes(step_s=step, phases=MappingProxyType(phases)),
        Throughput(
            tokens_per_s_per_gpu=tokens / step / gpus,
            model_tflops_per_gpu=tflops / 1e12,
            mfu=tflops / hw.peak_flops_per_s(),
        ),
        MappingProxyType(details),
    )


_Phases = tuple[dict[str, float], dict[str, float], float, float]
"""(seconds per phase, details, tokens per step, model FLOPs per step)."""


def _pretrain(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload, cal: dict[str, float]
) -> _Phases:
    tok_mb, micro = micro_batch_plan(s, wl, wl.gbs, hw.efficiency.packing_efficiency)
    parts, _ = train_s(m, hw, cluster, s, tokens_mb=tok_mb, micro_batches=micro, seq_len=wl.seq_len, cal=cal)
    upd = parts.total_s + cal["update_overhead_s"]
    off = offload_s(m, hw, s, wl) + (cal["offload_overhead_s"] if s.memory.offload else 0.0)
    tokens = wl.gbs * wl.seq_len
    flops = 3 * tokens * forward_flops_per_token(m, wl.seq_len, causal_fraction=attention_fraction(hw))
    details = _train_details(parts, s)
    return {Phase.UPDATE.value: upd, Phase.OFFLOAD.value: off}, details, tokens, flops


def _train_details(parts: TrainParts, s: Strategy) -> dict[str, float]:
    lay = s.layout
    return {
        "micro_batches": float(parts.micro_batches),
        "tokens_per_micro_batch": parts.tokens_per_micro_batch,
        "bubble_fraction": (lay.pp - 1) / (lay.vpp * parts.micro_batches),
        "dp_exposed_s": parts.dp_s,
        "optimizer_s": parts.optimizer_s,
    }


def _grpo(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload, cal: dict[str, float]
) -> _Phases:
    seq = wl.mean_seq_len
    seqs = wl.prompts * wl.n
    rs = (native_rollout_s if s.rollout.native else rollout_s)(m, hw, cluster, s, wl, cal)
    ctl_gen = 0.0 if s.rollout.native else controller_s(hw, wl, "rollout")  # the generated batch back to the driver
    rollout = (
        rs["prefill_s"]
        + rs["decode_s"]
        + (0.0 if s.rollout.native else sleep_s(hw, s))
        + cal["rollout_overhead_s"]
        + ctl_gen
    )
    if s.rollout.native:
        sync, ws = 0.0, {}
    else:
        ws = weight_sync_s(m, hw, cluster, s, cal)
        sync = sum(v for k, v in ws.items() if k.endswith("_s"))
    sync += cal["weight_sync_overhead_s"]
    pe = hw.efficiency.packing_efficiency
    # RL passes (short packed micro-batches, fp32 log-prob) reach rl_compute_scale of pretraining's FLOP/s.
    rl = dict(cal, compute_efficiency_scale=cal["compute_efficiency_scale"] * hw.efficiency.rl_compute_scale)
    fill = hw.efficiency.pp_packed_fill
    tok_lp, micro_lp = micro_batch_plan(s, wl, seqs, pe, logprob=True, pp_packed_fill=fill)
    fwd, lt = train_s(
        m,
        hw,
        cluster,
        s,
        tokens_mb=tok_lp,
        micro_batches=micro_lp,
        seq_len=seq,
        cal=rl,
        forward_only=True,
        logprob=True,
    )
    # the single controller's batch moves (verl: DataProto through Ray), once per call, whatever the GPU count
    ctl_lp, ctl_up = controller_s(hw, wl, "logprob"), controller_s(hw, wl, "update")
    old = fwd.total_s + cal["old_logprob_overhead_s"] + ctl_lp
    ref = (fwd.total_s + cal["ref_logprob_overhead_s"] + ctl_lp) if wl.kl else 0.0
    tok_mb, micro = micro_batch_plan(s, wl, wl.mini_batch * wl.n, pe, pp_packed_fill=fill)
    mini, _ = train_s(
        m,
        hw,
        cluster,
        s,
        tokens_mb=tok_mb,
        micro_batches=micro,
        seq_len=seq,
        cal=rl,
        logprob=True,
        lt=lt if tok_mb == tok_lp else None,
    )  # same micro-batch shape: same per-layer times
    slowest = 1.0 if hw.efficiency.balance_per_optimizer_step else slowest_rank_factor(wl, s.layout.dp or 1)
    per_mini = mini.compute_s * slowest + mini.dp_s + mini.optimizer_s
    upd = wl.ppo_epochs * (wl.prompts // wl.mini_batch) * per_mini + cal["update_overhead_s"] + ctl_up
    off = offload_s(m, hw, s, wl) + (cal["offload_overhead_s"] if s.memory.offload else 0.0)
    tokens = seqs * seq
    passes = 2 + (1 if wl.kl else 0) + 3 * wl.ppo_epochs  # generate, old, ref, update (fwd + 2x bwd)
    flops = passes * tokens * forward_flops_per_token(m, seq, causal_fraction=attention_fraction(hw))
    phases = {
        Phase.ROLLOUT.value: rollout,
        Phase.WEIGHT_SYNC.value: sync,
        Phase.OLD_LOGPROB.value: old,
        Phase.REF_LOGPROB.value: ref,
        Phase.UPDATE.value: upd,
        Phase.OFFLOAD.value: off,
    }
    details = _train_details(mini, s)
    details.update(
        slowest_rank_factor=slowest,
        controller_rollout_s=ctl_gen,
        controller_logprob_s=ctl_lp,
        controller_update_s=ctl_up,
        prefill_s=rs["prefill_s"],
        decode_s=rs["decode_s"],
        decode_step_s=rs["decode_step_s"],
        decode_concurrency=rs["concurrency"],
        decode_memory_bound=rs["memory_bound"],
        longest_response=rs["longest_response"],
        logprob_micro_batches=float(micro_lp),
        **{f"weight_sync_{k}": v for k, v in ws.items()},
    )
    return phases, details, tokens, flops
