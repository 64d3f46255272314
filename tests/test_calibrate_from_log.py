"""grpo-tune calibrate --from-log: fit the time model to verl logs (written by verl 0.9.1's own logger code,
tests/fixtures/verl_logs/make_fixtures.py) and to our own trainer's metrics.jsonl.

The synthetic truth: the cost model with perturbed knobs (truth.json) plus 3% log-normal noise per phase and
step, three plans of Qwen2.5-7B on 8 x H100, 11 steps each after the warm-up step.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune import runlog as R
from autotune.calibrate import defaults, load
from cli.main import main

FIX = Path(__file__).resolve().parent / "fixtures" / "verl_logs"
TRUTH = json.loads((FIX / "truth.json").read_text())


def _calibrate(capsys, tmp_path, logs, launches, *extra):
    out = tmp_path / "cal.json"
    args = ["calibrate"]
    for lg in logs:
        args += ["--from-log", str(FIX / lg)]
    for la in launches:
        args += ["--launch", str(FIX / la)]
    rc = main([*args, "--out", str(out), "--json", *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out), out, cap.err


def test_recovers_the_knobs_and_phase_times_of_a_synthetic_truth(capsys, tmp_path):
    # JSONL and console logs mixed: both are read the same way
    res, out, _ = _calibrate(capsys, tmp_path, ["run_a.jsonl", "run_b.console.log", "run_c.jsonl"],
                             ["launch_a.txt", "launch_b.txt", "launch_c.txt"])
    sigma_pct = 100 * TRUTH["noise_sigma"]
    before, after = res["phase_mape_before_pct"], res["phase_mape_after_pct"]
    for ph in ("rollout", "weight_sync", "old_logprob", "ref_logprob", "update", "step"):
        assert after[ph] <= sigma_pct, (ph, after[ph])  # medians of 11 noisy steps: within the noise
        assert before[ph] >= 3 * sigma_pct, (ph, before[ph])  # the perturbation was visible
    p = res["params"]
    truth = TRUTH["knobs"]
    # well-determined scales within 6%; additive overheads within 1.5 s (phases of 10-60 s)
    for k in ("compute_efficiency_scale", "comm_efficiency_scale", "rollout_efficiency_scale"):
        assert p[k] == pytest.approx(truth[k], rel=0.06), k
    for k in ("rollout_overhead_s", "weight_sync_overhead_s", "step_overhead_s"):
        assert p[k] == pytest.approx(truth[k], abs=1.5), k
    # the file is what --calibration reads
    assert load(out, hardware="h100-sxm-80gb") == pytest.approx(p)
    # the memory comparison flags plan A, where the run allocated 12% more than predicted
    mem = {Path(m["log"]).name: m for m in res["memory"]}
    assert mem["run_a.jsonl"]["optimistic"] is True
    assert mem["run_b.console.log"]["optimistic"] is False


def test_fitted_knobs_predict_a_held_out_run_of_another_model(capsys, tmp_path):
    res, _, _ = _calibrate(capsys, tmp_path, ["run_a.jsonl", "run_b.jsonl", "run_c.jsonl"],
                           ["launch_a.txt", "launch_b.txt", "launch_c.txt"])
    held = [R.log_point(R.read_log(FIX / "run_other_model.jsonl"), FIX / "launch_other_model.txt")]
    before, after = R.phase_mape(held, defaults()), R.phase_mape(held, res["params"])
    assert after["step"] < 5.0 < before["step"]
    for ph in ("rollout", "old_logprob", "update"):
        assert after[ph] < 10.0 and after[ph] < before[ph], ph


def test_one_launch_for_several_logs_and_files_after_from_log(capsys, tmp_path):
    out = tmp_path / "c.json"
    rc = main(["calibrate", "--from-log", str(FIX / "run_a.jsonl"), str(FIX / "run_a.console.log"),
               "--launch", str(FIX / "launch_a.txt"), "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "Per-phase MAPE" in cap.out and out.is_file()
    assert "memory model optimistic" in " ".join(cap.out.split())


def test_warmup_step_is_dropped():
    log = R.read_log(FIX / "run_a.jsonl")
    assert [r.step for r in log.records] == list(range(1, TRUTH["steps"] + 1))  # step 0 is validation only
    lp = R.log_point(log, FIX / "launch_a.txt", skip_warmup=1)
    assert lp.kept_steps == TRUTH["steps"] - 1
    truth_rollout = TRUTH["logs"]["run_a"]["phases_s"]["rollout"]
    assert lp.point.measured_phases_s["rollout"] == pytest.approx(truth_rollout, rel=0.03)
    slow = R.log_point(R.read_log(FIX / "run_a.jsonl"), FIX / "launch_a.txt", skip_warmup=0)
    assert slow.point.measured_phases_s["rollout"] >= lp.point.measured_phases_s["rollout"]


def test_killed_run_warns_and_still_fits(capsys, tmp_path):
    for name in ("killed.jsonl", "killed.console.log"):
        log = R.read_log(FIX / name)
        assert len(log.records) == TRUTH["steps"] - 1 and "no newline" in log.warnings[0]
    _, _, err = _calibrate(capsys, tmp_path, ["killed.jsonl", "run_b.jsonl"], ["launch_a.txt", "launch_b.txt"])
    assert "warning:" in err and "no newline" in err


@pytest.mark.parametrize("logs,launches,code,words", [
    (["no_timing.jsonl"], ["launch_a.txt"], "BAD_CONFIG", "timing key"),
    (["run_other_model.jsonl"], ["launch_a.txt"], "BAD_CONFIG", "another model"),
    (["run_b.jsonl"], ["launch_a.txt"], "BAD_CONFIG", "not a run of that launch"),  # 4096-token responses
    (["run_a.jsonl"], ["truth.json"], "BAD_CONFIG", "truth.json"),
    (["run_a.jsonl", "run_b.jsonl"], ["launch_a.txt", "launch_b.txt", "launch_c.txt"], "BAD_CONFIG", "--launch"),
])
def test_bad_input_is_a_coded_error(capsys, tmp_path, logs, launches, code, words):
    args = ["calibrate"] + [a for lg in logs for a in ("--from-log", str(FIX / lg))]
    args += [a for la in launches for a in ("--launch", str(FIX / la))]
    assert main([*args, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err
    assert "Traceback" not in err


def test_unparseable_launch_is_a_coded_error(capsys, tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\npython3 -m verl.trainer.main_ppo trainer.nnodes='1\n")
    assert main(["calibrate", "--from-log", str(FIX / "run_a.jsonl"), "--launch", str(bad),
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "[BAD_CONFIG]" in capsys.readouterr().err


def test_our_cpu_trainer_log_end_to_end(capsys, tmp_path):
    """A real `grpo-tune train` run of `tiny` (2 ranks, torchrun on CPU), then calibrate from its metrics.jsonl."""
    from core.config import RunConfig, TrainerOptions, save
    from core.specs import load_hardware, load_model
    from core.strategy import Cluster, Strategy, Workload

    cfg = RunConfig(model=load_model("tiny"), hardware=load_hardware("cpu"), cluster=Cluster(gpus=2, gpus_per_node=2),
                    strategy=Strategy(tp=2), workload=Workload(prompts=4, n=4, prompt_len=16, response_len=8,
                                                               mini_batch=2, dtype="fp32"),
                    trainer=TrainerOptions(steps=4, log_every=1, out_dir=str(tmp_path / "run")))
    best = save(cfg, tmp_path / "best.yaml")
    assert main(["train", "--config", str(best)]) == 0
    capsys.readouterr()
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert R.read_log(metrics).format == "grpo-tune"
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--from-log", str(metrics), "--launch", str(best), "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["hardware"] == "cpu" and res["logs"][0]["steps_kept"] == 3
    assert res["phase_mape_after_pct"]["step"] <= res["phase_mape_before_pct"]["step"]
    assert load(out, hardware="cpu")


def test_fixtures_were_written_from_the_current_cost_model():
    """The synthetic truth is the cost model's own prediction: when the model changes, the fixtures must be
    written again (python tests/fixtures/verl_logs/make_fixtures.py), or the recovery tests test nothing."""
    from autotune.calibrate import Point
    from autotune.tune import plan_of

    for name, doc in TRUTH["logs"].items():
        lp = R.log_point(R.read_log(FIX / f"{name}.jsonl"), FIX / doc["launch"])
        wl = lp.plan.workload
        # the generator used the logged means before noise; the reader rounds the logged (noisy) median
        plan = plan_of(FIX / doc["launch"])
        assert plan.model.name == doc["model"]
        pt = Point(model=plan.model, hardware=plan.hardware, cluster=plan.cluster, strategy=plan.strategy,
                   workload=wl, measured_step_s=1.0)
        _, phases = R.predict_folded({**defaults(), **TRUTH["knobs"]}, pt)
        for ph, v in doc["phases_s"].items():
            assert phases[ph] == pytest.approx(v, rel=0.03), (
                f"{name} {ph}: the cost model now predicts {phases[ph]:.3f} s, the fixture holds {v:.3f} s; "
                "rerun tests/fixtures/verl_logs/make_fixtures.py")
