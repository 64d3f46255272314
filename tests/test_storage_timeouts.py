"""Time limits on every wait for the study database (autotune/refine/study.py): a server that accepts and never
answers is a STORAGE_ERROR within the connect timeout (stated: 10 s; settable: ?connect_timeout=N), found before the
search runs and before anything is written; a SQLite URL whose folder does not exist is refused, never created.
Before: `search --refine --storage postgresql://...` to such a socket waited in psycopg's connect past 60 s, and
`sqlite:////nonexistent/dir/x.db` created the folder."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from grpo_tune.autotune.refine import study as S
from grpo_tune.cli.main import main
from grpo_tune.core.errors import StorageError


class SilentServer:
    """A listening socket on 127.0.0.1 that accepts connections and never sends a byte; it stops itself after
    ``life_s`` seconds at the latest (a bounded accept loop), and on exit of the ``with``."""

    def __init__(self, life_s: float = 30.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.deadline = time.monotonic() + life_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(conn)  # held open, never answered

    def __enter__(self) -> "SilentServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for c in self.accepted:
            c.close()
        self.sock.close()


def test_a_server_that_never_answers_is_a_storage_error_before_the_search(tmp_path, capsys):
    out = tmp_path / "runs"
    with SilentServer() as srv:
        url = f"postgresql://u:secret@127.0.0.1:{srv.port}/db?connect_timeout=1"
        t0 = time.monotonic()
        rc = main(["search", "-m", "7b", "-g", "8", "--refine", "--storage", url, "--out", str(out)])
        dt = time.monotonic() - t0
        assert srv.accepted  # it did connect: the wait was on the answer
    err = capsys.readouterr().err
    assert rc == 2 and "[STORAGE_ERROR]" in err and "did not answer within 1 s" in err, err
    assert "secret" not in err and "connect_timeout" in err  # the password masked; the hint names the setting
    assert dt < 8  # 1 s of probe; the search did not run (it takes seconds)
    assert not out.exists()  # nothing written


def test_the_connect_timeout_is_stated_and_settable():
    assert S.CONNECT_TIMEOUT_S == 10.0
    assert S.connect_timeout("postgresql://u@h/db") == 10.0
    assert S.connect_timeout("postgresql://u@h/db?connect_timeout=3") == 3.0
    args = S.connect_args("postgresql+psycopg://u@h/db")
    assert args["connect_timeout"] == 10 and "statement_timeout=300000" in str(args["options"])
    assert "connect_timeout" not in S.connect_args("postgresql+psycopg://u@h/db?connect_timeout=3")  # the URL's own
    assert S.connect_args("mysql+pymysql://u@h/db")["read_timeout"] == 300
    assert S.connect_args("sqlite:///x.db") == {"timeout": S.DB_TIMEOUT_S}
    for bad in ("0", "-1", "nan", "inf", "abc", "99999"):
        with pytest.raises(S.ConfigError):
            S.connect_timeout(f"postgresql://u@h/db?connect_timeout={bad}")


def test_a_refused_port_is_a_storage_error_quickly():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="cannot connect"):
        S.check_storage(f"postgresql://u@127.0.0.1:{port}/db")
    assert time.monotonic() - t0 < 5


def test_a_sqlite_url_never_creates_a_folder(tmp_path, capsys):
    missing = tmp_path / "nonexistent" / "dir"
    out = tmp_path / "runs"
    rc = main(
        ["search", "-m", "7b", "-g", "8", "--refine", "--storage", f"sqlite:///{missing}/x.db", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "[STORAGE_ERROR]" in err and "does not exist" in err, err
    assert not missing.parent.exists() and not out.exists()
    # open_study itself creates no folder either (the default study.db sits in the run folder, which exists)
    with pytest.raises(StorageError):
        S.open_study(f"sqlite:///{missing}/y.db", "s", 0, 30, 90)
    assert not missing.parent.exists()


def test_a_sqlite_url_in_an_existing_folder_passes_the_check(tmp_path):
    S.check_storage(f"sqlite:///{tmp_path}/x.db")
    assert not Path(tmp_path / "x.db").exists()  # checked, not created


@pytest.mark.cluster
def test_psycopg_connect_to_a_silent_server_is_bounded():
    """The driver's own wait (no probe before it): psycopg's connect_timeout from connect_args()."""
    pytest.importorskip("psycopg")
    with SilentServer() as srv:
        t0 = time.monotonic()
        with pytest.raises(StorageError):
            S.open_study(f"postgresql+psycopg://u:pw@127.0.0.1:{srv.port}/db?connect_timeout=2", "s", 0, 30, 90)
        assert time.monotonic() - t0 < 20
