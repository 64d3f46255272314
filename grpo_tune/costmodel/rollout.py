"""Rollout seconds: vLLM colocated with the trainer (prefill + decode over a shrinking batch), or
the CPU trainer's own Megatron sampler.

Decode, per rollout replica of N sequences at concurrency C = min(max_num_seqs, what the KV
cache holds, N) (vLLM continuous batching):
- while sequences wait, C run; the first N - C responses take (N - C) x mean / C steps;
- then the batch drains: at step j of the drain C x S(j) sequences still run (S the survival of
  the response-length distribution, costmodel.lengths), until the expected longest response of the
  whole batch (every replica's N together) ends: generation returns when its slowest replica does.
  Each step costs what it costs at the concurrency running then: the larger of the weight + KV-cache
  reads over HBM bandwidth and the FLOPs, plus the rollout TP all-reduces (latency by group size,
  inter-node when the group spans nodes): the GPU's time. When vLLM runs eager (``enforce_eager``, vLLM's
  CPU build, or a batch above the CUDA-graph capture sizes) the host launches every kernel of every layer itself,
  ahead of the GPU: the forward takes the longer of the GPU's time and the launches (layers x the
  stack's ``eager_layer_overhead_s``), so a small batch is launch-bound and a large one hides them; a
  CUDA graph replays the forward as one launch. On top, serial with the forward, the scheduler's and
  sampler's cost per step and per running sequence.
"""

from __future__ import annotations

import math

from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload

from grpo_tune import engines

from . import comm, memory
from .lengths import LengthDist, dist
from .timing_base import PARAM_BYTES, attention_fraction, gemm_efficiency, model_consts
from .train_time import train_s

CUDA_GRAPH_MAX_BATCH = 512
"""vLLM's largest captured decode batch by default (``max_cudagraph_capture_size`` 512); larger
batches run eager."""
DRAIN_POINTS = 8
"""Midpoint-rule points over the drain of the batch (each side of the eager/graph crossing, :func:`drain_s`)."""


def response_dist(wl: Workload) -> LengthDist:
    return dist(float(wl.response_len), wl.mean_response_len, wl.response_len_quantiles or ())


def _tp_allreduce_s(hw: HardwareSpec, nbytes: float, rtp: int, gpn: int, cal: dict[str, float]) -> float:
    """One rollout TP all-reduce. Inside an NVLink domain: small messages are latency-bound and the
    latency grows with the group (log2 steps of a tree / one-shot kernel). A group spanning domains
    (TP16/TP32 rollouts) runs hierarchically as NCCL does: an NVLink stage inside each domain, then
    the domains' shares over every GPU's own NIC at once (comm.hierarchical_all_reduce_s)."""
    if rtp <= 1:
        return 0.0
    domain = comm.nvlink_domain(hw, gpn)
    if rtp <= domain:
        bw, lat = comm.link(hw, rtp, gpn, cal)
        return comm.all_reduce_s(nbytes, rtp, bw, lat * (1.0 + math.log2(rtp)))
    g = domain
    bw_i, lat_i = comm.link(hw, g, gpn, cal)
    bw_x, lat_x = comm.link(hw, rtp, gpn, cal)
    nodes = max(2, rtp // g)
    intra = (bw_i, lat_i * (1.0 + math.log2(g)) / 2)  # the tree latency, split over the RS and AG stages
    inter = (bw_x, lat_x * (1.0 + math.log2(nodes)))
    return comm.hierarchical_all_reduce_s(nbytes, rtp, g, intra, inter)


class _DecodeStep:
    """Seconds of one decode step at a given concurrency for one replica (constants hoisted)."""

    def __init__(
        self, m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, prompt: float, cal: dict[str, float]
    ):
        eng = s.rollout
        e = hw.efficiency
        c = model_consts(m)
        rtp = eng.rollout_tp
        self.m, self.hw, self.rtp, self.cal, self.prompt = m, hw, rtp, cal, prompt
        self.gpn = cluster.gpus_per_node
        # Decode is priced on two rooflines, each counted once: HBM traffic at the kernels' share of the
        # achievable bandwidth (decode_efficiency, per GPU), and FLOPs at the GEMM ceiling (the low
        # intensity of a small batch is what makes it memory-bound: the GEMM curve would count it twice).
        # Prefill's GEMMs are large and take the curve at their own shape.
        prec, engine = s.precision, engines.of(s, hw)
        self.peak = hw.gemm_flops_per_s(prec.rollout_precision) * cal["rollout_efficiency_scale"]  # W8A8 GEMMs
        self.decode_peak = self.peak * e.gemm_efficiency_max
        self.hbm = (
            hw.hbm_bandwidth_bytes_per_s * e.hbm_efficiency * cal["rollout_efficiency_scale"] * e.decode_efficiency
        )
        self.body_flops = m.layers * (c["dense_flops"] + c["routed_flops"])
        self.attn = m.layers * c["attn_coef"]
        self.head = c["head_flops"]
        wb = PARAM_BYTES if prec.rollout_precision == "bf16" else engine.weight_bytes(prec.rollout_precision)
        self.all_expert = (m.moe_layers * m.experts * c["expert_w"] * wb / rtp) if m.is_moe else 0.0
        self.dense_bytes = memory.rollout_weight_bytes(m, rtp, prec.rollout_precision) - self.all_expert
        self.kv_tok = memory.kv_bytes_per_token(m, rtp, prec.kv_cache_dtype)
        self.ffn = (m.ffn_hidden or m.expert_ffn_hidden) / rtp
        # Host costs (the stack's), fixed seconds: per step, per running sequence per step, and the per-layer
        # launches of an eager step.
        self.graph_ovh = e.decode_step_overhead_s
        self.seq_ovh = e.decode_sequence_overhead_s
        self.eager_launch = m.layers * e.eager_layer_overhead_s
        self.eager = not memory.captures_cuda_graphs(hw, eng.enforce_eager)  # vLLM on CPU always runs eager
        self.moe_eff = e.moe_decode_efficiency
        self.graph_max = engine.graph_batch(rtp)
        self.overlap = engine.overlaps_host

    def __call__(self, conc: float, ctx: float) -> tuple[float, bool]:
        conc = max(conc, 1e-3)
        expert = 0.0
        if self.all_expert:
            m = self.m
            touched = 1 - (1 - m.top_k / m.experts) ** max(conc, 1.0)  # share of experts some token visits
            expert = self.all_expert * touched / self.moe_eff
        t_mem = (self.dense_bytes + expert + conc * ctx * self.kv_tok) / self.hbm
        flops = conc * (self.body_flops + self.attn * ctx + self.head) / self.rtp
        t_comp = flops / self.decode_peak
        t_comm = (
            2
            * self.m.layers
            * _tp_allreduce_s(self.hw, conc * self.m.hidden * PARAM_BYTES, self.rtp, self.gpn, self.cal)
        )
        t_gpu = max(t_mem, t_comp) + t_comm
        if self.eager or conc > self.graph_max:
            # eager: the host launches each layer's kernels while the GPU runs the earlier ones (vLLM syncs
            # once per step, on the sampled tokens), so the forward takes the longer of the two
            t_gpu = max(t_gpu, self.eager_launch)
        if self.overlap:  # the next step is scheduled on the host while the GPU runs this one (engines/sglang)
            return max(t_gpu, self.graph_ovh + conc * self.seq_ovh), t_mem >= t_comp
        return t_gpu + self.graph_ovh + conc * self.seq_ovh, t_mem >= t_comp


def drain_s(step: _DecodeStep, d: LengthDist, conc: float, prompt: float, longest: float) -> float:
    """Seconds of a drain: ``sum over j in [0, longest] of step(conc * S(j), prompt + j)``, the decode steps of
    ``conc`` sequences started together while they finish on the survival curve ``S`` of ``d``.

    The step has a cliff where the running sequences fall to the engine's CUDA-graph batch (``graph_max``): above
    it a step runs eager (at least ``eager_launch``), below it on the graphs. The interval is split at that
    crossing, ``j* = quantile(1 - graph_max / conc)`` (``conc * S(j*) = graph_max``), and each side integrated
    with the midpoint rule (:data:`DRAIN_POINTS` points), so the drain is continuous in ``conc`` across the cliff;
    a single midpoint rule over the whole drain moved it by a whole segment (longest / 8 tokens of eager steps)
    when a point crossed it (docs/placement.md, "The drain at the CUDA-graph cliff")."""
    if longest <= 0:
        return 0.0
    cuts = [0.0, longest]
    if not step.eager and conc > step.graph_max:
        cross = d.quantile(1.0 - step.graph_max / conc)
        if 0.0 < cross < longest:
            cuts = [0.0, cross, longest]
    total = 0.0
    for a, b in zip(cuts, cuts[1:]):
        h = (b - a) / DRAIN_POINTS
        for k in range(DRAIN_POINTS):
            j = a + (k + 0.5) * h
            total += step(conc * d.survival(j), prompt + j)[0] * h
    return total


_CACHE: dict[tuple[object, ...], tuple[tuple[object, ...], dict[str, float]]] = {}


def rollout_s(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload, cal: dict[str, float]
) -> dict[str, float]:
    """``prefill_s``, ``decode_s``, ``decode_step_s`` (at full concurrency), ``concurrency``,
    ``longest_response`` (expected, of the whole batch), ``memory_bound``. Memoized on the rollout's own
    inputs (the search prices each rollout option against many training plans); read-only."""
    eng = s.rollout
    key = (
        id(m),
        id(hw),
        id(wl),
        cluster.gpus,
        cluster.gpus_per_node,
        eng.rollout_tp,
        eng.gpu_memory_utilization,
        eng.max_num_seqs,
        eng.max_num_batched_tokens,
        eng.enforce_eager,
        eng.chunked_prefill,
        eng.engine,
        s.precision.rollout_precision,
        s.precision.kv_cache_dtype,
        tuple(cal.values()),
    )
    hit = _CACHE.get(key)
    if hit is not None and hit[0][0] is m and hit[0][1] is hw and hit[0][2] is wl:
        return hit[1]
    if len(_CACHE) > 4096:
        _CACHE.clear()
    out = _rollout_s(m, hw, cluster, s, wl, cal)
    _CACHE[key] = ((m, hw, wl), out)
    return out


def _rollout_s(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload, cal: dict[str, float]
) -> dict[str, float]:
    eng = s.rollout
    e = hw.efficiency
    c = model_consts(m)
    rtp = eng.rollout_tp
    replicas = max(1, cluster.gpus // rtp)
    seqs = wl.prompts * wl.n / replicas
    d = response_dist(wl)
    mean, prompt = d.mean_len, wl.mean_prompt_len
    step = _DecodeStep(m, hw, cluster, s, prompt, cal)

    # Prefill: the n copies of a prompt share it (prefix caching), so each unique prompt is
    # computed once, in chunks of max_num_batched_tokens.
    pre_tokens = seqs / wl.n * prompt
    chunk = eng.max_num_batched_tokens if eng.chunked_prefill else max(eng.max_num_batched_tokens, wl.prompt_len)
    pre_rows = min(chunk, max(1.0, pre_tokens))
    pre_flops = (
        pre_tokens * (step.body_flops + step.attn * prompt * attention_fraction(hw)) + seqs * c["head_flops"]
    ) / rtp
    t_pre = pre_flops / (step.peak * gemm_efficiency(e, pre_rows, m.hidden, step.ffn))
    if s.precision.rollout_precision != "bf16":  # FP8 linears; prefill's attention stays bf16 (docs/precision.md)
        attn = pre_tokens * step.attn * prompt * attention_fraction(hw) / rtp
        t_pre += (
            attn
            * (1 / hw.peak_flops_per_s() - 1 / hw.gemm_flops_per_s("fp8"))
            / (cal["rollout_efficiency_scale"] * gemm_efficiency(e, pre_rows, m.hidden, step.ffn))
        )
    t_pre += math.ceil(pre_tokens / chunk) * step.graph_ovh
    if rtp > 1:
        t_pre += (
            2 * m.layers * _tp_allreduce_s(hw, pre_tokens * m.hidden * PARAM_BYTES, rtp, cluster.gpus_per_node, cal)
        )

    # Concurrency: max_num_seqs, the KV cache (a sequence holds prompt + mean response tokens at its
    # end; vLLM allocates blocks as sequences grow) and the sequences this replica has.
    kv_tokens = memory.kv_cache_capacity(m, hw, s, wl, ranks_per_node=cluster.ranks_per_node).tokens
    conc = max(1.0, min(seqs, float(eng.max_num_seqs), kv_tokens / (prompt + mean)))
    t_full, bound = step(conc, prompt + mean / 2)
    steady = max(0.0, seqs - conc) * mean / conc * t_full
    # the phase ends when the last replica does: the drain runs to the expected longest response of the
    # whole batch (every replica's own survival curve, held until the batch's longest finishes)
    longest = d.expected_max(wl.prompts * wl.n)
    drain = drain_s(step, d, conc, prompt, longest)
    return {
        "prefill_s": t_pre,
        "decode_s": steady + drain,
        "decode_step_s": t_full,
        "concurrency": conc,
        "longest_response": longest,
        "memory_bound": float(bound),
    }


def native_strategy(m: ModelSpec, s: Strategy, roll: Cluster) -> Strategy:
    """The rollout pool's engine on a profile that samples with the trainer's own model (the ``cpu`` profile):
    a forward-only megatron engine with ``tp = rollout_tp`` and data parallel over the rest of the pool, as
    trainer/separate.py builds it."""
    from grpo_tune.core.strategy import validate

    rtp = s.rollout.rollout_tp
    rs = Strategy.of(
        tp=rtp,
        dp=roll.gpus // rtp,
        mbs=s.batching.log_prob_mbs_,
        recompute="none",
        rollout_tp=rtp,
        sync_bucket_mb=s.rollout.sync_bucket_mb,
    )
    return validate(m, rs, roll.gpus, gpus_per_node=roll.gpus_per_node)


def native_rollout_s(
    m: ModelSpec, hw: HardwareSpec, cluster: Cluster, s: Strategy, wl: Workload, cal: dict[str, float]
) -> dict[str, float]:
    """The CPU trainer's sampler (trainer/rollout/megatron.py): no KV cache, so each of the
    ``response_len`` steps is a forward-only pass of the training layout over every prefix (each DP
    rank splits its rows into ``pp`` micro-batches, as Engine.next_token_logits does), then the
    last token's fp32 logits are summed over the world."""
    e = hw.efficiency
    seqs = wl.prompts * wl.n
    dp = s.layout.dp or 1
    rows = -(-seqs // (dp * s.layout.pp))
    ctx = wl.prompt_len + wl.response_len / 2  # padded prefix length, averaged over the steps
    fwd, _ = train_s(
        m, hw, cluster, s, tokens_mb=rows * ctx, micro_batches=s.layout.pp, seq_len=ctx, cal=cal, forward_only=True
    )
    gather = comm.all_reduce_s(
        seqs * m.vocab * 4, cluster.gpus, *comm.link(hw, cluster.gpus, cluster.gpus_per_node, cal)
    )
    t_step = fwd.total_s + gather + e.decode_step_overhead_s
    return {
        "prefill_s": 0.0,
        "decode_s": wl.response_len * t_step,
        "decode_step_s": t_step,
        "concurrency": float(seqs),
        "longest_response": float(wl.response_len),
        "memory_bound": 0.0,
    }
