"""Refine's study mechanics with a stand-in profile command (tests/refine_standin.py).

The stand-in writes the real profile JSON contract and can be slowed down or made to crash, so
these tests check what the study does with trials (crash, kill and resume, two workers) without
paying for a Megatron run each time; tests/test_refine_real.py runs the real trainer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STANDIN = [sys.executable, str(ROOT / "tests" / "refine_standin.py")]

DRIVER = r"""
import sys
from grpo_tune.jobs.inputs import plan_inputs
from grpo_tune.autotune.search.driver import search
from grpo_tune.autotune.refine import RefineOptions, refine
out, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m, hw, cl, wl = plan_inputs(model="tiny", hardware="cpu", gpus=4, gpus_per_node=None, workload="grpo", prompts=8,
                            n=4, prompt_len=16, response_len=16, mini_batch=8, ppo_epochs=1, kl=True, seq_len=64, gbs=8)
r = search(m, hw, cl, wl)
policy = sys.argv[6] if len(sys.argv) > 6 else "model"
refine(r.ranked, m, hw, cl, wl, out, RefineOptions(
    trials=trials, profile_cmd=[sys.executable, sys.argv[4]], trial_steps=2, trial_timeout_s=float(sys.argv[5]),
    seed=seed, emit=False, calibrate=False, progress=False, heartbeat_s=1, policy=policy))
"""


def _env(**kw) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: str(v) for k, v in kw.items()})
    return env


def _driver(tmp: Path) -> Path:
    p = tmp / "driver.py"
    p.write_text(DRIVER)
    return p


def _start(
    tmp: Path, out: Path, trials: int, *, seed: int = 0, timeout_s: float = 60, policy: str = "tpe", **env
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(_driver(tmp)), str(out), str(trials), str(seed), STANDIN[1], str(timeout_s), policy],
        env=_env(**env),
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _study(out: Path):
    import optuna

    names = optuna.get_all_study_names(f"sqlite:///{out / 'study.db'}")
    assert len(names) == 1
    return optuna.load_study(study_name=names[0], storage=f"sqlite:///{out / 'study.db'}")


def _calls(log: Path) -> list[str]:
    return [json.loads(ln)["config"] for ln in log.read_text().splitlines()] if log.exists() else []


def test_crashing_trial_is_recorded_and_study_continues(tmp_path):
    out, log = tmp_path / "run", tmp_path / "calls.jsonl"
    # every tp=2 plan aborts (SIGABRT, no JSON); the study must record it and go on
    p = _start(tmp_path, out, 8, REFINE_STANDIN_CRASH_TP=2, REFINE_STANDIN_LOG=log)
    text, _ = p.communicate(timeout=240)
    assert p.returncode == 0, text
    st = _study(out)
    ran = [t for t in st.trials if t.user_attrs.get("ran")]
    assert len(ran) == 8
    failed = [t for t in ran if t.state.name == "FAIL"]
    done = [t for t in ran if t.state.name == "COMPLETE"]
    assert done, "the top plans (tp=1) complete"
    for t in failed:
        assert t.user_attrs["strategy"]["tp"] == 2
        assert t.user_attrs["reason"].startswith("error: exit code")
        assert (out / "trials" / f"{t.number:04d}" / "profile.log").exists()
    for t in done:
        assert t.user_attrs["strategy"]["tp"] == 1
        assert t.value == pytest.approx(t.user_attrs["measured_tokens_per_s"])
    assert len(_calls(log)) == 8  # skipped plans (pruned without running) never called the profiler


@pytest.mark.parametrize("policy", ["tpe", "model"])
def test_kill_mid_trial_then_resume(tmp_path, policy):
    out, log = tmp_path / "run", tmp_path / "calls.jsonl"
    p = _start(tmp_path, out, 5, policy=policy, REFINE_STANDIN_DELAY_S=1.5, REFINE_STANDIN_LOG=log)
    deadline = time.time() + 120
    while len(_calls(log)) < 3 and time.time() < deadline:  # third trial is running
        time.sleep(0.1)
    assert len(_calls(log)) == 3, p.stdout.read() if p.poll() is not None else "too slow"
    p.send_signal(signal.SIGKILL)  # no cleanup: the trial stays RUNNING in the storage
    p.wait()
    st = _study(out)
    states = sorted(t.state.name for t in st.trials)
    assert states.count("COMPLETE") == 2 and "RUNNING" in states
    before = {t.number: (t.value, t.user_attrs["plan"]) for t in st.trials if t.state.name == "COMPLETE"}
    killed = next(t for t in st.trials if t.state.name == "RUNNING")

    p = _start(tmp_path, out, 5, policy=policy, REFINE_STANDIN_LOG=log)
    text, _ = p.communicate(timeout=240)
    assert p.returncode == 0, text
    assert "requeued interrupted plan" in text and "resuming study" in text
    st = _study(out)
    by_no = {t.number: t for t in st.trials}
    # completed trials kept as they were, not rerun
    for no, (value, plan) in before.items():
        assert by_no[no].state.name == "COMPLETE" and by_no[no].value == value and by_no[no].user_attrs["plan"] == plan
    # the killed one is FAIL with its reason; its plan ran again in a later trial
    k = by_no[killed.number]
    assert k.state.name == "FAIL" and k.user_attrs["reason"].startswith("interrupted")
    again = [t for t in st.trials if t.number > killed.number and t.user_attrs.get("plan") == killed.user_attrs["plan"]]
    assert [t.state.name for t in again] == ["COMPLETE"]
    # trial counts continue: 5 profiled trials in all, numbered after the old ones
    ran = [t for t in st.trials if t.user_attrs.get("ran")]
    assert len(ran) == 5
    assert min(t.number for t in st.trials if t.number not in before and t.number != killed.number) > killed.number
    # nothing recomputed: each config profiled once, except the killed trial's (which never finished)
    calls = _calls(log)
    assert len(calls) == 5 + 1
    assert len(set(calls)) == len(calls)


def test_two_workers_share_one_study(tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "calls.jsonl"
    a = _start(tmp_path, out, 6, seed=1, REFINE_STANDIN_DELAY_S=0.7, REFINE_STANDIN_LOG=log)
    time.sleep(0.5)  # let the first worker create the study; the second loads it
    b = _start(tmp_path, out, 6, seed=2, REFINE_STANDIN_DELAY_S=0.7, REFINE_STANDIN_LOG=log)
    for p in (a, b):
        text, _ = p.communicate(timeout=240)
        assert p.returncode == 0, text
    st = _study(out)
    ran = [t for t in st.trials if t.user_attrs.get("ran")]
    # each worker stops when the shared count reaches 6; both may have started one at the same moment
    assert 6 <= len(ran) <= 7
    pids = {t.user_attrs["worker"]["pid"] for t in ran}
    assert len(pids) == 2, "both workers profiled trials of the one study"
    plans = [t.user_attrs["plan"] for t in ran]
    assert len(set(plans)) == len(plans), "no plan profiled twice"
    assert len(_calls(log)) == len(ran)


def test_timeout_marks_trial_failed(tmp_path):
    out = tmp_path / "run"
    p = _start(tmp_path, out, 1, timeout_s=1.0, REFINE_STANDIN_DELAY_S=30)
    text, _ = p.communicate(timeout=120)
    assert p.returncode == 0, text
    (t,) = [t for t in _study(out).trials if t.user_attrs.get("ran")]
    assert t.state.name == "FAIL" and t.user_attrs["reason"].startswith("timeout")
    assert t.user_attrs["duration_s"] < 15  # killed, not waited for


def _inputs():
    from _inputs import grpo_inputs
    from grpo_tune.autotune.search.driver import search

    m, hw, cl, wl = grpo_inputs(
        "tiny", "cpu", 2, prompts=4, n=2, prompt_len=8, response_len=8, mini_batch=4, seq_len=64, gbs=8
    )
    return search(m, hw, cl, wl).ranked, m, hw, cl, wl


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"trials": 0}, "--trials"),
        ({"trial_steps": 1}, "--trial-steps"),
        ({"trial_timeout_s": 0}, "--trial-timeout"),
        ({"policy": "greedy"}, "unknown refine policy"),
        ({"storage": "nosuchdb://x/y"}, "not a database URL"),  # checked before any file is written
    ],
)
def test_bad_refine_arguments_are_coded_errors(tmp_path, kw, match):
    from grpo_tune.autotune.refine import RefineOptions, refine
    from grpo_tune.core.errors import ConfigError

    ranked, m, hw, cl, wl = _inputs()
    with pytest.raises(ConfigError, match=match):
        refine(
            ranked,
            m,
            hw,
            cl,
            wl,
            tmp_path,
            RefineOptions(profile_cmd=STANDIN, emit=False, calibrate=False, progress=False, **kw),
        )


def test_space_holds_only_fitting_plans_the_trainer_accepts():
    from grpo_tune.autotune.refine import build_space, distinct, plan_key, predicted, runnable
    from grpo_tune.core.config import TrainerOptions

    ranked, m, hw, cl, wl = _inputs()
    space = build_space(ranked, m, hw, cl, wl)
    keys = [plan_key(e.strategy) for e in space]
    assert len(keys) == len(set(keys)) and all(e.fits for e in space)
    steps = [predicted(e)[0] for e in space]
    assert steps == sorted(steps)
    ok, rejected = runnable(space, TrainerOptions())
    assert all(e.strategy.layout.cp == 1 for e in ok)  # this trainer's megatron backend has no CP
    assert len(ok) + len(rejected) == len(space)
    seeds = distinct(ok, 4)
    assert seeds[0] == 0
    for a in seeds:
        for b in seeds:
            if a < b:
                assert steps_of(ok, b) > 1.03 * steps_of(ok, a) - 1e-12


def steps_of(space, i):
    from grpo_tune.autotune.refine import predicted

    return predicted(space[i])[0]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA GPUs")
def test_refining_a_gpu_plan_where_there_is_no_gpu_stops_at_the_first_refusal(tmp_path):
    """Each trial of an H100 plan on a CPU machine is refused by its pre-start check (NO_GPU): the refinement
    stops at the first with that refusal, where it used to fail every trial the same way and exit 0."""
    r = subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "search", "--model", "7b", "--gpus", "8",
         "--refine", "--trials", "4", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=240,
    )  # fmt: skip
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "[NO_GPU] this config is a plan for 8 x h100-sxm-80gb" in r.stderr, r.stderr
    assert "hint: run it on the GPUs it was planned for" in r.stderr
    (run,) = [p for p in tmp_path.iterdir() if (p / "study.db").exists()]
    st = _study(run)
    assert [t.state.name for t in st.trials if t.user_attrs.get("ran")] == ["FAIL"]
