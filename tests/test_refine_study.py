"""The refinement's study on a real SQLite storage: stale heartbeats, dead workers, reasons kept.

A finished Optuna trial cannot be changed, so the reason must be written while it is RUNNING;
these tests read the reasons back from a fresh load of the storage.
"""

from __future__ import annotations

import subprocess
import sys
import time

import optuna
import pytest

from grpo_tune.autotune.refine.study import fail_running, open_study, recover


def _reload(url: str, name: str):
    return {t.number: t for t in optuna.load_study(study_name=name, storage=url).trials}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_heartbeat_and_dead_worker_are_failed_with_their_reasons(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    h = open_study(url, "s", seed=0, heartbeat_s=1, grace_s=30)
    now = time.time()
    cases = {  # plan -> (worker host, pid, last heartbeat)
        "stale-elsewhere": ("other-host", 1, now - 100),
        "fresh-elsewhere": ("other-host", 1, now - 5),
        "dead-here": ("this-host", _dead_pid(), now),
        "just-asked-elsewhere": ("other-host", 1, None),  # no heartbeat yet: asked a moment ago, alive
    }
    numbers = {}
    for plan, (host, pid, beat) in cases.items():
        t = h.study.ask()
        t.set_user_attr("plan", plan)
        t.set_user_attr("worker", {"host": host, "pid": pid})
        if beat is not None:
            t.set_user_attr("heartbeat_utc", beat)
        numbers[plan] = t.number
    plans = recover(h, "this-host")
    assert sorted(plans) == ["dead-here", "stale-elsewhere"]
    trials = _reload(url, "s")
    reason = lambda p: trials[numbers[p]].user_attrs.get("reason")
    assert trials[numbers["stale-elsewhere"]].state.name == "FAIL"
    assert reason("stale-elsewhere") == "interrupted: heartbeat went stale"
    assert trials[numbers["just-asked-elsewhere"]].state.name == "RUNNING"
    assert reason("dead-here") == "interrupted: its worker process died"
    assert trials[numbers["fresh-elsewhere"]].state.name == "RUNNING" and reason("fresh-elsewhere") is None
    # a second recovering worker finds nothing left to do
    assert recover(h, "this-host") == []


def test_fail_running_refuses_a_finished_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    h = open_study(url, "s", seed=0, heartbeat_s=1, grace_s=30)
    t = h.study.ask()
    h.study.tell(t, 1.0)
    assert fail_running(h, t.number, "interrupted: x") is False
    (done,) = _reload(url, "s").values()
    assert done.state.name == "COMPLETE" and "reason" not in done.user_attrs


def test_heartbeat_thread_refreshes_the_attribute(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    h = open_study(url, "s", seed=0, heartbeat_s=1, grace_s=30)
    t = h.study.ask()
    t0 = time.time()
    with h.heartbeat(t.number):
        time.sleep(1.5)
    beat = _reload(url, "s")[t.number].user_attrs["heartbeat_utc"]
    assert beat >= t0 - 1e-3 and beat == pytest.approx(time.time(), abs=3)
