"""The Optuna study behind a refinement: open it, recover trials of dead workers, flatten its trials.

Only Optuna's public API: ``Study.ask/tell/enqueue_trial/get_trials`` and the public methods of
the storage object this module creates (``set_trial_user_attr``, ``get_study_id_from_name``,
``get_trial_id_from_study_id_trial_number``). The heartbeat is a user attribute
(``heartbeat_utc``, wall-clock seconds) that a thread refreshes while the trial profiles; Optuna's
own RDB heartbeat would need its private stale-trial query. A trial's reason is written while it
is still RUNNING, then it is finished with ``study.tell(number, state=FAIL)``: a finished trial
cannot be changed.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_tune.core.errors import ConfigError

from grpo_tune.autotune.refine.runner import kill_group

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage

PARAM = "plan_rank"
"""The user attribute holding a trial's position in the plan space (the parameters are the plan's knobs)."""


@dataclass
class StudyHandle:
    """A study with the storage object it was opened on (heartbeats and attributes go through it)."""

    study: optuna.Study
    storage: BaseStorage
    study_id: int
    heartbeat_s: float = 0.0
    grace_s: float = 30.0
    """A RUNNING trial whose heartbeat is older than this (and whose worker is not alive here) is stale."""

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def set_attr(self, number: int, key: str, value: object) -> None:
        """Set a user attribute on a RUNNING trial by number (also one asked by another worker)."""
        self.storage.set_trial_user_attr(self.trial_id(number), key, value)

    def heartbeat(self, number: int) -> _Heartbeat:
        if self.heartbeat_s:
            return _Heartbeat(self.storage, self.trial_id(number), self.heartbeat_s)
        return _Heartbeat(None, 0, 0)


def _quiet_optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats are used deliberately with ask/tell (see _Heartbeat); silence optuna's notices about it.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    return optuna


DB_TIMEOUT_S = 60.0
"""How long a statement waits for a study database that another process holds locked (SQLite's busy timeout)."""

CONNECT_TIMEOUT_S = 10.0
"""How long connecting to a database server may take before it is a STORAGE_ERROR (the probe before the search and
the driver's own ``connect_timeout``); a ``connect_timeout=N`` in the --storage URL's query sets it."""
STATEMENT_TIMEOUT_S = 300.0
"""How long one statement on a database server may run (PostgreSQL's ``statement_timeout``, MySQL's read and write
timeouts); a study's statements take milliseconds."""
MAX_TIMEOUT_S = 3600.0
"""The longest connect_timeout a URL may set."""

DRIVERS = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pymysql": "pymysql",
    "mysqldb": "mysqlclient",
    "asyncpg": "asyncpg",
}
"""SQLAlchemy driver -> the pip package that provides it."""


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``postgresql://u:***@host/db``): what is printed or written."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL: hide everything between '://' and '@'
        import re

        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _scrub(text: str, url: str) -> str:
    """An error text with the URL's password (if any) replaced, wherever the driver put it."""
    from sqlalchemy.engine import make_url

    try:
        pw = make_url(url).password
    except Exception:  # noqa: BLE001
        pw = None
    text = text.replace(url, redact(url))
    return text.replace(str(pw), "***") if pw else text


def check_url(url: str) -> None:
    """A --storage SQLAlchemy cannot parse, or whose database driver is missing, is a coded error now."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from grpo_tune.core.errors import MissingDependencyError

    shown = redact(url)
    try:
        u = make_url(url)
        dialect = u.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigError(
            f"--storage {shown!r} is not a database URL SQLAlchemy can open ({_scrub(str(exc), url)})",
            hint="use sqlite:///path/study.db, postgresql://user@host/db or mysql://...",
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        driver = getattr(dialect, "driver", "") or u.get_driver_name()
        pkg = DRIVERS.get(driver, driver)
        extra = " (or pip install 'grpo-tune[cluster]')" if driver == "psycopg" else ""
        raise MissingDependencyError(
            f"--storage {shown}: the {u.get_backend_name()} driver {driver!r} is not installed ({exc})",
            hint=f"pip install '{pkg}'{extra}",
        ) from None


def connect_timeout(url: str) -> float:
    """The URL's ``connect_timeout`` (seconds), else :data:`CONNECT_TIMEOUT_S`; a bad one is a coded error."""
    import math

    from sqlalchemy.engine import make_url

    raw = make_url(url).query.get("connect_timeout")
    if raw is None:
        return CONNECT_TIMEOUT_S
    raw = raw[-1] if isinstance(raw, tuple) else raw
    try:
        t = float(raw)
    except ValueError:
        t = math.nan
    if not (0 < t <= MAX_TIMEOUT_S):
        raise ConfigError(
            f"--storage {redact(url)}: connect_timeout={raw!r} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]",
            hint=f"e.g. ?connect_timeout=10 (the default, {CONNECT_TIMEOUT_S:g} s, when it is left out)",
        )
    return t


def connect_args(url: str) -> dict[str, object]:
    """The driver's time limits for ``url``: SQLite's busy timeout; a server's connect timeout (unless the URL sets
    one) and statement timeout (PostgreSQL through ``options``, MySQL's read/write timeouts)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        return {"timeout": DB_TIMEOUT_S}
    out: dict[str, object] = {}
    if "connect_timeout" not in u.query:
        out["connect_timeout"] = max(1, round(connect_timeout(url)))
    if backend == "postgresql" and u.get_driver_name() in ("psycopg", "psycopg2") and "options" not in u.query:
        out["options"] = f"-c statement_timeout={int(STATEMENT_TIMEOUT_S * 1000)}"
    if backend in ("mysql", "mariadb") and u.get_driver_name() in ("pymysql", "mysqldb"):
        out.setdefault("read_timeout", int(STATEMENT_TIMEOUT_S))
        out.setdefault("write_timeout", int(STATEMENT_TIMEOUT_S))
    return out


_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}
_SSL_REQUEST = b"\x00\x00\x00\x08\x04\xd2\x16\x2f"
"""PostgreSQL's SSLRequest (length 8, code 80877103): a server answers it with one byte before any login."""


def probe(url: str) -> None:
    """Check a --storage before the search runs and before anything is written, with a time limit on every wait:
    a SQLite file's folder must exist (grpo-tune creates no folder outside --out); a database server must accept a
    connection and answer its first protocol message (PostgreSQL: SSLRequest; MySQL: the server's greeting) within
    the connect timeout. No driver is needed for this: a server that accepts and never answers is found here."""
    import socket

    from sqlalchemy.engine import make_url

    from grpo_tune.core.errors import StorageError

    shown = redact(url)
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        db = u.database or ""
        if db and db != ":memory:" and not db.startswith("file:"):
            parent = Path(db).expanduser().parent
            if not parent.is_dir():
                raise StorageError(
                    f"--storage {shown}: the folder {parent} does not exist",
                    hint="create it first, or give a path in an existing folder (grpo-tune creates no folder outside "
                    "--out); without --storage the study is in the run folder",
                )
        return
    host, port = u.host, u.port or _DEFAULT_PORTS.get(backend)
    if not host or host.startswith("/") or port is None:
        return  # a Unix socket or a backend we do not speak: the driver's connect_timeout holds
    limit = connect_timeout(url)
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=limit) as sock:
            sock.settimeout(limit)
            if backend == "postgresql":
                sock.sendall(_SSL_REQUEST)
            reply = sock.recv(1)
    except (TimeoutError, socket.timeout):
        raise StorageError(
            f"--storage {shown}: the database server at {where} did not answer within {limit:g} s",
            hint="check that a database server (not another program) listens there and is not overloaded; "
            "?connect_timeout=N in the URL sets the time limit",
        ) from None
    except OSError as exc:
        raise StorageError(
            f"--storage {shown}: cannot connect to {where} ({exc.strerror or exc})",
            hint="start the database server or fix the host and port",
        ) from None
    if not reply:
        raise StorageError(
            f"--storage {shown}: the server at {where} closed the connection without answering",
            hint="check that a database server listens there",
        )


def check_storage(url: str) -> None:
    """Everything about a --storage that can be known before the search runs: the URL, the server (:func:`probe`),
    the driver (:func:`check_url`)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(url)
    except (ArgumentError, ValueError):
        check_url(url)  # the coded error for an unparsable URL
    connect_timeout(url)
    probe(url)
    check_url(url)


def open_study(storage: str, study_name: str, seed: int | None, heartbeat_s: int, grace_s: int) -> StudyHandle:
    """Create or load the study on an RDB URL (a bad URL, a missing driver, a damaged or locked database: coded
    errors, with the password never shown)."""
    from grpo_tune.core.errors import StorageError

    optuna = _quiet_optuna()
    from optuna.storages import RDBStorage

    check_url(storage)
    shown = redact(storage)
    connect_timeout(storage)
    last: Exception | None = None
    t0 = time.monotonic()
    for attempt in range(6):  # two workers starting together race to create the schema: retry
        try:
            st = RDBStorage(
                storage,
                engine_kwargs={"connect_args": connect_args(storage)},
            )
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
            study = optuna.create_study(
                storage=st, study_name=study_name, direction="maximize", sampler=sampler, load_if_exists=True
            )
            return StudyHandle(study, st, st.get_study_id_from_name(study_name), heartbeat_s, grace_s)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy, driver and URL errors all end as a coded error below
            last = exc
            text = str(exc)
            if "locked" in text and time.monotonic() - t0 >= DB_TIMEOUT_S:
                break  # the busy timeout ran out: another process holds the database
            racing = ("IntegrityError", "locked", "already exists")  # schema creation by two workers at once
            if not any(w in type(exc).__name__ + text for w in racing):
                break
            time.sleep(0.5 * (attempt + 1))
    text = _scrub(str(last).splitlines()[0] if str(last) else type(last).__name__, storage)
    if "locked" in text:
        raise StorageError(
            f"study database {shown} is locked by another process (waited {time.monotonic() - t0:.0f} s): {text}",
            hint="stop the program holding it (a DB browser, another tool's transaction), or use --storage with a "
            "database server (postgresql://...) for many workers",
        )
    if "not a database" in text or "malformed" in text or "no such table" in text:
        raise StorageError(
            f"study database {shown} is damaged: {text}",
            hint="move the file away (a new study starts), or restore it from a copy",
        )
    raise StorageError(f"cannot open study storage {shown}: {text}")


def memory_study(seed: int | None) -> StudyHandle:
    """An in-memory study (the benchmark's simulated refinements: no heartbeats, no files)."""
    optuna = _quiet_optuna()
    st = optuna.storages.InMemoryStorage()
    study = optuna.create_study(
        storage=st, direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    )
    return StudyHandle(study, st, st.get_study_id_from_name(study.study_name))


def worker_host() -> str:
    """The name a worker records on its trials: ``GRPO_TUNE_HOST`` when set (containers that share one host name
    across machines must set it), else the host name. A RUNNING trial of another host is failed only when its
    heartbeat goes stale; one of this host, as soon as its worker's pid is gone."""
    import socket

    return os.environ.get("GRPO_TUNE_HOST") or socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_runs(pgid: int, config: str | None) -> bool:
    """Is process group ``pgid`` still running this trial's profile (Linux /proc; a reused id is left alone)?"""
    if not config:
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of /proc/<pid>/stat: the process group
                continue
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if config in cmd or "trainer" in cmd:
            return True
    return False


def fail_running(h: StudyHandle, number: int, reason: str) -> bool:
    """Record ``reason`` on a RUNNING trial, then mark it FAIL. False when another worker got there first."""
    from optuna.trial import TrialState

    try:
        h.set_attr(number, "reason", reason)  # before tell: a finished trial cannot be changed
        h.study.tell(number, state=TrialState.FAIL)
    except (RuntimeError, ValueError):  # already finished (by its worker or another recovering one)
        return False
    return True


def recover(h: StudyHandle, host: str, requeue=None) -> list[str]:
    """Fail trials left RUNNING by dead workers on this host, and stale ones elsewhere; return their plans.

    ``requeue(plan)`` is called before each trial is failed: the plan is back in the queue before the budget
    count drops, so no live worker fills the freed slot with another plan first."""
    from optuna.trial import TrialState

    plans = []
    now = time.time()
    for t in h.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker") or {}
        here = w.get("host") == host and isinstance(w.get("pid"), int)
        if here and not _pid_alive(w["pid"]):
            if isinstance(w.get("pgid"), int) and _group_runs(w["pgid"], t.user_attrs.get("config")):
                kill_group(w["pgid"])  # orphaned profiling processes of the dead worker
            reason = "interrupted: its worker process died"
        elif not here and _stale(_last_sign(t), now, h.grace_s):
            reason = "interrupted: heartbeat went stale"
        else:
            continue
        if requeue is not None and t.user_attrs.get("plan"):
            requeue(t.user_attrs["plan"])
        if fail_running(h, t.number, reason) and t.user_attrs.get("plan"):
            plans.append(t.user_attrs["plan"])
    return plans


def _last_sign(t) -> float | None:
    """When the trial last showed life: its heartbeat, else when it was asked (a worker sets its
    attributes one by one after ask(); another worker must not take that gap for death)."""
    beat = t.user_attrs.get("heartbeat_utc")
    if isinstance(beat, (int, float)):
        return float(beat)
    return None if t.datetime_start is None else t.datetime_start.timestamp()


def _stale(beat: float | None, now: float, grace_s: float) -> bool:
    """No sign of life for more than ``grace_s`` seconds (or none at all)."""
    return beat is None or now - beat > grace_s


@dataclass
class TrialRecord:
    """One trial of the study, flattened for reports and calibration."""

    number: int
    state: str
    """``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING`` or ``WAITING``."""
    plan: str | None
    reason: str | None
    ran: bool
    """True when the trial profiled its plan (counts toward ``trials``)."""
    strategy: dict[str, object] | None
    predicted_step_s: float | None
    predicted_tokens_per_s: float | None
    measured_step_s: float | None
    measured_tokens_per_s: float | None
    measured_phases_s: dict[str, float] | None
    peak_memory_bytes: int | None
    duration_s: float | None
    repeat: bool = False
    """A deliberate re-measurement of a plan already measured (to see the noise)."""

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def records(study) -> list[TrialRecord]:
    out = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        out.append(
            TrialRecord(
                number=t.number,
                state=t.state.name,
                plan=a.get("plan"),
                reason=a.get("reason"),
                ran=bool(a.get("ran")),
                strategy=a.get("strategy"),
                predicted_step_s=a.get("predicted_step_s"),
                predicted_tokens_per_s=a.get("predicted_tokens_per_s"),
                measured_step_s=a.get("measured_step_s"),
                measured_tokens_per_s=a.get("measured_tokens_per_s"),
                measured_phases_s=a.get("measured_phases_s"),
                peak_memory_bytes=a.get("peak_memory_bytes"),
                duration_s=a.get("duration_s"),
                repeat=bool(a.get("repeat")),
            )
        )
    return out


def counted(study) -> int:
    """Trials that profiled (or are profiling) a plan: the budget ``trials`` refers to."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
    ):
        if t.user_attrs.get("ran") or (t.state == TrialState.RUNNING and t.user_attrs.get("running_profile")):
            if str(t.user_attrs.get("reason", "")).startswith("interrupted"):
                continue
            n += 1
    return n


class _Heartbeat:
    """Refreshes the trial's ``heartbeat_utc`` user attribute while it runs."""

    def __init__(self, storage, trial_id: int, interval_s: float):
        self._stop = threading.Event()
        self._t = None
        if storage is not None:
            self._t = threading.Thread(target=self._loop, args=(storage, trial_id, interval_s), daemon=True)

    def _loop(self, storage, trial_id, interval_s):
        while True:
            try:
                storage.set_trial_user_attr(trial_id, "heartbeat_utc", time.time())
            except Exception:  # noqa: BLE001, S110 - a lost DB connection must not kill the trial; the next beat retries
                pass
            if self._stop.wait(interval_s):
                return

    def __enter__(self):
        if self._t is not None:
            self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._t is not None:  # a beat stuck on the database ends at its statement timeout; the thread is a daemon
            self._t.join(timeout=STATEMENT_TIMEOUT_S + DB_TIMEOUT_S)
