"""Refinement across machines, on a real PostgreSQL server started here (marker ``cluster``: not in the default run).

``pytest -m cluster tests/test_cluster_refine.py`` needs Debian's ``postgresql`` package (initdb and pg_ctl under
/usr/lib/postgresql/*/bin) and the ``cluster`` extra (psycopg). The server runs as an unprivileged user on a
loopback port in a temporary folder and is stopped at the end.

Each worker is its own process with its own run folder and its own host name (``GRPO_TUNE_HOST``), as workers
on separate machines are: a dead worker's trial is found by its stale heartbeat, not by its pid.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "refine_standin.py"


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("PostgreSQL server binaries not found: apt-get install -y postgresql", pytrace=False)
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pg_url():
    try:
        import psycopg  # noqa: F401
    except ImportError:  # the group was asked for: a missing driver fails it loudly, as missing binaries do
        pytest.fail("psycopg is not installed: pip install -e '.[cluster]'", pytrace=False)
    bindir = _pg_bin()
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="grpo-tune-pg-"))  # outside pytest's 0700 folder: the server user reads it
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    password = "pw-" + secrets.token_hex(8)
    (base / "pw").write_text(password + "\n")
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: use an unprivileged account
        user = "postgres" if _has_user("postgres") else "nobody"
        uid = pwd.getpwnam(user).pw_uid
        for p in (base, sock, base / "pw"):
            os.chown(p, uid, -1)
        os.chmod(base, 0o755)
        as_user = ["runuser", "-u", user, "--"]
    port = _free_port()

    def run(*cmd: str) -> None:
        r = subprocess.run([*as_user, *cmd], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr

    run(str(bindir / "initdb"), "-D", str(data), "-U", "grpo", "--pwfile", str(base / "pw"), "-A", "scram-sha-256")
    run(
        str(bindir / "pg_ctl"),
        "-D",
        str(data),
        "-l",
        str(base / "server.log"),
        "-w",
        "-o",
        f"-p {port} -k {sock} -c listen_addresses=127.0.0.1",
        "start",
    )
    try:
        yield f"postgresql://grpo:{password}@127.0.0.1:{port}/postgres", password
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"])
        shutil.rmtree(base, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


DRIVER = r"""
import sys
from grpo_tune.jobs.inputs import plan_inputs
from grpo_tune.autotune.search.driver import search
from grpo_tune.autotune.refine import RefineOptions, refine
out, trials, storage, standin = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
m, hw, cl, wl = plan_inputs(model="tiny", hardware="cpu", gpus=4, gpus_per_node=None, workload="grpo", prompts=8,
                            n=4, prompt_len=16, response_len=16, mini_batch=8, ppo_epochs=1, kl=True, seq_len=64, gbs=8)
r = search(m, hw, cl, wl)
res = refine(r.ranked, m, hw, cl, wl, out, RefineOptions(
    trials=trials, profile_cmd=[sys.executable, standin], trial_steps=2, trial_timeout_s=120, storage=storage,
    study_name="shared", seed=int(sys.argv[5]), emit=True, calibrate=False, progress=False, heartbeat_s=1,
    policy="tpe"))
print("winner", res.to_dict().get("winner"))
"""


def _worker(tmp: Path, i: int, url: str, trials: int, log: Path) -> subprocess.Popen:
    drv = tmp / "driver.py"
    drv.write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GRPO_TUNE_HOST": f"machine-{i}",
        "REFINE_STANDIN_DELAY_S": "2",
        "REFINE_STANDIN_LOG": str(log),
    }
    return subprocess.Popen(
        [sys.executable, str(drv), str(tmp / f"m{i}"), str(trials), url, str(STANDIN), str(i)],
        env=env,
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_three_workers_on_one_postgresql_study_one_killed_mid_trial(tmp_path, pg_url):
    import optuna

    url, password = pg_url
    trials = 6
    log = tmp_path / "calls.jsonl"
    workers = [_worker(tmp_path, i, url, trials, log) for i in range(3)]
    # SIGKILL the first worker seen profiling a trial, while it profiles it. Which one starts first depends on the
    # machine's load (a worker that loses the race to create the schema retries), so the victim is not fixed: a
    # slow starter may find the budget already taken by the other two.
    t0 = time.monotonic()
    started: list[dict] = []
    while time.monotonic() - t0 < 180:
        started = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
        if started or all(w.poll() is not None for w in workers):
            break
        time.sleep(0.1)
    if not started:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
        outs = [w.communicate(timeout=60)[0] for w in workers]
        pytest.fail("no worker started a trial:\n" + "\n---\n".join(o[-2000:] for o in outs))
    killed_cfg = started[0]["config"]
    v = next(i for i in range(3) if f"/m{i}/" in killed_cfg)
    victim = workers[v]
    time.sleep(0.5)
    os.kill(victim.pid, signal.SIGKILL)
    try:
        outs = [w.communicate(timeout=300)[0] for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
    assert all(w.returncode == 0 for i, w in enumerate(workers) if i != v), outs

    study = optuna.load_study(study_name="shared", storage=url)
    table = [
        (
            t.number,
            t.state.name,
            t.user_attrs.get("plan", "")[-40:],
            t.user_attrs.get("reason"),
            t.user_attrs.get("requeued"),
        )
        for t in study.trials
    ]
    print("\n".join(map(str, table)))
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == trials, [(t.number, t.state.name, t.user_attrs.get("reason")) for t in study.trials]
    plans = [t.user_attrs["plan"] for t in done]
    assert len(set(plans)) == len(plans), plans  # tpe asks for no repeat: no plan measured twice
    killed = [t for t in study.trials if t.user_attrs.get("config") == killed_cfg]
    assert killed and killed[0].state.name == "FAIL"
    assert killed[0].user_attrs["reason"] == "interrupted: heartbeat went stale"
    again = [t for t in done if t.user_attrs["plan"] == killed[0].user_attrs["plan"]]
    assert again and again[0].user_attrs.get("requeued") is True  # taken over by a live worker
    assert any("took over the interrupted plan" in o for o in outs)
    assert not any(t.state.name == "WAITING" and t.user_attrs.get("requeued") for t in study.trials)
    assert not any(t.state.name == "RUNNING" for t in study.trials)

    # the password is in no file of any run folder, and in no output
    for o in outs:
        assert password not in o
    for f in tmp_path.rglob("*"):
        if f.is_file() and f.name not in ("driver.py",):
            assert password.encode() not in f.read_bytes(), f
    report = next(r for i in range(3) if i != v for r in tmp_path.glob(f"m{i}/**/report.md"))
    assert "grpo:***@127.0.0.1" in report.read_text()


def test_a_wrong_password_is_a_coded_error_that_does_not_print_it(tmp_path, pg_url):
    url, password = pg_url
    bad = url.replace(password, "not-" + password)
    drv = tmp_path / "driver.py"
    drv.write_text(DRIVER)
    r = subprocess.run(
        [sys.executable, str(drv), str(tmp_path / "m"), "1", bad, str(STANDIN), "0"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "STORAGE_ERROR" in r.stdout + r.stderr
    assert "not-" + password not in r.stdout + r.stderr and password not in r.stdout + r.stderr
