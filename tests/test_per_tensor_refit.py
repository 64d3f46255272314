"""verl's separate-pool weight sync without its checkpoint engine (costmodel/pools.py ``per_tensor_sync``):
one sync priced by hand, trends against the bucketed broadcast, and the two published engine-off rows that
score it (validate --grpo) with the layouts of their engine-on twins."""

from __future__ import annotations

import dataclasses

import pytest

import grpo_tune.validate.grpo as vg
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel import pools as P
from grpo_tune.core import placement as CP
from grpo_tune.costmodel import weight_sync as WS
from grpo_tune.costmodel.timing_base import check_calibration, hf_tensor_count, model_consts

CAL = check_calibration(None)


def test_vllm_param_count_hand_computed():
    """Qwen3-30B-A3B: 48 layers of q, k, v, o, q_norm, k_norm, two norms, the router and 128 x 3 expert tensors,
    plus embedding, final norm and LM head = 18,867 HF tensors; vLLM fuses each layer's experts into w13 and w2:
    18,867 - 48 x (384 - 2) = 531. A dense model keeps its HF count."""
    m = load_model("qwen3-30b-a3b")
    assert hf_tensor_count(m) == 48 * (4 + 2 + 2 + 1 + 3 * 128) + 3 == 18_867
    assert WS.vllm_param_count(m) == 18_867 - 48 * (3 * 128 - 2) == 531
    dense = load_model("qwen2.5-7b")
    assert WS.vllm_param_count(dense) == hf_tensor_count(dense)


def test_per_tensor_sync_hand_computed_qwen3_30ba3b_on_h20():
    """16 + 16 H20 on whole nodes, train TP1: the whole bf16 model over a node's eight NICs (8 x 50 GB/s x 0.8),
    one broadcast latency (20 us) per HF tensor and no buckets; per tensor the stack's cost plus one
    load_weights call walking 531 vLLM parameters."""
    hw0 = load_hardware("h20", stack="verl-0.9.1")
    hw = hw0.with_efficiency(sync_tensor_overhead_s=2e-4, load_weights_scan_s=1e-6)
    m = load_model("qwen3-30b-a3b")
    s = Strategy.of(tp=1, ep=8, etp=1, rollout_tp=4)
    ps = CP.pools(Cluster(gpus=32, gpus_per_node=8), 16)
    got = WS.per_tensor_sync(m, hw, hw, ps, s, CAL)
    nbytes = model_consts(m)["total_params"] * 2
    tensors = 18_867
    assert got["transfer_s"] == pytest.approx(nbytes / (400e9 * 0.8) + tensors * 20e-6, rel=1e-9)
    assert got["overhead_s"] == pytest.approx(tensors * (2e-4 + 531 * 1e-6), rel=1e-9)
    assert got["copy_s"] == pytest.approx(nbytes / 4 / (4.0e12 * 0.8), rel=1e-9)
    assert got["buckets"] == 0.0
    assert got["sync_s"] == pytest.approx(
        got["export_s"] + got["transfer_s"] + got["copy_s"] + got["overhead_s"], rel=1e-12
    )


def test_per_tensor_sync_costs_more_than_the_bucketed_broadcast_by_its_per_call_costs():
    """The same export, bytes and link: the bucketed broadcast overlaps its three stages (double buffering), the
    per-tensor path runs everything in sequence and pays a latency and a load_weights call per tensor instead of
    a latency and a bucket cost per bucket; a model with twice the layers walks twice the parameters per call."""
    hw = load_hardware("h20", stack="verl-0.9.1")
    m = load_model("qwen3-30b-a3b")
    s = Strategy.of(tp=1, ep=8, etp=1, rollout_tp=4, sync_bucket_mb=4096)
    ps = CP.pools(Cluster(gpus=32, gpus_per_node=8), 16)
    per = WS.per_tensor_sync(m, hw, hw, ps, s, CAL)
    bc = WS.cross_pool_sync(m, hw, hw, ps, s, CAL)
    e = hw.efficiency
    tensors = hf_tensor_count(m)
    lat = e.inter_node_latency_s
    assert per["export_s"] == pytest.approx(bc["export_s"])
    assert per["link_bytes_per_s"] == pytest.approx(bc["link_bytes_per_s"])
    assert per["transfer_s"] - bc["transfer_s"] == pytest.approx((tensors - bc["buckets"]) * lat, rel=1e-9)
    assert per["overhead_s"] - bc["overhead_s"] == pytest.approx(
        tensors * WS.vllm_param_count(m) * e.load_weights_scan_s - bc["buckets"] * e.sync_bucket_overhead_s, rel=1e-9
    )
    serial = bc["export_s"] + bc["transfer_s"] + bc["copy_s"] + bc["overhead_s"]
    assert bc["sync_s"] == pytest.approx(serial - bc["overlap_s"], rel=1e-9) and bc["overlap_s"] > 0
    assert per["sync_s"] > 2 * bc["sync_s"]
    deep = dataclasses.replace(m, layers=96)
    assert deep.moe_layers == 96
    assert WS.vllm_param_count(deep) == pytest.approx(2 * WS.vllm_param_count(m), abs=3)


def test_estimate_separate_prices_the_per_tensor_transport():
    hw = load_hardware("h20", stack="verl-0.9.1")
    kw = dict(
        model=load_model("qwen2.5-7b"),
        hardware=hw,
        cluster=Cluster(gpus=16, gpus_per_node=8),
        strategy=Strategy.of(tp=1, rollout_tp=2),
        workload=Workload(prompts=8, n=4, mini_batch=8, prompt_len=256, response_len=512),
        placement=Placement(mode="separate", rollout_gpus=8),
    )
    per = P.estimate_separate(**kw, refit_transport="per_tensor")
    bc = P.estimate_separate(**kw)
    assert per.time.phases["weight_sync"] == pytest.approx(per.placement["sync"]["sync_s"])
    assert per.placement["sync"]["sync_s"] > bc.placement["sync"]["sync_s"]
    assert "per_tensor" in WS.REFIT_TRANSPORTS


@pytest.mark.parametrize("size", ["qwen3_30ba3b", "qwen3_235b"])
def test_engine_off_rows_score_the_per_tensor_path_with_their_twins_layouts(size):
    """Each checkpoint-engine-off row is scored, priced by per_tensor_sync, with the plan of its engine-on twin;
    the two differ in the sync's per-call costs only (the same export), and the published off/on ratios
    (15.76 / 4.38 = 3.6x, 58.57 / 23.70 = 2.5x) are matched within 15%."""
    rows = {r.id: r for r in vg.load_grpo_rows()}
    off, on = rows[f"verl_ckpt_engine_{size}_off"], rows[f"verl_ckpt_engine_{size}_on"]
    assert off.split == on.split == "scored"
    assert off.raw["refit_transport"] == "per_tensor" and not on.raw["refit_transport"]
    for k in ("model", "hardware", "gpus", "rollout_gpus", "tp", "pp", "cp", "ep", "etp", "rollout_tp", "offload"):
        assert off.raw[k] == on.raw[k], k
    p_off, e_off = vg.predict(off)
    p_on, e_on = vg.predict(on)
    assert e_off.placement["sync"]["export_s"] == pytest.approx(e_on.placement["sync"]["export_s"])
    assert p_off["refit_s"] == pytest.approx(e_off.placement["sync"]["sync_s"], rel=1e-12)
    ratio = p_off["refit_s"] / p_on["refit_s"]
    published = off.published["refit_s"] / on.published["refit_s"]
    assert ratio == pytest.approx(published, rel=0.15)


def test_load_weights_scan_is_fitted_on_the_two_engine_off_rows():
    rows = [r for r in vg.load_grpo_rows() if r.split != "excluded"]
    prior = next(p for p in vg.PRIORS if p.key == "load_weights_scan_s")
    assert prior.on == "stack:verl-0.9.1"
    mv = vg.movers(rows, (prior,))
    assert sorted(mv[prior]) == ["verl_ckpt_engine_qwen3_235b_off", "verl_ckpt_engine_qwen3_30ba3b_off"]
