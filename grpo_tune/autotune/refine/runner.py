"""One profiling run: ``grpo-tune profile`` on one config in its own process group, never raising.

The JSON it writes is read through the typed :class:`core.profile_report.ProfileReport`.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.profile_report import ProfileReport

if TYPE_CHECKING:
    from grpo_tune.core.lifeline import Watchdog

# The profile command, run as `PROFILE_CMD + ["--config", X, "--steps", K, "--json", OUT]`.
PROFILE_CMD = [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "profile"]


@dataclass
class ProfileOutcome:
    status: str
    """``ok``, ``oom``, ``error`` or ``timeout``."""
    message: str | None
    data: dict[str, object] | None
    """The profile report as JSON (``core.profile_report``), checked; None when there is none."""
    duration_s: float


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_profile(
    config_path: Path,
    *,
    steps: int,
    timeout_s: float,
    json_path: Path,
    log_path: Path,
    profile_cmd: Sequence[str] | None = None,
    on_start: Callable[[int], None] | None = None,
    watchdog: Watchdog | None = None,
    command: Sequence[str] | None = None,
    cleanup: Callable[[], None] | None = None,
    stop_cmd: Sequence[str] | None = None,
) -> ProfileOutcome:
    """Run ``grpo-tune profile`` on one config in its own process group; never raises for a bad run.

    The trial dies with this process (core.lifeline: a parent-death signal, and ``watchdog`` when given,
    which also stops the trial at its timeout if this process is gone or stuck); ``--timeout`` makes the
    profile command stop its own workers at the same deadline. ``command``: run this instead (``sbatch --wait``
    of the trial's job script), and ``cleanup()`` after it however it ends (``scancel`` of its job); ``stop_cmd``:
    what the watchdog runs if this process dies first (the same ``scancel``)."""
    from grpo_tune.core import lifeline, safeio

    cmd = [*(profile_cmd or PROFILE_CMD), "--config", str(config_path), "--steps", str(steps), "--json", str(json_path)]
    if profile_cmd is None:
        cmd += ["--timeout", repr(float(timeout_s))]
    if command is not None:
        cmd = list(command)
    t0 = time.monotonic()
    json_path.unlink(missing_ok=True)
    try:
        log = safeio.open_write(log_path)
    except GrpoTuneError as exc:
        return ProfileOutcome("error", exc.message, None, 0.0)
    with log:
        log.write(("$ " + shlex.join(cmd) + "\n").encode())
        log.flush()
        try:
            proc = lifeline.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, sig=signal.SIGKILL)
        except OSError as exc:
            return ProfileOutcome("error", f"cannot start the profile command: {exc}", None, 0.0)
        if watchdog is not None:
            watchdog.guard(proc.pid, deadline_s=timeout_s + 2 * lifeline.GRACE_S, on_stop=stop_cmd)
        if on_start:
            on_start(proc.pid)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            return ProfileOutcome("timeout", f"timed out after {timeout_s:g} s", None, time.monotonic() - t0)
        except BaseException:  # Ctrl-C / SIGTERM of the worker: take the trial's processes down with it
            kill_group(proc.pid)
            raise
        finally:
            # torchrun's workers live in the same group; make sure none outlive the trial.
            kill_group(proc.pid)
            if watchdog is not None:
                watchdog.release(proc.pid)
            if cleanup is not None:
                cleanup()
    dt = time.monotonic() - t0
    data = None
    if json_path.exists():
        try:
            data = json.loads(safeio.read_text(json_path, max_bytes=16 << 20))
        except (OSError, json.JSONDecodeError, GrpoTuneError) as exc:
            return ProfileOutcome("error", f"unreadable profile JSON ({exc}); exit code {rc}", None, dt)
    if not isinstance(data, dict):
        return ProfileOutcome(
            "oom" if rc == 3 else "error",
            f"exit code {rc}, no profile JSON; last log lines: {_tail(log_path)}",
            None,
            dt,
        )
    try:  # the typed contract (core.profile_report) checks every field the study records
        report = ProfileReport.from_dict(data, where=str(json_path))
    except GrpoTuneError as exc:
        return ProfileOutcome("error", f"malformed profile JSON: {exc.message}", None, dt)
    data = report.to_dict()
    status = report.status.value
    if status == "ok" and rc == 0:
        if not positive(report.tokens_per_s) or not positive(report.step_s):
            return ProfileOutcome("error", "profile JSON lacks a positive tokens_per_s/step_s", data, dt)
        return ProfileOutcome("ok", None, data, dt)
    if status == "oom" or rc == 3:
        return ProfileOutcome("oom", report.message or "out of memory", data, dt)
    return ProfileOutcome("error", report.message or f"exit code {rc}: {_tail(log_path)}", data, dt)


def positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and math.isfinite(x)


def _tail(path: Path, n: int = 3) -> str:
    from grpo_tune.core import safeio

    try:
        size = os.lstat(path).st_size
        data = safeio.read_bytes(path, offset=max(0, size - 65536), max_bytes=65536)
    except (OSError, GrpoTuneError):
        return ""
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-400:]
