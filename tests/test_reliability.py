"""One writer per run folder, no child outliving its command, no write through a planted link, metrics
that match the checkpoint on every resume, and Ctrl-C that says how to resume.

Most tests run ``grpo-tune train`` for real (config, preflight, lock, launcher, progress, signals) with
torchrun replaced by tests/fake_torchrun.py, which has torchrun's process shape (a worker in a session of
its own, dying with its parent; SIGTERM stops it) at none of its cost. One slow test interrupts a real
two-rank run.
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

from grpo_tune.core.config import RunConfig, TrainerOptions, save
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_torchrun.py"

DRIVER = r"""
import sys
from grpo_tune.trainer import launch
import os
fake, steps, delay = sys.argv[1], sys.argv[2], sys.argv[3]
def fake_cmd(config, lay, *, worker_args=(), **kw):
    out = worker_args[worker_args.index("--out") + 1]
    return [sys.executable, fake, out, steps, delay, os.environ.get("FAKE_MODE", "")]
launch.torchrun_command = fake_cmd
from grpo_tune.cli.main import main
sys.exit(main(sys.argv[4:]))
"""


def _config(tmp: Path, out: Path, steps: int = 6) -> Path:
    cfg = RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy.of(mbs=4, recompute="none"),
        workload=Workload(prompts=4, n=2, prompt_len=8, response_len=8, mini_batch=4, dtype="fp32"),
        trainer=TrainerOptions(steps=steps, out_dir=str(out), checkpoint_every=2, rollout_engine="megatron"),
    )
    return save(cfg, tmp / "cfg.yaml")


def _train(tmp: Path, cfg: Path, *args: str, steps: int = 6, delay: float = 0.05, **extra: str) -> subprocess.Popen:
    drv = tmp / "driver.py"
    drv.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **extra}
    return subprocess.Popen(
        [sys.executable, str(drv), str(FAKE), str(steps), str(delay), "train", "--config", str(cfg), *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a shell gives a job: a terminal's Ctrl-C goes to the group
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(pred, timeout: float = 60.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _steps(out: Path) -> list[int]:
    p = out / "metrics.jsonl"
    return [json.loads(ln)["step"] for ln in p.read_text().splitlines()] if p.exists() else []


def _pids(out: Path) -> list[int]:
    p = out / "fake.pids"
    return [int(x) for x in p.read_text().split()] if p.exists() and p.read_text().strip() else []


def _reap(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- children die with their parent, on every way it can end ------------------------------------------


@pytest.mark.parametrize(
    "sig, to_group, code",
    [
        (signal.SIGINT, True, 130),  # Ctrl-C at a terminal: the whole foreground group
        (signal.SIGTERM, False, 143),
        (signal.SIGHUP, False, 129),  # the terminal closed
        (signal.SIGQUIT, True, 131),
        (signal.SIGKILL, False, -9),  # nothing runs in the CLI: the parent-death signal and the watchdog act
    ],
    ids=["SIGINT-group", "SIGTERM", "SIGHUP", "SIGQUIT-group", "SIGKILL"],
)
def test_every_signal_to_train_takes_torchrun_and_its_workers_down(tmp_path, sig, to_group, code):
    out = tmp_path / "run"
    cfg = _config(tmp_path, out)
    p = _train(tmp_path, cfg, steps=100000, delay=0.05)
    try:
        assert _wait_for(lambda: len(_pids(out)) == 2 and len(_steps(out)) >= 2), p.communicate(timeout=5)
        kids = _pids(out)
        (os.killpg if to_group else os.kill)(p.pid, sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == code, err
        assert _wait_for(lambda: not any(_alive(k) for k in kids), 30), "torchrun or a worker outlived the CLI"
        if sig != signal.SIGKILL:
            assert "Traceback" not in err
            assert "interrupted at step " in err and "rerun the same command" in err, err
    finally:
        _reap(_pids(out))


def test_ctrl_c_names_the_step_and_the_checkpoint_to_resume_from(tmp_path):
    """The resume line (issue: Ctrl-C looked like a crash): the step reached and the last checkpoint."""
    from grpo_tune.jobs.train import interrupted_line

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in (1, 2, 3)))
    assert interrupted_line(out, 1) == (
        "interrupted at step 3; no checkpoint was written yet; rerun the same command to start again"
    )


# --- one writer per run folder -------------------------------------------------------------------------

HOLD = r"""
import sys, time
from grpo_tune.core.runlock import acquire
lk = acquire(sys.argv[1], "holder")
print("held", flush=True)
time.sleep(600)
"""


def _holder(folder: Path) -> subprocess.Popen:
    h = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert h.stdout is not None and h.stdout.readline().strip() == "held"
    return h


def test_a_second_writer_gets_a_coded_error_naming_the_holder(tmp_path):
    import socket

    from grpo_tune.core.runlock import RunLockedError, acquire

    h = _holder(tmp_path / "run")
    try:
        with pytest.raises(RunLockedError) as e:
            acquire(tmp_path / "run", "second")
        assert f"pid {h.pid}" in e.value.message and socket.gethostname() in e.value.message
        assert e.value.code == "RUN_LOCKED"
    finally:
        h.kill()
        h.wait()
    said: list[str] = []
    with acquire(tmp_path / "run", "third", say=said.append) as lk:  # its holder died: taken over, with a line
        assert lk.took_over is not None and lk.took_over["pid"] == h.pid
    assert said and "took over the lock" in said[0] and f"pid {h.pid}" in said[0]
    with acquire(tmp_path / "run", "fourth", say=said.append):  # a clean release leaves nothing to take over
        pass
    assert len(said) == 1


def test_second_train_into_a_live_run_folder_is_refused_before_it_starts(tmp_path):
    """`train --out cc4 & train --out cc4`: the second resumed from the live run and rewrote its metrics."""
    out = tmp_path / "run"
    cfg = _config(tmp_path, out)
    first = _train(tmp_path, cfg, steps=100000, delay=0.05)
    try:
        assert _wait_for(lambda: len(_steps(out)) >= 2)
        second = _train(tmp_path, cfg)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2 and "[RUN_LOCKED]" in err and f"pid {first.pid}" in err, err
        assert first.poll() is None  # the first run goes on, untouched
        n = len(_steps(out))
        assert _wait_for(lambda: len(_steps(out)) > n)
        assert _steps(out) == list(range(1, len(_steps(out)) + 1))
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=60)
        _reap(_pids(out))


def test_refine_workers_share_the_study_folder_but_exclude_train(tmp_path):
    from grpo_tune.core.runlock import RunLockedError, acquire

    a = acquire(tmp_path, "refine", shared=True)
    b = acquire(tmp_path, "refine", shared=True)
    with pytest.raises(RunLockedError):
        acquire(tmp_path, "train")
    a.release()
    b.release()
    acquire(tmp_path, "train").release()


# --- metrics on resume ---------------------------------------------------------------------------------


def test_metrics_are_truncated_on_a_resume_before_the_first_checkpoint(tmp_path):
    """A run killed before its first checkpoint: the rerun started at step 1 and appended (39 duplicates)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in (1, 2, 3)) + '{"step": 4')
    cfg = _config(tmp_path, out)
    p = _train(tmp_path, cfg, steps=2, delay=0.01)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert _steps(out) == [1, 2]


def test_no_resume_refuses_a_folder_with_metrics_even_without_a_checkpoint(tmp_path):
    from grpo_tune.cli.main import main as cli_main

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    assert cli_main(["train", "--config", str(_config(tmp_path, out)), "--no-resume"]) == 2
    assert _steps(out) == [1]


def test_live_console_shows_every_step_after_the_trainer_rewrites_metrics(tmp_path):
    """The progress reader kept a byte offset from before the trainer trimmed metrics.jsonl on resume."""
    import io

    from rich.console import Console

    from grpo_tune.cli.train import Progress
    from grpo_tune.core.config import atomic_write

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": 0.0}) + "\n" for i in range(1, 9)))  # killed at 8
    buf = io.StringIO()
    prog = Progress(path, 10, Console(file=buf, width=200), after=4)  # resumed from the step-4 checkpoint
    atomic_write(path, "".join(json.dumps({"step": i, "loss": 0.0}) + "\n" for i in range(1, 5)))  # the trim
    prog.poll()
    with open(path, "a") as fh:
        fh.write("".join(json.dumps({"step": i, "loss": 0.0}) + "\n" for i in (5, 6)))
    prog.poll()
    assert [r["step"] for r in prog.rows] == [5, 6]
    assert "step=5" in buf.getvalue()


# --- no write through a planted link, no read that hangs -----------------------------------------------


@pytest.mark.parametrize("name", ["metrics.jsonl", "train.log"])
def test_train_never_writes_through_a_link_in_its_folder(tmp_path, name):
    out = tmp_path / "tout"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, out / name)
    p = _train(tmp_path, _config(tmp_path, out), steps=2, delay=0.01)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "[IO_ERROR]" in err and "symbolic link" in err, err
    assert victim.read_text() == "precious\n"


def test_refine_trial_log_is_not_opened_through_a_link(tmp_path):
    from grpo_tune.autotune.refine.runner import run_profile

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "profile.log")
    res = run_profile(
        tmp_path / "c.yaml",
        steps=2,
        timeout_s=10,
        json_path=tmp_path / "p.json",
        log_path=tmp_path / "profile.log",
        profile_cmd=[sys.executable, "-c", "pass"],
    )
    assert res.status == "error" and "symbolic link" in (res.message or "")
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("where", ["checkpoints/latest.json", "metrics.jsonl", "train.log"])
def test_a_fifo_in_the_run_folder_is_an_error_not_a_hang(tmp_path, where):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    os.mkfifo(out / where)
    p = _train(tmp_path, _config(tmp_path, out), steps=2, delay=0.01)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"train hung on a FIFO at {where}")
    assert p.returncode == 2 and "Traceback" not in err and "regular file" in err, err


# --- the watchdog keeps a deadline even when its command is stuck ---------------------------------------


def test_watchdog_stops_a_group_at_its_deadline_and_when_its_command_dies(tmp_path):
    from grpo_tune.core import lifeline

    with lifeline.Watchdog(grace_s=1.0) as wd:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        wd.guard(p.pid, deadline_s=1.0)
        t0 = time.monotonic()
        p.wait(timeout=30)
        assert time.monotonic() - t0 < 10
    # a command killed with SIGKILL: its watchdog sees the pipe close and stops what it guarded
    code = (
        "import subprocess, sys, time\n"
        "from grpo_tune.core import lifeline\n"
        "wd = lifeline.Watchdog(grace_s=1.0).start()\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], start_new_session=True)\n"
        "wd.guard(p.pid)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    cmd = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True
    )
    assert cmd.stdout is not None
    child = int(cmd.stdout.readline())
    cmd.kill()
    cmd.wait()
    try:
        assert _wait_for(lambda: not _alive(child), 20), "the guarded group outlived its command"
    finally:
        _reap([child])


def test_a_killed_refine_takes_its_running_trial_down(tmp_path):
    """Any signal to refine, even to its whole group, left the trial (its own session) running."""
    drv = tmp_path / "refine_driver.py"
    drv.write_text(
        "import sys\n"
        "from grpo_tune.jobs.inputs import plan_inputs\n"
        "from grpo_tune.autotune.search.driver import search\n"
        "from grpo_tune.autotune.refine import RefineOptions, refine\n"
        "m, hw, cl, wl = plan_inputs(model='tiny', hardware='cpu', gpus=4, gpus_per_node=None, workload='grpo',\n"
        "    prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8, ppo_epochs=1, kl=True, seq_len=64, gbs=8)\n"
        "r = search(m, hw, cl, wl)\n"
        "refine(r.ranked, m, hw, cl, wl, sys.argv[1], RefineOptions(trials=2, trial_steps=2, trial_timeout_s=600,\n"
        "    profile_cmd=[sys.executable, sys.argv[2]], emit=False, calibrate=False, progress=False))\n"
    )
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REFINE_STANDIN_DELAY_S": "300", "REFINE_STANDIN_LOG": str(log)}
    p = subprocess.Popen(
        [sys.executable, str(drv), str(tmp_path / "out"), str(ROOT / "tests" / "refine_standin.py")],
        env=env,
        start_new_session=True,
    )
    try:
        assert _wait_for(lambda: log.exists() and log.read_text().strip(), 120)
        trial = json.loads(log.read_text().splitlines()[0])["pid"]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        assert _wait_for(lambda: not _alive(trial), 20), "the trial outlived its refine worker"
    finally:
        _reap([p.pid] + ([json.loads(ln)["pid"] for ln in log.read_text().splitlines()] if log.exists() else []))


# --- a real run: Ctrl-C, the resume line, the rerun ----------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_of_a_real_run_prints_the_resume_line_and_the_rerun_shows_every_step(tmp_path):
    out = tmp_path / "run"
    cfg = _config(tmp_path, out, steps=40)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    cli = [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "train", "--config", str(cfg)]
    p = subprocess.Popen(
        cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert _wait_for(lambda: (out / "checkpoints" / "latest.json").exists() and len(_steps(out)) >= 3, 240)
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "SignalException" not in err, err
    import re

    m = re.search(
        r"interrupted at step (\d+); the last checkpoint is step (\d+); rerun the same command to resume", err
    )
    assert m, err
    ck = int(m.group(2))
    done = subprocess.run(
        [*cli, "--steps", str(ck + 3)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert f"resuming after step {ck}" in done.stdout
    shown = [int(s) for s in re.findall(r"^step=(\d+)", done.stdout, re.M)]
    assert shown == [ck + 1, ck + 2, ck + 3], done.stdout
    assert _steps(out) == list(range(1, ck + 4))


def test_profile_stops_its_workers_at_its_own_timeout(tmp_path):
    """The trial's timeout holds in the profile command itself (refine passes --trial-timeout as --timeout), so
    a trial whose refine worker is gone or stuck still ends on time."""
    drv = tmp_path / "driver.py"
    drv.write_text(DRIVER)
    cfg = _config(tmp_path, tmp_path / "unused")
    out = tmp_path / "p.run"
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(drv), str(FAKE), "100000", "0.05", "profile", "--config", str(cfg), "--steps", "2"]
        + ["--json", str(tmp_path / "p.json"), "--out", str(out), "--timeout", "2"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 4, r.stderr
    assert time.monotonic() - t0 < 60
    rep = json.loads((tmp_path / "p.json").read_text())
    assert rep["status"] == "error" and "timed out" in rep["message"]
    assert _wait_for(lambda: not any(_alive(k) for k in _pids(out)), 20)
