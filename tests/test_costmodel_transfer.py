"""Trends a cost model that transfers across GPUs must keep, with hand-computed values.

- Same stack, a compute-bound update: B200 over H100 throughput is at most their FLOP/s ratio.
- A memory-bound decode: B200 over H100 at most their HBM-bandwidth ratio.
- An H20 decode is not priced slower than its HBM bandwidth implies (its low FLOP/s must not be
  counted through the GEMM curve on top of the memory roofline).
- The MoE overhead term grows with the micro-batch count at its documented bound (Megatron's MoE
  docs: a few hundred microseconds to ~1 ms per layer with permute fusion and grouped GEMM), no more.
- Eager vLLM (``enforce_eager``, every verl H20 row): the host launches each layer's kernels, so a decode
  step takes the longer of the GPU's time and the launches: a small batch is launch-bound (slower than its
  HBM price by exactly the launches' excess), a large one hides them (its HBM or FLOP price, unchanged).
- Generation ends with the batch's expected longest response (the slowest replica), not a replica's.
"""

from __future__ import annotations

import pytest

from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.stacks import load_stack
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate
from grpo_tune.costmodel import rollout, timing
from grpo_tune.costmodel.estimate import estimate

H100, B200, H20 = load_hardware("h100"), load_hardware("b200"), load_hardware("h20")
CAL = timing.CALIBRATION_DEFAULTS


def _update_s(hw, m, s, wl, gpus=8):
    return estimate(model=m, hardware=hw, cluster=Cluster(gpus=gpus), strategy=s, workload=wl).time["update"]


def test_b200_over_h100_compute_bound_update_is_at_most_the_flops_ratio():
    """Qwen2.5-32B at TP4, micro-batches of 4 x 4k tokens: GEMMs near the curve's ceiling dominate. (An
    update with a large memory-bound share, element-wise work and the fp32 log-softmax, may sit between
    the FLOP/s ratio and the HBM ratio of 2.39: Llama-3.1-8B at TP1 and micro-batch 8 is priced at 2.28.)"""
    m = load_model("qwen2.5-32b")
    s = Strategy.of(tp=4, mbs=4, recompute="none")
    wl = Workload(prompts=256, n=8, mini_batch=64, prompt_len=1024, response_len=3072, response_len_mean=3072)
    h, b = _update_s(H100, m, s, wl), _update_s(B200, m, s, wl)
    flops_ratio = 2.25e15 / 989.4e12  # datasheets: 2.274
    assert B200.bf16_dense_flops_per_s / H100.bf16_dense_flops_per_s == pytest.approx(flops_ratio)
    assert 2.0 < h / b <= flops_ratio


def _decode_step(hw, m, rtp, conc, ctx):
    s = validate(m, Strategy.of(rollout_tp=rtp), 8)
    step = rollout._DecodeStep(m, hw, Cluster(gpus=8), s, 256.0, CAL)
    return step(conc, ctx)


def test_b200_over_h100_memory_bound_decode_is_at_most_the_hbm_ratio():
    m = load_model("llama-3.1-8b")
    for conc in (1, 8, 64):
        th, bound_h = _decode_step(H100, m, 1, conc, 1024)
        tb, bound_b = _decode_step(B200, m, 1, conc, 1024)
        assert bound_h and bound_b  # memory-bound at these batches
        assert 1.0 < th / tb <= 8.0e12 / 3.35e12  # HBM ratio 2.388


def test_h20_decode_is_priced_by_its_hbm_bandwidth():
    """By hand, one decode step of Llama-3.1-8B at rollout TP1, 8 sequences at context 1024 on H20:
    weights (bf16) + KV cache read over 4.0 TB/s x hbm_efficiency x decode_efficiency, plus the stack's
    per-step and per-sequence host costs (no TP all-reduce at TP1). The FLOPs (at the GEMM ceiling) are
    far below: an H20's 148 TFLOP/s do not make a memory-bound step slower than its bandwidth implies."""
    from grpo_tune.costmodel import memory

    m = load_model("llama-3.1-8b")
    conc, ctx = 8, 1024
    t, bound = _decode_step(H20, m, 1, conc, ctx)
    e = H20.efficiency
    read = memory.rollout_weight_bytes(m, 1) + conc * ctx * memory.kv_bytes_per_token(m, 1)
    want = read / (4.0e12 * e.hbm_efficiency * e.decode_efficiency) + e.decode_step_overhead_s
    want += conc * e.decode_sequence_overhead_s
    assert bound and t == pytest.approx(want, rel=1e-9)
    # and faster than an H100's step (3.35 TB/s), whatever its FLOP/s
    assert t < _decode_step(H100, m, 1, conc, ctx)[0]


def test_moe_overhead_grows_with_micro_batches_at_its_bound():
    """The MoE host cost is per MoE layer per micro-batch, forward and backward: raising it from 0 to
    Megatron's ~1 ms bound adds 2 x 1 ms x 48 MoE layers per micro-batch of Qwen3-30B-A3B's update, so
    twice the micro-batches add twice the time, and the shipped verl stack's value stays inside the bound."""
    m = load_model("qwen3-30b-a3b")
    wl = Workload(prompts=64, n=8, mini_batch=16, prompt_len=512, response_len=1024, response_len_mean=1024)
    verl = load_stack("verl-0.9.1")
    assert 2e-4 <= verl.params["moe_layer_overhead_s"] <= 1e-3
    added = {}
    for mbs in (1, 2):
        s = Strategy.of(tp=1, ep=8, mbs=mbs, recompute="none", offload=("param", "grad", "optimizer"))
        t = {x: _update_s(H100.with_efficiency(moe_layer_overhead_s=x), m, s, wl) for x in (0.0, 1e-3)}
        added[mbs] = t[1e-3] - t[0.0]
    # per DP rank: 16 x 8 / 8 = 16 sequences per mini-batch, 4 mini-batches
    micro = {1: 16 * 4, 2: 8 * 4}
    for mbs, n in micro.items():
        assert added[mbs] == pytest.approx(n * 2 * 1e-3 * 48, rel=1e-6)
    assert added[1] == pytest.approx(2 * added[2], rel=1e-6)


def test_eager_decode_step_is_the_longer_of_the_launches_and_the_gpu():
    """By hand, Qwen3-30B-A3B at rollout TP4 on H20, eager, at context 1024 (the verl rows' engine):
    - 1 sequence: the GPU reads the dense weights and 8 of 128 experts per MoE layer (plus the KV) at
      4.0 TB/s x hbm_efficiency x decode_efficiency and runs 2 x 48 TP4 all-reduces; the host launches
      48 layers at eager_layer_overhead_s each: launch-bound, so the step is the launches plus the
      per-step and per-sequence host costs, slower than the HBM price only by the launches' excess;
    - 256 sequences: every expert is read (the GPU time is above the launches), so eager costs what the
      CUDA-graph step costs, the HBM price: the launches hide behind the GPU."""
    from grpo_tune.costmodel import memory

    m = load_model("qwen3-30b-a3b")
    hw = H20.with_efficiency(eager_layer_overhead_s=2e-4)  # a round value: 48 x 0.2 ms = 9.6 ms of launches
    e = hw.efficiency
    ctx = 1024

    def step(conc, eager):
        s = validate(m, Strategy.of(rollout_tp=4, enforce_eager=eager), 8)
        return rollout._DecodeStep(m, hw, Cluster(gpus=8), s, 256.0, CAL)(conc, ctx)

    launch = 48 * 2e-4
    one_e, bound = step(1, True)
    one_g, _ = step(1, False)
    host = e.decode_step_overhead_s + 1 * e.decode_sequence_overhead_s
    assert bound and one_e == pytest.approx(launch + host, rel=1e-9)  # launch-bound
    gpu = one_g - host
    experts = m.moe_layers * m.experts * 3 * m.hidden * m.expert_ffn_hidden * 2 / 4  # bf16, split by TP4
    touched = experts * (m.top_k / m.experts) / e.moe_decode_efficiency
    dense = memory.rollout_weight_bytes(m, 4) - experts
    hbm = 4.0e12 * e.hbm_efficiency * e.decode_efficiency
    read = (dense + touched + ctx * memory.kv_bytes_per_token(m, 4)) / hbm
    assert read < gpu < launch  # the all-reduces are the rest of the GPU time
    assert one_e - one_g == pytest.approx(launch - gpu, rel=1e-9)
    big_e, _ = step(256, True)
    big_g, _ = step(256, False)
    assert big_e == pytest.approx(big_g, rel=1e-12)  # hidden: the GPU time (HBM-bound) is the longer
    assert big_g - (e.decode_step_overhead_s + 256 * e.decode_sequence_overhead_s) > launch


def test_generation_drains_to_the_batchs_longest_response():
    """The phase ends when the slowest replica does: the drain runs to the expected longest of all
    prompts x n responses (the cap if one of them is truncated, probability 1 - (1 - p)^N; else the body's
    Beta(1, b) quantile N/(N+1)), the same on 1 or 8 replicas, and further than one replica's expected longest."""
    from grpo_tune.costmodel.lengths import CLIP_FRACTION, dist

    m = load_model("qwen2.5-7b")
    wl = Workload(prompts=128, n=16, mini_batch=32, prompt_len=256, response_len=8192, response_len_mean=800)
    d = dist(8192.0, 800.0)
    n = 128 * 16
    p = CLIP_FRACTION
    b = 1 / ((800 / 8192 - p) / (1 - p)) - 1  # the body's shape: the whole keeps the mean 800
    hit = 1 - (1 - p) ** n
    want = hit * 8192 + (1 - hit) * 8192 * (1 - (1 / (n + 1)) ** (1 / b))
    assert d.expected_max(n) == pytest.approx(want, rel=1e-9)
    got = []
    for gpus in (1, 8):
        s = validate(m, Strategy.of(rollout_tp=1), gpus)
        got.append(rollout.rollout_s(m, H20, Cluster(gpus=gpus), s, wl, CAL)["longest_response"])
    assert got == [pytest.approx(want, rel=1e-9)] * 2
    assert want > d.expected_max(n / 8)


def test_shipped_eager_launch_cost_is_inside_its_prior():
    """verl's fitted eager launch cost per layer stays inside the prior validate/grpo.py states (80 us-1.5
    ms), and NeMo-RL's rows (CUDA graphs) leave theirs at the unfitted default."""
    from grpo_tune.validate.grpo import PRIORS

    p = next(p for p in PRIORS if p.key == "eager_layer_overhead_s" and p.on == "stack:verl-0.9.1")
    assert p.lo <= load_stack("verl-0.9.1").params["eager_layer_overhead_s"] <= p.hi
    assert load_stack("nemo-rl-v0.3").params["eager_layer_overhead_s"] == pytest.approx(8e-5)


def test_micro_batch_host_cost_is_paid_on_every_pipeline_stage():
    """Megatron's 1F1B schedule calls the forward step on every stage, and NeMo-RL's and verl's forward steps
    fetch and pack the micro-batch on every rank, so a stage's critical path holds the whole per-micro-batch
    host cost (not 1/pp of it). By hand, Llama-3.1-8B on 8 H100, 64 x 8 sequences, mini-batch 16, mbs 1:
    - PP1 (DP8): 16 micro-batches per mini-batch, 4 mini-batches, the cost once in the forward and twice in
      the backward of each: 4 x 16 x 3 x h;
    - PP2 (DP4): 32 micro-batches, and 1F1B runs m + pp - 1 = 33 micro-batch slots: 4 x 33 x 3 x h;
    - PP2 with 2 model chunks per stage (interleaved): the bubble shrinks to (pp - 1) / vpp, 32 + 1/2 slots;
    - the old log-prob pass (forward only, 1 sequence per micro-batch): 512 / 4 = 128 micro-batches at PP2,
      129 slots x h."""
    m = load_model("llama-3.1-8b")
    wl = Workload(prompts=64, n=8, mini_batch=16, prompt_len=512, response_len=1024, response_len_mean=1024)
    h = 1e-2

    def times(pp, x, vpp=1):
        s = Strategy.of(tp=1, pp=pp, vpp=vpp, mbs=1, recompute="none")
        t = estimate(
            model=m,
            hardware=H100.with_efficiency(micro_batch_overhead_s=x),
            cluster=Cluster(gpus=8),
            strategy=s,
            workload=wl,
        ).time
        return t["update"], t["old_logprob"]

    for pp, slots in ((1, 16), (2, 33)):
        (u0, lp0), (u1, _) = times(pp, 0.0), times(pp, h)
        assert u1 - u0 == pytest.approx(4 * slots * 3 * h, rel=1e-6)
    (u0, _), (u1, _) = times(2, 0.0, vpp=2), times(2, h, vpp=2)
    assert u1 - u0 == pytest.approx(4 * 32.5 * 3 * h, rel=1e-6)
    (_, lp0), (_, lp1) = times(2, 0.0), times(2, h)
    assert lp1 - lp0 == pytest.approx(129 * h, rel=1e-6)


def test_packed_micro_batches_padded_to_the_longest_bin_under_pipeline_parallelism():
    """NeMo-RL v0.3 pads every packed micro-batch to the longest bin when PP > 1 (``pad_full_seq_to``, so that
    the pipeline's buffers keep one shape; first-fit-decreasing fills that bin to within a short sequence of
    the cap): the stack's ``pp_packed_fill`` = 1 prices each micro-batch at the cap. By hand, 16 x 8 sequences of
    256 + 512 tokens per mini-batch, cap 4096, packing efficiency 0.95:
    - PP2 (DP4): 32 x 768 = 24,576 tokens per rank, ceil(24,576 / 3,891.2) = 7 micro-batches of 3,510.9 packed
      tokens, computed on 4,096 with the fill (verl's stack: 0, the packed tokens);
    - PP1 (DP8): no pipeline buffers, the packed 12,288 / 4 = 3,072 tokens either way."""
    from grpo_tune.costmodel.timing import micro_batch_plan

    wl = Workload(
        prompts=64, n=8, mini_batch=16, prompt_len=512, response_len=1024, prompt_len_mean=256, response_len_mean=512
    )
    s2 = Strategy.of(tp=1, pp=2, max_tokens_per_gpu=4096).replace(dp=4)
    s1 = Strategy.of(tp=1, pp=1, max_tokens_per_gpu=4096).replace(dp=8)
    assert micro_batch_plan(s2, wl, 128, 0.95) == (pytest.approx(24576 / 7), 7)
    assert micro_batch_plan(s2, wl, 128, 0.95, pp_packed_fill=1.0) == (4096.0, 7)
    assert micro_batch_plan(s1, wl, 128, 0.95, pp_packed_fill=1.0) == (3072.0, 4)
    assert load_stack("nemo-rl-v0.3").params["pp_packed_fill"] == 1.0
    assert load_stack("verl-0.9.1").params.get("pp_packed_fill", 0.0) == 0.0


def test_moe_dispatcher_copies_are_priced_as_hbm_traffic():
    """Megatron's all-to-all token dispatcher moves every routed copy of a token through HBM besides the expert
    GEMMs: permute (read the token, write the copy), sort_chunks_by_idxs by local expert and back (a read and a
    write each), unpermute (read the copy): 7 hidden-vectors of bf16 per copy with EP and more than one local
    expert, 3 without EP. By hand, Qwen3-30B-A3B (h 2048, top-8 of 128, expert FFN 768, every layer MoE) at TP1,
    4,096 tokens per micro-batch, routing imbalance 1.1: a layer's forward moves
    4,096 x (12 x 2,048 + 4 x 8 x 768 x 1.1) x 2 B (norms, residuals, the experts' activation)
    + 4,096 x 8 x 1.1 x 2,048 x 2 B x 7 (EP8) or x 3 (EP1) through HBM; read off as the forward's change
    between two HBM bandwidths (nothing else in a layer's time reads them)."""
    import dataclasses

    from grpo_tune.costmodel.train_time import layer_times

    m = load_model("qwen3-30b-a3b")
    tokens = 4096.0
    base = 4096 * (12 * 2048 + 4 * 8 * 768 * 1.1) * 2
    copy = 4096 * 8 * 1.1 * 2048 * 2
    for ep, passes in ((8, 7), (1, 3)):
        s = validate(m, Strategy.of(tp=1, ep=ep, recompute="none"), 8)
        fwd = []
        for bw in (3.35e12, 6.7e12):
            hw = dataclasses.replace(H100, hbm_bandwidth_bytes_per_s=bw)
            fwd.append(layer_times(m, hw, hw.efficiency, Cluster(gpus=8), s, tokens, 2048.0, dict(CAL))["fwd"])
        he = H100.efficiency.hbm_efficiency
        moved = (fwd[0] - fwd[1]) / (1 / (3.35e12 * he) - 1 / (6.7e12 * he))
        assert moved == pytest.approx(base + passes * copy, rel=1e-6)
