"""The weight-sync bucket (``Strategy.sync_bucket_mb``, verl 0.9.1's
``actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes``, default 2048): priced in the
weight_sync phase's memory and time, refused below 1 with a coded error, left out of best.yaml/--json at the
default (older plans keep their bytes), written to verl.sh, read back by tune and diagnose, taken as a pin,
and accepted by ``train --dry-run``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_tune.autotune import tune as T
from grpo_tune.frameworks import read_plan
from grpo_tune.cli.options import strategy_pins
from grpo_tune.cli.main import main
from grpo_tune.core.config import RunConfig, dumps, load, save
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import SYNC_BUCKET_MB, Cluster, Strategy, Workload, validate
from grpo_tune.core.support import check_plan
from grpo_tune.costmodel.estimate import estimate
from grpo_tune.costmodel.weight_sync import weight_sync_s
from trainer_harness import run_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples/qwen2-7b-grpo-megatron.sh"  # sets no bucket: verl's default 2048
KEY = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
MiB = 1 << 20
WL = Workload(prompts=64, n=4, mini_batch=16)
# qwen2.5-7b: 7,615,616,512 parameters (embedding and LM head untied) -> 15,231,233,024 B in bf16 (14,525.6 MiB);
# its largest tensor is the embedding, 152,064 x 3,584 = 544,997,376 values -> 1,089,994,752 B.
PARAMS_7B = 7_615_616_512
MODEL_BF16_BYTES = 2 * PARAMS_7B
BIGGEST_TENSOR_BYTES = 2 * 152_064 * 3_584


def _est(mb: int, **kw):
    return estimate(
        model=load_model("7b"),
        hardware=load_hardware("h100"),
        cluster=Cluster(gpus=8),
        strategy=Strategy.of(tp=2, rollout_tp=2, mbs=4, sync_bucket_mb=mb, **kw),
        workload=WL,
    )


def test_the_default_is_verls_and_defined_once():
    assert SYNC_BUCKET_MB == 2048 and Strategy().rollout.sync_bucket_mb == SYNC_BUCKET_MB
    assert Strategy().rollout.sync_bucket_bytes == 2_147_483_648


def test_weight_sync_memory_moves_by_exactly_the_bucket_difference():
    """costmodel/memory.py: the weight_sync phase holds one bucket, min(bucket, model bf16 bytes), plus the largest
    tensor gathered whole. Buckets below the model's 15,231,233,024 B:
      2048 MiB: 2,147,483,648 + 1,089,994,752 = 3,237,478,400 B
        64 MiB:    67,108,864 + 1,089,994,752 = 1,157,103,616 B
    so the phase total drops by exactly (2048 - 64) MiB = 2,080,374,784 B and no other phase moves.
    Buckets above the model (16 GiB and 32 GiB) are capped at the model: both hold 15,231,233,024 + 1,089,994,752
    = 16,321,227,776 B."""
    m = load_model("7b")
    assert m.vocab * m.hidden * 2 == BIGGEST_TENSOR_BYTES
    big, small = _est(2048).memory, _est(64).memory
    assert big["weight_sync"].parts["sync_bucket"] == 3_237_478_400
    assert small["weight_sync"].parts["sync_bucket"] == 1_157_103_616
    assert big["weight_sync"].total_bytes - small["weight_sync"].total_bytes == 2_080_374_784 == (2048 - 64) * MiB
    for name in big:
        if name != "weight_sync":
            assert big[name].total_bytes == small[name].total_bytes, name
    huge, huger = _est(16384).memory, _est(32768).memory
    assert 16384 * MiB > MODEL_BF16_BYTES
    assert huge["weight_sync"].parts["sync_bucket"] == huger["weight_sync"].parts["sync_bucket"] == 16_321_227_776


def test_weight_sync_buckets_and_overhead_follow_ceil_of_model_over_bucket():
    """costmodel/weight_sync.py: buckets = ceil(model bf16 bytes / bucket bytes), overhead = tensors x per-tensor +
    buckets x per-bucket (h100: 0.012 s per bucket).
      2048 MiB: ceil(15,231,233,024 / 2,147,483,648) = ceil(7.09)  = 8
       256 MiB: ceil(15,231,233,024 /   268,435,456) = ceil(56.74) = 57
         1 MiB: ceil(15,231,233,024 /     1,048,576) = ceil(14,525.6) = 14,526
    so 256 MiB costs (57 - 8) x 0.012 = 0.588 s more than 2048, and so does the estimate's weight_sync phase."""
    m, hw = load_model("7b"), load_hardware("h100")
    assert hw.efficiency.sync_bucket_overhead_s == 0.012
    c = Cluster(gpus=8)
    s = validate(m, Strategy.of(tp=2, rollout_tp=2), 8)
    from grpo_tune.costmodel.timing import CALIBRATION_DEFAULTS as CAL

    got = {mb: weight_sync_s(m, hw, c, s.replace(sync_bucket_mb=mb), CAL) for mb in (2048, 256, 1)}
    assert {mb: got[mb]["buckets"] for mb in got} == {2048: 8, 256: 57, 1: 14_526}
    assert all(got[mb]["buckets"] == math.ceil(MODEL_BF16_BYTES / (mb * MiB)) for mb in got)
    assert got[256]["overhead_s"] - got[2048]["overhead_s"] == pytest.approx(49 * 0.012, rel=1e-12)
    for part in ("wake_s", "onload_s", "gather_s", "copy_s"):
        assert got[256][part] == got[2048][part]
    t_big, t_small = _est(2048).time.phases, _est(256).time.phases
    assert t_small["weight_sync"] - t_big["weight_sync"] == pytest.approx(0.588, rel=1e-9)
    assert {k: v for k, v in t_small.items() if k != "weight_sync"} == {
        k: v for k, v in t_big.items() if k != "weight_sync"
    }


@given(st.integers(max_value=0))
def test_a_bucket_below_one_mib_is_a_coded_error_everywhere(mb):
    with pytest.raises(ConfigError) as e:
        Strategy.from_dict({"sync_bucket_mb": mb})
    assert e.value.code == "BAD_CONFIG" and "sync_bucket_mb" in str(e.value)
    with pytest.raises(ConfigError, match="--sync-bucket-mb must be >= 1"):
        strategy_pins(sync_bucket_mb=mb)
    found = check_plan(load_model("tiny"), Strategy.of(sync_bucket_mb=mb))
    assert [f.code for f in found] == ["BAD_CONFIG"] and "sync_bucket_mb" in found[0].message


def _cfg(mb: int) -> RunConfig:
    """The tiny model on one CPU process (tests/trainer_harness.py), 16 sequences a step."""
    cfg = run_config("tiny", {"mbs": 4, "sync_bucket_mb": mb}, 1, rollout_engine="megatron", dataset="synthetic")
    return cfg.replace(workload=Workload(prompts=4, n=4, mini_batch=2, prompt_len=8, response_len=4, dtype="fp32"))


def test_best_yaml_spells_the_bucket_and_reads_older_plans_as_the_default(tmp_path):
    """The plan we price is the plan we emit: best.yaml (and --json) always spell the bucket, verl's default
    included; a best.yaml written before the field (no key) loads to 2048; a set bucket is written and read back."""
    text = dumps(_cfg(SYNC_BUCKET_MB))
    assert f"sync_bucket_mb: {SYNC_BUCKET_MB}" in text and Strategy().to_dict()["sync_bucket_mb"] == SYNC_BUCKET_MB
    older = text.replace(f"  sync_bucket_mb: {SYNC_BUCKET_MB}\n", "")
    assert "sync_bucket_mb" not in older
    (tmp_path / "old.yaml").write_text(older)
    assert load(tmp_path / "old.yaml").strategy.rollout.sync_bucket_mb == SYNC_BUCKET_MB
    assert load(save(_cfg(SYNC_BUCKET_MB), tmp_path / "a.yaml")).strategy.rollout.sync_bucket_mb == SYNC_BUCKET_MB
    assert "sync_bucket_mb: 512" in dumps(_cfg(512))
    assert load(save(_cfg(512), tmp_path / "b.yaml")).strategy.rollout.sync_bucket_mb == 512


def test_train_dry_run_accepts_any_bucket_and_refuses_zero(capsys, tmp_path):
    """The trainer's CPU sampler has no weight sync; the vLLM adapter buckets by the plan (test_trainer_vllm.py).
    Any size >= 1 MiB runs; 0 is the schema's coded error (exit 2)."""
    for mb in (1, 512, 10**6):
        p = save(_cfg(mb), tmp_path / f"b{mb}.yaml")
        rc = main(["train", "--config", str(p), "--dry-run", "--json"])
        out = capsys.readouterr()
        assert rc == 0, out.err
    p = tmp_path / "zero.yaml"
    p.write_text(dumps(_cfg(512)).replace("sync_bucket_mb: 512", "sync_bucket_mb: 0"))
    assert main(["train", "--config", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "[BAD_CONFIG]" in err and "sync_bucket_mb" in err


def test_estimate_takes_the_pin(capsys):
    rc = main(["estimate", "-m", "7b", "-g", "8", "--tp", "2", "--sync-bucket-mb", "64", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    d = json.loads(out.out)
    assert d["strategy"]["sync_bucket_mb"] == 64
    assert d["memory"]["phases"]["weight_sync"]["sync_bucket_bytes"] == 1_157_103_616  # 64 MiB + the embedding


def test_search_prices_every_plan_with_a_pinned_bucket():
    from grpo_tune.autotune.search.driver import search

    res = search(load_model("7b"), load_hardware("h100"), Cluster(gpus=8), WL, pins={"sync_bucket_mb": 64}, top=5)
    assert res.ranked and all(e.strategy.rollout.sync_bucket_mb == 64 for e in res.ranked)
    for e in res.ranked:
        assert e.details["weight_sync_buckets"] == math.ceil(MODEL_BF16_BYTES / (64 * MiB)) == 227


def _tune(capsys, path: Path, out: Path, *extra: str) -> dict:
    rc = main(["tune", str(path), "--hardware", "h100", "--out", str(out), "--json", *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


def _with_bucket(tmp_path: Path, mb: int) -> Path:
    text = EXAMPLE.read_text()
    assert KEY not in text
    text, n = re.subn(r"^(\s*)(actor_rollout_ref\.rollout\.n=\S+ \\)$", rf"\1\2\n\1{KEY}={mb} \\", text, flags=re.M)
    assert n == 1
    p = tmp_path / f"bucket{mb}.sh"
    p.write_text(text)
    return p


def test_tune_prices_and_keeps_the_launchs_bucket(capsys, tmp_path):
    """A launch with 512: tune reads it, prices the current and best plans with it (8 vs 29 buckets:
    ceil(15,231,233,024 / 536,870,912) = 29), reports no change of the key, and tuned.sh keeps 512."""
    launch = _with_bucket(tmp_path, 512)
    plan = read_plan(launch, hardware="h100")
    assert plan.strategy.rollout.sync_bucket_mb == 512
    res = T.tune(plan)
    assert res.current.details["weight_sync_buckets"] == 29
    assert res.best.strategy.rollout.sync_bucket_mb == 512 and KEY not in res.changes
    first = _tune(capsys, launch, tmp_path / "a")
    assert KEY not in first["overrides"]
    tuned = Path(first["files"]["tuned.sh"]).read_text()
    assert re.search(rf"^\s*{re.escape(KEY)}=512 \\$", tuned, re.M)
    assert _tune(capsys, Path(first["files"]["tuned.sh"]), tmp_path / "b")["overrides"] == {}


def test_tune_takes_the_pin_and_leaves_a_launch_without_the_key_alone(capsys, tmp_path):
    """The example sets no bucket (verl's 2048): tune reports no bucket change; --sync-bucket-mb 256 moves it
    (reported 2048 -> 256, written to tuned.sh), and tuning tuned.sh again proposes nothing."""
    plain = _tune(capsys, EXAMPLE, tmp_path / "a")
    assert KEY not in plain["overrides"] and KEY not in Path(plain["files"]["tuned.sh"]).read_text()
    first = _tune(capsys, EXAMPLE, tmp_path / "b", "--sync-bucket-mb", "256")
    assert first["overrides"][KEY] == {"old": 2048, "new": 256}
    assert first["best"]["strategy"]["sync_bucket_mb"] == 256
    tuned = Path(first["files"]["tuned.sh"])
    assert read_plan(tuned, hardware="h100").strategy.rollout.sync_bucket_mb == 256
    assert _tune(capsys, tuned, tmp_path / "c")["overrides"] == {}


def test_diagnose_prices_the_launchs_bucket(capsys, tmp_path):
    """diagnose reads the key through the verl table: 64 MiB holds exactly (2048 - 64) MiB less in weight_sync."""

    def phases(p: Path) -> dict:
        main(["diagnose", str(p), "--json"])
        return json.loads(capsys.readouterr().out)["summary"]["memory"]["phases"]

    default, small = phases(EXAMPLE), phases(_with_bucket(tmp_path, 64))
    assert default["weight_sync"] - small["weight_sync"] == (2048 - 64) * MiB == 2_080_374_784
    assert default["update"] == small["update"]


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "abc"])
def test_diagnose_refuses_a_bucket_verl_cannot_shift_into_bytes(capsys, tmp_path, value):
    """verl computes the bucket as ``update_weights_bucket_megabytes << 20`` (engine_workers.py l.681): 0 or less
    is no bucket, a fraction or a word fails the shift. An error on the key, not a silent 2048."""
    p = _with_bucket(tmp_path, 64)
    p.write_text(p.read_text().replace(f"{KEY}=64", f"{KEY}={value}"))
    main(["diagnose", str(p), "--json"])
    d = json.loads(capsys.readouterr().out)
    errors = [f for f in d["findings"] if f["severity"] == "error"]
    assert [(f["code"], f["key"]) for f in errors] == [("BAD_CONFIG", KEY)]
