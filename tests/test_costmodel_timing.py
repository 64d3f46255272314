"""Time model: each term against hand-computed values, the trends the issue names, calibration,
the CPU profile's sanity and the cost of one call."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _inputs import gpt_spec
from grpo_tune.costmodel.lengths import CLIP_FRACTION
from grpo_tune.costmodel import comm, timing, train_time
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.costmodel.estimate import estimate
from grpo_tune.costmodel.memory import kv_bytes_per_token, kv_cache_capacity, rollout_weight_bytes
from grpo_tune.costmodel.params import active_params, embedding_params
from grpo_tune.core.specs import Efficiency, ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate

A100 = load_hardware("a100")
H100 = load_hardware("h100")
CPU = load_hardware("cpu")
CAL = timing.CALIBRATION_DEFAULTS


def gpt(h: int, a: int, layers: int, vocab: int = 51200) -> ModelSpec:
    return gpt_spec(h, a, layers, vocab=vocab, tied=True)


EFF_KEYS = {f.name for f in dataclasses.fields(Efficiency)}


def hw_with(hw, **kw):
    eff = {k: kw.pop(k) for k in list(kw) if k in EFF_KEYS}
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **eff), **kw)


def step(model, hw, gpus, strategy, workload, gpus_per_node=8, calibration=None):
    s = validate(model, strategy, gpus, gpus_per_node=gpus_per_node, allow_cross_node_tp=True)
    t, th, _ = timing.step_time(
        model, hw, Cluster(gpus=gpus, gpus_per_node=gpus_per_node), s, workload, cal=calibration
    )
    return t, th


def layer_fwd(m, hw, e, c, s, seq):
    """Forward seconds of one layer for one micro-batch of mbs sequences of ``seq`` tokens."""
    return train_time.layer_times(m, hw, e, c, s, s.batching.mbs * seq, seq, CAL)["fwd"]


# ---------------------------------------------------------------------------------------------
# Terms in isolation
# ---------------------------------------------------------------------------------------------


def test_collectives_use_nccl_tests_bus_factors():
    # nccl-tests PERFORMANCE.md: all-reduce moves 2(n-1)/n of the buffer, all-gather/RS (n-1)/n.
    assert comm.all_reduce_s(1e9, 8, 100e9) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    assert comm.all_gather_s(1e9, 4, 100e9) == pytest.approx(3 / 4 * 1e9 / 100e9)
    assert comm.reduce_scatter_s(1e9, 4, 100e9, latency_s=1e-5) == pytest.approx(1e-5 + 0.0075)
    assert comm.all_reduce_s(1e9, 1, 100e9) == 0.0
    assert comm.p2p_s(5e8, 50e9) == pytest.approx(0.01)
    # Rank order tp -> cp -> dp -> pp: a group of 16 consecutive ranks crosses 8-GPU nodes.
    assert comm.spans_nodes(16, 8) and not comm.spans_nodes(8, 8)
    ce, one = A100.efficiency.comm_efficiency, {"comm_efficiency_scale": 1.0}
    assert comm.link(A100, 16, 8, one) == (
        A100.inter_node_bandwidth_bytes_per_s * ce,
        A100.efficiency.inter_node_latency_s,
    )
    assert comm.link(A100, 8, 8, one) == (
        A100.intra_node_bandwidth_bytes_per_s * ce,
        A100.efficiency.intra_node_latency_s,
    )


def test_gpt_flops_match_narayanan_eq3_by_hand():
    # Narayanan et al. 2021 eq. 3 counts 24 l h^2 (1 + s/(6h)) + 2 h V forward FLOPs per token
    # with the full s x s attention scores (causal_fraction 1).
    h, a, l, s, v = 2304, 24, 24, 2048, 51200
    m = gpt(h, a, l, v)
    want = 24 * l * h * h * (1 + s / (6 * h)) + 2 * h * v
    assert timing.forward_flops_per_token(m, s, causal_fraction=1.0) == pytest.approx(want, rel=1e-12)
    # FlashAttention computes half of the causal scores: the 4 s h term halves.
    assert timing.forward_flops_per_token(m, s, causal_fraction=0.5) == pytest.approx(want - 2 * l * s * h, rel=1e-12)


def test_swiglu_gqa_flops_by_hand():
    m = load_model("tiny")  # h 64, ffn 128, 4 heads, 2 kv heads, head_dim 16, vocab 128, 4 layers
    attn_w = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64  # QKV + output projection
    mlp_w = 3 * 64 * 128  # gate, up, down
    per_layer = 2 * (attn_w + mlp_w) + 2 * 4 * (16 + 16) * 32 * 0.5  # + causal QK^T and AV at s=32
    want = 4 * per_layer + 2 * 64 * 128
    assert timing.forward_flops_per_token(m, 32, causal_fraction=0.5) == pytest.approx(want)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen3-30b-a3b", "deepseek-v3", "moonlight-16b-a3b"])
def test_matmul_flops_are_twice_the_active_weights(name):
    # At zero context only the weight matmuls remain: 2 FLOPs per active weight per token, the
    # input embedding (a lookup) excluded. MoE counts the top_k routed experts only.
    m = load_model(name)
    f0 = timing.forward_flops_per_token(m, 0)
    assert f0 == pytest.approx(2 * (active_params(m) - embedding_params(m)), rel=2e-3)


def test_gemm_efficiency_curve_by_hand():
    e = Efficiency(gemm_efficiency_max=0.8, gemm_intensity_half=100.0)
    i = 1 / (1 / 1000 + 1 / 1000 + 1 / 500)
    assert timing.gemm_efficiency(e, 1000, 1000, 500) == pytest.approx(0.8 * i / (i + 100))
    assert timing.gemm_efficiency(e, 1, 4096, 4096) < 0.01  # a decode-sized GEMM is far from peak


def test_pipeline_bubble_by_hand():
    # (m + (p-1)/v) micro-batch times: bubble fraction (p-1)/(v m) (Narayanan et al. 2021 sec. 2.2).
    assert timing.pipeline_s(1.0, 8, 4, 1) == pytest.approx(8 + 3)
    assert timing.pipeline_s(1.0, 8, 4, 2) == pytest.approx(8 + 1.5)
    assert timing.pipeline_s(2.0, 16, 1, 1) == pytest.approx(32)


def test_tp_all_reduce_term_by_hand():
    # Two layer-forward all-reduces of b*s*h bf16 values; only the link bandwidth differs.
    m = gpt(4096, 32, 8)
    e = A100.efficiency
    s = validate(m, Strategy.of(tp=4, sequence_parallel=False, mbs=1), 4)
    c = Cluster(gpus=4, gpus_per_node=8)
    slow = hw_with(A100, intra_node_bandwidth_bytes_per_s=100e9)
    fast = hw_with(A100, intra_node_bandwidth_bytes_per_s=400e9)
    f_slow = layer_fwd(m, slow, e, c, s, 2048)
    f_fast = layer_fwd(m, fast, e, c, s, 2048)
    nbytes = 2048 * 4096 * 2
    ce = e.comm_efficiency
    want = 2 * (2 * 3 / 4 * nbytes) * (1 / (100e9 * ce) - 1 / (400e9 * ce))
    assert f_slow - f_fast == pytest.approx(want, rel=1e-9)


def test_cp_ring_exchange_by_hand():
    # cp-1 hops of this rank's K/V chunk per layer forward, hidden behind attention when it can be;
    # with attention made free the whole ring shows.
    m = load_model("llama-3.1-8b")  # 8 KV heads of 128
    e = dataclasses.replace(H100.efficiency, attention_efficiency=1e12)
    s = validate(m, Strategy.of(cp=4, mbs=1), 4)
    c = Cluster(gpus=4, gpus_per_node=8)
    slow = hw_with(H100, intra_node_bandwidth_bytes_per_s=10e9)
    fast = hw_with(H100, intra_node_bandwidth_bytes_per_s=40e9)
    d = layer_fwd(m, slow, e, c, s, 8192) - layer_fwd(m, fast, e, c, s, 8192)
    chunk = 8192 / 4 * 2 * 8 * 128 * 2  # tokens per rank x (K, V) x kv heads x head_dim x bf16
    ce = e.comm_efficiency
    assert d == pytest.approx(3 * chunk * (1 / (10e9 * ce) - 1 / (40e9 * ce)), rel=1e-9)
    # On NVLink the ring (3 x 8.4 MB) takes less than the attention it overlaps with: fully hidden,
    # the same forward as with infinitely fast links (Megatron/TE overlap the ring with attention).
    e_real = H100.efficiency
    free = hw_with(H100, intra_node_bandwidth_bytes_per_s=1e18, intra_node_latency_s=0.0)
    assert layer_fwd(m, H100, e_real, c, s, 8192) == pytest.approx(layer_fwd(m, free, e_real, c, s, 8192))


def test_dp_all_reduce_term_by_hand():
    m = gpt(2048, 16, 4)
    hw = hw_with(A100, dp_overlap=0.0)
    s = validate(m, Strategy.of(mbs=1, distributed_optimizer=False), 8)
    parts, _ = timing.train_s(
        m, hw, Cluster(gpus=8, gpus_per_node=8), s, tokens_mb=1024, micro_batches=8, seq_len=1024, cal=CAL
    )
    dense, expert = timing.rank_params(m, s)
    e = hw.efficiency
    want = comm.all_reduce_s(
        dense * 4, 8, A100.intra_node_bandwidth_bytes_per_s * e.comm_efficiency, e.intra_node_latency_s
    )
    assert expert == 0
    assert parts.dp_s == pytest.approx(want)
    # 64 sequences / (dp 8 x mbs 1)
    wl = Workload(kind="pretrain", gbs=64, seq_len=1024)
    assert timing.micro_batch_plan(s, wl, 64, 0.95) == (1024, 8)


def test_offload_transfers_by_hand():
    m = load_model("qwen2.5-7b")
    s = validate(m, Strategy.of(tp=2, offload=("param", "optimizer")), 8)
    dense, expert = timing.rank_params(m, s)
    p = dense + expert
    wl = Workload(kl=True)
    # verl 0.9.1 (verl/utils/megatron_utils.py): params round-trip pinned around old log-prob and
    # the update (the weight-sync round trip is priced in weight sync); the reference model's
    # params and the optimizer state (12 B/param, sharded over dp=4) round-trip pageable.
    h2d = H100.host_to_device_bandwidth_bytes_per_s
    pageable = h2d * H100.efficiency.pageable_copy_fraction
    want = 2 * 2 * p * 2 / h2d + 2 * p * 2 / pageable + 2 * p * 12 / 4 / pageable
    assert timing.offload_s(m, H100, s, wl) == pytest.approx(want)
    assert timing.offload_s(m, H100, s.replace(offload=()), wl) == 0.0


def test_decode_follows_the_formula():
    m = load_model("qwen2.5-7b")
    wl = Workload(prompts=256, n=4, prompt_len=512, response_len=1024, response_len_mean=600, mini_batch=64)
    s = validate(m, Strategy.of(tp=2, rollout_tp=2, gpu_memory_utilization=0.6), 8)
    ro = timing.rollout_s(m, H100, Cluster(gpus=8), s, wl, CAL)
    seqs = 256 * 4 / 4  # 4 replicas
    kv_tokens = kv_cache_capacity(m, H100, s, wl).tokens
    conc = min(seqs, 256, kv_tokens / (512 + 600))  # max_num_seqs 256 (verl's default)
    assert ro["concurrency"] == pytest.approx(conc)
    # Lengths: a share p truncated at the cap, the rest ~ 1024 x Beta(1, b) keeping the mean 600; generation
    # ends with the slowest replica: the expected longest of the batch's 1024 responses (the cap when one of
    # them is truncated, else the body's 1024/1025 quantile).
    p = CLIP_FRACTION
    b = 1 / ((600 / 1024 - p) / (1 - p)) - 1
    hit = 1 - (1 - p) ** 1024
    assert ro["longest_response"] == pytest.approx(hit * 1024 + (1 - hit) * 1024 * (1 - (1 / 1025) ** (1 / b)))
    # A step costs at least the weight + KV reads over the achieved HBM bandwidth (vLLM decode at
    # decode_efficiency of its roofline), plus the TP all-reduces and the per-step overhead.
    e = H100.efficiency
    t_mem = (rollout_weight_bytes(m, 2) + conc * (512 + 300) * kv_bytes_per_token(m, 2)) / (
        H100.hbm_bandwidth_bytes_per_s * e.hbm_efficiency * e.decode_efficiency
    )
    assert ro["decode_step_s"] > t_mem + e.decode_step_overhead_s
    if ro["memory_bound"]:
        assert ro["decode_step_s"] < 1.2 * (t_mem + e.decode_step_overhead_s) + 1e-3
    # Every sequence runs at once (256 <= conc): the batch drains over the longest response, each
    # step cheaper than at full concurrency and dearer than with one sequence left.
    one = timing.rollout_s(m, H100, Cluster(gpus=8), s, wl.replace(prompts=1, n=1, mini_batch=1), CAL)
    assert (
        ro["longest_response"] * one["decode_step_s"] * 0.9
        < ro["decode_s"]
        < ro["longest_response"] * ro["decode_step_s"]
    )


# ---------------------------------------------------------------------------------------------
# Trends
# ---------------------------------------------------------------------------------------------


def pretrain_s(m, hw, gpus, strategy, gbs=64, seq_len=2048, gpus_per_node=8):
    t, _ = step(m, hw, gpus, strategy, Workload(kind="pretrain", gbs=gbs, seq_len=seq_len), gpus_per_node)
    return t.step_s


def test_more_micro_batches_shrink_the_bubble_and_vpp_shrinks_it_further():
    m = gpt(4096, 32, 32)
    base = dict(tp=8, pp=4, mbs=1)
    per_seq = {}
    for gbs in (8, 32, 128):
        per_seq[gbs] = pretrain_s(m, A100, 32, Strategy.of(**base), gbs=gbs) / gbs
    assert per_seq[8] > per_seq[32] > per_seq[128]
    t1 = pretrain_s(m, A100, 32, Strategy.of(**base), gbs=16)
    t2 = pretrain_s(m, A100, 32, Strategy.of(**base, vpp=2), gbs=16)
    t4 = pretrain_s(m, A100, 32, Strategy.of(**base, vpp=4), gbs=16)
    assert t1 > t2 > t4
    # Bubble (p-1)/(v m): with m = 16 micro-batches and p = 4 the pipeline takes 16 + 3/v
    # micro-batch times. Interleaving also sends v times more p2p traffic (sec. 2.2.2): take the
    # links out to see the bubble alone.
    c = Cluster(gpus=32, gpus_per_node=8)
    fast = hw_with(
        A100,
        inter_node_bandwidth_bytes_per_s=1e18,
        intra_node_bandwidth_bytes_per_s=1e18,
        inter_node_latency_s=0.0,
        intra_node_latency_s=0.0,
    )
    comp = {
        v: timing.train_s(
            m,
            fast,
            c,
            validate(m, Strategy.of(**base, vpp=v), 32),
            tokens_mb=2048,
            micro_batches=16,
            seq_len=2048,
            cal=CAL,
        )[0].compute_s
        for v in (1, 2, 4)
    }
    assert comp[1] / comp[2] == pytest.approx((16 + 3) / (16 + 1.5), rel=0.01)
    assert comp[1] / comp[4] == pytest.approx((16 + 3) / (16 + 0.75), rel=0.01)


def test_tp_spanning_nodes_is_slower():
    m = gpt(8192, 64, 8)
    inside = pretrain_s(m, A100, 16, Strategy.of(tp=16, mbs=1), gbs=16, gpus_per_node=16)
    across = pretrain_s(m, A100, 16, Strategy.of(tp=16, mbs=1), gbs=16, gpus_per_node=8)
    assert across > 1.5 * inside


def test_ep_spanning_nodes_is_slower():
    m = load_model("qwen3-30b-a3b")
    e_in = layer_fwd(
        m, H100, H100.efficiency, Cluster(gpus=16, gpus_per_node=16), validate(m, Strategy.of(ep=16), 16), 4096
    )
    e_out = layer_fwd(
        m, H100, H100.efficiency, Cluster(gpus=16, gpus_per_node=8), validate(m, Strategy.of(ep=16), 16), 4096
    )
    assert e_out > e_in


def test_offload_costs_time_and_saves_memory():
    m = load_model("qwen2.5-7b")
    c = Cluster(gpus=8)
    wl = Workload(prompts=64, n=4, prompt_len=512, response_len=512, mini_batch=16)
    plain = estimate(model=m, hardware=H100, cluster=c, strategy=Strategy.of(tp=2, rollout_tp=2), workload=wl)
    off = estimate(
        model=m,
        hardware=H100,
        cluster=c,
        workload=wl,
        strategy=Strategy.of(tp=2, rollout_tp=2, offload=("param", "grad", "optimizer")),
    )
    assert off.time["offload"] > 0 == plain.time["offload"]
    assert off.step_s > plain.step_s
    assert off.memory["rollout"].total_bytes < plain.memory["rollout"].total_bytes
    assert off.peak_bytes < plain.peak_bytes


def test_rollout_tp_lowers_memory_and_changes_decode_as_modelled():
    c = Cluster(gpus=8)
    # KV-limited: 32B at 0.7 of HBM. More rollout TP: fewer weight bytes per GPU, so more KV room
    # per replica, more concurrent sequences, a shorter decode.
    m = load_model("qwen2.5-32b")
    wl = Workload(prompts=128, n=8, prompt_len=1024, response_len=2048, mini_batch=32)
    res = {}
    for rtp in (2, 4, 8):
        est = estimate(
            model=m,
            hardware=H100,
            cluster=c,
            workload=wl,
            strategy=Strategy.of(tp=4, pp=2, rollout_tp=rtp, gpu_memory_utilization=0.7, max_num_seqs=4096),
        )
        res[rtp] = (est.memory["rollout"].parts, timing.rollout_s(m, H100, c, est.strategy, wl, CAL))
    w = {r: res[r][0]["rollout_weights"] for r in res}  # bytes per GPU, from the memory model
    assert w[2] > w[4] > w[8]
    # The time model's concurrency is the memory model's KV capacity (mean = max response here).
    for rtp in res:
        est_seqs = kv_cache_capacity(
            m, H100, Strategy.of(rollout_tp=rtp, gpu_memory_utilization=0.7, max_num_seqs=4096), wl
        ).sequences
        assert int(res[rtp][1]["concurrency"]) == est_seqs
    assert res[2][1]["concurrency"] < res[4][1]["concurrency"] < res[8][1]["concurrency"]
    assert res[2][1]["decode_s"] > res[4][1]["decode_s"] > res[8][1]["decode_s"]
    for rtp, (_, ro) in res.items():  # steps x step time, each replica with its share of sequences
        seqs = 128 * 8 / (8 // rtp)
        assert ro["decode_s"] == pytest.approx((seqs * 2048 / ro["concurrency"]) * ro["decode_step_s"], rel=1e-2)
    # Not KV-limited (every sequence runs at once): a step reads weights/rtp, so it gets cheaper
    # with rollout TP even though each replica carries more sequences.
    m = load_model("qwen2.5-7b")
    wl = Workload(prompts=32, n=8, prompt_len=512, response_len=1024, mini_batch=32)
    ro = {r: timing.rollout_s(m, H100, c, validate(m, Strategy.of(tp=2, rollout_tp=r), 8), wl, CAL) for r in (1, 2, 4)}
    assert [ro[r]["concurrency"] for r in (1, 2, 4)] == [32, 64, 128]
    assert ro[1]["decode_step_s"] > ro[2]["decode_step_s"] > ro[4]["decode_step_s"]
    assert ro[1]["decode_s"] == pytest.approx(1024 * ro[1]["decode_step_s"], rel=1e-2)


def test_longer_tail_raises_rollout_and_leaves_the_update_alone():
    """Same mean, a larger maximum: the expected longest response of the batch grows (by hand: the cap when
    one of the N responses of the step is truncated, probability 1 - (1 - p)^N, else the quantile N/(N+1) of
    the body max x Beta(1, b) that keeps the mean), so rollout takes longer; training is priced on the mean
    tokens, so the log-prob passes do not move, nor the update where the stack balances every optimizer step's
    sequences across DP ranks (NeMo-RL); under verl (the step's batch balanced, then split into mini-batches) the
    update moves only by the slowest DP rank's spread, which the longer tail widens."""
    m = load_model("qwen2.5-7b")
    c = Cluster(gpus=8)
    s = validate(m, Strategy.of(tp=2, rollout_tp=2, mbs=1), 8)
    short = Workload(prompts=64, n=8, response_len=1024, response_len_mean=512, mini_batch=16)
    long = short.replace(response_len=8192)
    n = 64 * 8
    for wl in (short, long):
        p = CLIP_FRACTION
        b = 1 / ((512 / wl.response_len - p) / (1 - p)) - 1
        hit = 1 - (1 - p) ** n
        want = wl.response_len * (hit + (1 - hit) * (1 - (1 / (n + 1)) ** (1 / b)))
        assert timing.rollout_s(m, H100, c, s, wl, CAL)["longest_response"] == pytest.approx(want)
    t_short, _ = step(m, H100, 8, s, short)
    t_long, _ = step(m, H100, 8, s, long)
    assert t_long["rollout"] > 1.5 * t_short["rollout"]
    # the passes are priced on the mean tokens; only verl's controller moves the batch padded to the cap (8x the
    # response columns: costmodel.train_time.controller_s)
    ctl = {k: train_time.controller_s(H100, wl, "logprob") for k, wl in (("short", short), ("long", long))}
    assert ctl["long"] > 4 * ctl["short"] > 0
    assert t_long["old_logprob"] - ctl["long"] == pytest.approx(t_short["old_logprob"] - ctl["short"])
    f_short, f_long = timing.slowest_rank_factor(short, 4), timing.slowest_rank_factor(long, 4)
    assert 1.0 < f_short < f_long
    up = {
        k: t["update"] - train_time.controller_s(H100, wl, "update")
        for k, t, wl in (("s", t_short, short), ("l", t_long, long))
    }
    assert 1.0 < up["l"] / up["s"] <= f_long / f_short + 1e-9
    from grpo_tune.core.hardware import with_stack

    nemo = with_stack(H100, "nemo-rl-v0.3")
    assert step(m, nemo, 8, s, long)[0]["update"] == pytest.approx(step(m, nemo, 8, s, short)[0]["update"])


def test_recompute_costs_time():
    m = gpt(6144, 64, 48)
    t = {r: pretrain_s(m, A100, 8, Strategy.of(tp=8, mbs=1, recompute=r), gbs=8) for r in ("none", "selective", "full")}
    assert t["none"] < t["selective"] < t["full"]
    assert t["full"] / t["none"] == pytest.approx(4 / 3, rel=0.12)  # one more forward of three passes


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------


def test_calibration_unknown_key_is_coded():
    with pytest.raises(GrpoTuneError) as ei:
        timing.check_calibration({"compute_eficiency_scale": 1.0})
    assert ei.value.code == "BAD_CONFIG" and "compute_efficiency_scale" in ei.value.hint
    with pytest.raises(GrpoTuneError):
        timing.check_calibration({"compute_efficiency_scale": 0.0})
    with pytest.raises(GrpoTuneError):
        timing.check_calibration({"rollout_overhead_s": float("nan")})


def test_calibration_is_applied():
    m = load_model("qwen2.5-7b")
    wl = Workload(prompts=64, n=4, prompt_len=512, response_len=512, mini_batch=16)
    base, _ = step(m, H100, 8, Strategy.of(tp=2, rollout_tp=2), wl)
    over, _ = step(
        m, H100, 8, Strategy.of(tp=2, rollout_tp=2), wl, calibration={"rollout_overhead_s": 3.0, "step_overhead_s": 1.0}
    )
    assert over["rollout"] == pytest.approx(base["rollout"] + 3.0)
    assert over.step_s == pytest.approx(base.step_s + 4.0)
    fast, _ = step(m, H100, 8, Strategy.of(tp=2, rollout_tp=2), wl, calibration={"compute_efficiency_scale": 2.0})
    assert fast["update"] < 0.7 * base["update"]
    assert fast["rollout"] == pytest.approx(base["rollout"])


def test_phases_sum_to_the_step():
    m = load_model("qwen3-30b-a3b")
    t, th = step(m, H100, 16, Strategy.of(tp=2, ep=4, rollout_tp=4, offload=("optimizer",)), Workload())
    assert set(t.phases) == set(timing.PHASES)
    assert sum(t.phases.values()) == pytest.approx(t.step_s)
    assert 0 < th.mfu < 1 and th.tokens_per_s_per_gpu > 0


# ---------------------------------------------------------------------------------------------
# The CPU profile and speed
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gpus,strategy", [(1, Strategy()), (2, Strategy.of(tp=2)), (2, Strategy.of(pp=2)), (4, Strategy.of(tp=2, pp=2))]
)
def test_cpu_profile_gives_sensible_times_for_tiny(gpus, strategy):
    m = load_model("tiny")
    wl = Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=4)
    t, th = step(m, CPU, gpus, strategy, wl)
    # A real CPU run of this takes a few seconds: the model must say between 0.1 s and 60 s.
    assert 0.1 < t.step_s < 60
    assert all(v >= 0 and math.isfinite(v) for v in t.phases.values())
    assert t["rollout"] > 0 and t["update"] > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    mbs=st.integers(1, 4),
    recompute=st.sampled_from(["none", "selective", "full"]),
    prompts=st.sampled_from([8, 64, 512]),
    n=st.integers(1, 8),
    plen=st.integers(1, 4096),
    rlen=st.integers(1, 8192),
    rtp=st.sampled_from([1, 2, 4, 8]),
)
def test_times_are_finite_and_positive(tp, pp, mbs, recompute, prompts, n, plen, rlen, rtp):
    m = load_model("llama-3.1-8b")  # 32 heads, 8 KV heads: every tp/rollout_tp here divides them
    wl = Workload(prompts=prompts, n=n, prompt_len=plen, response_len=rlen, mini_batch=min(8, prompts))
    t, th = step(m, H100, 32, Strategy.of(tp=tp, pp=pp, mbs=mbs, recompute=recompute, rollout_tp=rtp), wl)
    assert math.isfinite(t.step_s) and t.step_s > 0
    assert all(math.isfinite(v) and v >= 0 for v in t.phases.values())
    assert 0 < th.mfu < 1


@settings(max_examples=80, deadline=None)
@given(
    cal=st.dictionaries(
        st.one_of(st.sampled_from(sorted(timing.CALIBRATION_DEFAULTS)), st.text(max_size=12)),
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(-5, 5),
            st.booleans(),
            st.text(max_size=3),
            st.none(),
        ),
        max_size=4,
    )
)
def test_any_calibration_is_accepted_or_a_coded_error(cal):
    m = load_model("tiny")
    try:
        t, _ = step(
            m,
            CPU,
            2,
            Strategy(),
            Workload(prompts=8, n=2, prompt_len=16, response_len=16, mini_batch=4),
            calibration=cal,
        )
    except GrpoTuneError as exc:
        assert exc.code == "BAD_CONFIG"
        return
    assert math.isfinite(t.step_s) and t.step_s > 0


def test_cpu_rollout_is_the_native_sampler():
    # trainer/rollout/megatron.py: no KV cache, one forward-only pass over every prefix per step,
    # weights shared with the actor (no sync).
    m = load_model("tiny")
    wl = Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=4)
    s = validate(m, Strategy.of(engine="megatron"), 2)  # the plan's engine: cpu plans default to it
    c = Cluster(gpus=2)
    ro = timing.native_rollout_s(m, CPU, c, s, wl, CAL)
    assert ro["decode_s"] == pytest.approx(16 * ro["decode_step_s"])
    fwd, _ = timing.train_s(
        m, CPU, c, s, tokens_mb=16 * 24, micro_batches=1, seq_len=16 + 8, cal=CAL, forward_only=True
    )
    assert ro["decode_step_s"] > fwd.compute_s
    t, _, _ = timing.step_time(m, CPU, c, s, wl)
    assert t["weight_sync"] == 0.0
    assert t["rollout"] == pytest.approx(ro["decode_s"])
    # Longer responses cost more than linearly: every step recomputes a longer prefix.
    ro2 = timing.native_rollout_s(m, CPU, c, s, wl.replace(response_len=64), CAL)
    assert ro2["decode_s"] > 4 * ro["decode_s"]


def test_oversubscribed_ranks_fill_the_pipeline_bubble():
    """With more ranks than cores (cpu profile), a stage idle in its bubble lends its core to the
    others: the wall time is max(critical path, busy time x ranks-per-core), not their product."""
    from grpo_tune.costmodel.timing import pipeline_s

    t, m, p = 0.1, 2, 2
    assert pipeline_s(t, m, p, 1) == pytest.approx(t * (m + p - 1))  # dedicated cores
    # 2 ranks per core: busy time x 2 = 0.4 s beats the critical path 0.3 s; returned / share
    assert pipeline_s(t, m, p, 1, share=2.0) * 2.0 == pytest.approx(t * m * 2.0)
    # a deep bubble still dominates when sharing is light
    assert pipeline_s(t, 1, 8, 1, share=2.0) * 2.0 == pytest.approx(t * 8)


def test_native_rollout_splits_rows_into_pp_micro_batches():
    """Engine.next_token_logits runs pp micro-batches per DP rank, so PP2 costs (p-1)/p of bubble,
    not a whole extra pass; on 2 ranks with 2 cores PP2 and DP2 roll out in about the same time."""
    from grpo_tune.costmodel.timing import native_rollout_s, check_calibration

    m, hw = load_model("tiny"), load_hardware("cpu")
    wl = Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8)
    cl = Cluster(gpus=2, gpus_per_node=2)
    cal = check_calibration(None)
    dp2 = native_rollout_s(m, hw, cl, validate(m, Strategy(), 2), wl, cal)["decode_s"]
    pp2 = native_rollout_s(m, hw, cl, validate(m, Strategy.of(pp=2), 2), wl, cal)["decode_s"]
    # critical path: 3 half-batch slots of 2 layers vs one full batch of 4 layers -> 1.5x at most
    assert pp2 / dp2 < 1.6
