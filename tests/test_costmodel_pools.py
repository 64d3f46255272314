"""Separate rollout and training pools (costmodel/pools.py, autotune/search/placement.py): trends
against hand-computed values, the pools' memory, the cross-pool sync, and the split the search finds."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from grpo_tune.autotune.search.placement import TIE as P_TIE
from grpo_tune.autotune.search.placement import choose_split, search_placement
from grpo_tune.autotune.search.driver import search
from grpo_tune.core.errors import ConfigError, InvalidDegreesError
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel import memory
from grpo_tune.costmodel import pools as P
from grpo_tune.core import placement as CP
from grpo_tune.costmodel import weight_sync as WS
from grpo_tune.costmodel.estimate import estimate
from grpo_tune.costmodel.timing_base import PARAM_BYTES, check_calibration, model_consts

H100 = load_hardware("h100")
CAL = check_calibration(None)


def sep(r: int, k: int = 0, **kw) -> Placement:
    return Placement(mode="separate", rollout_gpus=r, staleness=k, **kw)


# -- composition ------------------------------------------------------------------------------


def test_compose_hand_computed():
    # staleness 0: in sequence; >= 1: the slower pool plus the sync (every interval steps)
    assert P.compose_step(10.0, 5.0, 2.0, 0)["step_s"] == pytest.approx(17.0)
    one = P.compose_step(10.0, 5.0, 2.0, 1)
    assert one["step_s"] == pytest.approx(12.0)
    assert (one["rollout_busy"], one["train_busy"]) == pytest.approx((10 / 12, 5 / 12))
    assert P.compose_step(10.0, 5.0, 2.0, 2, sync_interval=2)["step_s"] == pytest.approx(11.0)
    assert P.compose_step(4.0, 9.0, 1.0, 1)["step_s"] == pytest.approx(10.0)  # training-bound


def test_staleness_zero_is_the_sum_of_the_phases_plus_the_sync():
    m, wl = load_model("qwen2.5-1.5b"), Workload(prompts=256, mini_batch=64)
    cl = Cluster(gpus=16)
    s = Strategy.of(tp=1, rollout_tp=1, gpu_memory_utilization=0.9)
    e = P.estimate_separate(model=m, hardware=H100, cluster=cl, strategy=s, workload=wl, placement=sep(8))
    f = e.placement
    # the parts, priced on their own pools
    train = P.train_pool(model=m, hardware=H100, cluster=Cluster(gpus=8), strategy=s, workload=wl)
    roll = P.generation(m, H100, Cluster(gpus=8), CP.rollout_strategy(s), wl, CAL, partial=False)
    ps = CP.pools(cl, 8)
    sync = WS.cross_pool_sync(m, H100, H100, ps, s, CAL)
    assert f["train_s"] == pytest.approx(train.step_s)
    assert f["gen_s"] == pytest.approx(roll["gen_s"])
    assert f["sync_s"] == pytest.approx(sync["sync_s"])
    assert e.step_s == pytest.approx(roll["gen_s"] + sync["sync_s"] + train.step_s, rel=1e-12)
    # no vLLM sleep/wake in either pool; the training pool recomputes the proximal log-probs (decoupled PPO)
    assert e.time.phases["rollout"] == pytest.approx(roll["prefill_s"] + roll["decode_s"])
    assert set(train.time.phases) == {"old_logprob", "ref_logprob", "update", "offload"}
    # one step later (staleness 1) the pools overlap
    e1 = P.estimate_separate(model=m, hardware=H100, cluster=cl, strategy=s, workload=wl, placement=sep(8, 1))
    assert e1.step_s == pytest.approx(max(f["gen_s"], f["train_s"]) + f["sync_s"])
    assert e1.step_s < e.step_s


# -- the split ---------------------------------------------------------------------------------


def test_search_finds_the_balanced_split_of_a_two_phase_toy():
    # generation 100/r s on r GPUs, training 60/(16-r) s on the rest: balanced where 100(16-r) = 60r, r = 10
    cands = list(range(1, 16))
    order = choose_split(cands, lambda r: 100 / r, lambda r: 60 / (16 - r), lambda r: 0.0, staleness=1)
    assert order[0] == (pytest.approx(10.0), 10)
    steps = dict((r, st) for st, r in order)
    # moving GPUs to the rollout pool helps while generation dominates, then hurts once training does
    assert all(steps[r] > steps[r + 1] for r in range(1, 10))
    assert all(steps[r] < steps[r + 1] for r in range(10, 15))
    # on-policy (in sequence) the optimum of 100/r + 60/(16-r) is at r = 16/(1+sqrt(0.6)) = 9.02 -> 9
    order0 = choose_split(cands, lambda r: 100 / r, lambda r: 60 / (16 - r), lambda r: 0.0, staleness=0)
    assert order0[0][1] == 9
    assert order0[0][0] == pytest.approx(100 / 9 + 60 / 7)


def test_real_split_curve_falls_while_generation_dominates_then_rises():
    # qwen2.5-1.5b on 2 nodes, GPUs split on every node; long responses make generation dominate at first
    m = load_model("qwen2.5-1.5b")
    wl = Workload(prompts=672, mini_batch=168, n=5, response_len=4096)  # 840 sequences split over 2..14 ranks
    cl = Cluster(gpus=16)
    s = Strategy.of(tp=1, rollout_tp=1, gpu_memory_utilization=0.9)
    rows = []
    for r in range(2, 16, 2):
        e = P.estimate_separate(model=m, hardware=H100, cluster=cl, strategy=s, workload=wl, placement=sep(r, 1))
        assert e.fits, [v.message for v in e.violations]
        rows.append((r, e.step_s, e.placement["gen_s"], e.placement["train_s"]))
    best = min(rows, key=lambda x: x[1])
    for (r0, s0, g0, t0), (r1, s1, g1, t1) in zip(rows, rows[1:]):
        if g1 > t1:  # still generation-bound after the move: it helps
            assert s1 < s0, (r0, r1)
        if g0 < t0:  # already training-bound: moving more GPUs hurts
            assert s1 > s0, (r0, r1)
    assert rows[0][2] > rows[0][3] and rows[-1][2] < rows[-1][3]  # both regimes are present
    assert rows[0][0] < best[0] < rows[-1][0]


# -- the sync ------------------------------------------------------------------------------------


def test_cross_pool_sync_grows_with_bytes_over_the_link():
    m = load_model("qwen2.5-7b")
    s = Strategy.of(tp=1, rollout_tp=1)
    ps = CP.pools(Cluster(gpus=16), 8)  # whole nodes: the NICs, bounded by NVLink
    a = WS.cross_pool_sync(m, H100, H100, ps, s, CAL)
    nbytes = model_consts(m)["total_params"] * PARAM_BYTES
    # eight 400 Gb/s NICs per DGX H100 node: 8 x 50 GB/s = 400 GB/s, under NVLink's 450 GB/s
    bw = 8 * H100.inter_node_bandwidth_bytes_per_s * H100.efficiency.comm_efficiency
    lat = H100.efficiency.inter_node_latency_s
    assert a["bytes_per_rollout_gpu"] == pytest.approx(nbytes)
    assert a["link_bytes_per_s"] == pytest.approx(400e9 * 0.8)
    assert a["transfer_s"] == pytest.approx(nbytes / bw + a["buckets"] * lat)
    big = WS.cross_pool_sync(load_model("qwen2.5-14b"), H100, H100, ps, s, CAL)
    ratio = model_consts(load_model("qwen2.5-14b"))["total_params"] / model_consts(m)["total_params"]
    assert big["transfer_s"] - big["buckets"] * lat == pytest.approx((a["transfer_s"] - a["buckets"] * lat) * ratio)
    # pools sharing nodes broadcast over NVLink
    shared = WS.cross_pool_sync(m, H100, H100, CP.pools(Cluster(gpus=16), 4), s, CAL)
    assert shared["link_bytes_per_s"] == pytest.approx(H100.intra_node_bandwidth_bytes_per_s * 0.8)
    assert shared["transfer_s"] < a["transfer_s"]
    # a rollout pool whose nodes carry fewer NICs is bound by them: four 200 Gb/s NICs = 100 GB/s a node
    slow = dataclasses.replace(load_hardware("h20"), inter_node_bandwidth_bytes_per_s=4 * 25e9 / 8)
    het = WS.cross_pool_sync(m, H100, slow, ps, s, CAL)
    assert het["link_bytes_per_s"] == pytest.approx(100e9 * 0.8)


@pytest.mark.parametrize("hw_name", ["h100", "h20"])
def test_cross_pool_broadcast_halves_as_the_nodes_nics_double_until_nvlink_binds(hw_name):
    """Hand-computed: an NCCL broadcast across nodes runs its rail-aligned channels over every NIC of a node, so
    the wire time of the whole bf16 model is its bytes over (NICs x 50 GB/s) x comm_efficiency 0.8 until the
    NICs' sum passes the NVLink rate each GPU forwards at (450 GB/s on H100 and H20), which then binds."""
    hw0 = load_hardware(hw_name)
    m = load_model("qwen2.5-7b")
    s = Strategy.of(tp=1, rollout_tp=1)
    ps = CP.pools(Cluster(gpus=16, gpus_per_node=8), 8)
    nbytes = model_consts(m)["total_params"] * PARAM_BYTES
    lat = hw0.efficiency.inter_node_latency_s

    def wire(nics: int) -> float:
        hw = dataclasses.replace(hw0, inter_node_bandwidth_bytes_per_s=nics * 50e9 / 8)  # per GPU, 8 GPUs a node
        got = WS.cross_pool_sync(m, hw, hw, ps, s, CAL)
        return got["transfer_s"] - got["buckets"] * lat

    assert hw0.intra_node_bandwidth_bytes_per_s == 450e9
    assert wire(1) == pytest.approx(nbytes / (50e9 * 0.8), rel=1e-12)
    assert wire(2) == pytest.approx(wire(1) / 2, rel=1e-12)
    assert wire(4) == pytest.approx(wire(2) / 2, rel=1e-12)
    assert wire(8) == pytest.approx(wire(4) / 2, rel=1e-12)  # 400 GB/s: still under NVLink
    assert wire(16) == pytest.approx(nbytes / (450e9 * 0.8), rel=1e-12)  # 800 GB/s of NICs: NVLink binds
    assert wire(32) == pytest.approx(wire(16), rel=1e-12)


def test_reshard_bulk_stays_point_to_point_and_its_misc_is_broadcast_over_the_nodes_nics():
    """The NCCL reshard's bulk reaches each rollout GPU as its own shard over its own NIC (sync_link), while its
    misc tensors are one broadcast to every rollout GPU (broadcast_link): doubling a node's NICs halves both
    wire times here (neither reaches NVLink's 450 GB/s), and the bulk's per-GPU rate is 1/8 of the misc's."""
    m = load_model("qwen3-30b-a3b")
    s = Strategy.of(tp=1, pp=2, ep=8, etp=1, rollout_tp=8, sync_bucket_mb=1631)
    ps = CP.pools(Cluster(gpus=32, gpus_per_node=8), 16)
    assert WS.sync_link(H100, H100, False, CAL)[0] == pytest.approx(50e9 * 0.8)
    assert WS.broadcast_link(H100, H100, ps, CAL)[0] == pytest.approx(400e9 * 0.8)
    half = dataclasses.replace(H100, inter_node_bandwidth_bytes_per_s=25e9)
    assert WS.broadcast_link(half, half, ps, CAL)[0] == pytest.approx(200e9 * 0.8)
    lat = H100.efficiency.inter_node_latency_s
    a = WS.reshard_sync(m, H100, H100, ps, s, CAL)
    b = WS.reshard_sync(m, half, half, ps, s, CAL)
    entries, _ = WS.reshard_entries(m)
    fixed = (entries + a["buckets"]) * lat
    assert b["transfer_s"] - fixed == pytest.approx(2 * (a["transfer_s"] - fixed), rel=1e-9)


# -- memory -------------------------------------------------------------------------------------


def test_a_rollout_pool_without_training_state_has_more_kv_cache():
    m, wl = load_model("qwen2.5-7b"), Workload()
    cl = Cluster(gpus=16)
    s = Strategy.of(tp=2, rollout_tp=1)
    # colocated: the largest vLLM fraction of the grid that still fits beside the resident training state
    best = None
    for g in (0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        e = estimate(model=m, hardware=H100, cluster=cl, strategy=s.replace(gpu_memory_utilization=g), workload=wl)
        if e.fits:
            best = e
    assert best is not None and best.strategy.rollout.gpu_memory_utilization < 0.9
    colo_tokens = best.memory["rollout"].info["kv_cache_tokens"]
    e = P.estimate_separate(
        model=m,
        hardware=H100,
        cluster=cl,
        strategy=s.replace(gpu_memory_utilization=0.9),
        workload=wl,
        placement=sep(8),
    )
    assert e.fits
    rm = e.memory["rollout"]
    assert set(rm.parts) == {"rollout_weights", "rollout_activations", "rollout_cuda_graphs", "rollout_kv_cache"}
    kvc = memory.kv_cache_capacity(m, H100, s.replace(gpu_memory_utilization=0.9), wl, 8)
    assert rm.info["kv_cache_tokens"] == kvc.tokens
    hand = (0.9 * H100.hbm_bytes - kvc.weights_bytes - kvc.working_bytes) // kvc.bytes_per_token
    assert kvc.tokens == hand
    assert rm.info["kv_cache_tokens"] > colo_tokens
    # and the training pool holds no vLLM part
    for name, pm in e.memory.items():
        if name != "rollout":
            assert not any(k.startswith(("rollout_", "vllm_")) for k in pm.parts), (name, pm.parts)


# -- validation ------------------------------------------------------------------------------------


def test_pool_shapes_follow_verl():
    one = CP.pools(Cluster(gpus=8), 3)
    assert (one.rollout.gpus, one.train.gpus, one.shared_nodes) == (3, 5, True)
    whole = CP.pools(Cluster(gpus=32), 8)
    assert (whole.rollout.gpus, whole.train.gpus, whole.shared_nodes) == (8, 24, False)
    per = CP.pools(Cluster(gpus=32), 8 * 0 + 4)  # one GPU on each of the 4 nodes
    assert (per.rollout.gpus_per_node, per.train.gpus_per_node, per.shared_nodes) == (1, 7, True)
    with pytest.raises(InvalidDegreesError):
        CP.pools(Cluster(gpus=32), 3)
    with pytest.raises(InvalidDegreesError):
        CP.pools(Cluster(gpus=8), 8)
    assert CP.split_candidates(Cluster(gpus=16)) == [2, 4, 6, 8, 10, 12, 14]


def test_placement_rules():
    with pytest.raises(ConfigError, match="sync_interval"):
        P.check_fields(sep(8, 1, sync_interval=2))
    P.check_fields(sep(8, 2, sync_interval=2))
    with pytest.raises(ConfigError, match="partial_rollout"):
        P.check_fields(sep(8, 0, partial_rollout=True))
    m, wl = load_model("qwen2.5-1.5b"), Workload(prompts=256, mini_batch=64)
    with pytest.raises(InvalidDegreesError, match="rollout_tp"):
        P.estimate_separate(
            model=m,
            hardware=H100,
            cluster=Cluster(gpus=8),
            strategy=Strategy.of(rollout_tp=2),
            workload=wl,
            placement=sep(3),
        )


def test_partial_rollout_prices_decode_at_sustained_concurrency():
    # one batch ahead, every slot refilled: N x mean / C x t(C) at C = min(max_num_seqs, KV, 2N), no drain
    m, wl = load_model("qwen2.5-1.5b"), Workload(prompts=256, mini_batch=64, response_len=8192, response_len_mean=2048)
    s = CP.rollout_strategy(Strategy.of(rollout_tp=1, gpu_memory_utilization=0.9))
    full = P.generation(m, H100, Cluster(gpus=8), s, wl, CAL, partial=False)
    part = P.generation(m, H100, Cluster(gpus=8), s, wl, CAL, partial=True)
    assert part["decode_s"] < full["decode_s"]  # the tail is carried over
    from grpo_tune.costmodel.rollout import _DecodeStep

    from grpo_tune.costmodel.rollout import response_dist

    seqs = wl.prompts * wl.n / 8  # 160 per replica
    res = response_dist(wl).resident_len()  # a resident response's mean length so far, in equilibrium
    kv = memory.kv_cache_capacity(m, H100, s, wl).tokens / (wl.mean_prompt_len + res)
    conc = min(256, kv, 2 * seqs)
    assert conc == 256  # max_num_seqs binds: the feed (320) and the KV cache hold more
    t = _DecodeStep(m, H100, Cluster(gpus=8), s, wl.mean_prompt_len, CAL)(conc, wl.mean_prompt_len + res)[0]
    assert part["concurrency"] == 256 and part["drain_s"] == 0.0
    assert part["decode_s"] == pytest.approx(seqs * 2048 / conc * t, rel=1e-12)


# -- the rollout pool as a server in steady state ------------------------------------------------------------


def _server(k: float, *, partial: bool = True, seqs: int = 256, gmu: float = 0.9, **kw):
    """Qwen2.5-1.5B on one H100 replica, 32 prompts x 4 (128 sequences per step), mean response 512 of 2,048."""
    m = load_model("qwen2.5-1.5b")
    wl = Workload(prompts=32, n=4, mini_batch=8, response_len=2048, response_len_mean=512)
    s = CP.rollout_strategy(Strategy.of(rollout_tp=1, gpu_memory_utilization=gmu, max_num_seqs=seqs))
    kn = P.AsyncKnobs(ahead=k, no_drain=partial, **kw)
    return P.generation(m, H100, Cluster(gpus=1), s, wl, CAL, partial=partial, knobs=kn), m, wl, s


def test_server_fed_k_batches_ahead_runs_at_what_the_feed_allows_until_max_num_seqs_binds():
    # 128 sequences per step, max_num_seqs 512 (within the CUDA-graph sizes), a KV cache that holds more: the feed
    # (1 + K) x 128 sets the concurrency (256, 384, 512) until max_num_seqs binds at K = 3; the time per step
    # falls with K until then and is flat after. Half a batch ahead, half the step's batch is the synchronous batch
    # (its own 128) and half the fed server's (192): 160 on average
    ks = (0.5, 1, 2, 3, 4, 8)
    got = {k: _server(k, seqs=512)[0] for k in ks}
    assert [got[k]["concurrency"] for k in ks] == [160, 256, 384, 512, 512, 512]
    assert [P.CONCURRENCY_BOUNDS[int(got[k]["bound"])] for k in (1, 3, 4)] == ["feed", "max_num_seqs", "max_num_seqs"]
    secs = [got[k]["gen_s"] for k in (0.5, 1, 2, 3)]
    assert all(a > b for a, b in zip(secs, secs[1:]))  # strictly falling while the feed binds
    assert got[4]["gen_s"] == pytest.approx(got[3]["gen_s"], rel=1e-12) == got[8]["gen_s"]
    # hand-computed: the step's tokens over the throughput sustained at that concurrency
    _, m, wl, s = _server(1, seqs=512)
    from grpo_tune.costmodel.rollout import _DecodeStep, response_dist

    step = _DecodeStep(m, H100, Cluster(gpus=1), s, wl.mean_prompt_len, CAL)
    res = response_dist(wl).resident_len()
    assert 512 / 2 < res < 2048  # the length-biased residual: above half the mean, the tail pulls it up
    for k, c in ((1, 256), (2, 384)):
        t = step(c, wl.mean_prompt_len + res)[0]
        assert got[k]["sustained_s"] == pytest.approx(128 * 512 / c * t, rel=1e-12)
        assert got[k]["decode_s"] == pytest.approx(got[k]["sustained_s"])  # partial rollout: no drain
    # half a batch ahead: the synchronous batch's decode (costmodel.rollout's) and the fed server's at 192, halved
    from grpo_tune.costmodel.rollout import rollout_s

    sync_decode = rollout_s(m, H100, Cluster(gpus=1), s, wl, CAL)["decode_s"]
    fed = 128 * 512 / 192 * step(192, wl.mean_prompt_len + res)[0]
    assert got[0.5]["decode_s"] == pytest.approx(0.5 * sync_decode + 0.5 * fed, rel=1e-12)


def test_resident_length_is_the_length_biased_residual():
    from grpo_tune.costmodel.lengths import LengthDist, dist

    # uniform on [0, 1000] (Beta(1, 1), nothing truncated): E[L^2] / (2 E[L]) = (1e6 / 3) / 1000
    assert LengthDist(max_len=1000, mean_len=500, b=1.0, clip=0.0).resident_len() == pytest.approx(1000 / 3)
    # the assumed model: 1% at the cap, a Beta(1, b) body keeping the mean 500 (b = 1/0.49495 - 1)
    d = dist(1000, 500)
    b = 1 / ((0.5 - 0.01) / 0.99) - 1
    want = (0.01 * 1e6 + 0.99 * 2 / ((b + 1) * (b + 2)) * 1e6) / 1000
    assert d.resident_len() == pytest.approx(want, rel=1e-12)
    # a histogram: its quantiles squared, averaged (every response 400 long: 200; the top half-bin runs on to the
    # cap, as LengthDist.quantile interpolates it, which adds 4%)
    assert LengthDist(max_len=1000, mean_len=400, quantiles=(400.0,) * 20).resident_len() == pytest.approx(
        208, rel=0.01
    )


def test_server_concurrency_stops_at_the_kv_cache():
    # a small vLLM memory fraction: the KV cache binds before the feed and before max_num_seqs
    g, m, wl, s = _server(8, seqs=1024, gmu=0.15)
    from grpo_tune.costmodel.rollout import response_dist

    kv = memory.kv_cache_capacity(m, H100, s, wl).tokens / (wl.mean_prompt_len + response_dist(wl).resident_len())
    assert 128 < kv < 1024
    assert g["concurrency"] == pytest.approx(kv) and P.CONCURRENCY_BOUNDS[int(g["bound"])] == "kv_cache"
    assert _server(16, seqs=1024, gmu=0.15)[0]["gen_s"] == pytest.approx(g["gen_s"], rel=1e-12)


def test_a_drain_is_priced_only_where_a_batch_drains():
    # staleness 0: the synchronous batch (costmodel.rollout's drain to the batch's longest); K >= 1 without partial
    # rollout: each sync waits for the sequences in flight (a drain, amortised over the sync interval); partial
    # rollout or in-flight weight updates: none
    sync0 = _server(0, partial=False)[0]
    from grpo_tune.costmodel.rollout import rollout_s

    _, m, wl, s = _server(0)
    rs = rollout_s(m, H100, Cluster(gpus=1), s, wl, CAL)
    assert sync0["decode_s"] == pytest.approx(rs["decode_s"], rel=1e-12) and sync0["drain_s"] > 0
    waits = _server(1, partial=False)[0]
    part = _server(1, partial=True)[0]
    assert part["drain_s"] == 0.0 and waits["drain_s"] > 0
    assert waits["gen_s"] == pytest.approx(part["gen_s"] + waits["drain_s"], rel=1e-12)
    m_, wl_, s_ = m, wl, s
    kn = P.AsyncKnobs(ahead=1, no_drain=False)
    every2 = P.generation(m_, H100, Cluster(gpus=1), s_, wl_, CAL, partial=False, knobs=kn, sync_interval=2)
    assert every2["drain_s"] == pytest.approx(waits["drain_s"] / 2, rel=1e-12)
    # K = 1 and K = 2 with partial rollout price apart here (the feed binds at 256 sequences a step)
    assert _server(2, seqs=512)[0]["gen_s"] < _server(1, seqs=512)[0]["gen_s"]


def test_trainer_waits_for_its_first_fetch_where_the_ahead_samples_do_not_hold_it():
    # verl's staleness_threshold 0.1 with require_batches x mini = a quarter of a version: after each sync the
    # trainer waits for 0.25 - 0.1 of the pool's batch; at 0.3 (or any integer K >= 1) it does not wait
    kn = P.AsyncKnobs(ahead=0.1, no_drain=True, fetch_fraction=0.25)
    assert P.first_fetch_wait(100.0, kn) == pytest.approx(15.0)
    assert P.first_fetch_wait(100.0, dataclasses.replace(kn, ahead=0.3)) == 0.0
    assert P.first_fetch_wait(100.0, P.AsyncKnobs(ahead=1.0)) == 0.0
    # training-bound: step = train + wait + sync; rollout-bound: gen + sync
    assert P.compose_step(100.0, 150.0, 4.0, 0.1, first_wait_s=15.0)["step_s"] == pytest.approx(169.0)
    assert P.compose_step(200.0, 150.0, 4.0, 0.1, first_wait_s=15.0)["step_s"] == pytest.approx(204.0)


def test_a_rollout_pool_with_no_kv_cache_is_infeasible_and_says_what_fraction_would_fit():
    # Qwen3-235B at rollout TP8 and 0.6 on H100: 0 KV tokens (the 2,272 s rollout, priced as a fit)
    m = load_model("qwen3-235b-a22b")
    wl = Workload(prompts=1024, n=5, mini_batch=256)
    s = Strategy.of(tp=1, pp=8, vpp=2, ep=8, rollout_tp=8, gpu_memory_utilization=0.6, recompute="full")
    rs = CP.rollout_strategy(s)
    assert memory.kv_cache_capacity(m, H100, rs, wl).tokens == 0
    pm, viol = P.rollout_memory(m, H100, Cluster(gpus=128), rs, wl)
    kv = [v for v in viol if "KV cache" in v.message]
    assert len(kv) == 1 and kv[0].code == "OOM_RISK" and kv[0].phase == "rollout"
    need = P.kv_fraction_needed(m, H100, rs, wl)
    assert 0.6 < need < 0.9 and f"gpu_memory_utilization >= {need:.2f}" in kv[0].message
    # the fraction it names does hold one sequence, and a hair less does not
    ok = CP.rollout_strategy(s.replace(gpu_memory_utilization=math.ceil(need * 100) / 100))
    assert memory.kv_cache_capacity(m, H100, ok, wl).sequences >= 1
    assert not [v for v in P.rollout_memory(m, H100, Cluster(gpus=128), ok, wl)[1] if "KV cache" in v.message]
    # the search never proposes it: pinned at TP8 and 0.6 the pool has no engine; free, it takes a larger fraction
    from grpo_tune.autotune.search.placement import best_rollout

    pins = {"rollout_tp": 8, "gpu_memory_utilization": 0.6}
    assert best_rollout(m, H100, Cluster(gpus=128), wl, pins, CAL, False) is None
    opt, _ = best_rollout(m, H100, Cluster(gpus=128), wl, {"rollout_tp": 8}, CAL, False)
    assert opt["gpu_memory_utilization"] >= need


def test_engines_that_price_the_same_take_the_frameworks_memory_fraction():
    """Issue 36 item 2: a separate rollout pool's memory fraction is searched and its default is the framework's own
    for that mode (frameworks.separate_memory: verl 0.9.1's rollout.gpu_memory_utilization 0.5, which its
    fully-async standalone fraction falls back to; NeMo-RL 0.7.0's async recipes' 0.8). Where the KV cache does not
    bind, every fraction of the grid (0.6 .. 0.9) prices the same generation: the tie goes to the grid value nearest
    the framework's (equidistant: the smaller), where it went to the smallest before. Where the KV cache binds the
    larger fraction is faster and wins whatever the default."""
    from grpo_tune.autotune.search import placement as SP

    m, wl, roll = load_model("qwen2.5-1.5b"), Workload(prompts=64, mini_batch=16, n=4), Cluster(gpus=2)
    picks = {md: SP.best_rollout(m, H100, roll, wl, {}, CAL, False, None, md) for md in (None, 0.5, 0.75, 0.8, 0.9)}
    assert len({round(g, 9) for _, g in picks.values()}) == 1  # one generation time: a tie
    assert {md: opt["gpu_memory_utilization"] for md, (opt, _) in picks.items()} == {
        None: 0.6,  # verl's 0.5, the default framework's: the nearest grid value
        0.5: 0.6,
        0.75: 0.7,
        0.8: 0.8,  # NeMo-RL's
        0.9: 0.9,
    }
    assert SP.rollout_memory_default() == 0.5 and SP.rollout_memory_default(("nemo-rl",)) == 0.8
    # a search: the same step, the framework's fraction
    got = {
        rm: SP.search_placement(
            m, H100, Cluster(gpus=8), wl, placement="separate", staleness=1, rollout_gpus=2, rollout_memory=rm
        ).best_separate
        for rm in (None, 0.8)
    }
    assert got[None].strategy.rollout.gpu_memory_utilization == 0.6
    assert got[0.8].strategy.rollout.gpu_memory_utilization == 0.8
    assert got[0.8].step_s == got[None].step_s
    # the KV cache binds (Qwen2.5-7B on one GPU, 8 x 256 responses of mean 4,096): 0.9 holds 201 sequences to 0.6's
    # 114 and is the fastest, whatever the framework's fraction
    m7 = load_model("qwen2.5-7b")
    wl7 = Workload(prompts=256, mini_batch=64, n=8, response_len=8192, response_len_mean=4096)
    for md in (0.5, 0.8):
        opt, _ = SP.best_rollout(m7, H100, Cluster(gpus=1), wl7, {}, CAL, False, None, md)
        assert opt["gpu_memory_utilization"] == 0.9


def test_rollout_logprobs_as_the_old_ones_drop_exactly_the_old_logprob_pass():
    # recompute_logprobs off (verl's bypass_mode): the training pool runs ref + update, no old log-prob pass
    m, wl, cl = load_model("qwen2.5-7b"), Workload(prompts=128, mini_batch=32, n=8, response_len=2048), Cluster(gpus=16)
    s = Strategy.of(tp=2, rollout_tp=2, gpu_memory_utilization=0.8)
    on = P.estimate_separate(model=m, hardware=H100, cluster=cl, strategy=s, workload=wl, placement=sep(8, 1))
    off = P.estimate_separate(
        model=m, hardware=H100, cluster=cl, strategy=s, workload=wl, placement=sep(8, 1, recompute_logprobs=False)
    )
    old = on.time.phases["old_logprob"]
    assert old > 0 and "old_logprob" not in off.time.phases
    assert off.placement["train_s"] == pytest.approx(on.placement["train_s"] - old, rel=1e-12)
    f = off.placement
    assert off.step_s == pytest.approx(max(f["gen_s"], f["train_s"]) + f["sync_s"], rel=1e-12)
    assert (on.placement["recompute_logprobs"], f["recompute_logprobs"]) == (True, False)


# -- search ---------------------------------------------------------------------------------------


def test_default_placement_is_todays_search():
    m, hw = load_model("qwen2.5-1.5b"), H100
    wl = Workload(prompts=256, mini_batch=64)
    plain = search(m, hw, Cluster(gpus=8), wl)
    res = search_placement(m, hw, Cluster(gpus=8), wl)
    assert res.best.strategy == plain.best.strategy and res.best.step_s == plain.best.step_s
    assert res.separate == [] and not res.best.placement


def test_auto_returns_both_placements_and_the_faster_wins():
    m = load_model("qwen2.5-1.5b")
    wl = Workload(prompts=256, mini_batch=64, response_len=4096)
    res = search_placement(m, H100, Cluster(gpus=8), wl, placement="auto", staleness=1)
    c, s = res.best_colocated, res.best_separate
    assert c is not None and s is not None
    assert res.best.step_s == min(c.step_s, s.step_s)
    assert res.speedup() == pytest.approx(c.step_s / s.step_s)
    assert s.fits and s.placement["staleness"] in (0, 1)
    # every separate plan the search returns prices the same when estimated again from its parts
    again = P.estimate_separate(
        model=m,
        hardware=H100,
        cluster=Cluster(gpus=8),
        strategy=s.strategy,
        workload=wl,
        placement=sep(s.placement["rollout_gpus"], s.placement["staleness"]),
    )
    assert again.step_s == pytest.approx(s.step_s, rel=1e-9)
    assert math.isfinite(s.placement["rollout_busy"]) and 0 < s.placement["train_busy"] <= 1


def _every_split_in_full(m, hw, cl, wl, K):
    """The best separate step over every split verl can express and every staleness <= K, each training pool
    searched in full (no repricing) and its three best plans composed with the split's best rollout engine."""
    from grpo_tune.autotune.search import placement as SP

    best = None
    for r in CP.split_candidates(cl):
        ps = CP.pools(cl, r)
        g = SP.best_rollout(m, hw, ps.rollout, wl, {}, CAL, False)
        try:
            tr = search(m, hw, ps.train, wl, pins=SP._train_pins({}), _price=P.train_pool, top=3,
                        keep_layouts=SP.TRAIN_KEEP_LAYOUTS, exact=SP.TRAIN_EXACT)  # fmt: skip
        except InvalidDegreesError:
            continue
        for k in range(K + 1):
            for te in tr.ranked[:3]:
                e = P.estimate_separate(
                    model=m, hardware=hw, cluster=cl, strategy=te.strategy.replace(**g[0]), workload=wl,
                    placement=sep(r, k), train=te,
                )  # fmt: skip
                if e.fits and (best is None or e.step_s < best[0]):
                    best = (e.step_s, r, k)
    return best


def test_search_finds_the_split_every_split_searched_in_full_finds():
    # 32 GPUs: splits 4..28 (every node alike, or whole nodes); the 24-GPU training pool of the 8 + 24 split cannot
    # take the colocated plans (at tp 2 its DP 12 does not divide the 1280 sequences of a mini-batch), so only its
    # own search finds its plans, and that split is the best one: the search must not lose it
    m, wl, cl = load_model("qwen2.5-7b"), Workload(), Cluster(gpus=32)
    res = search_placement(m, H100, cl, wl, placement="separate", staleness=1)
    step, r, k = _every_split_in_full(m, H100, cl, wl, 1)
    b = res.best_separate
    assert r == 8 and b.placement["rollout_gpus"] == 8
    assert b.step_s == pytest.approx(step, rel=P_TIE), (b.placement["rollout_gpus"], r)


def test_every_separate_plan_keeps_its_tp_groups_on_one_node():
    """Plans searched on one training pool are repriced on the others: each must still be a plan the search would
    propose there. On 2 nodes a 6 + 10 split has a training pool of 5 GPUs per node, where tp=2 straddles nodes
    (it was proposed, repriced from a pool of 6 per node)."""
    from grpo_tune.core.rules import within_node

    m, cl = load_model("qwen2.5-7b"), Cluster(gpus=16)
    res = search_placement(m, H100, cl, Workload(), placement="separate", staleness=1)
    assert {e.placement["rollout_gpus"] for e in res.separate} >= {4, 6}  # 6 + 10 is composed, but not with tp 2
    for e in res.separate:
        pools = CP.pools(cl, e.placement["rollout_gpus"])
        tc = pools.train
        assert within_node(e.strategy.layout.tp, tc.gpus, tc.gpus_per_node), (e.placement, e.strategy.layout)
        assert within_node(e.strategy.rollout.rollout_tp, pools.rollout.gpus, pools.rollout.gpus_per_node)


# -- CLI ----------------------------------------------------------------------------------------


def _cli(*args: str):
    """(exit code, stdout + stderr) of ``grpo-tune ARGS`` through the CLI's own entry point."""
    import contextlib
    import io
    from types import SimpleNamespace

    from grpo_tune.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(list(args))
    return SimpleNamespace(exit_code=rc, output=out.getvalue())


def test_search_auto_prints_both_placements_side_by_side():
    r = _cli(
        "search", "--model", "qwen2.5-1.5b", "--gpus", "8", "--prompts", "256", "--mini-batch", "64",
        "--response-len", "4096", "--placement", "auto", "--staleness", "1", "--no-emit",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "Best plan of each placement" in r.output
    for word in ("colocated", "separate", "busy R/T", "speed", "stated error"):
        assert word in r.output
    # each pool in steady state, and why the split won
    assert "resident sequences per replica (bound by" in r.output and "tokens/s sustained" in r.output
    assert re.search(r"why \d+\+\d+: its step is ", r.output), r.output
    assert all(len(line) <= 80 for line in r.output.splitlines() if "│" in line or "placement" in line)
    assert "--staleness 1 lets them overlap" not in r.output  # asked for it
    r0 = _cli(
        "search", "--model", "qwen2.5-1.5b", "--gpus", "8", "--prompts", "256", "--mini-batch", "64",
        "--response-len", "4096", "--placement", "auto", "--no-emit",
    )  # fmt: skip
    assert r0.exit_code == 0 and "staleness 0 (the default)" in r0.output, r0.output  # the lever, said


def test_search_auto_on_one_gpu_gives_the_colocated_plan_and_says_why():
    """auto is the better of the two placements; one GPU has only one (it was refused: separate pools need 2)."""
    r = _cli(
        "search", "--model", "qwen2.5-0.5b", "--gpus", "1", "--prompts", "64", "--mini-batch", "16",
        "--placement", "auto", "--staleness", "1", "--no-emit",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "separate: none (separate pools need 2 GPUs or more)" in r.output
    assert "winner: colocated" in r.output
    r = _cli("search", "--model", "qwen2.5-0.5b", "--gpus", "1", "--placement", "separate", "--no-emit")
    assert r.exit_code == 2 and "separate pools need at least 2 GPUs" in r.output


def test_compare_of_separate_pools_shows_each_hardware_s_split(tmp_path):
    import json

    r = _cli(
        "compare", "--model", "qwen2.5-1.5b", "--gpus", "8", "--hardware", "h100,h20", "--prompts", "256",
        "--mini-batch", "64", "--placement", "separate", "--rollout-gpus", "2", "--staleness", "1",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    for row in rows:
        f = row["placement"]
        assert (f["rollout_gpus"], f["train_gpus"]) == (2, 6)
        assert row["plan"].startswith(f"2+6 K{f['staleness']} "), row["plan"]  # the split before the layout


def test_search_and_estimate_name_the_rollout_pools_own_hardware_first():
    """The first line says what is priced: the GPUs and their profile, and a rollout pool on another profile."""
    common = ["--model", "qwen2.5-1.5b", "--gpus", "16", "--prompts", "256", "--mini-batch", "64"]
    r = _cli("search", *common, "--placement", "auto", "--staleness", "1", "--rollout-hardware", "h20", "--no-emit")
    assert r.exit_code == 0, r.output
    first = " ".join(" ".join(r.output.split("\n")[0:2]).split())  # the line as one, however it wrapped
    assert first.startswith("qwen2.5-1.5b on 16 x h100-sxm-80gb (8/node; profile fitted, stack verl-0.9.1; rollout")
    assert "rollout pool on h20-96gb, profile" in first, first
    r = _cli("estimate", *common, "--placement", "separate", "--rollout-gpus", "8", "--staleness", "1",
             "--rollout-hardware", "h20")  # fmt: skip
    assert r.exit_code == 0 and "rollout pool on h20-96gb" in " ".join(r.output.split("\n")[0:2]), r.output
    r = _cli("estimate", *common)
    assert "rollout pool" not in r.output.split("\n")[0]


def test_estimate_separate_json_keeps_step_s_as_the_steady_state():
    import json

    r = _cli(
        "estimate", "--model", "qwen2.5-1.5b", "--gpus", "16", "--prompts", "256", "--mini-batch", "64",
        "--placement", "separate", "--rollout-gpus", "8", "--staleness", "1", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    f = d["placement"]
    assert d["time"]["step_s"] == pytest.approx(max(f["gen_s"], f["train_s"]) + f["sync_s"])
    assert f["rollout_gpus"] == 8 and f["train_gpus"] == 8


@pytest.mark.parametrize(
    "args, words",
    [
        (["--placement", "separate"], "--rollout-gpus"),
        (["--staleness", "1"], "separate"),
        (["--placement", "separate", "--rollout-gpus", "3"], "rollout_gpus 3"),
        (["--placement", "separate", "--rollout-gpus", "8", "--partial-rollout"], "staleness"),
        (["--placement", "auto", "--rollout-gpus", "8"], "auto is for search"),
    ],
)
def test_bad_placement_flags_are_coded_errors(args, words):
    r = _cli("estimate", "--model", "qwen2.5-1.5b", "--gpus", "16", *args)
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


def test_run_config_carries_the_placement():
    from grpo_tune.core.config import RunConfig

    base = RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=4, gpus_per_node=4),
        strategy=Strategy.of(mbs=8),
        workload=Workload(prompts=8, n=4, prompt_len=8, response_len=6, mini_batch=4, kl=False, dtype="fp32"),
    )
    assert "placement" not in base.to_dict()  # a colocated config reads and writes as before
    cfg = base.replace(placement=sep(2, 1))
    back = RunConfig.from_dict(cfg.to_dict())
    assert back.placement == sep(2, 1)
    assert back.strategy.layout.dp == 2  # the training pool's 2 GPUs, not the cluster's 4
    with pytest.raises(ConfigError, match="leaves no GPU"):
        RunConfig.from_dict(base.replace(placement=sep(4, 1)).to_dict())


def test_search_auto_writes_the_split_curve(tmp_path):
    r = _cli(
        "search", "--model", "qwen2.5-1.5b", "--gpus", "8", "--prompts", "256", "--mini-batch", "64",
        "--response-len", "4096", "--placement", "auto", "--staleness", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    (run,) = list(tmp_path.iterdir())
    png = run / "placement.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "verl.sh").is_file() and (run / "best.yaml").is_file()


def test_the_cpu_profile_prices_and_proposes_separate_pools():
    # the CPU trainer runs separate pools (trainer/separate.py: the rollout pool samples with its own
    # forward-only engine, tp = rollout_tp, data parallel over the pool), so the search prices and proposes them
    from grpo_tune.costmodel.rollout import native_rollout_s

    cpu, m = load_hardware("cpu"), load_model("tiny")
    wl = Workload(prompts=8, n=4, prompt_len=8, response_len=6, mini_batch=4, kl=False, dtype="fp32")
    cl = Cluster(gpus=4, gpus_per_node=4)
    s = Strategy.of(mbs=8, recompute="none", rollout_tp=1, engine="megatron")  # the cpu plans' default engine
    e = P.estimate_separate(model=m, hardware=cpu, cluster=cl, strategy=s, workload=wl, placement=sep(2, 1))
    assert e.fits, [v.message for v in e.violations]
    roll = CP.pools(cl, 2).rollout
    rs = P.native_strategy(m, s, roll)
    assert (rs.layout.tp, rs.layout.dp) == (1, 2)  # the rollout pool's own layout, not the training pool's
    want = native_rollout_s(m, cpu, roll, rs, wl, CAL)["decode_s"] + CAL["rollout_overhead_s"]
    assert e.placement["gen_s"] == pytest.approx(want, rel=1e-12)
    rm = e.memory["rollout"]
    assert rm.parts["rollout_kv_cache"] == 0 and rm.parts["rollout_weights"] > 0  # no KV cache, no training state
    assert "grads" not in rm.parts and "optimizer" not in rm.parts
    res = search_placement(m, cpu, cl, wl, placement="auto", staleness=1)
    b = res.best_separate
    assert b is not None and b.fits and b.placement["rollout_gpus"] in CP.split_candidates(cl)


def test_split_curves_merge_staleness_values_that_change_nothing():
    from grpo_tune.rundir.report import staleness_curves

    splits = [{"rollout_gpus": r, "staleness": 0, "step_s": 10.0 + r} for r in (2, 4)]
    splits += [{"rollout_gpus": r, "staleness": k, "step_s": 8.0 + r} for k in range(1, 101) for r in (2, 4)]
    got = staleness_curves(splits)
    assert [lab for lab, _ in got] == ["staleness 0", "staleness 1-100"]
    assert got[1][1] == [(2, 10.0), (4, 12.0)]
    # a curve that moves is its own; past CURVES_MAX distinct curves: 0, 1, 2, 4, ... and the last
    moving = [{"rollout_gpus": 2, "staleness": k, "step_s": 100.0 - k} for k in range(20)]
    labels = [lab for lab, _ in staleness_curves(moving, most=6)]
    assert labels == ["staleness 0", "staleness 1", "staleness 2", "staleness 4", "staleness 8", "staleness 19"]


def test_search_with_a_large_staleness_draws_a_legend_that_fits(tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Tight layout not applied" is a legend that overflowed
        r = _cli(
            "search", "--model", "qwen2.5-1.5b", "--gpus", "8", "--prompts", "256", "--mini-batch", "64",
            "--placement", "separate", "--rollout-gpus", "7", "--staleness", "100", "--out", str(tmp_path),
        )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "Tight layout" not in r.output


# -- the drain at the CUDA-graph cliff ----------------------------------------------------------------------------


def _at_ahead(model: str, gpus: int, rollout_gpus: int, s: Strategy, wl: Workload, a: float, no_drain: bool = False):
    """The separate plan (staleness 1, ``rollout_gpus`` of ``gpus`` H100) priced with its pool ``a`` batches ahead."""
    return P.estimate_separate(
        model=load_model(model),
        hardware=H100,
        cluster=Cluster(gpus=gpus),
        strategy=s,
        workload=wl,
        placement=sep(rollout_gpus, 1),
        knobs=P.AsyncKnobs(ahead=a, no_drain=no_drain),
    )


def _ahead_sweep(model: str, gpus: int, rollout_gpus: int, strategy: Strategy, grid: list[float]):
    wl = Workload(prompts=256, mini_batch=64, prompt_len_mean=205, response_len_mean=205)
    out = []
    for a in grid:
        e = _at_ahead(model, gpus, rollout_gpus, strategy, wl, a)
        out.append((a, e.step_s, e.placement["gen_s"], e.placement["decode_concurrency"]))
    return out


# the verl launch of tests/test_tune_placement.py (Qwen2.5-1.5B, 8 H100, 2 + 6, staleness 1) and an MoE plan
# (Qwen3-30B-A3B, 16 H100, 8 + 8, rollout TP4 on CUDA graphs): both run from 640 sequences a replica at ahead 0 to
# max_num_seqs 1,024 at ahead 1, across vLLM's CUDA-graph batch of 512
_CLIFF_PLANS = {
    "qwen2.5-1.5b": (
        8,
        2,
        Strategy.of(
            tp=1, pp=3, dp=2, last_stage_layers=8, mbs=8, rollout_tp=1, gpu_memory_utilization=0.6, max_num_seqs=1024
        ),
        0.001,
    ),
    "qwen3-30b-a3b": (
        16,
        8,
        Strategy.of(tp=1, ep=8, dp=8, rollout_tp=4, gpu_memory_utilization=0.6, max_num_seqs=1024),
        0.002,
    ),
}


@pytest.mark.parametrize("model", list(_CLIFF_PLANS))
def test_running_further_ahead_never_prices_a_slower_step(model):
    """The drain of a batch crosses the CUDA-graph cliff (above ``graph_max`` running sequences a step runs eager,
    at least ``eager_launch``) at ``j* = quantile(1 - graph_max / conc)``; rollout.drain_s splits the drain there.
    With one 8-point midpoint rule a point crossing the cliff moved the drain by a whole segment: the 1.5B launch
    priced 16.25 s at ahead 0.001, 17.19 s at 0.05 and 16.66 s at 0.1. Over a fine grid of ``ahead`` the step now
    never rises and the generation moves by at most 0.5% between neighbours (it was 27%)."""
    gpus, rollout_gpus, s, dx = _CLIFF_PLANS[model]
    grid = [0.0] + [round(dx * i, 6) for i in range(1, int(round(1 / dx)) + 1)]
    rows = _ahead_sweep(model, gpus, rollout_gpus, s, grid)
    assert rows[0][3] == pytest.approx(640) and rows[-1][3] == 1024
    for (a0, step0, gen0, _), (a1, step1, gen1, _) in zip(rows, rows[1:]):
        assert step1 <= step0 * (1 + 1e-9), (model, a0, a1, step0, step1)
        assert abs(gen1 - gen0) <= 0.005 * gen0, (model, a0, a1, gen0, gen1)


def test_the_drain_is_continuous_across_the_cuda_graph_batch():
    """rollout_s's drain (its decode less the steady part) of one replica with 1,280 sequences as max_num_seqs runs
    from 496 to 758 across vLLM's graph batch 512: the running sequences fall below 512 at ``j*``, which moves
    continuously from 0, so the drain moves by at most 0.05 s for 2 more sequences (0.024 s here); the single 8-point
    rule jumped by 2.6 s at 668 (its first point crossing the cliff). The steady part keeps its cliff at 512 itself:
    a whole step of more than 512 sequences runs eager."""
    from grpo_tune.costmodel.rollout import _DecodeStep, drain_s, response_dist, rollout_s

    m = load_model("qwen2.5-1.5b")
    wl = Workload(prompts=256, mini_batch=64, prompt_len_mean=205, response_len_mean=205)
    cl = Cluster(gpus=1)
    drains = []
    for seqs in range(496, 760, 2):
        s = Strategy.of(rollout_tp=1, gpu_memory_utilization=0.6, max_num_seqs=seqs)
        r = rollout_s(m, H100, cl, s, wl, CAL)
        assert r["concurrency"] == seqs
        d = response_dist(wl)
        step = _DecodeStep(m, H100, cl, s, wl.mean_prompt_len, CAL)
        steady = (1280 - seqs) * d.mean_len / seqs * r["decode_step_s"]
        drain = r["decode_s"] - steady
        assert drain == pytest.approx(drain_s(step, d, seqs, wl.mean_prompt_len, r["longest_response"]), rel=1e-9)
        drains.append(drain)
    jumps = [abs(b - a) for a, b in zip(drains, drains[1:])]
    assert max(jumps) < 0.05, max(jumps)
    # the split point: conc * S(j*) = graph_max
    d = response_dist(wl)
    j = d.quantile(1 - 512 / 700)
    assert 700 * d.survival(j) == pytest.approx(512, rel=1e-9)


# -- between on-policy and one batch ahead ------------------------------------------------------------------------


def _small_ahead(model: str, gpus: int, rollout_gpus: int, s: Strategy, wl: Workload, grid, no_drain: bool):
    out = []
    for a in grid:
        e = _at_ahead(model, gpus, rollout_gpus, s, wl, a, no_drain)
        f = e.placement
        out.append((a, e.step_s, f["gen_s"], f["train_s"], f["concurrency_bound"]))
    return out


_SWEEP_WL = Workload(prompts=256, mini_batch=64, prompt_len_mean=205, response_len_mean=205)


@pytest.mark.parametrize("no_drain", [False, True])
@pytest.mark.parametrize("max_num_seqs", [256, 1024])
def test_the_price_is_continuous_as_ahead_leaves_zero(max_num_seqs, no_drain):
    """The verl launch of the CUDA-graph tests (Qwen2.5-1.5B, 8 H100, 2 + 6, 640 sequences a replica), with
    max_num_seqs below vLLM's graph batch of 512 (256: max_num_seqs binds, every step on the graphs) and above it
    (1,024: the feed binds, the steps eager). At ahead 0 the pool is the synchronous batch (a step reads the context
    mean / 2 in, the batch drains to its longest); one batch ahead, the fed server (resident sequences at the
    length-biased residual, no batch drain). Between them the pool produces the share ``ahead`` of each step's batch
    as the fed server and the rest as the synchronous batch, so step and generation move by at most ``ahead`` of
    their value at 0 (Lipschitz 1, relative). Before, max_num_seqs 256 jumped between ahead 0 and 0.0001: the step by
    +0.10 s of 16.06 (+0.6%; the step read 182 tokens of context in, not 102: t(256) 5.11 -> 5.45 ms) and, with
    partial rollout, by -2.59 s (the batch's drain of 2.76 s gone at once)."""
    s = Strategy.of(
        tp=1,
        pp=3,
        dp=2,
        last_stage_layers=8,
        mbs=8,
        rollout_tp=1,
        gpu_memory_utilization=0.6,
        max_num_seqs=max_num_seqs,
    )
    rows = _small_ahead("qwen2.5-1.5b", 8, 2, s, _SWEEP_WL, [0.0, 1e-4, 1e-3, 0.01], no_drain)
    _, step0, gen0, _, _ = rows[0]
    for a, step, gen, _, _ in rows[1:]:
        assert abs(step - step0) <= a * step0, (a, step0, step)
        assert abs(gen - gen0) <= a * gen0, (a, gen0, gen)


@pytest.mark.parametrize("no_drain", [False, True])
@pytest.mark.parametrize("rollout_gpus", [1, 2])
def test_where_the_feed_binds_running_further_ahead_never_prices_a_slower_step(rollout_gpus, no_drain):
    """Qwen2.5-1.5B on 8 H100, 64 prompts x 4 of up to 4,096 tokens (mean 1,024): 256 (1 rollout GPU) or 128 (2)
    sequences a replica, max_num_seqs 512 (within the graph batch) and a KV cache that holds more, so the feed
    (1 + ahead) x N sets the concurrency from ahead 0 up to where max_num_seqs binds. On 1 rollout GPU the pool is
    the slower one from ahead 0.3 on (the step is its generation), on 2 the trainer; either way the step never rises
    with ahead (from 29.65 s to 20.73 s and 10.81 s with partial rollout on 1 GPU)."""
    wl = Workload(prompts=64, mini_batch=16, n=4, response_len=4096, response_len_mean=1024)
    s = Strategy.of(tp=1, dp=8 - rollout_gpus, rollout_tp=1, gpu_memory_utilization=0.9, max_num_seqs=512)
    grid = [0.0, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0, 1.5, 2.0]
    rows = _small_ahead("qwen2.5-1.5b", 8, rollout_gpus, s, wl, grid, no_drain)
    assert rows[0][4] == "feed" and rows[6][4] == "feed"  # the feed binds at 0 and at 0.2
    if rollout_gpus == 1:
        assert all(gen > train for a, _, gen, train, _ in rows if a >= 0.3)  # rollout-bound
    for (a0, step0, *_), (a1, step1, *_) in zip(rows, rows[1:]):
        assert step1 <= step0 * (1 + 1e-12), (a0, a1, step0, step1)
    assert rows[-1][1] < 0.75 * rows[0][1]
