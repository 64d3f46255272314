"""The log-prob passes' own micro-batch (``Strategy.log_prob_mbs``, verl's rollout/ref
``log_prob_micro_batch_size_per_gpu``): priced, checked as verl checks it, kept by ``tune``, round-tripped
through best.yaml, and run by the trainer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_tune.autotune import tune as T
from grpo_tune.frameworks import read_plan
from grpo_tune.cli.options import strategy_pins
from grpo_tune.cli.main import main
from grpo_tune.core.config import RunConfig, TrainerOptions, load, save
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate
from grpo_tune.core.support import check_plan
from grpo_tune.costmodel.estimate import estimate
from trainer_harness import torchrun_json

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples/qwen2-7b-grpo-megatron.sh"  # ppo micro-batch 4, log-prob micro-batch 8
LP_KEYS = [f"actor_rollout_ref.{r}.log_prob_micro_batch_size_per_gpu" for r in ("ref", "rollout")]
WL = Workload(prompts=64, n=4, mini_batch=16)  # 256 sequences, 1024 + 1024 tokens


def _est(**kw):
    return estimate(
        model=load_model("7b"),
        hardware=load_hardware("h100"),
        cluster=Cluster(gpus=8),
        strategy=Strategy.of(tp=2, mbs=4, **kw),
        workload=WL,
    )


def test_log_prob_phase_memory_scales_with_log_prob_mbs_as_the_formulas_say():
    """Hand arithmetic (costmodel/activations.py), qwen2.5-7b at TP2 with SP on an H100 (bf16 activations),
    sequences of 2048 tokens, b = log-prob micro-batch:
      logits_bytes = tokens x (2 x 2 B x hidden / tp + LOGITS_FORWARD_BYTES x vocab / tp), 8 B per logit in a
      forward-only pass with entropy (bf16 logits, their clone, one fp32 working copy: verl's old log-prob)
                   = 2048 b x (2 x 2 x 3584 / 2 + 8 x 152064 / 2) = 2048 b x 615,424 B
      (b=4: 5,041,553,408 B; b=8: 10,083,106,816 B);
      forward_activation_bytes = b x 2048 x (linear + quad x 2048 + 2 x layer_input): linear in b,
      so b=8 holds exactly twice b=4 and 8x b=1.
    The update phase (micro-batch 4) does not move, and every other part of the log-prob phases stays."""
    m = load_model("7b")
    assert (m.hidden, m.vocab) == (3584, 152064)
    phases = {b: _est(log_prob_mbs=b).memory for b in (1, 4, 8)}
    base = _est().memory
    for b in (1, 4, 8):
        for name in ("old_logprob", "ref_logprob"):
            assert phases[b][name].parts["logits"] == 2048 * b * 615_424
    assert phases[8]["old_logprob"].parts["logits"] == 10_083_106_816
    act = {b: phases[b]["old_logprob"].parts["activations"] for b in (1, 4, 8)}
    assert act[8] == pytest.approx(2 * act[4], rel=1e-12) and act[8] == pytest.approx(8 * act[1], rel=1e-12)
    # log_prob_mbs == mbs prices exactly as unset
    assert phases[4]["old_logprob"] == base["old_logprob"] and phases[4]["ref_logprob"] == base["ref_logprob"]
    for name in ("old_logprob", "ref_logprob"):
        moved = {k for k in base[name].parts if base[name].parts[k] != phases[8][name].parts[k]}
        assert moved == {"activations", "logits"}
    assert phases[8]["update"] == base["update"]


def test_log_prob_time_counts_the_log_prob_micro_batches():
    """256 sequences over dp=4 = 64 per rank: 16 micro-batches of 4, 8 of 8 (costmodel/timing.py micro_batch_plan);
    the update's time does not move."""
    a, b = _est(), _est(log_prob_mbs=8)
    assert a.details["logprob_micro_batches"] == 16 and b.details["logprob_micro_batches"] == 8
    assert a.time.phases["update"] == b.time.phases["update"]
    assert a.time.phases["old_logprob"] != b.time.phases["old_logprob"]
    assert _est(log_prob_mbs=4).time == a.time


def test_the_log_prob_batch_rule_is_verls():
    """verl 0.9.1: the log-prob pass takes a DP rank's prompts x n / dp sequences whole and asserts them
    divisible by its micro-batch (workers/engine/utils.py prepare_micro_batches); with vpp the micro-batch count
    must be a multiple of pp (megatron/transformer_impl.py, microbatch_group_size_per_vp_stage)."""
    m = load_model("7b")

    def codes(gpus: int, **kw) -> list[str]:
        s = validate(m, Strategy.of(**kw), gpus)
        return [f.code for f in check_plan(m, s, workload=WL)]

    assert codes(8, tp=2, mbs=4, log_prob_mbs=8) == []  # 64 per rank / 8
    assert codes(8, tp=2, mbs=4, log_prob_mbs=64) == []
    assert codes(8, tp=2, mbs=4, log_prob_mbs=7) == ["BATCH_DIVISIBILITY"]
    assert codes(8, tp=2, mbs=4, log_prob_mbs=128) == ["BATCH_DIVISIBILITY"]
    # pp2 vpp2 dp2: 128 per rank; 64 -> 2 micro-batches (a multiple of pp), 128 -> 1 (not)
    assert codes(8, tp=2, pp=2, vpp=2, mbs=4, log_prob_mbs=64) == []
    assert codes(8, tp=2, pp=2, vpp=2, mbs=4, log_prob_mbs=128) == ["BATCH_DIVISIBILITY"]
    # the estimate reports the same rule as a violation
    assert any(v.code == "BATCH_DIVISIBILITY" for v in _est(log_prob_mbs=7).violations)
    assert not any(v.code == "BATCH_DIVISIBILITY" for v in _est(log_prob_mbs=8).violations)


@given(st.integers(-(2**40), 0))
def test_a_log_prob_mbs_below_one_is_a_coded_error(v):
    with pytest.raises(ConfigError):
        Strategy.from_dict({"log_prob_mbs": v})
    with pytest.raises(ConfigError, match="--log-prob-mbs must be >= 1"):
        strategy_pins(log_prob_mbs=v)
    assert [f.code for f in check_plan(load_model("tiny"), Strategy.of(log_prob_mbs=v))] == ["BAD_CONFIG"]


def test_best_yaml_round_trips_log_prob_mbs(tmp_path):
    m = load_model("tiny")
    for lp in (None, 3):
        cfg = RunConfig(
            model=m,
            hardware=load_hardware("cpu"),
            cluster=Cluster(gpus=1),
            strategy=validate(m, Strategy.of(mbs=2, log_prob_mbs=lp), 1),
            workload=Workload(prompts=4, n=3, mini_batch=2, prompt_len=8, response_len=4),
            trainer=TrainerOptions(),
        )
        p = save(cfg, tmp_path / f"best-{lp}.yaml")
        assert ("log_prob_mbs" in p.read_text()) == (lp is not None)  # unset writes nothing: old files read the same
        assert load(p).strategy == cfg.strategy


def test_estimate_pin_flag(capsys):
    rc = main(["estimate", "-m", "7b", "-g", "8", "--tp", "2", "--mbs", "4", "--log-prob-mbs", "8", "--prompts", "64"]
              + ["--n", "4", "--mini-batch", "16", "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["strategy"]["log_prob_mbs"] == 8 and out["details"]["logprob_micro_batches"] == 8


def _tune(capsys, path: Path, out: Path) -> dict:
    rc = main(["tune", str(path), "--hardware", "h100", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


def test_tune_prices_and_keeps_the_launchs_log_prob_micro_batch(capsys, tmp_path):
    plan = read_plan(EXAMPLE, hardware="h100")
    assert (plan.strategy.batching.mbs, plan.strategy.batching.log_prob_mbs) == (4, 8)
    res = T.tune(plan)
    # priced with 8: 1024 x 5 sequences / dp 4 = 1280 per rank -> 160 log-prob micro-batches (not 320)
    assert res.current.details["logprob_micro_batches"] == 1280 / 8
    assert res.best.strategy.batching.log_prob_mbs_ == 8
    assert not set(LP_KEYS) & set(res.changes)
    first = _tune(capsys, EXAMPLE, tmp_path / "a")
    tuned = Path(first["files"]["tuned.sh"]).read_text()
    for k in LP_KEYS:
        assert re.search(rf"^\s*{re.escape(k)}=8 \\$", tuned, re.M), k
        assert k not in first["overrides"]


def test_tune_moves_an_equal_log_prob_micro_batch_with_mbs_and_reports_it(capsys, tmp_path):
    """A launch whose log-prob micro-batch equals the training one (4 and 4): unset in the plan, so it follows
    the best plan's mbs and both keys are reported; the tuned script is a fixed point."""
    text = EXAMPLE.read_text()
    for k in LP_KEYS:
        text, n = re.subn(rf"({re.escape(k)})=8", r"\1=4", text)
        assert n == 1
    launch = tmp_path / "equal.sh"
    # tune leaves `=$TP` as written (a value computed at run time: it says what to set), so for the fixed point
    # the degrees are spelt out, as ${TP:-2} gives them
    launch.write_text(text.replace("=$TP ", "=2 "))
    plan = read_plan(launch, hardware="h100")
    assert (plan.strategy.batching.mbs, plan.strategy.batching.log_prob_mbs) == (4, None)
    first = _tune(capsys, launch, tmp_path / "a")
    new_mbs = first["best"]["strategy"]["mbs"]
    assert new_mbs != 4  # the search changes mbs on this launch (README: 4 -> 5)
    for k in LP_KEYS:
        assert first["overrides"][k] == {"old": 4, "new": new_mbs}
    second = _tune(capsys, Path(first["files"]["tuned.sh"]), tmp_path / "b")
    assert second["overrides"] == {}


def task_log_prob_passes(spec: dict) -> dict:
    """Runs under torchrun (tests/trainer_harness.py): GRPO steps of the tiny model for each strategy; returns
    the metrics the log-prob passes and the update report."""
    import tempfile

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.build import build
    from trainer_harness import run_config

    parallel.init_distributed()
    out = []
    for strategy in spec["layouts"]:
        cfg = run_config(
            "tiny", strategy, 1, lr=3e-3, kl_coef=0.01, rollout_engine="megatron", out_dir=tempfile.mkdtemp()
        )
        cfg = cfg.replace(workload=Workload(prompts=4, n=4, prompt_len=8, response_len=4, mini_batch=2, dtype="fp32"))
        parallel.reinit(cfg.strategy, seed=cfg.trainer.seed)
        loop, _ = build(cfg, checkpoint_every=0)
        keys = ("loss", "kl", "reward_mean", "old_logprob_micro_batches", "ref_logprob_micro_batches")
        keys += ("update_micro_batches",)
        out.append([{k: h[k] for k in keys} for h in loop.run(spec["steps"])])
        del loop
    parallel.destroy()
    return {"results": out}


@pytest.mark.slow
def test_trainer_log_prob_passes_run_with_their_micro_batch():
    """One CPU process, 16 sequences a step: mbs 4 with log-prob micro-batch 2 runs 8 old and 8 ref log-prob
    micro-batches (unset: 4 each), the update keeps 4 per mini-batch of 8 (2 x 2 mini-batches), and the
    log-probs, hence loss and KL, do not depend on how the forward pass was split (fp32, 1e-5)."""
    res = torchrun_json(
        "test_log_prob_mbs:task_log_prob_passes",
        nproc=1,
        spec={"layouts": [{"mbs": 4}, {"mbs": 4, "log_prob_mbs": 2}], "steps": 2},
        timeout=300,
    )["results"]
    base, split = res
    for a, b in zip(base, split):
        assert (a["old_logprob_micro_batches"], a["ref_logprob_micro_batches"]) == (4, 4)
        assert (b["old_logprob_micro_batches"], b["ref_logprob_micro_batches"]) == (8, 8)
        assert a["update_micro_batches"] == b["update_micro_batches"] == 4
        assert b["reward_mean"] == a["reward_mean"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["kl"] == pytest.approx(a["kl"], abs=1e-5)


def test_train_dry_run_takes_the_log_prob_micro_batch(capsys, tmp_path):
    """16 sequences on one rank: log-prob micro-batch 8 -> 2 micro-batches; 3 does not divide 16, which verl
    refuses, so the dry run does too (coded error, exit 2)."""
    m = load_model("tiny")
    for lp, rc_want in ((8, 0), (3, 2)):
        cfg = RunConfig(
            model=m,
            hardware=load_hardware("cpu"),
            cluster=Cluster(gpus=1),
            strategy=validate(m, Strategy.of(mbs=4, log_prob_mbs=lp), 1),
            workload=Workload(prompts=4, n=4, mini_batch=2, prompt_len=8, response_len=4, dtype="fp32"),
            trainer=TrainerOptions(rollout_engine="megatron", dataset="synthetic", reward="math"),
        )
        p = save(cfg, tmp_path / f"lp{lp}.yaml")
        rc = main(["train", "--config", str(p), "--dry-run", "--json"])
        out = capsys.readouterr()
        assert rc == rc_want, out.err
        if rc == 0:
            b = json.loads(out.out)["batch"]
            assert (b["log_prob_mbs"], b["log_prob_micro_batches_per_dp_rank"]) == (8, 2)
        else:
            assert "[BATCH_DIVISIBILITY]" in out.err and "log-prob micro-batches of 3" in out.err
    rc = main(["train", "--config", str(tmp_path / "lp8.yaml"), "--dry-run"])
    text = " ".join(capsys.readouterr().out.split())  # rich wraps the line
    assert rc == 0 and "log-prob micro-batch 8 (2 per DP rank)" in text


def test_search_prices_every_plan_with_a_pinned_log_prob_micro_batch():
    from grpo_tune.autotune.search.driver import search

    res = search(load_model("7b"), load_hardware("h100"), Cluster(gpus=8), WL, pins={"log_prob_mbs": 8}, top=5)
    assert res.ranked and all(e.strategy.batching.log_prob_mbs == 8 for e in res.ranked)
    fixed = [e for e in res.ranked if e.strategy.batching.max_tokens_per_gpu is None]
    assert fixed and all(e.details["logprob_micro_batches"] == 256 / e.strategy.layout.dp / 8 for e in fixed)


def _diagnose(capsys, text: str, tmp_path: Path, name: str) -> dict:
    p = tmp_path / name
    p.write_text(text)
    main(["diagnose", str(p), "--json"])
    return json.loads(capsys.readouterr().out)


def test_diagnose_prices_and_checks_the_launchs_log_prob_micro_batch(capsys, tmp_path):
    """The example's log-prob micro-batch 8 (training 4) is what diagnose's memory estimate uses (8 holds more
    than 4 in the log-prob phases, the update is the same), and 7, which does not divide a rank's 1280
    sequences, is verl's assert: an error on the rollout key (and the ref key, KL being on)."""
    text = EXAMPLE.read_text()
    eight = _diagnose(capsys, text, tmp_path, "lp8.sh")
    four = _diagnose(
        capsys,
        text.replace("log_prob_micro_batch_size_per_gpu=8", "log_prob_micro_batch_size_per_gpu=4"),
        tmp_path,
        "lp4.sh",
    )
    m8, m4 = eight["summary"]["memory"]["phases"], four["summary"]["memory"]["phases"]
    assert m8["old_logprob"] > m4["old_logprob"] and m8["update"] == m4["update"]
    assert not [f for f in eight["findings"] if f["code"] == "BATCH_DIVISIBILITY"]
    seven = _diagnose(
        capsys,
        text.replace("log_prob_micro_batch_size_per_gpu=8", "log_prob_micro_batch_size_per_gpu=7"),
        tmp_path,
        "lp7.sh",
    )
    keys = {f.get("key") for f in seven["findings"] if f["code"] == "BATCH_DIVISIBILITY" and f["severity"] == "error"}
    assert keys == set(LP_KEYS)


def test_tune_takes_the_log_prob_mbs_pin_as_estimate_does(capsys, tmp_path):
    """Issue 11: tune takes any estimate flag as a pin. The example runs log-prob micro-batch 8; --log-prob-mbs 4
    moves both keys to 4 (reported, written to tuned.sh), and the best plan is priced with it:
    1024 prompts x n=5 = 5120 sequences / dp per rank, in micro-batches of 4."""
    out = tmp_path / "a"
    rc = main(["tune", str(EXAMPLE), "--hardware", "h100", "--out", str(out), "--json", "--log-prob-mbs", "4"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    first = json.loads(captured.out)
    assert first["pins"]["log_prob_mbs"] == 4
    for k in LP_KEYS:
        assert first["overrides"][k] == {"old": 8, "new": 4}
    best = first["best"]["strategy"]
    assert best.get("log_prob_mbs", best["mbs"]) == 4
    plan = read_plan(Path(first["files"]["tuned.sh"]), hardware="h100")
    assert plan.strategy.batching.log_prob_mbs_ == 4
    est = estimate(
        model=plan.model, hardware=plan.hardware, cluster=plan.cluster, strategy=plan.strategy, workload=plan.workload
    )
    assert est.details["logprob_micro_batches"] == 5120 // plan.strategy.layout.dp // 4
    # without the flag the launch's 8 stays (test above); a value below 1 is estimate's coded error
    assert main(["tune", str(EXAMPLE), "--no-emit", "--log-prob-mbs", "0"]) == 2
    assert "--log-prob-mbs must be >= 1" in capsys.readouterr().err


def test_log_prob_choices_follow_verls_rule():
    """1024 prompts x n=5 = 5120 sequences. dp 4: 1280 = 2^8 x 5 per rank, so above mbs 5 and up to 256 the
    divisors 8 10 16 20 32 40 64 80 128 160 256. pp2 vpp2 dp2: 2560 per rank and the micro-batch count must be
    even: 512 leaves 5 (refused), 640 leaves 4 (kept). Dynamic batching or a set log-prob micro-batch: none."""
    from grpo_tune.autotune.search.log_prob import log_prob_choices

    wl = Workload(prompts=1024, n=5, mini_batch=256)
    m = load_model("qwen2-7b")
    s = validate(m, Strategy.of(tp=2, mbs=5), 8)
    assert log_prob_choices(s, wl, 256, 8) == [8, 10, 16, 20, 32, 40, 64, 80, 128, 160, 256]
    vp = validate(m, Strategy.of(tp=2, pp=2, vpp=2, mbs=4), 8)
    got = log_prob_choices(vp, wl, 1024, 8)
    assert 512 not in got and 640 in got and all(2560 % v == 0 and (2560 // v) % 2 == 0 for v in got)
    assert log_prob_choices(s.replace(max_tokens_per_gpu=4096), wl, 256, 8) == []
    assert log_prob_choices(s.replace(log_prob_mbs=8), wl, 256, 8) == []


def test_search_keeps_a_pinned_log_prob_micro_batch_to_the_layouts_it_splits():
    """1000 prompts x n=5 = 5000 sequences: dp 8 leaves 625 per rank, which a pinned log-prob micro-batch of 2
    does not split (verl's engine refuses it), dp 4 and 2 leave 1250 and 2500, which it does. With dynamic
    batching off, the search ranks no dp-8 plan (it used to rank 14, each with the BATCH_DIVISIBILITY violation);
    with it on, dp-8 plans stay (verl does not use the micro-batch then)."""
    from grpo_tune.autotune.search.driver import search

    wl = Workload(prompts=1000, n=5, mini_batch=200)
    args = (load_model("7b"), load_hardware("h100"), Cluster(gpus=8), wl)
    fixed = search(*args, pins={"log_prob_mbs": 2, "max_tokens_per_gpu": None}, top=5).ranked
    assert fixed and {e.strategy.layout.dp for e in fixed} == {2, 4}
    assert not [v for e in fixed for v in e.violations if v.code == "BATCH_DIVISIBILITY"]
    dyn = search(*args, pins={"log_prob_mbs": 2}, top=5).ranked
    assert {e.strategy.layout.dp for e in dyn if e.strategy.batching.max_tokens_per_gpu} >= {8}
    assert not [v for e in dyn for v in e.violations if v.code == "BATCH_DIVISIBILITY"]


def test_tune_chooses_a_log_prob_micro_batch_that_fits_when_the_launchs_overflows(capsys, tmp_path):
    """The example with log-prob micro-batch 256 (training 4). One log-prob micro-batch's logits, by hand
    (costmodel/activations.py: 2 x 2 B x hidden + 8 B x vocab per token, over TP), 2048-token sequences:
      TP2 (the launch): 2048 x 256 x (2 x 2 x 3584 / 2 + 8 x 152064 / 2) = 322,659,418,112 B;
      TP4 (the most qwen2-7b's 4 KV heads allow): 2048 x 256 x 307,712 = 161,329,709,056 B
    both over an H100's 81,559 MiB = 85,520,809,984 B (the driver's figure), so no layout runs 256 (the
    trainer has no CP) and keeping it, as tune did, left no plan. tune now lets the search choose one up to
    256: smaller, verl's rule holds
    (a divisor of the rank's 5120 / dp sequences), it fits, both keys are reported, and re-tuning is a fixed
    point."""
    m = load_model("qwen2-7b")
    assert (m.hidden, m.vocab, m.kv_heads) == (3584, 152064, 4)
    hbm = load_hardware("h100").hbm_bytes
    assert hbm == 81559 * 2**20 < 2048 * 256 * (2 * 2 * 3584 // 4 + 8 * 152064 // 4) == 161_329_709_056
    text = EXAMPLE.read_text().replace("log_prob_micro_batch_size_per_gpu=8", "log_prob_micro_batch_size_per_gpu=256")
    text = text.replace("=$TP ", "=2 ")  # spelt out: tune leaves a value computed at run time as written
    launch = tmp_path / "lp256.sh"
    launch.write_text(text)
    plan = read_plan(launch, hardware="h100")
    assert (plan.strategy.batching.mbs, plan.strategy.batching.log_prob_mbs) == (4, 256)
    res = T.tune(plan)
    assert res.current.memory["old_logprob"].parts["logits"] == 322_659_418_112
    assert {v.phase for v in res.current.violations if v.code == "OOM_RISK"} == {"old_logprob", "ref_logprob"}

    first = _tune(capsys, launch, tmp_path / "a")
    assert not first["current"]["fits"] and first["best"]["fits"]
    tuned = read_plan(Path(first["files"]["tuned.sh"]), hardware="h100")
    s = tuned.strategy
    lp = s.batching.log_prob_mbs_
    assert lp < 256 and (5120 // s.layout.dp) % lp == 0
    for k in LP_KEYS:
        assert first["overrides"][k] == {"old": 256, "new": lp}
    est = estimate(model=m, hardware=tuned.hardware, cluster=tuned.cluster, strategy=s, workload=tuned.workload)
    assert est.fits and est.details["logprob_micro_batches"] == 5120 // s.layout.dp // lp
    assert est.memory["old_logprob"].total_bytes <= est.capacity_bytes
    # the search chose it: no other value up to 256 that verl accepts for this plan ranks before it with the
    # 5% headroom tune asks for (autotune/search/log_prob.py; 256 itself is over, as above)
    from grpo_tune.autotune.search.log_prob import log_prob_choices
    from grpo_tune.autotune.search.rank import rank_key

    base = s.replace(log_prob_mbs=None)
    for v in [None, *log_prob_choices(base, tuned.workload, 256, 8)]:
        e = estimate(model=m, hardware=tuned.hardware, cluster=tuned.cluster, strategy=base.replace(log_prob_mbs=v),
                     workload=tuned.workload)  # fmt: skip
        if e.fits and e.headroom_bytes >= 0.05 * hbm:
            assert rank_key(est) <= rank_key(e), v
    second = _tune(capsys, Path(first["files"]["tuned.sh"]), tmp_path / "b")
    assert second["overrides"] == {} and second["current"]["fits"]
