"""Messages that always arrive, secrets kept out, damaged or hostile state refused with a coded error.

Each test is a regression test for one defect found by a fault battery: a closed pipe, ``COLUMNS=0``, an
ASCII-only terminal, a password in a storage URL, a missing database driver, a study database locked by
another process, timings that are no durations, a run config cut short, a newline in ``--out``, and worker
failures that printed torchrun's traceback instead of their cause.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_tune.core.errors import ConfigError, GrpoTuneError, MissingDependencyError

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from grpo_tune.cli.main import run; run()"]
TINY = ["--model", "tiny", "--gpus", "1", "--hardware", "cpu", "--prompts", "4", "--n", "2"]
TINY += ["--prompt-len", "8", "--response-len", "8", "--mini-batch", "4"]


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True, text=True, **kw
    )


# --- messages that always arrive -----------------------------------------------------------------------


def test_code_and_hint_reach_stderr_with_columns_zero():
    r = _cli("search", "--model", "nope", "--gpus", "8", env={"COLUMNS": "0"})
    assert r.returncode == 2
    assert "[UNKNOWN_MODEL]" in r.stderr and "hint:" in r.stderr, repr(r.stderr)


def test_an_ascii_only_terminal_runs_search_to_the_end(tmp_path):
    r = _cli("search", *TINY, "--out", str(tmp_path), env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr
    assert "INTERNAL_ERROR" not in r.stderr


def test_a_closed_pipe_exits_141_quietly():
    """`search | head -1`: exit 141 (as the shell reports a program ended by SIGPIPE), nothing on stderr."""
    for extra in ([], ["--json"]):
        p = subprocess.Popen(
            [*CLI, "search", "--model", "7b", "--gpus", "8", "--all", "--no-emit", *extra],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert p.stdout is not None and p.stderr is not None
        p.stdout.read(1)
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 141, err
        assert err == "", err


def test_a_newline_in_out_is_refused(tmp_path):
    r = _cli("search", *TINY, "--out", str(tmp_path / "a\nb"))
    assert r.returncode == 2 and "[BAD_CONFIG]" in r.stderr and "control character" in r.stderr
    assert not any(tmp_path.iterdir())


# --- secrets -------------------------------------------------------------------------------------------


def test_storage_urls_are_redacted():
    from grpo_tune.autotune.refine.study import redact

    assert redact("postgresql://u:p@host/db") == "postgresql://u:***@host/db"
    assert redact("postgresql+psycopg://u:s3cr%40t@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    assert redact("sqlite:////tmp/x/study.db") == "sqlite:////tmp/x/study.db"


def test_a_missing_driver_is_its_own_coded_error_naming_the_package():
    from grpo_tune.autotune.refine import RefineOptions

    with pytest.raises(MissingDependencyError) as e:
        RefineOptions(storage="postgresql+pg8000://u:sekret@host/db").check()
    assert "pg8000" in e.value.message and "pg8000" in e.value.hint
    assert "sekret" not in e.value.message + e.value.hint


def test_report_md_quotes_the_dashboard_command_and_fences_names():
    import shlex

    from grpo_tune.autotune.refine.markdown import code

    storage = "sqlite:////tmp/$(touch pwned)/study.db"
    line = code("pip install optuna-dashboard && optuna-dashboard " + shlex.quote(storage))
    cmd = line.strip("`").strip()
    assert shlex.split(cmd)[-1] == storage  # pasted into bash, the path is one word, the $(...) never runs
    assert code("a`b|<b>c") == "`` a`b|<b>c ``"


# --- the study database --------------------------------------------------------------------------------

HOLD = r"""
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
time.sleep(600)
"""


def test_a_study_db_locked_by_another_process_is_a_coded_error_within_its_timeout(tmp_path, monkeypatch):
    from grpo_tune.autotune.refine import study

    db = tmp_path / "study.db"
    sqlite3.connect(db).execute("CREATE TABLE x (a)").connection.commit()
    h = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert h.stdout is not None and h.stdout.readline().strip() == "held"
        monkeypatch.setattr(study, "DB_TIMEOUT_S", 1.0)
        t0 = time.monotonic()
        with pytest.raises(GrpoTuneError) as e:
            study.open_study(f"sqlite:///{db}", "s", 0, 0, 30)
        assert time.monotonic() - t0 < 30
        assert e.value.code == "STORAGE_ERROR" and "locked" in e.value.message
    finally:
        h.kill()
        h.wait()


def test_a_damaged_study_db_is_named_damaged_not_a_url_problem(tmp_path):
    from grpo_tune.autotune.refine import study

    db = tmp_path / "study.db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(GrpoTuneError) as e:
        study.open_study(f"sqlite:///{db}", "s", 0, 0, 30)
    assert e.value.code == "STORAGE_ERROR" and "damaged" in e.value.message
    assert "URL" not in e.value.hint


# --- inputs that are not what they claim ---------------------------------------------------------------


@pytest.mark.parametrize("bad", [1e300, True, -5.0])
def test_calibrate_refuses_timings_that_are_no_durations(tmp_path, bad):
    from grpo_tune.autotune.calibrate.runlog import read_log

    lines = [{"step": i, "step_s": 1.0, "phases_s": {"rollout": 0.5, "update": 0.4}} for i in (1, 2, 3)]
    lines[1]["phases_s"]["update"] = bad
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ConfigError, match="not a duration"):
        read_log(p)


def test_a_best_yaml_cut_before_trainer_is_an_error_not_defaults(tmp_path):
    from grpo_tune.core import config as run_config

    r = _cli("search", *TINY, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    best = next(tmp_path.glob("*/best.yaml"))
    text = best.read_text()
    cut = tmp_path / "cut.yaml"
    cut.write_text(text[: text.index("\ntrainer:") + 1])
    run_config.load(best)  # the whole file loads
    with pytest.raises(ConfigError, match="cut short"):
        run_config.load(cut)


# --- worker failures: the cause and the path, not torchrun's traceback ---------------------------------


def test_worker_failures_are_classified_with_their_path():
    from grpo_tune.trainer.launch import classify_failure

    kind, msg = classify_failure(OSError(errno.ENOSPC, "No space left on device", "/ck/rank_00000.pt"))
    assert kind == "no_space" and "/ck/rank_00000.pt" in msg and msg.startswith("[WORKER_FAILED]")
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/ck/x.pt")
        except OSError as inner:
            raise RuntimeError("PytorchStreamWriter failed writing file data") from inner
    except RuntimeError as wrapped:
        assert classify_failure(wrapped)[0] == "no_space"
    assert classify_failure(OSError(errno.EMFILE, "Too many open files", "/data/x"))[0] == "too_many_files"
    assert classify_failure(MemoryError())[0] == "host_oom"
    assert classify_failure(RuntimeError("std::bad_alloc"))[0] == "host_oom"

    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name
        pass

    assert classify_failure(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))[0] == "cuda_oom"
    assert classify_failure(ValueError("a bug"))[0] is None


def test_train_prints_the_classified_cause_not_the_traceback(tmp_path):
    from test_reliability import _config, _train  # the same fake-torchrun harness (tests/ is on sys.path)

    out = tmp_path / "run"
    p = _train(tmp_path, _config(tmp_path, out), steps=2, delay=0.01, FAKE_MODE="nospace")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 4, err
    assert "[WORKER_FAILED] no space left on the device writing" in err and "checkpoints" in err
    assert "Traceback" not in err


def test_a_coded_worker_error_arrives_without_torchruns_traceback(tmp_path):
    """A worker that stops on `[BAD_CONFIG] the vllm rollout engine needs a CUDA GPU`: train printed that line, then
    torchrun's ChildFailedError traceback and its "Root Cause" box (the log's tail), and exited 4."""
    from test_reliability import _config, _train

    out = tmp_path / "run"
    p = _train(tmp_path, _config(tmp_path, out), steps=2, delay=0.01, FAKE_MODE="coded")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    assert "[BAD_CONFIG] the vllm rollout engine needs a CUDA GPU" in err
    assert "ChildFailedError" not in err and "Root Cause" not in err and "Traceback" not in err, err
    assert "ChildFailedError" in (out / "train.log").read_text()  # still in the log, which the line names
    assert "train.log" in err


# --- run folders appear whole --------------------------------------------------------------------------


def test_a_run_folder_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """kill -9 during emit left a run folder with some files and not others (each file atomic, the folder not)."""
    from grpo_tune.jobs.inputs import plan_inputs
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.rundir import emit as E
    from grpo_tune.rundir import report

    m, hw, cl, wl = plan_inputs(model="tiny", hardware="cpu", gpus=1, gpus_per_node=None, workload="grpo",
                                prompts=4, n=2, prompt_len=8, response_len=8, mini_batch=4, ppo_epochs=1, kl=True,
                                seq_len=16, gbs=4)  # fmt: skip
    best = search(m, hw, cl, wl).best

    def dies(*a, **k):  # the process dies after best.yaml, verl.sh and megatron_args.txt are on disk
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_report", dies)
    with pytest.raises(KeyboardInterrupt):
        E.emit_run(best, out=tmp_path / "runs")
    assert list((tmp_path / "runs").iterdir()) == []  # no run folder, no partial sibling
    monkeypatch.undo()
    d, files = E.emit_run(best, out=tmp_path / "runs")
    assert sorted(p.name for p in d.iterdir()) == sorted(p.name for p in files.values())
    assert all(p.parent == d and p.is_file() for p in files.values())
    assert str(d) in (d / "best.yaml").read_text()  # the content names the final folder, not the staging one
    assert ".partial" not in (d / "best.yaml").read_text()


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path, monkeypatch, capsys):
    """`[IO_ERROR] No space left on device` named no path."""
    from grpo_tune.cli.main import main as cli_main

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    rc = cli_main(["search", *TINY, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "[IO_ERROR] No space left on device" in err
    assert str(tmp_path) in err and "best.yaml" in err, err
