"""The bucketed cross-pool broadcast (costmodel/pools.py ``cross_pool_sync``): the training pool's HF export
by hand, the double-buffered stream, and NeMo-RL's DeepSeek-V3 NCCL refit row that scores it (validate --grpo),
with the per-tensor and per-entry costs of NeMo-RL's stack each set by at least two rows."""

from __future__ import annotations

import pytest

import grpo_tune.validate.grpo as vg
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy
from grpo_tune.costmodel import weight_sync as WS
from grpo_tune.costmodel import weight_sync as W
from grpo_tune.costmodel.timing_base import check_calibration, hf_tensor_count, model_consts

CAL = check_calibration(None)


def test_double_buffered_hand_computed():
    """Two buffers: the slowest stage plus one bucket of the other two; one bucket runs them in sequence."""
    t, hidden = WS.double_buffered(6.0, 4.0, 2.0, 10)
    assert t == pytest.approx(6.0 + (4.0 + 2.0) / 10)
    assert hidden == pytest.approx(12.0 - t)
    assert WS.double_buffered(6.0, 4.0, 2.0, 1)[0] == pytest.approx(12.0)
    assert WS.double_buffered(1.0, 9.0, 2.0, 3)[0] == pytest.approx(9.0 + 1.0)


def test_hf_export_hand_computed_deepseek_v3_tp1_pp16_ep16():
    """256 H100, TP1 PP16 EP16: each rank receives 15/16 of its EP-local shard of the other stages over its own NIC
    (a pipeline group has one rank per node: 50 GB/s x 0.8), then 15/16 of every routed expert by an all-gather
    over an expert group of two whole nodes (8 NICs a node: 400 GB/s x 0.8, under NVLink's 450), with one
    latency (20 us)."""
    hw = load_hardware("h100", stack="nemo-rl-main-2026-08")
    m = load_model("deepseek-v3")
    s = Strategy.of(tp=1, pp=16, ep=16, etp=1, last_stage_layers=1)
    total = model_consts(m)["total_params"] * 2
    routed = 58 * 256 * 3 * 7168 * 2048 * 2
    dense = total - routed
    want = 15 / 16 * (dense + routed / 16) / 40e9 + 20e-6 + 15 / 16 * routed / 320e9
    got = W.hf_export_s(m, hw, Cluster(gpus=256, gpus_per_node=8), s, CAL)
    assert got == pytest.approx(want, rel=1e-9)
    assert 5.0 < got < 8.0  # where the colocated refit's gather prices 61 s (the whole model over one NIC per stage)


def test_hf_export_within_a_node_runs_over_nvlink():
    """TP2 x EP8 on one node: the TP all-gather of the dense weights and the EP all-gather of the experts both
    over NVLink (450 GB/s x 0.8, 10 us); no pipeline broadcast."""
    hw = load_hardware("h20", stack="verl-0.9.1")
    m = load_model("qwen3-30b-a3b")
    s = Strategy.of(tp=2, ep=8, etp=1)
    total = model_consts(m)["total_params"] * 2
    routed = 48 * 128 * 3 * 2048 * 768 * 2
    bw, lat = 450e9 * 0.8, 10e-6
    want = lat + (1 / 2) * (total - routed) / bw + lat + (7 / 8) * routed / bw
    assert W.hf_export_s(m, hw, Cluster(gpus=16, gpus_per_node=8), s, CAL) == pytest.approx(want, rel=1e-9)


def test_pp_export_cost_is_paid_only_with_pipeline_parallelism():
    hw = load_hardware("h20", stack="verl-0.9.1")
    e = hw.efficiency
    assert e.pp_export_tensor_overhead_s > 0
    assert W.export_tensor_overhead_s(hw, Strategy.of(tp=2)) == e.sync_tensor_overhead_s
    assert W.export_tensor_overhead_s(hw, Strategy.of(tp=2, pp=2)) == pytest.approx(
        e.sync_tensor_overhead_s + e.pp_export_tensor_overhead_s
    )


def _row(rid: str) -> vg.GrpoRow:
    return {r.id: r for r in vg.load_grpo_rows()}[rid]


def test_nemo_rl_dsv3_nccl_refit_row_is_scored_as_a_broadcast():
    """NeMo-RL's checkpoint-engine guide: DeepSeek-V3, 32 policy nodes (TP1 PP16 EP16) + 4 rollout nodes (vLLM
    TP32), NCCL 14.21 s: a refit-only row priced by the bucketed broadcast (every HF tensor whole to every rollout
    rank in 1631 MiB packed buckets), producer-bound: the export and the per-tensor cost outlast the wire."""
    row = _row("nemorl_ckpt_nccl_dsv3_h100")
    assert row.split == "scored" and set(row.published) == {"refit_s"}
    assert row.published["refit_s"] == 14.21
    assert not row.raw["refit_transport"] and row.raw["stack"] == "nemo-rl-main-2026-08"
    assert "checkpoint-engine-refit.md" in row.raw["source"]
    pred, est = vg.predict(row)
    f = est.placement
    assert f["rollout_gpus"] == 32 and f["train_gpus"] == 256 and not f["shared_nodes"]
    sy = f["sync"]
    m = est.model
    assert sy["bytes_per_rollout_gpu"] == pytest.approx(model_consts(m)["total_params"] * 2)
    assert sy["buckets"] == pytest.approx(785)
    produce = sy["export_s"] + hf_tensor_count(m) * est.hardware.efficiency.sync_tensor_overhead_s
    assert produce > sy["transfer_s"]
    assert pred["refit_s"] == pytest.approx(f["sync_s"], rel=1e-12)


def test_nemo_rl_refit_costs_are_split_and_each_set_by_two_or_more_rows():
    """NeMo-RL main's per-tensor cost (every tensor of the packed broadcast: the DeepSeek-V3 NCCL row and the
    reshard rows' misc tensors) and its per-bulk-entry cost (the nine reshard rows) are separate priors, each
    moved by at least two scored rows."""
    rows = [r for r in vg.load_grpo_rows() if r.split != "excluded"]
    mine = tuple(p for p in vg.PRIORS if p.on == "stack:nemo-rl-main-2026-08")
    assert {p.key for p in mine} == {"sync_tensor_overhead_s", "reshard_entry_overhead_s"}
    mv = vg.movers(rows, mine)
    by = {p.key: mv[p] for p in mine}
    assert "nemorl_ckpt_nccl_dsv3_h100" in by["sync_tensor_overhead_s"] and len(by["sync_tensor_overhead_s"]) >= 2
    assert "nemorl_ckpt_nccl_dsv3_h100" not in by["reshard_entry_overhead_s"]
    assert len(by["reshard_entry_overhead_s"]) == 9
