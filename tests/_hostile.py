"""Helpers shared by the hostile-input tests (test_hostile_input.py, test_fuzz_cli.py)."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def within(seconds: int):
    """A hang (a FIFO or /dev/zero read forever, a runaway loop) becomes a TimeoutError instead of a stuck test.
    SIGALRM: the main thread of a POSIX process only, as pytest runs these tests."""

    def boom(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
