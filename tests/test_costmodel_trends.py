"""Issue 9's trend checks, each against a value computed by hand from the model's stated formulas."""

from __future__ import annotations

import math

import pytest

from grpo_tune.costmodel import memory, timing, timing_base, train_time
from grpo_tune.costmodel.estimate import estimate
from grpo_tune.costmodel.train_time import CPU_ADAM_BYTES_PER_PARAM, CPU_ADAM_FLOPS_PER_PARAM
from grpo_tune.costmodel.weight_sync import weight_sync_s
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import SYNC_BUCKET_MB, Cluster, Strategy, Workload, validate

H100 = load_hardware("h100")
CAL = timing.CALIBRATION_DEFAULTS
M7 = load_model("qwen2.5-7b")
WL = Workload(prompts=256, n=4, mini_batch=64, prompt_len=1024, response_len=1024, response_len_mean=512)


def est(s: Strategy, wl: Workload = WL, m=M7, gpus: int = 8):
    return estimate(model=m, hardware=H100, cluster=Cluster(gpus=gpus), strategy=s, workload=wl)


def test_a_lower_token_cap_lowers_peak_activations():
    """With flash attention every stored activation is linear in the micro-batch's tokens, so
    halving the cap (both caps hold the 2048-token sequence) halves the update's activations and
    the logits exactly; fewer tokens per micro-batch mean more micro-batches."""
    big = est(Strategy.of(tp=2, max_tokens_per_gpu=8192, rollout_tp=2))
    small = est(Strategy.of(tp=2, max_tokens_per_gpu=4096, rollout_tp=2))
    a_big, a_small = big.memory["update"].parts, small.memory["update"].parts
    assert a_small["activations"] == pytest.approx(a_big["activations"] / 2)
    assert a_small["logits"] == pytest.approx(a_big["logits"] / 2)
    assert small.details["micro_batches"] > big.details["micro_batches"]
    # micro-batches by hand: 64 x 4 sequences of 1024 + 512 tokens over dp 4, cap x packing 0.95
    assert small.details["micro_batches"] == math.ceil(64 * 4 / 4 * 1536 / (4096 * 0.95))


def test_the_cpu_optimizer_lowers_gpu_memory_and_adds_host_time():
    base = Strategy.of(tp=2, rollout_tp=2)
    cpu = base.replace(cpu_optimizer=1.0, overlap_cpu_optimizer=True)
    a, b = est(base), est(cpu)
    # Without the precision-aware optimizer the distributed optimizer's fp32 copy of the param shard stays on
    # the GPU (megatron-core distrib_optimizer.py: 4 B per shard parameter); with it, nothing of the state.
    shard0 = train_time.optimizer_shard(M7, validate(M7, base, 8))
    # (memory counts the most loaded stage's parameters exactly, the time model's shard is its O(1) twin: 3e-5 apart)
    assert b.memory["update"].parts["optimizer"] == pytest.approx(4 * shard0, rel=1e-4)
    assert 4 * shard0 < a.memory["update"].parts["optimizer"]
    pa = est(cpu.replace(precision_aware_optimizer=True))
    assert pa.memory["update"].parts["optimizer"] == 0
    assert b.peak_bytes <= a.peak_bytes and b.host_bytes_per_node > a.host_bytes_per_node
    # Update time: + CPU Adam over the rank's shard (8 ranks share the node's DRAM bandwidth and
    # FLOP/s; copies overlapped), - the GPU Adam it replaces; 4 mini-batches per step.
    s = validate(M7, base, 8)
    shard = train_time.optimizer_shard(M7, s)
    t_cpu = max(
        8 * shard * CPU_ADAM_BYTES_PER_PARAM / H100.host_memory_bandwidth_bytes_per_s,
        8 * shard * CPU_ADAM_FLOPS_PER_PARAM / H100.host_flops_per_s,
    )
    t_copy = shard * 6 / H100.host_to_device_bandwidth_bytes_per_s
    t_gpu = shard * timing_base.ADAM_BYTES_PER_PARAM / (H100.hbm_bandwidth_bytes_per_s * H100.efficiency.hbm_efficiency)
    want = 4 * (max(t_cpu, t_copy) - t_gpu)
    assert b.time["update"] - a.time["update"] == pytest.approx(want, rel=1e-6)
    assert want > 0


def test_max_num_seqs_raises_concurrency_until_the_kv_cache_binds():
    c = Cluster(gpus=8)
    wl = Workload(prompts=512, n=8, mini_batch=64, prompt_len=1024, response_len=4096, response_len_mean=2048)
    seqs_per_replica = 512 * 8 / 4
    conc = []
    for n in (32, 64, 128, 256, 512, 1024):
        s = validate(M7, Strategy.of(tp=2, rollout_tp=2, gpu_memory_utilization=0.5, max_num_seqs=n), 8)
        got = timing.rollout_s(M7, H100, c, s, wl, CAL)["concurrency"]
        kv = memory.kv_cache_capacity(M7, H100, s, wl).tokens
        assert got == pytest.approx(min(n, kv / (1024 + 2048), seqs_per_replica))  # by hand
        conc.append((n, got, kv / (1024 + 2048)))
    assert [g for _, g, _ in conc[:3]] == [32, 64, 128]  # max_num_seqs binds
    assert conc[-1][1] < 1024 and conc[-1][1] == pytest.approx(conc[-1][2])  # then the KV cache does
    # Past the binding point a larger max_num_seqs only enlarges vLLM's sampler buffer (max_num_seqs x
    # vocab fp32 logits), which takes a little from the KV cache: concurrency stays at the KV bound.
    bound = next(i for i, (n, g, _) in enumerate(conc) if g < n)
    assert all(b[1] > a[1] for a, b in zip(conc[:bound], conc[1 : bound + 1]))
    assert all(g == pytest.approx(k) for _, g, k in conc[bound:])


def test_weight_sync_grows_with_model_bytes_and_buckets():
    c = Cluster(gpus=8)
    e = H100.efficiency
    parts = {}
    for name in ("qwen2.5-7b", "qwen2.5-14b"):
        m = load_model(name)
        parts[name] = weight_sync_s(m, H100, c, validate(m, Strategy.of(tp=2, rollout_tp=2), 8), CAL)
    assert sum(v for k, v in parts["qwen2.5-14b"].items() if k.endswith("_s")) > sum(
        v for k, v in parts["qwen2.5-7b"].items() if k.endswith("_s")
    )
    s = validate(M7, Strategy.of(tp=2, rollout_tp=2), 8)
    one = weight_sync_s(M7, H100, c, s, CAL)
    small = weight_sync_s(M7, H100, c, s.replace(sync_bucket_mb=SYNC_BUCKET_MB // 8), CAL)
    total = timing.model_consts(M7)["total_params"] * 2
    assert one["buckets"] == math.ceil(total / (SYNC_BUCKET_MB * 2**20))
    assert small["buckets"] == math.ceil(total / (SYNC_BUCKET_MB * 2**20 / 8))
    assert small["overhead_s"] - one["overhead_s"] == pytest.approx(
        (small["buckets"] - one["buckets"]) * e.sync_bucket_overhead_s
    )


def test_a_token_budget_below_the_longest_sequence_is_flagged():
    e = est(Strategy.of(tp=2, rollout_tp=2, max_tokens_per_gpu=1000))
    assert "BATCH_DIVISIBILITY" in [v.code for v in e.violations]
    ok = est(Strategy.of(tp=2, rollout_tp=2, max_tokens_per_gpu=2048))
    assert "BATCH_DIVISIBILITY" not in [v.code for v in ok.violations]


def test_eager_costs_time_per_step_and_frees_the_graph_memory():
    """Eager vLLM's forward takes the longer of the GPU's time and the host's launches (layers x
    eager_layer_overhead_s; CUDA graphs replay the forward as one launch), so eager is never cheaper
    per step, and costs exactly the launches' excess over the GPU time; it gets the captured graphs'
    memory back for the KV cache."""
    c = Cluster(gpus=8)
    s = validate(M7, Strategy.of(tp=2, rollout_tp=2, max_num_seqs=256), 8)
    graphs = timing.rollout_s(M7, H100, c, s, WL, CAL)
    eager = timing.rollout_s(M7, H100, c, s.replace(enforce_eager=True), WL, CAL)
    assert graphs["concurrency"] <= 512  # within vLLM's captured sizes
    e = H100.efficiency
    launch = M7.layers * e.eager_layer_overhead_s
    host = e.decode_step_overhead_s + graphs["concurrency"] * e.decode_sequence_overhead_s
    gpu = graphs["decode_step_s"] - host
    if graphs["concurrency"] == eager["concurrency"]:
        assert eager["decode_step_s"] - graphs["decode_step_s"] == pytest.approx(max(0.0, launch - gpu), abs=1e-12)
    assert eager["decode_s"] >= graphs["decode_s"]
    kv_g = memory.kv_cache_capacity(M7, H100, s, WL).kv_bytes
    kv_e = memory.kv_cache_capacity(M7, H100, s.replace(enforce_eager=True), WL).kv_bytes
    assert kv_e - kv_g == pytest.approx(memory.CUDA_GRAPH_BYTES)
