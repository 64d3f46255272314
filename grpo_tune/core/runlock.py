"""One writer per run folder: an OS file lock held for the life of a run (train, profile, refine).

``with run_lock(out_dir, "train") as lock: ...`` takes ``flock(LOCK_EX | LOCK_NB)`` on
``<out_dir>/.grpo-tune.lock`` and writes who holds it (host, pid, command, start time) into it. The
kernel drops the lock when the holder dies, however it dies, so a lock file left by a dead run is
taken over with a line saying so; a live holder makes a second writer fail at once with
``RUN_LOCKED``, naming the holder's host and pid. The lock file is opened with ``O_NOFOLLOW``: a link
planted at its name is refused, never followed.

Children that should keep the folder locked while they run (torchrun) get the descriptor through
``pass_fds=[lock.fd]``: an flock belongs to the open file, so it lasts until the last process
holding it is gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from .errors import GrpoTuneError

LOCK_NAME = ".grpo-tune.lock"
MAX_LOCK_BYTES = 4096


class RunLockedError(GrpoTuneError, code="RUN_LOCKED"):
    """Another live process holds the run folder's lock."""


def _holder_text(info: dict[str, object]) -> str:
    host, pid = info.get("host", "?"), info.get("pid", "?")
    what = info.get("command") or "grpo-tune"
    since = info.get("started_utc")
    when = f" since {time.strftime('%H:%M:%S UTC', time.gmtime(since))}" if isinstance(since, (int, float)) else ""
    return f"{what} (pid {pid} on host {host}{when})"


def _read_info(fd: int) -> dict[str, object]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, MAX_LOCK_BYTES)
        info = json.loads(raw.decode(errors="replace") or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """A held lock on one run folder (see the module doc)."""

    def __init__(self, folder: Path, fd: int, info: dict[str, object], took_over: dict[str, object] | None, path: Path):
        self.folder, self.fd, self.info, self.took_over, self.path = folder, fd, info, took_over, path

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            # a clean end leaves no holder behind to be "taken over" (a shared holder: only the last one out)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(
    folder: str | os.PathLike[str],
    command: str,
    *,
    say: Callable[[str], None] | None = None,
    name: str = LOCK_NAME,
    shared: bool = False,
) -> RunLock:
    """Lock ``folder`` (created if missing) for this process, or raise RUN_LOCKED naming the live holder.

    ``name``: the lock file's name (node k > 0 of a multi-node run on a shared file system takes its own).
    ``shared``: several holders of one kind at once (the workers of one refinement study, which share its
    folder through the study database); it still excludes every exclusive writer (train, profile)."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise GrpoTuneError(
                f"{p} is a symbolic link; grpo-tune does not write through links in a run folder",
                code="IO_ERROR",
                hint=f"remove the link ({p}) and run again",
            ) from None
        raise GrpoTuneError(
            f"cannot create the run lock {p} ({exc.strerror})", code="IO_ERROR", hint="check the folder is writable"
        ) from None
    import stat

    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GrpoTuneError(
            f"{p} is not a regular file", code="IO_ERROR", hint=f"remove {p} (grpo-tune keeps its run lock there)"
        )
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        info = _read_info(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise GrpoTuneError(f"cannot lock {p} ({exc.strerror})", code="IO_ERROR") from None
        who = _holder_text(info) if info else "another process"
        gone = (
            info.get("host") == socket.gethostname()
            and isinstance(info.get("pid"), int)
            and not _pid_alive(info.get("pid"))
        )
        raise RunLockedError(
            f"{d} is in use by {who}" + ("; that command has died but processes it started still run" if gone else ""),
            hint="wait for that run to end (or stop it), or give this one another --out",
        ) from None
    old = _read_info(fd)
    took_over = old if old.get("pid") not in (None, os.getpid()) and not old.get("shared") else None
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": command,
        "started_utc": time.time(),
        "shared": shared,
    }
    if shared and old.get("shared") and _pid_alive(old.get("pid")) and old.get("host") == info["host"]:
        return RunLock(d, fd, old, None, p)  # another worker of the same study holds it with us: leave its name
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(info) + "\n").encode())
    except OSError:
        pass  # the lock itself is what matters; the holder's name is a courtesy
    if took_over and say is not None:
        say(f"took over the lock of {d} from a run that is no longer alive: {_holder_text(took_over)}")
    return RunLock(d, fd, info, took_over, p)


def lock_name(node_rank: int = 0) -> str:
    """Node 0 (and one-node runs) lock the folder; node k of a multi-node run on a shared file system takes
    ``.grpo-tune.nodeK.lock``, so the nodes of one run do not lock each other out."""
    return LOCK_NAME if node_rank == 0 else f".grpo-tune.node{node_rank}.lock"


def run_lock(
    folder: str | os.PathLike[str], command: str, *, say: Callable[[str], None] | None = None, name: str = LOCK_NAME
) -> RunLock:
    """:func:`acquire` as a context manager (released on exit)."""
    return acquire(folder, command, say=say, name=name)
