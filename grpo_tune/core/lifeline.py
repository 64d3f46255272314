"""No child process outlives the command that started it.

Three layers, each enough on its own for one way the command can end:

- **A process group the command owns.** Every child (torchrun, a refinement trial) is started in a
  session of its own (:func:`spawn`), so a terminal's Ctrl-C reaches the command only, and the
  command takes the child's whole group down (:func:`stop_group`: SIGTERM, a grace period, SIGKILL).
- **A parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG)``): the child is started through a
  tiny ``exec`` shim (``python -m <this module> exec``) that asks the kernel to signal it when the
  command dies, even by SIGKILL, then replaces itself with the real program (the setting survives
  ``execve``). Set in the shim rather than in ``preexec_fn``, which is unsafe with threads (rich's
  live display and refine's heartbeat run threads).
- **A watchdog** (:class:`Watchdog`): a small process in a session of its own that holds the read end
  of a pipe from the command. When the command dies, however it dies, the pipe closes and the
  watchdog stops every group it was told about. It also enforces a deadline per group (a trial's
  ``--trial-timeout``) even when the command itself is stuck or gone.

Standard library only (the CLI imports it before torch is anywhere near).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO

MODULE = __name__  # "core.lifeline" (or its namespaced name): the shim and the watchdog run this module
GRACE_S = 10.0
"""How long a group has between SIGTERM and SIGKILL (torchrun tears its workers down on SIGTERM)."""
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_pdeathsig(sig: int = signal.SIGTERM) -> bool:
    """Linux: ask the kernel to send ``sig`` to this process when its parent dies. False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def shim(cmd: Sequence[str], *, sig: int = signal.SIGTERM) -> list[str]:
    """``cmd`` run through the parent-death shim: the child gets ``sig`` when this process dies."""
    return [sys.executable, "-m", MODULE, "exec", str(os.getpid()), str(int(sig)), "--", *cmd]


def spawn(
    cmd: Sequence[str],
    *,
    stdout: int | IO[bytes] | IO[str] | None = None,
    stderr: int | IO[bytes] | IO[str] | None = None,
    env: dict[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    sig: int = signal.SIGTERM,
    cwd: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a new session (its pid is its group id), dying with this process (see module doc)."""
    return subprocess.Popen(
        shim(cmd, sig=sig),
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, *, grace_s: float = GRACE_S, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL what is left.

    ``proc`` (the group's leader, our child) is reaped while waiting, or its zombie would keep the group alive.
    """
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc is not None:
            proc.poll()
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    if proc is not None:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Watchdog:
    """A process that stops the groups it guards when this process dies, or at a group's deadline.

    ``with Watchdog() as wd: wd.guard(proc.pid, deadline_s=600) ... wd.release(proc.pid)``. A clean exit
    releases everything first, so the watchdog stops nothing; a kill -9 of this process closes the pipe.
    """

    def __init__(self, grace_s: float = GRACE_S):
        self._proc: subprocess.Popen[bytes] | None = None
        self.grace_s = grace_s

    def start(self) -> Watchdog:
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", MODULE, "watch", str(float(self.grace_s))],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a signal to our own group must not take the watchdog with it
                close_fds=True,
            )
        return self

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write((line + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def guard(self, pgid: int, *, deadline_s: float | None = None, on_stop: Sequence[str] | None = None) -> None:
        """Stop group ``pgid`` when this process dies, or ``deadline_s`` seconds from now; then run ``on_stop``
        (e.g. ``scancel`` of the Slurm job the group was waiting on, which killing the group leaves running)."""
        import json

        at = "-" if deadline_s is None else repr(time.time() + float(deadline_s))
        self._send(f"guard {int(pgid)} {at} {json.dumps(list(on_stop or []))}")

    def release(self, pgid: int) -> None:
        self._send(f"release {int(pgid)}")

    def close(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            assert proc.stdin is not None
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=self.grace_s + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _watch(stream: IO[bytes], grace_s: float) -> int:
    """The watchdog's loop: read ``guard PGID DEADLINE|-`` / ``release PGID`` lines until EOF."""
    import json

    guarded: dict[int, float | None] = {}
    after: dict[int, list[str]] = {}

    def run_after(pgid: int) -> None:
        cmd = after.pop(pgid, None)
        if cmd:
            try:
                subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass

    fd = stream.fileno()
    buf = b""
    while True:
        now = time.time()
        for pgid, at in list(guarded.items()):
            if at is not None and now >= at:
                del guarded[pgid]
                stop_group(pgid, grace_s=grace_s)
                run_after(pgid)
        waits = [at - now for at in guarded.values() if at is not None]
        ready, _, _ = select.select([fd], [], [], max(0.05, min(waits)) if waits else 1.0)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:  # the command is gone: stop everything it left
            for pgid in guarded:
                _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while any(group_alive(p) for p in guarded) and time.monotonic() < deadline:
                time.sleep(0.05)
            for pgid in guarded:
                _signal_group(pgid, signal.SIGKILL)
                run_after(pgid)
            return 0
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            parts = raw.decode(errors="replace").split()
            try:
                if parts[0] == "guard":
                    guarded[int(parts[1])] = None if parts[2] == "-" else float(parts[2])
                    cmd = json.loads(raw.decode(errors="replace").split(None, 3)[3]) if len(parts) > 3 else []
                    if cmd:
                        after[int(parts[1])] = [str(c) for c in cmd]
                elif parts[0] == "release":
                    guarded.pop(int(parts[1]), None)
                    after.pop(int(parts[1]), None)
            except (IndexError, ValueError):
                continue


def _exec(parent: int, sig: int, cmd: list[str]) -> int:
    """The shim: set the parent-death signal, check the parent is still there, become ``cmd``."""
    set_pdeathsig(sig)
    if os.getppid() != parent:  # the parent died before prctl took effect: nothing to run for
        return 128 + sig
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"cannot start {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


def main(argv: list[str]) -> int:
    if argv[:1] == ["watch"]:
        for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)  # the watchdog ends when its command is gone, not before
        return _watch(sys.stdin.buffer, float(argv[1]) if len(argv) > 1 else GRACE_S)
    if argv[:1] == ["exec"] and len(argv) >= 5 and argv[3] == "--":
        return _exec(int(argv[1]), int(argv[2]), argv[4:])
    print(f"usage: python -m {MODULE} watch [GRACE_S] | exec PARENT_PID SIGNAL -- CMD...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
