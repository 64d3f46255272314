"""Files inside output folders, opened the careful way.

A run folder has a predictable name, so anyone who can write next to it can plant a symbolic link
(``metrics.jsonl -> ../cfg.yaml``) or a FIFO (``checkpoints/latest.json``) in it. Every file grpo-tune
appends to, truncates or reads there goes through this module:

- opened with ``O_NOFOLLOW`` (a link at the name is refused, never followed) and ``O_NONBLOCK`` (opening
  a FIFO does not wait for a writer), then checked to be a regular file before a byte moves;
- reads are bounded (:data:`MAX_READ_BYTES` unless told otherwise), like every read of an input.

Failures are coded ``IO_ERROR`` errors that name the path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import GrpoTuneError

MAX_READ_BYTES = 64 * 1024 * 1024


def _refuse(p: Path, why: str) -> GrpoTuneError:
    return GrpoTuneError(
        f"{p} {why}; grpo-tune only writes and reads regular files in its output folders",
        code="IO_ERROR",
        hint=f"remove {p} (or choose another output folder) and run again",
    )


def _open(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    p = Path(path)
    try:
        fd = os.open(p, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(p, "is a symbolic link") from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise _refuse(p, "is not a regular file (a FIFO?)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(p, "is not a regular file")
        fl = os.get_blocking(fd)
        if not fl:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: str | os.PathLike[str]) -> BinaryIO:
    """``open(path, 'ab')``, refusing links and non-regular files."""
    return os.fdopen(_open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def open_write(path: str | os.PathLike[str]) -> BinaryIO:
    """``open(path, 'wb')``, refusing links and non-regular files (the check comes before the truncation)."""
    fd = _open(path, os.O_WRONLY | os.O_CREAT)
    os.ftruncate(fd, 0)
    return os.fdopen(fd, "wb")


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_READ_BYTES, offset: int = 0) -> bytes:
    """At most ``max_bytes`` of a regular file from ``offset`` (a link, FIFO or device is an IO_ERROR)."""
    fd = _open(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        if offset:
            fh.seek(offset)
        return fh.read(max_bytes)


def read_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_READ_BYTES) -> str:
    p = Path(path)
    data = read_bytes(p, max_bytes=max_bytes + 1)
    if len(data) > max_bytes:
        raise GrpoTuneError(
            f"{p} is larger than the {max_bytes:,}-byte limit for this file",
            code="IO_ERROR",
            hint=f"{p} is not what grpo-tune wrote there; remove it and run again",
        )
    return data.decode("utf-8", errors="replace")


def is_regular(path: str | os.PathLike[str]) -> bool:
    """A regular file, not followed through a link (for checks before a library opens the file itself)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
