"""Separate rollout and training pools, priced as a producer and a consumer.

A colocated plan runs every phase on every GPU, in sequence (costmodel.timing). A separate plan
splits the cluster: a *rollout pool* of ``rollout_gpus`` GPUs (its own hardware profile when it
differs) runs only vLLM, and a *training pool* (the rest) runs only Megatron. The two meet at the
weight sync, when the training pool's new weights are broadcast to every rollout replica.

What each pool costs:

- rollout pool: prefill + decode (costmodel.rollout) on the pool's own GPUs, with no vLLM sleep
  or wake (verl's separate trainers require ``free_cache_engine=False``), and with the KV cache
  that ``gpu_memory_utilization`` leaves on a GPU that holds no training state (so the search can
  give vLLM up to 0.9 of HBM there);
- training pool: the old (proximal) and reference log-probs, the update and any offload
  (costmodel.timing), with no vLLM on its GPUs. The old log-probs are recomputed by the training
  pool, as decoupled PPO needs them (verl: ``rollout_correction.bypass_mode=False`` with token-level
  truncated importance sampling against the rollout's own log-probs; the trainer does the same),
  unless the plan takes the rollout's own log-probs as the old ones (``recompute_logprobs=False``,
  verl fully-async's default ``bypass_mode=True``): then the pool runs no old log-prob pass;
- weight sync across pools: the training side exports its tensors in HF layout (the TP/PP/EP
  gathers of the colocated refit), then the whole model (bf16) is broadcast to every rollout GPU
  (NVLink when the pools share nodes; across nodes an NCCL ring broadcast over every NIC of a node,
  bounded by NVLink: :func:`costmodel.weight_sync.broadcast_link`; the slower profile's when the pools differ),
  in buckets of ``sync_bucket_mb`` with the profile's per-tensor and per-bucket costs; each vLLM worker copies
  its rollout-TP slice into place. NeMo-RL's NCCL reshard (:func:`costmodel.weight_sync.reshard_sync`, chosen by
  ``refit_transport``) instead moves each destination shard of the FFN weights once and broadcasts only the rest.
  Every transport is priced in costmodel/weight_sync.py, beside the colocated refit.

How the step composes (steady state, seconds per optimizer step):

- staleness 0 (on-policy): generation, then the sync, then training, in sequence;
- staleness >= 1: the pools overlap; a step is bounded by the slower pool plus what cannot
  overlap: the sync (both pools stop for it; every ``sync_interval`` steps). The pipeline fill
  (the first batch's generation, once per run) is reported apart as ``fill_s``;
- partial rollout (staleness >= 1 only): verl's fully-async rollouter aborts the unfinished
  sequences at a sync and resumes them under the new weights, so the long tail no longer holds the
  batch; decode is priced at the sustained concurrency (every slot busy) and the tail's tokens are
  carried into the next step.

Each pool's busy fraction (one minus verl's ``idle_ratio``) is its own work over the step.
Pure float math, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

from grpo_tune.core.errors import ConfigError, InvalidDegreesError
from grpo_tune.core.phases import Phase
from grpo_tune.core.placement import Placement, check, pools, rollout_strategy, train_strategy
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.core.units import GiB

from . import memory, streaming
from .estimate import estimate
from .results import Estimate, PhaseMemory, PhaseTimes, PoolFigures, SeparateFigures, Throughput, Violation
from .rollout import _DecodeStep, drain_s, native_rollout_s, native_strategy, response_dist, rollout_s
from .timing_base import attention_fraction, check_calibration, forward_flops_per_token
from .weight_sync import REFIT_TRANSPORTS, cross_pool_sync, per_tensor_sync, reshard_sync

CONCURRENCY_BOUNDS = ("max_num_seqs", "kv_cache", "feed", "per_replica")
"""What sets a rollout replica's resident sequences (:func:`generation`'s ``bound``)."""


def check_fields(p: Placement, where: str = "placement") -> None:
    """:func:`grpo_tune.core.placement.check`, and the sync interval against the staleness: syncing every
    ``n`` steps makes the last batch of an interval ``n`` versions old (colocated: every step)."""
    check(p, where)
    n, k = p.sync_interval, p.staleness
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{where}.sync_interval must be an integer >= 1, got {n!r}")
    if n > max(1, k) and (p.separate or n != 1):
        raise ConfigError(
            f"{where}: sync_interval {n} exceeds the staleness {k}: the last batch between two syncs "
            f"would be {n} policy versions old",
            hint=f"give sync_interval <= {max(1, k)}, or a larger staleness",
        )


# ---------------------------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AsyncKnobs:
    """How far the rollout pool may run ahead of the trainer, and what a weight sync does to it: the frameworks'
    asynchronous knobs, in the terms the steady-state server (:func:`generation`) prices.

    - ``ahead``: the batches the rollout pool may produce beyond the one being trained. verl's fully-async
      rollouter pauses once it has produced ``(1 + staleness_threshold) x trigger_parameter_sync_step x
      require_batches x ppo_mini_batch_size`` prompts since the last sync (``max_required_samples``,
      verl/experimental/fully_async_policy/fully_async_rollouter.py, 0.9.1): ``ahead = staleness_threshold`` (a
      fraction). NeMo-RL's async GRPO keeps trajectories up to ``max_trajectory_age_steps`` versions old:
      ``ahead = max_trajectory_age_steps``. An integer staleness K prices as ``ahead = K``; 0 is on-policy (the pool
      generates exactly one batch per version, then waits).
    - ``no_drain``: a sync does not wait for the sequences in flight: verl's ``partial_rollout`` (aborted at the
      sync, resumed under the new weights) or NeMo-RL's ``in_flight_weight_updates`` (the refit does not wait for
      pending generations). Otherwise (and always at ``ahead = 0``) every sync drains the pool.
    - ``fetch_fraction``: the share of a step's prompts the trainer takes before its first update (verl:
      ``require_batches x ppo_mini_batch_size / prompts per version``; 1 for a trainer that takes the whole batch:
      one-step-off, NeMo-RL). After a sync the trainer waits for its first fetch unless the rollout pool's
      produced-ahead samples (``ahead`` of a batch) already hold it.
    - ``per_replica``: a cap on the sequences a replica is sent at once (verl's ``concurrent_samples_per_replica``
      x n); None: no cap but vLLM's own.
    """

    ahead: float
    no_drain: bool = False
    fetch_fraction: float = 1.0
    per_replica: float | None = None
    whole_batch: bool = False
    """The rollout generates each step's batch as one synchronous call while the trainer trains the last (verl's
    one-step-off trainer): fed by its own batch only and drained to that batch's longest response every step, the
    pools overlapping ``ahead`` steps."""

    @classmethod
    def of(cls, placement: Placement) -> "AsyncKnobs":
        """The knobs an integer staleness and partial rollout set (what grpo-tune emits: verl's fully-async with
        ``staleness_threshold = K``, ``partial_rollout``; NeMo-RL with ``max_trajectory_age_steps = K``)."""
        k = placement.staleness
        return cls(ahead=float(k), no_drain=bool(placement.partial_rollout and k >= 1))


def generation(
    m: ModelSpec,
    hw: HardwareSpec,
    cluster: Cluster,
    s: Strategy,
    wl: Workload,
    cal: dict[str, float],
    *,
    partial: bool,
    knobs: AsyncKnobs | None = None,
    sync_interval: int = 1,
) -> dict[str, float]:
    """Seconds the rollout pool needs for one step's batch, priced as a server in steady state.

    Per replica of ``N = prompts x n / replicas`` sequences per step, the resident sequences are
    ``C = min(max_num_seqs, what the KV cache holds, what the feed gives)``, the feed being
    ``(1 + ahead) x N`` (the rollouter may run ``ahead`` batches beyond the one being trained) and, where the
    framework caps it, ``per_replica``. Fed ahead, the server holds its resident sequences in equilibrium: each has
    reached on average the length-biased residual ``E[L^2] / (2 E[L])`` of the response lengths
    (LengthDist.resident_len: the long responses stay resident longer), so a resident sequence holds ``prompt +``
    that many KV tokens and each decode step reads that context. The pool's seconds per step are the step's tokens
    over the throughput it sustains at that concurrency, ``N x mean / C x t(C)`` (``t`` the decode step of
    costmodel.rollout), plus the
    prefill, plus a drain where a batch really drains: at ``ahead = 0`` every batch drains to the expected longest
    response of the whole batch (the synchronous batch of costmodel.rollout, which this reproduces); at
    ``ahead > 0`` without partial rollout or in-flight updates each sync waits for the sequences in flight, a drain
    to the expected longest of the ``C x replicas`` in flight, once per ``sync_interval`` steps; with them, none.
    A drain costs its own time less what its tokens would take at full concurrency (those tokens are part of the
    step's work). Between ``ahead = 0`` and one batch ahead the pool produces the share ``ahead`` of each step's
    batch ahead of the trainer's fetch, as the fed server, and the rest as the synchronous batch the trainer waits
    for (fed its own batch only; :func:`first_fetch_wait` counts the same share): every figure is the two weighted by
    those shares, so the price is continuous from the synchronous batch at 0 (docs/placement.md, "Between on-policy
    and one batch ahead"). ``partial``: the plan's partial rollout (:class:`AsyncKnobs` ``no_drain`` when ``knobs`` is
    None, which prices an integer staleness as ``ahead = 1``). On a profile that samples natively the pool's
    forward-only engine (:func:`native_strategy`) decodes the whole batch.

    Keys: ``gen_s``, ``prefill_s``, ``decode_s`` (sustained + drain), ``sustained_s``, ``drain_s`` (the drain's
    excess), ``concurrency`` (resident sequences per replica), ``bound`` (what sets it: 0 max_num_seqs, 1 the KV
    cache, 2 the feed, 3 the framework's cap; the fed server's where ``ahead > 0``), ``decode_step_s`` (at that
    concurrency), ``tokens_per_s`` (the pool's sustained decode throughput)."""
    if s.rollout.native:
        rs = native_rollout_s(m, hw, cluster, native_strategy(m, s, cluster), wl, cal)
        gen = rs["prefill_s"] + rs["decode_s"] + cal["rollout_overhead_s"]
        return {
            "gen_s": gen,
            "prefill_s": rs["prefill_s"],
            "decode_s": rs["decode_s"],
            "sustained_s": rs["decode_s"],
            "drain_s": 0.0,
            "concurrency": rs["concurrency"],
            "bound": 2.0,
            "decode_step_s": rs["decode_step_s"],
            "tokens_per_s": wl.prompts * wl.n * wl.mean_response_len / rs["decode_s"] if rs["decode_s"] > 0 else 0.0,
        }
    k = knobs if knobs is not None else AsyncKnobs(ahead=1.0 if partial else 0.0, no_drain=partial)
    if k.whole_batch:
        k = AsyncKnobs(ahead=0.0)  # its generation is the synchronous batch's (the overlap is compose_step's)
    rs = rollout_s(m, hw, cluster, s, wl, cal)
    eng = s.rollout
    replicas = max(1, cluster.gpus // eng.rollout_tp)
    n_seq = wl.prompts * wl.n / replicas
    d = response_dist(wl)
    mean, prompt = d.mean_len, wl.mean_prompt_len
    kv_tokens = memory.kv_cache_capacity(m, hw, s, wl).tokens
    step = _DecodeStep(m, hw, cluster, s, prompt, cal)

    def concurrency(held: float, feed: float) -> tuple[float, float]:
        """Resident sequences of a replica fed ``feed`` sequences, each holding ``prompt + held`` KV tokens, and what
        bounds them (an index into :data:`CONCURRENCY_BOUNDS`)."""
        caps = [float(eng.max_num_seqs), kv_tokens / (prompt + held), feed]
        if k.per_replica is not None:
            caps.append(float(k.per_replica))
        return max(1.0, min(caps)), float(min(range(len(caps)), key=lambda i: caps[i]))

    def drain_excess(c: float, t: float) -> float:
        """A drain of ``c`` sequences a replica to the expected longest of those in flight, less what its tokens
        would take at that concurrency (step ``t``: they are part of the sustained work)."""
        longest = d.expected_max(min(float(wl.prompts * wl.n), c * replicas))
        return max(0.0, drain_s(step, d, c, prompt, longest) - mean * t)

    def batch() -> tuple[float, float, float, float, float]:
        """The synchronous batch (concurrency, bound, step, sustained, drain): fed its own batch only, its slots start
        together, a sequence holds prompt + mean at its end, a step reads the context mean / 2 in
        (costmodel.rollout), and the batch drains to the expected longest of the whole batch."""
        c, b = concurrency(mean, n_seq)
        t = step(c, prompt + mean / 2)[0]
        sus = n_seq * mean / c * t
        if c <= n_seq:
            return c, b, t, sus, max(0.0, rs["decode_s"] - sus)  # exactly costmodel.rollout's decode
        return c, b, t, sus, drain_excess(c, t)  # fewer than one sequence a replica

    if k.ahead <= 0:
        conc, bound, t_c, sustained, drain = batch()
    else:
        # the fed server: its slots refilled as sequences end, each resident sequence at the length-biased residual
        # (LengthDist.resident_len), which sets its KV tokens and the context each step reads; a drain only where a
        # sync waits for the sequences in flight (no partial rollout or in-flight updates), once per sync_interval
        res = d.resident_len()
        conc, bound = concurrency(res, (1.0 + k.ahead) * n_seq)
        t_c = step(conc, prompt + res)[0]
        sustained = n_seq * mean / conc * t_c
        drain = 0.0
        if not k.no_drain:
            drain = drain_excess(conc, t_c) / max(1, sync_interval)
        if k.ahead < 1.0:
            # below one batch ahead the pool produces the share ``ahead`` of a step's batch ahead of the trainer's
            # fetch, as the fed server, and the rest as the synchronous batch the trainer waits for (as
            # first_fetch_wait counts it: (fetch - ahead) x gen): each figure is the two weighted by those shares,
            # so the price runs from the synchronous batch's at ahead 0 to the fed server's at one batch ahead
            # (docs/placement.md, "Between on-policy and one batch ahead")
            w = k.ahead
            c_b, _, t_b, sus_b, drain_b = batch()
            conc = (1.0 - w) * c_b + w * conc
            t_c = (1.0 - w) * t_b + w * t_c
            sustained = (1.0 - w) * sus_b + w * sustained
            drain = (1.0 - w) * drain_b + w * drain
    decode = sustained + drain
    gen = rs["prefill_s"] + decode + cal["rollout_overhead_s"]
    return {
        "gen_s": gen,
        "prefill_s": rs["prefill_s"],
        "decode_s": decode,
        "sustained_s": sustained,
        "drain_s": drain,
        "concurrency": conc,
        "bound": bound,
        "decode_step_s": t_c,
        "tokens_per_s": replicas * conc * 1.0 / t_c if t_c > 0 else 0.0,
    }


def first_fetch_wait(gen_s: float, knobs: AsyncKnobs) -> float:
    """Seconds the trainer waits after a sync for its first fetch: the part of it that the rollout pool's
    produced-ahead samples (``ahead`` of a batch) do not already hold, produced at the pool's rate (one batch per
    ``gen_s``). Zero at an integer staleness K >= 1 (K batches ahead hold any fetch); at ``ahead = 0`` the step is
    sequential and the whole generation is waited for (:func:`compose_step`)."""
    if knobs.ahead <= 0:
        return 0.0
    return max(0.0, min(1.0, knobs.fetch_fraction) - knobs.ahead) * gen_s


def rollout_memory(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload
) -> tuple[PhaseMemory, list[Violation]]:
    """Bytes on a rollout-pool GPU: vLLM's weights, working set and KV cache; nothing of training. On a
    native-sampling profile: the forward-only engine's weights and one forward (:func:`_native_memory`)."""
    if s.rollout.native:
        return _native_memory(m, hw, cluster, s, wl)
    kvc = memory.kv_cache_capacity(m, hw, s, wl, cluster.gpus, cluster.ranks_per_node)
    graphs = memory.CUDA_GRAPH_BYTES if memory.captures_cuda_graphs(hw, s.rollout.enforce_eager) else 0.0
    parts = {
        "rollout_weights": kvc.weights_bytes,
        "rollout_activations": kvc.working_bytes - graphs,
        "rollout_cuda_graphs": graphs,
        "rollout_kv_cache": max(0.0, kvc.kv_bytes),
    }
    pm = PhaseMemory("rollout", parts, kvc.to_info())
    out = _over_capacity(pm, hw, "vLLM", cluster.ranks_per_node)
    if kvc.kv_bytes <= 0 or kvc.sequences < 1:
        need = (wl.prompt_len + wl.response_len) * kvc.bytes_per_token
        frac = kv_fraction_needed(m, hw, s, wl)
        fix = (
            f"gpu_memory_utilization >= {frac:.2f} would hold one"
            if frac <= 0.95
            else f"no gpu_memory_utilization up to 0.95 holds one at rollout_tp {s.rollout.rollout_tp} (it needs "
            f"{frac:.2f} of HBM): raise rollout_tp"
        )
        out.append(
            Violation(
                "OOM_RISK",
                f"rollout pool: the KV cache ({kvc.tokens} tokens) cannot hold one sequence of "
                f"{wl.prompt_len + wl.response_len} tokens at gpu_memory_utilization "
                f"{s.rollout.gpu_memory_utilization:g} (vLLM refuses to start without KV blocks); {fix}",
                phase="rollout",
                bytes_over=need - max(0.0, kvc.kv_bytes),
            )
        )
    return pm, out


def kv_fraction_needed(m: ModelSpec, hw: HardwareSpec, s: Strategy, wl: Workload, sequences: int = 1) -> float:
    """The smallest ``gpu_memory_utilization`` whose KV cache holds ``sequences`` of ``prompt_len + response_len``
    tokens per replica, besides vLLM's weights, working set and CUDA graphs (memory.kv_cache_capacity's terms)."""
    kvc = memory.kv_cache_capacity(m, hw, s, wl)
    fixed = kvc.weights_bytes + kvc.working_bytes
    return (fixed + sequences * (wl.prompt_len + wl.response_len) * kvc.bytes_per_token) / hw.hbm_bytes


def _native_memory(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload
) -> tuple[PhaseMemory, list[Violation]]:
    """A native rollout pool's rank: its forward-only engine's weights (no gradients, no optimizer), the
    sampler's forward over every prefix of its rows (no KV cache) and the behaviour log-prob pass's logits."""
    from .activations import FP32, forward_activation_bytes, kernels_for, logits_bytes
    from .params import per_stage_params

    rs = native_strategy(m, s, cluster)
    k = kernels_for(hw, wl)
    dtype = "fp32" if k.act_bytes == FP32 else wl.dtype
    wbytes = memory.STATE_BYTES[dtype][0]
    weights = max(float(p.dense + p.expert) for p in per_stage_params(m, rs)) * wbytes
    ctx = wl.prompt_len + wl.response_len
    rows = -(-wl.prompts * wl.n // (rs.layout.dp or 1))
    sample = forward_activation_bytes(m, rs, seq_len=ctx, mbs=rows, kernels=k) + rows * m.vocab * 4
    lp = rs.batching.mbs
    lp_pass = forward_activation_bytes(m, rs, seq_len=ctx, mbs=lp, kernels=k) + logits_bytes(
        m, rs, seq_len=ctx, mbs=lp, act_bytes=k.act_bytes, grad=False, entropy=False
    )
    parts = {"rollout_weights": weights, "rollout_activations": max(sample, lp_pass), "rollout_kv_cache": 0.0}
    pm = PhaseMemory("rollout", parts, {"native_rollout": 1.0})
    return pm, _over_capacity(pm, hw, "the sampler", cluster.ranks_per_node)


def _over_capacity(pm: PhaseMemory, hw: HardwareSpec, engine: str, ranks_per_node: int) -> list[Violation]:
    """``OOM_RISK`` when the rollout engine's bytes on a rollout-pool GPU exceed its capacity."""
    cap = hw.rank_capacity_bytes(ranks_per_node)
    if not pm.total_bytes > cap:
        return []
    return [
        Violation(
            "OOM_RISK",
            f"rollout pool: {engine} takes {pm.total_bytes / GiB:.1f} GiB > {cap / GiB:.1f} GiB capacity",
            phase="rollout",
            bytes_over=pm.total_bytes - cap,
        )
    ]


def compose_step(
    gen_s: float,
    train_s: float,
    sync_s: float,
    staleness: float,
    sync_interval: int = 1,
    first_wait_s: float = 0.0,
    *,
    arrivals: Sequence[float] | None = None,
    serial_s: float = 0.0,
    bubble_s: float = 0.0,
) -> dict[str, float]:
    """The steady-state step of two pools and each pool's busy fraction.

    staleness 0: ``gen + sync + train`` (in sequence), or streamed when ``arrivals`` (the units' arrival times,
    costmodel.streaming) are given: the training pool takes each unit as it arrives, ``serial_s`` of its
    ``train_s`` waiting for the last, ``bubble_s`` added to the streamed part (each unit's own pipeline fill and
    drain, :func:`costmodel.streaming.pass_bubbles_s`); staleness > 0 (``AsyncKnobs.ahead``):
    ``max(gen, train + first_wait) + sync / interval`` (the pools overlap, both stop for the sync, and the trainer
    waits ``first_wait_s`` after each sync for the first fetch the produced-ahead samples do not hold:
    :func:`first_fetch_wait`)."""
    if staleness <= 0 and arrivals:
        unit_s = (train_s - serial_s + bubble_s) / len(arrivals)
        step = streaming.streamed_step_at(arrivals, unit_s, serial_s) + sync_s
    elif staleness <= 0:
        step = gen_s + sync_s + train_s
    else:
        step = max(gen_s, train_s + first_wait_s) + sync_s / sync_interval
    return {
        "step_s": step,
        "rollout_busy": gen_s / step if step > 0 else 0.0,
        "train_busy": train_s / step if step > 0 else 0.0,
        "exposed_sync_s": sync_s if staleness <= 0 else sync_s / sync_interval,
    }


def stream_shape(
    m: ModelSpec,
    hw_r: HardwareSpec,
    roll: Cluster,
    roll_s: Strategy,
    wl: Workload,
    cal: dict[str, float],
    gen_s: float,
    train_phases: dict[str, float],
    t_train: float,
    placement: Placement,
    train: Estimate | None = None,
) -> streaming.StreamShape:
    """:func:`compose_step`'s streaming arguments of a plan (none unless it streams: staleness 0, ``stream``).
    ``train``: the training pool's estimate (its layout and log-prob micro-batches price each unit's own pipeline
    bubbles; None: none priced)."""
    if placement.staleness > 0 or not placement.stream:
        return {}
    units = streaming.units_of(wl.prompts, wl.mini_batch)
    _, serial = streaming.train_split(train_phases, t_train, wl.ppo_epochs)
    bubble = 0.0
    if train is not None:
        lay, micro = train.strategy.layout, float(train.details.get("logprob_micro_batches", 0.0))
        for ph, over in (
            (Phase.OLD_LOGPROB.value, "old_logprob_overhead_s"),
            (Phase.REF_LOGPROB.value, "ref_logprob_overhead_s"),
        ):
            t = train_phases.get(ph, 0.0)
            if t > 0:
                bubble += streaming.pass_bubbles_s(max(0.0, t - cal[over]), micro, lay.pp, lay.vpp, units)
    arrivals = streaming.rollout_arrivals(m, hw_r, roll, roll_s, wl, cal, gen_s, units)
    return {"arrivals": arrivals, "serial_s": serial, "bubble_s": bubble}


def tokens_per_usd(tokens: float, step_s: float, gpu_hours_price: float | None) -> float | None:
    """Tokens trained per US dollar: ``gpu_hours_price`` is the cluster's price per hour (None: unknown)."""
    if not gpu_hours_price or step_s <= 0:
        return None
    return tokens / (step_s / 3600.0 * gpu_hours_price)


def cluster_price(
    hw_train: HardwareSpec, train_gpus: int, hw_roll: HardwareSpec | None = None, rollout_gpus: int = 0
) -> float | None:
    """US dollars per hour of the two pools together (None when a profile has no price)."""
    pt = hw_train.price_per_gpu_hour_usd
    if pt is None:
        return None
    if rollout_gpus:
        pr = (hw_roll or hw_train).price_per_gpu_hour_usd
        if pr is None:
            return None
        return pt * train_gpus + pr * rollout_gpus
    return pt * train_gpus


# ---------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------

TRAIN_PHASES = (Phase.OLD_LOGPROB.value, Phase.REF_LOGPROB.value, Phase.UPDATE.value, Phase.OFFLOAD.value)
"""The phases a training pool runs (the log-prob passes, the update, offload): its step is their sum."""


def train_pool(
    *,
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    strategy: Strategy,
    workload: Workload,
    calibration: dict[str, float] | None = None,
) -> Estimate:
    """The training pool alone: the colocated estimate on the pool's GPUs without vLLM (its rollout and
    weight-sync phases and their violations dropped). ``time.step_s`` is the pool's own seconds per step;
    the search ranks training plans with it."""
    est = estimate(
        model=model,
        hardware=hardware,
        cluster=cluster,
        strategy=train_strategy(strategy),
        workload=workload,
        calibration=calibration,
        colocated=False,
    )
    cal = check_calibration(calibration)
    assert est.time is not None
    phases = {k: v for k, v in est.time.phases.items() if k in TRAIN_PHASES}
    step = sum(phases.values()) + cal["step_overhead_s"]
    mem = {k: v for k, v in est.memory.items() if k not in ("rollout", "weight_sync")}
    viol = tuple(v for v in est.violations if v.phase not in ("rollout", "weight_sync"))
    wl = workload
    tokens = wl.sequences * wl.mean_seq_len
    return _replace_est(
        est,
        memory=mem,
        violations=viol,
        time=PhaseTimes(step_s=step, phases=MappingProxyType(phases)),
        throughput=Throughput(tokens_per_s_per_gpu=tokens / step / cluster.gpus, model_tflops_per_gpu=0.0, mfu=0.0),
    )


def _replace_est(
    est: Estimate,
    *,
    memory: Mapping[str, PhaseMemory],
    violations: tuple[Violation, ...],
    time: PhaseTimes,
    throughput: Throughput,
) -> Estimate:
    import dataclasses

    return dataclasses.replace(est, memory=memory, violations=violations, time=time, throughput=throughput)


def estimate_separate(
    *,
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    strategy: Strategy,
    workload: Workload,
    placement: Placement,
    rollout_hardware: HardwareSpec | None = None,
    calibration: dict[str, float] | None = None,
    train: Estimate | None = None,
    refit_transport: str = "broadcast",
    knobs: AsyncKnobs | None = None,
) -> Estimate:
    """A separate-pool plan: ``strategy`` holds the training pool's layout and the rollout pool's engine
    (``rollout_tp``, ``gpu_memory_utilization``, ...); ``time.step_s`` is the steady-state step
    (:func:`compose_step`), the phases are each pool's own, ``placement`` holds the pools' figures.
    ``train``: the training pool's :func:`train_pool` estimate when the caller has it. ``refit_transport``:
    how the weights cross the pools (:data:`REFIT_TRANSPORTS`). ``knobs``: the frameworks' asynchronous knobs
    (:class:`AsyncKnobs`; default: what ``placement``'s staleness and partial rollout set)."""
    check_fields(placement)
    if refit_transport not in REFIT_TRANSPORTS:
        raise ConfigError(f"unknown refit transport {refit_transport!r}", hint="known: " + ", ".join(REFIT_TRANSPORTS))
    if not placement.separate:
        raise ConfigError("estimate_separate prices separate pools: give placement.mode = 'separate'")
    m, wl = model, workload
    hw_r = rollout_hardware or hardware
    cal = check_calibration(calibration)
    ps = pools(cluster, placement.rollout_gpus)
    s = strategy
    _check_rollout_degrees(m, s, ps.rollout)
    if train is None:
        train = train_pool(
            model=m, hardware=hardware, cluster=ps.train, strategy=s, workload=wl, calibration=calibration
        )
    assert train.time is not None
    roll_s = rollout_strategy(s)
    knobs = knobs if knobs is not None else AsyncKnobs.of(placement)
    partial = knobs.no_drain and knobs.ahead > 0
    g = generation(
        m, hw_r, ps.rollout, roll_s, wl, cal, partial=partial, knobs=knobs, sync_interval=placement.sync_interval
    )
    wait = first_fetch_wait(g["gen_s"], knobs)
    rmem, rviol = rollout_memory(m, hw_r, ps.rollout, roll_s, wl)
    sync_fn = {"nccl_reshard": reshard_sync, "per_tensor": per_tensor_sync}.get(refit_transport, cross_pool_sync)
    sync = sync_fn(m, hardware, hw_r, ps, s, cal)
    train_phases = dict(train.time.phases)
    t_train = train.time.step_s
    if not placement.recompute_logprobs:  # the rollout's log-probs are the old ones: no old log-prob pass
        t_train -= train_phases.pop(Phase.OLD_LOGPROB.value, 0.0)
    stream = stream_shape(m, hw_r, ps.rollout, roll_s, wl, cal, g["gen_s"], train_phases, t_train, placement, train)
    gen_s = stream["arrivals"][-1] if stream else g["gen_s"]  # a native pool's waves can end later than one call
    comp = compose_step(gen_s, t_train, sync["sync_s"], knobs.ahead, placement.sync_interval, wait, **stream)
    step = comp["step_s"]
    phases = {Phase.ROLLOUT.value: gen_s, Phase.WEIGHT_SYNC.value: sync["sync_s"], **train_phases}
    seq = wl.mean_seq_len
    tokens = wl.sequences * seq
    passes = (2 if placement.recompute_logprobs else 1) + (1 if wl.kl else 0) + 3 * wl.ppo_epochs
    flops = passes * tokens * forward_flops_per_token(m, seq, causal_fraction=attention_fraction(hardware))
    gpus = cluster.gpus
    tflops = flops / step / gpus
    price = cluster_price(hardware, ps.train.gpus, hw_r, ps.rollout.gpus)
    # where the ranks compute in RAM (the cpu profile), pools that share nodes share it too
    node_ranks = ps.train.ranks_per_node + ps.rollout.ranks_per_node if ps.shared_nodes else 0
    cap_t = hardware.rank_capacity_bytes(node_ranks or ps.train.ranks_per_node)
    cap_r = hw_r.rank_capacity_bytes(node_ranks or ps.rollout.ranks_per_node)
    head_t = cap_t - max((p.total_bytes for p in train.memory.values()), default=0.0)
    head_r = cap_r - rmem.total_bytes
    shared = []
    if node_ranks and hardware.memory_is_host and head_t < 0 and not train.violations:
        shared.append(_shared_ram(hardware, node_ranks, "training", -head_t))
    if node_ranks and hw_r.memory_is_host and head_r < 0 and not rviol:
        shared.append(_shared_ram(hw_r, node_ranks, "rollout", -head_r))
    figures: SeparateFigures = {
        "mode": "separate",
        "rollout_gpus": ps.rollout.gpus,
        "train_gpus": ps.train.gpus,
        "rollout_gpus_per_node": ps.rollout.gpus_per_node,
        "train_gpus_per_node": ps.train.gpus_per_node,
        "shared_nodes": ps.shared_nodes,
        "rollout_hardware": hw_r.name,
        "staleness": placement.staleness,
        "partial_rollout": partial,
        "sync_interval": placement.sync_interval,
        "recompute_logprobs": placement.recompute_logprobs,
        "gen_s": gen_s,
        "train_s": t_train,
        "sync_s": sync["sync_s"],
        "exposed_sync_s": comp["exposed_sync_s"],
        "fill_s": g["gen_s"] if knobs.ahead > 0 else 0.0,
        "rollout_busy": comp["rollout_busy"],
        "train_busy": comp["train_busy"],
        "tokens_per_usd": tokens_per_usd(tokens, step, price),
        "price_per_hour_usd": price,
        "rollout_capacity_bytes": cap_r,
        "train_capacity_bytes": cap_t,
        "rollout_headroom_bytes": head_r,
        "train_headroom_bytes": head_t,
        "headroom_bytes": min(head_t, head_r),
        "sync": {k: v for k, v in sync.items()},
        "decode_concurrency": g["concurrency"],
        "kv_cache_tokens": float(rmem.info.get("kv_cache_tokens", 0.0)),
        "rollout_ahead": knobs.ahead,
        "concurrency_bound": CONCURRENCY_BOUNDS[int(g["bound"])],
        "drain_s": g["drain_s"],
        "first_wait_s": wait,
        "rollout_tokens_per_s": g["tokens_per_s"],
        "stream_units": len(stream.get("arrivals", ())),
        "stream_bubble_s": stream.get("bubble_s", 0.0),
        "unstreamed_step_s": compose_step(
            g["gen_s"], t_train, sync["sync_s"], knobs.ahead, placement.sync_interval, wait
        )["step_s"],
        "streamed_step_s": step if stream else 0.0,
    }
    details = dict(train.details)
    details.update(
        prefill_s=g["prefill_s"],
        decode_s=g["decode_s"],
        decode_concurrency=g["concurrency"],
        decode_step_s=g["decode_step_s"],
        **{f"weight_sync_{k}": v for k, v in sync.items() if k.endswith("_s")},
    )
    mem = dict(train.memory)
    mem["rollout"] = rmem
    return Estimate(
        model=m,
        hardware=hardware,
        cluster=cluster,
        strategy=train.strategy.replace(
            rollout_tp=s.rollout.rollout_tp,
            gpu_memory_utilization=s.rollout.gpu_memory_utilization,
            max_num_seqs=s.rollout.max_num_seqs,
            enforce_eager=s.rollout.enforce_eager,
            free_cache_engine=False,
        ),
        workload=wl,
        params=train.params,
        memory=mem,
        capacity_bytes=cap_t,
        time=PhaseTimes(step_s=step, phases=MappingProxyType(phases)),
        throughput=Throughput(
            tokens_per_s_per_gpu=tokens / step / gpus,
            model_tflops_per_gpu=tflops / 1e12,
            mfu=tflops / hardware.peak_flops_per_s(),
        ),
        violations=tuple(train.violations) + tuple(rviol) + tuple(shared),
        host_bytes_per_node=train.host_bytes_per_node,
        details=MappingProxyType(details),
        placement=figures,
    )


def _shared_ram(hw: HardwareSpec, ranks: int, pool: str, over: float) -> Violation:
    """``OOM_RISK``: a pool's rank overruns its share of the RAM its node's ``ranks`` (both pools') compute in."""
    share = hw.rank_capacity_bytes(ranks)
    return Violation(
        "OOM_RISK",
        f"{pool} pool: a rank needs {(share + over) / GiB:.1f} GiB > {share / GiB:.1f} GiB, its share of the node's "
        f"RAM among the {ranks} ranks of both pools",
        phase="rollout" if pool == "rollout" else "update",
        bytes_over=over,
    )


def colocated_figures(est: Estimate) -> PoolFigures:
    """The placement block of a colocated estimate: every GPU busy all the step, its cost per token."""
    wl = est.workload
    tokens = wl.sequences * wl.mean_seq_len
    step = est.step_s or 0.0
    price = cluster_price(est.hardware, est.cluster.gpus)
    return {
        "mode": "colocated",
        "rollout_gpus": est.cluster.gpus,
        "train_gpus": est.cluster.gpus,
        "staleness": 0,
        "rollout_busy": 1.0,
        "train_busy": 1.0,
        "tokens_per_usd": tokens_per_usd(tokens, step, price),
        "price_per_hour_usd": price,
    }


def _check_rollout_degrees(m: ModelSpec, s: Strategy, roll: Cluster) -> None:
    """vLLM's TP must divide the rollout pool and the heads, within one of the pool's nodes."""
    rtp = s.rollout.rollout_tp
    kv = m.heads if m.is_mla else m.kv_heads
    if roll.gpus % rtp:
        raise InvalidDegreesError(
            f"rollout_tp {rtp} does not divide the rollout pool's {roll.gpus} GPUs",
            "give a rollout TP that divides --rollout-gpus",
        )
    if m.heads % rtp or not (kv % rtp == 0 or rtp % kv == 0):
        raise InvalidDegreesError(
            f"rollout_tp {rtp} does not divide {m.name}'s {m.heads} heads / {kv} KV heads",
            "give a divisor of the heads",
        )
    if rtp > roll.gpus_per_node and rtp % roll.gpus_per_node:
        raise InvalidDegreesError(
            f"rollout_tp {rtp} spans part of a node of the rollout pool ({roll.gpus_per_node} GPUs per node)",
            "give a rollout TP within one node, or whole nodes",
        )


__all__ = [
    "AsyncKnobs",
    "CONCURRENCY_BOUNDS",
    "first_fetch_wait",
    "check_fields",
    "colocated_figures",
    "compose_step",
    "estimate_separate",
    "generation",
    "rollout_memory",
    "kv_fraction_needed",
    "TRAIN_PHASES",
    "train_pool",
]
