"""NeMo-RL's NCCL-reshard refit across pools (costmodel/pools.py ``reshard_sync``): the bulk share against
the fraction NeMo-RL publishes, one sync priced by hand, trends against the broadcast transport, and the
published refit rows that score it (validate --grpo)."""

from __future__ import annotations

import math

import pytest

import grpo_tune.validate.grpo as vg
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.hardware import with_stack
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel import pools as P
from grpo_tune.core import placement as CP
from grpo_tune.costmodel import weight_sync as WS
from grpo_tune.costmodel.timing_base import check_calibration, hf_tensor_count, model_consts

CAL = check_calibration(None)
STACK = "nemo-rl-main-2026-08"


@pytest.mark.parametrize(
    "model, published",
    # docs/design-docs/nccl-reshard-refit.md, 'XferDTensor fraction' column (BF16 rows)
    [("qwen3-4b", 0.669), ("qwen3-30b-a3b", 0.950), ("deepseek-v3", 0.976)],
)
def test_bulk_share_is_the_published_xferdtensor_fraction(model, published):
    m = load_model(model)
    share = WS.reshard_bulk_params(m) / model_consts(m)["total_params"]
    assert share == pytest.approx(published, abs=0.0006)


def test_bulk_and_misc_bytes_are_the_published_split():
    """NeMo-RL pull request #3659 (Qwen3-30B-A3B, BF16): 54.00 GiB through the NCCL reshard and 2.87 GiB through
    the misc broadcast, per refit."""
    m = load_model("qwen3-30b-a3b")
    bulk = WS.reshard_bulk_params(m) * 2
    misc = model_consts(m)["total_params"] * 2 - bulk
    assert bulk / 2**30 == pytest.approx(54.00, abs=0.01)
    assert misc / 2**30 == pytest.approx(2.87, abs=0.01)


def test_bulk_params_hand_computed():
    # Qwen3-4B: 36 layers x (gate, up, down) of 2560 x 9728; DeepSeek-V3: 3 dense layers of 7168 x 18432 and
    # 58 MoE layers x 256 routed experts of 7168 x 2048 (the shared expert rides the misc path)
    assert WS.reshard_bulk_params(load_model("qwen3-4b")) == 36 * 3 * 2560 * 9728
    assert WS.reshard_bulk_params(load_model("deepseek-v3")) == 3 * 3 * 7168 * 18432 + 58 * 256 * 3 * 7168 * 2048
    # entries: one per projection per layer (experts grouped); the rest of the HF tensors one by one
    m = load_model("deepseek-v3")
    bulk, misc = WS.reshard_entries(m)
    assert bulk == 61 * 3
    assert bulk + misc == hf_tensor_count(m) - 58 * 3 * 256 + 58 * 3
    assert hf_tensor_count(m) == 45395  # NeMo-RL's NIXL benchmark: 45,395 tensors per vLLM rank (TP32)


def _pools(gpus: int, rollout: int, gpn: int = 8) -> CP.Pools:
    return CP.pools(Cluster(gpus=gpus, gpus_per_node=gpn), rollout)


def test_reshard_sync_hand_computed_qwen3_4b_on_h100():
    """DP8 -> TP8 on two H100 nodes: each rollout GPU receives its eighth of the FFN weights over its own NIC
    (50 GB/s x comm_efficiency 0.8) and the whole misc by a broadcast over the node's eight NICs (400 GB/s x 0.8,
    under NVLink's 450), a latency per bulk entry and misc bucket; copies at HBM x 0.8; the stack's cost per bulk
    entry and per misc tensor, its per-bucket cost per misc bucket. The bulk runs entry by entry; the misc is a
    double-buffered packed broadcast: its slowest stage (producing: per-tensor costs; the wire; consuming: copies
    and per-bucket costs) plus the other two stages of one of its two buckets."""
    hw = load_hardware("h100", stack=STACK)
    m = load_model("qwen3-4b")
    s = Strategy.of(tp=1, dp=8, rollout_tp=8, sync_bucket_mb=1631)
    got = WS.reshard_sync(m, hw, hw, _pools(16, 8), s, CAL)
    total = 4_022_468_096 * 2
    bulk = 36 * 3 * 2560 * 9728 * 2
    misc = total - bulk
    bw, bw_b, lat = 50e9 * 0.8, 400e9 * 0.8, 20e-6
    buckets = math.ceil(misc / (1631 * 2**20))
    assert buckets == 2
    transfer = bulk / 8 / bw + 108 * lat + misc / bw_b + buckets * lat
    copy = (bulk / 8 + misc / 8) / (3.35e12 * 0.8)
    e = hw.efficiency
    t, te, tb = e.sync_tensor_overhead_s, e.reshard_entry_overhead_s, e.sync_bucket_overhead_s
    overhead = 108 * te + 290 * t + buckets * tb
    assert got["transfer_s"] == pytest.approx(transfer, rel=1e-9)
    assert got["copy_s"] == pytest.approx(copy, rel=1e-9)
    assert got["overhead_s"] == pytest.approx(overhead, rel=1e-9)
    assert got["export_s"] == 0.0  # TP1, nothing offloaded: the shards leave as they lie
    bulk_s = bulk / 8 / bw + 108 * lat + bulk / 8 / (3.35e12 * 0.8) + 108 * te
    stages = (290 * t, misc / bw_b + buckets * lat, misc / 8 / (3.35e12 * 0.8) + buckets * tb)
    misc_s = max(stages) + (sum(stages) - max(stages)) / buckets
    assert got["sync_s"] == pytest.approx(bulk_s + misc_s, rel=1e-9)
    assert got["overlap_s"] == pytest.approx(sum(stages) - misc_s, rel=1e-9)
    assert got["bytes_per_rollout_gpu"] == pytest.approx(bulk / 8 + misc)


@pytest.mark.parametrize(
    "model, tp, pp, ep, rtp, gpus", [("qwen3-4b", 1, 1, 1, 8, 16), ("qwen3-30b-a3b", 1, 2, 8, 8, 32)]
)
def test_reshard_moves_fewer_bytes_than_the_broadcast(model, tp, pp, ep, rtp, gpus):
    """A rollout GPU receives fewer bytes by the reshard than by the broadcast (which sends it the whole model) by
    the bulk's share x (1 - 1/rollout TP); a larger rollout TP receives fewer bytes per GPU. Across whole nodes
    each rollout node still takes the model in once either way when rollout TP fills the node (eight shards over
    eight NICs, or one ring over the same eight NICs forwarding over NVLink): the two wire times are then equal
    but for the reshard's latency per bulk entry; a smaller rollout TP takes several copies in per node, so its
    reshard wire time is the longer."""
    hw = load_hardware("h100", stack=STACK)
    m = load_model(model)
    s = Strategy.of(tp=tp, pp=pp, ep=ep, etp=1 if ep > 1 else None, rollout_tp=rtp, sync_bucket_mb=1631)
    ps = _pools(gpus, gpus // 2)
    res = WS.reshard_sync(m, hw, hw, ps, s, CAL)
    bc = WS.cross_pool_sync(m, hw, hw, ps, s, CAL)
    share = WS.reshard_bulk_params(m) / model_consts(m)["total_params"]
    entries, _ = WS.reshard_entries(m)
    lat = hw.efficiency.inter_node_latency_s
    assert rtp == hw.gpus_per_node
    assert res["transfer_s"] - (entries + res["buckets"]) * lat == pytest.approx(
        bc["transfer_s"] - bc["buckets"] * lat, rel=1e-9
    )
    assert res["bytes_per_rollout_gpu"] == pytest.approx(bc["bytes_per_rollout_gpu"] * (1 - share * (1 - 1 / rtp)))
    wider = WS.reshard_sync(m, hw, hw, ps, s.replace(rollout_tp=rtp // 2), CAL)
    assert wider["bytes_per_rollout_gpu"] > res["bytes_per_rollout_gpu"]
    assert wider["transfer_s"] > res["transfer_s"]


def test_estimate_separate_takes_the_transport():
    """A MoE model's reshard is priced faster than its broadcast (NeMo-RL publishes both for DeepSeek-V3 on H100:
    2.39-2.83 s against 14.21 s): it pays per grouped bulk entry, not per expert tensor."""
    hw = load_hardware("h100", stack=STACK)
    m = load_model("qwen3-30b-a3b")
    kw = dict(
        model=m,
        hardware=hw,
        cluster=Cluster(gpus=32, gpus_per_node=8),
        strategy=Strategy.of(tp=1, pp=2, ep=8, etp=1, rollout_tp=8),
        workload=Workload(prompts=8, n=4, mini_batch=8, prompt_len=256, response_len=512),
        placement=Placement(mode="separate", rollout_gpus=16),
    )
    res = P.estimate_separate(**kw, refit_transport="nccl_reshard")
    bc = P.estimate_separate(**kw)
    assert res.placement["sync"]["sync_s"] < bc.placement["sync"]["sync_s"]
    assert res.time.phases["weight_sync"] == pytest.approx(res.placement["sync"]["sync_s"])
    with pytest.raises(ConfigError):
        P.estimate_separate(**kw, refit_transport="carrier-pigeon")


def _row(rid: str) -> vg.GrpoRow:
    return {r.id: r for r in vg.load_grpo_rows()}[rid]


@pytest.mark.parametrize(
    "rid", ["nemorl_reshard_qwen3_4b_h100", "nemorl_reshard_qwen3_30ba3b_h100", "nemorl_reshard_dsv3_gb200"]
)
def test_published_reshard_rows_score_the_reshard_transport(rid):
    """Each refit-only reshard row is priced by reshard_sync (not the broadcast); its costs count the grouped bulk
    entries (not every expert tensor): raising the stack's per-entry cost by d raises the refit by entries x d;
    the per-tensor cost is paid by the misc tensors only, on the producing stage of their packed broadcast."""
    row = _row(rid)
    assert set(row.published) == {"refit_s"} and row.raw["refit_transport"] == "nccl_reshard"
    pred, est = vg.predict(row)
    f = est.placement
    assert f["mode"] == "separate" and not f["shared_nodes"]
    assert pred["refit_s"] == pytest.approx(f["sync_s"], rel=1e-12)
    assert est.strategy.memory.offload == ()  # a training pool of its own keeps its state on the GPU
    m = est.model
    bulk, misc = WS.reshard_entries(m)
    hw = vg._hw(row, None)
    assert hw.stack == STACK
    bumped = hw.with_efficiency(reshard_entry_overhead_s=hw.efficiency.reshard_entry_overhead_s + 1e-4)
    pred2, _ = vg.predict(row, bumped)
    assert pred2["refit_s"] - pred["refit_s"] == pytest.approx(bulk * 1e-4, rel=1e-6)
    misc_up = hw.with_efficiency(sync_tensor_overhead_s=hw.efficiency.sync_tensor_overhead_s + 1e-3)
    pred3, _ = vg.predict(row, misc_up)
    assert 0 < pred3["refit_s"] - pred["refit_s"] <= misc * 1e-3 * (1 + 1e-9)


def test_reshard_rows_span_h100_and_gb200_and_name_their_source():
    rows = [r for r in vg.load_grpo_rows() if (r.raw.get("refit_transport") or "") == "nccl_reshard"]
    assert {r.raw["hardware"] for r in rows} == {"h100", "gb200-nvl72"}
    assert all(("nccl-reshard-refit.md" in r.raw["source"] or "pull/2971" in r.raw["source"]) for r in rows)
    assert all(r.split == "scored" for r in rows) and len(rows) == 9
    assert all(with_stack(load_hardware(r.raw["hardware"]), vg.row_stack(r)).stack == STACK for r in rows)


def test_unknown_refit_transport_in_a_row_is_a_coded_error(tmp_path):
    """A measurements file naming a transport the model does not price is BAD_CONFIG naming the row, and the
    CLI exits 2 (no traceback)."""
    import subprocess
    import sys
    from pathlib import Path

    from grpo_tune.core.errors import GrpoTuneError

    root = Path(__file__).resolve().parent.parent
    text = (root / "grpo_tune/profiles/data/published_grpo.csv").read_text()
    bad = tmp_path / "grpo.csv"
    bad.write_text(text.replace(",nccl_reshard\n", ",pigeon\n", 1))
    row = next(r for r in vg.load_grpo_rows(bad) if r.raw.get("refit_transport") == "pigeon")
    with pytest.raises(GrpoTuneError) as ei:
        vg.predict(row)
    assert ei.value.code == "BAD_CONFIG" and row.id in ei.value.message and "pigeon" in ei.value.message
    p = subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "validate", "--grpo", "--data", str(bad)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert p.returncode == 2 and "BAD_CONFIG" in (p.stdout + p.stderr) and "Traceback" not in p.stderr
