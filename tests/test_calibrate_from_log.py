"""grpo-tune calibrate --from-log: fit the time model to verl logs (written by verl 0.9.1's own logger code,
tests/fixtures/verl_logs/make_fixtures.py) and to our own trainer's metrics.jsonl.

The synthetic truth: the cost model with perturbed knobs (truth.json) plus 3% log-normal noise per phase and
step, three plans of Qwen2.5-7B on 8 x H100, 11 steps each after the warm-up step. The truth is the cost
model's own prediction, so when the model changes the committed logs no longer match it: the `fix` fixture
then writes them again, with verl 0.9.1's logger code, into a temporary folder (the wheel from
$GRPO_TUNE_VERL_WHEEL, /tmp/verlwheel or PyPI, and orjson from PyPI; without them these tests fail).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_tune.autotune.calibrate import runlog as R
from grpo_tune.autotune.calibrate.fit import defaults, load
from _verl_logs import calibrate_from_fixture_logs
from grpo_tune.cli.main import main

COMMITTED = Path(__file__).resolve().parent / "fixtures" / "verl_logs"


def _fresh(folder: Path) -> bool:
    """Do the logs in ``folder`` hold the current cost model's truth? truth.json holds the noise-free phase
    seconds and training peak the logs were written from, and the workload they were priced with: both must
    be what the cost model predicts today (to truth.json's rounding), else the logs are stale."""
    import dataclasses

    from grpo_tune.autotune.calibrate.fit import Point
    from grpo_tune.frameworks import read_plan
    from grpo_tune.core.target import inputs_of
    from grpo_tune.costmodel.estimate import estimate

    truth = json.loads((folder / "truth.json").read_text())
    for doc in truth["logs"].values():
        if "response_len_mean" not in doc:
            return False  # written before truth.json recorded its workload
        plan = read_plan(COMMITTED / doc["launch"])
        wl = plan.workload.replace(response_len_mean=doc["response_len_mean"], prompt_len_mean=doc["prompt_len_mean"])
        plan = dataclasses.replace(plan, workload=wl)
        pt = Point(**inputs_of(plan), measured_step_s=1.0)
        _, phases = R.predict_folded({**defaults(), **truth["knobs"]}, pt)
        if set(phases) != set(doc["phases_s"]):
            return False
        if any(phases[ph] != pytest.approx(v, rel=1e-6, abs=1e-5) for ph, v in doc["phases_s"].items()):
            return False
        est = estimate(
            model=plan.model, hardware=plan.hardware, cluster=plan.cluster, strategy=plan.strategy, workload=wl
        )
        peak = R.train_peak_bytes(est)
        if peak is None or peak[1] / 2**30 != pytest.approx(doc["train_peak_gib"], abs=1e-3):
            return False
    return True


@pytest.fixture(scope="module")
def fix(tmp_path_factory) -> Path:
    if _fresh(COMMITTED):
        return COMMITTED
    import importlib.util
    import os
    import shutil

    out = tmp_path_factory.mktemp("verl_logs")
    for p in COMMITTED.glob("launch_*.txt"):
        shutil.copy(p, out)
    local = sorted(Path("/tmp/verlwheel").glob("verl-0.9.1-*.whl"))
    mp = pytest.MonkeyPatch()
    if not os.environ.get("GRPO_TUNE_VERL_WHEEL") and local:
        mp.setenv("GRPO_TUNE_VERL_WHEEL", str(local[0]))
    spec = importlib.util.spec_from_file_location("make_fixtures", COMMITTED / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write_all(out, tmp_path_factory.mktemp("wheel"))
    mp.undo()
    assert _fresh(out)
    return out


@pytest.fixture(scope="module")
def TRUTH(fix) -> dict:
    return json.loads((fix / "truth.json").read_text())


# The launches of the fixture's plans A, B and C (one per run_a/b/c log).
LAUNCHES_ABC = ["launch_a.txt", "launch_b.txt", "launch_c.txt"]


def _calibrate(capsys, tmp_path, logs, launches, *extra, FIX=COMMITTED):
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


def test_recovers_the_knobs_and_phase_times_of_a_synthetic_truth(capsys, tmp_path, fix, TRUTH):
    # JSONL and console logs mixed: both are read the same way
    res, out, _ = _calibrate(
        capsys, tmp_path, ["run_a.jsonl", "run_b.console.log", "run_c.jsonl"], LAUNCHES_ABC, FIX=fix
    )
    sigma_pct = 100 * TRUTH["noise_sigma"]
    before, after = res["phase_mape_before_pct"], res["phase_mape_after_pct"]
    for ph in ("rollout", "weight_sync", "old_logprob", "ref_logprob", "update", "step"):
        assert after[ph] <= sigma_pct, (ph, after[ph])  # medians of 11 noisy steps: within the noise
        assert before[ph] >= 3 * sigma_pct, (ph, before[ph])  # the perturbation was visible
    p = res["params"]
    truth = TRUTH["knobs"]
    # well-determined scales within 6%; additive overheads within 1.5 s (phases of 10-60 s). The comm scale is
    # looser: under the verl 0.9.1 stack's fitted costs the weight-sync phase is mostly vLLM's fixed sleep/wake,
    # so the update's collectives carry most of what pins it. Measured on these plans: 0.720 without noise and
    # 0.745 with the fixture's 3% noise, for a truth of 0.7.
    for k, rel in (
        ("compute_efficiency_scale", 0.06),
        ("comm_efficiency_scale", 0.08),
        ("rollout_efficiency_scale", 0.06),
    ):
        assert p[k] == pytest.approx(truth[k], rel=rel), k
    for k in ("rollout_overhead_s", "weight_sync_overhead_s", "step_overhead_s"):
        assert p[k] == pytest.approx(truth[k], abs=1.5), k
    # the file is what --calibration reads
    assert load(out, hardware="h100-sxm-80gb") == pytest.approx(p)
    # the memory comparison flags plan A, where the run allocated 12% more than predicted
    mem = {Path(m["log"]).name: m for m in res["memory"]}
    assert mem["run_a.jsonl"]["optimistic"] is True
    assert mem["run_b.console.log"]["optimistic"] is False


def test_fitted_knobs_predict_a_held_out_run_of_another_model(capsys, tmp_path, fix):
    res, _, _ = _calibrate(capsys, tmp_path, ["run_a.jsonl", "run_b.jsonl", "run_c.jsonl"], LAUNCHES_ABC, FIX=fix)
    held = [R.log_point(R.read_log(fix / "run_other_model.jsonl"), fix / "launch_other_model.txt")]
    before, after = R.phase_mape(held, defaults()), R.phase_mape(held, res["params"])
    assert after["step"] < 5.0 < before["step"]
    for ph in ("rollout", "old_logprob", "update"):
        assert after[ph] < 10.0 and after[ph] < before[ph], ph


def test_one_launch_for_several_logs_and_files_after_from_log(capsys, tmp_path, fix):
    out = tmp_path / "c.json"
    rc = main(
        [
            "calibrate",
            "--from-log",
            str(fix / "run_a.jsonl"),
            str(fix / "run_a.console.log"),
            "--launch",
            str(fix / "launch_a.txt"),
            "--out",
            str(out),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "Per-phase MAPE" in cap.out and out.is_file()
    assert "memory model optimistic" in " ".join(cap.out.split())


def test_warmup_step_is_dropped(fix, TRUTH):
    FIX = fix
    log = R.read_log(FIX / "run_a.jsonl")
    assert [r.step for r in log.records] == list(range(1, TRUTH["steps"] + 1))  # step 0 is validation only
    lp = R.log_point(log, FIX / "launch_a.txt", skip_warmup=1)
    assert lp.kept_steps == TRUTH["steps"] - 1
    truth_rollout = TRUTH["logs"]["run_a"]["phases_s"]["rollout"]
    assert lp.point.measured_phases_s["rollout"] == pytest.approx(truth_rollout, rel=0.03)
    slow = R.log_point(R.read_log(FIX / "run_a.jsonl"), FIX / "launch_a.txt", skip_warmup=0)
    assert slow.point.measured_phases_s["rollout"] >= lp.point.measured_phases_s["rollout"]


def test_killed_run_warns_and_still_fits(capsys, tmp_path, fix, TRUTH):
    for name in ("killed.jsonl", "killed.console.log"):
        log = R.read_log(fix / name)
        assert len(log.records) == TRUTH["steps"] - 1 and "no newline" in log.warnings[0]
    _, _, err = _calibrate(capsys, tmp_path, ["killed.jsonl", "run_b.jsonl"], ["launch_a.txt", "launch_b.txt"], FIX=fix)
    assert "warning:" in err and "no newline" in err


@pytest.mark.parametrize(
    "logs,launches,code,words",
    [
        (["no_timing.jsonl"], ["launch_a.txt"], "BAD_CONFIG", "timing key"),
        (["run_other_model.jsonl"], ["launch_a.txt"], "BAD_CONFIG", "another model"),
        (["run_b.jsonl"], ["launch_a.txt"], "BAD_CONFIG", "not a run of that launch"),  # 4096-token responses
        (["run_a.jsonl"], ["truth.json"], "BAD_CONFIG", "truth.json"),
        (["run_a.jsonl", "run_b.jsonl"], LAUNCHES_ABC, "BAD_CONFIG", "--launch"),
    ],
)
def test_bad_input_is_a_coded_error(capsys, tmp_path, fix, logs, launches, code, words):
    args = ["calibrate"] + [a for lg in logs for a in ("--from-log", str(fix / lg))]
    args += [a for la in launches for a in ("--launch", str(fix / la))]
    assert main([*args, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err
    assert "Traceback" not in err


def test_unparseable_launch_is_a_coded_error(capsys, tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\npython3 -m verl.trainer.main_ppo trainer.nnodes='1\n")
    assert (
        main(
            [
                "calibrate",
                "--from-log",
                str(COMMITTED / "run_a.jsonl"),
                "--launch",
                str(bad),
                "--out",
                str(tmp_path / "x.json"),
            ]
        )
        == 2
    )
    assert "[BAD_CONFIG]" in capsys.readouterr().err


@pytest.mark.slow
def test_our_cpu_trainer_log_end_to_end(capsys, tmp_path):
    """A real `grpo-tune train` run of `tiny` (2 ranks, torchrun on CPU), then calibrate from its metrics.jsonl."""
    from grpo_tune.core.config import RunConfig, TrainerOptions, save
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    cfg = RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=2, gpus_per_node=2),
        strategy=Strategy.of(tp=2),
        workload=Workload(prompts=4, n=4, prompt_len=16, response_len=8, mini_batch=2, dtype="fp32"),
        trainer=TrainerOptions(steps=4, log_every=1, out_dir=str(tmp_path / "run")),
    )
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
    assert json.loads(out.read_text())["fit"]["source"] == "1 run log(s): grpo-tune"  # not "verl logs"


def test_the_logs_are_fresh_for_the_current_cost_model(fix):
    """Either the committed logs match the cost model, or the fixture wrote fresh ones that do."""
    assert _fresh(fix)
    assert (fix / "run_a.jsonl").read_text().startswith('{"step":0,"data":{')  # orjson's compact form, as verl writes


def test_the_file_applies_to_estimate_search_and_compare(capsys, tmp_path, fix):
    cal = tmp_path / "cal.json"
    assert calibrate_from_fixture_logs(fix, cal) == 0
    capsys.readouterr()
    plan = ["--model", "7b", "--gpus", "8", "--tp", "2", "--json"]

    def step(args):
        assert main(args) == 0
        return json.loads(capsys.readouterr().out)

    assert (
        step(["estimate", *plan, "--calibration", str(cal)])["time"]["step_s"]
        > step(["estimate", *plan])["time"]["step_s"]
    )  # the logs ran slower than the defaults predict
    s_cal = step(["search", *plan, "--no-emit", "--calibration", str(cal)])["best"]["time"]["step_s"]
    s_def = step(["search", *plan, "--no-emit"])["best"]["time"]["step_s"]
    assert s_cal > s_def
    cmp = ["compare", "--model", "7b", "--gpus", "8", "--hardware", "h100,h200", "--json"]
    rows = step([*cmp, "--out", str(tmp_path / "cmp"), "--calibration", str(cal)])["rows"]
    rows0 = step([*cmp, "--out", str(tmp_path / "cmp0")])["rows"]
    assert rows[0]["step_s"] > rows0[0]["step_s"]  # h100: the file's hardware
    assert rows[1]["step_s"] == rows0[1]["step_s"]  # h200: not fitted there, left alone
    assert main(["estimate", *plan, "--hardware", "h200", "--calibration", str(cal)]) == 2


def test_memory_check_leaves_out_what_vllm_holds(fix, tmp_path):
    """verl 0.9.1's perf/max_memory_allocated_gb is the trainer process's torch allocator; vLLM runs as an async
    server in its own process (/work/scratch/research/verl_091_facts.md: rollout mode "async", vllm_async_server.py),
    so the CUDA-graph pool a sleeping vLLM keeps, or the whole KV budget with free_cache_engine=False, is not in
    that figure and must not be in the prediction it is compared with."""
    from grpo_tune.costmodel.estimate import estimate

    log = R.read_log(fix / "run_a.jsonl")
    plain = R.memory_check(R.log_point(log, fix / "launch_a.txt"))
    resident = tmp_path / "launch_resident.txt"
    resident.write_text((fix / "launch_a.txt").read_text() + "actor_rollout_ref.rollout.free_cache_engine=False\n")
    lp = R.log_point(log, resident)
    kept = R.memory_check(lp)
    assert kept["predicted_gib"] == pytest.approx(plain["predicted_gib"], abs=0.01)
    # the estimate itself does hold vLLM's memory in the training phases (it is on the GPU); the check leaves it out
    p = lp.plan
    est = estimate(model=p.model, hardware=p.hardware, cluster=p.cluster, strategy=p.strategy, workload=p.workload)
    assert est.memory["update"].total_bytes / 2**30 > kept["predicted_gib"] + 10
    graphs = R.log_point(log, fix / "launch_a.txt").plan
    e2 = estimate(
        model=graphs.model,
        hardware=graphs.hardware,
        cluster=graphs.cluster,
        strategy=graphs.strategy,
        workload=graphs.workload,
    )
    assert e2.memory["update"].parts.get("vllm_cuda_graphs", 0) > 0
    assert plain["predicted_gib"] == pytest.approx(
        (e2.memory[plain["phase"]].total_bytes - e2.memory[plain["phase"]].parts["vllm_cuda_graphs"]) / 2**30, abs=0.01
    )


def test_freshness_check_sees_a_changed_time_or_memory_model(fix, tmp_path):
    """The committed logs are the cost model's predictions: a change of the time model by 1% or of the memory
    model by 0.5 GiB (the noise-free truth.json says what they were written from) makes them stale."""
    import shutil

    assert _fresh(fix)
    for what in ("time", "memory"):
        d = tmp_path / what
        shutil.copytree(fix, d)
        doc = json.loads((d / "truth.json").read_text())
        if what == "time":
            doc["logs"]["run_a"]["phases_s"]["update"] *= 1.01
        else:
            doc["logs"]["run_a"]["train_peak_gib"] += 0.5
        (d / "truth.json").write_text(json.dumps(doc))
        assert not _fresh(d), what
