"""Reading the files that describe a model, a GPU or a software stack: a regular file under a size cap
(:func:`read_spec_bytes`), and a TOML profile parsed with coded errors (core.specs and core.stacks read them)."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

from .errors import ConfigError

MAX_SPEC_BYTES = 1024 * 1024
"""A model/hardware TOML or config.json is a few KiB; anything over this is not one (and is not read)."""


def read_spec_bytes(path: Path, what: str) -> bytes:
    """A regular file's bytes, at most MAX_SPEC_BYTES: a FIFO, a device or a huge file is refused unread."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path} is not a regular file", hint=f"pass a {what} file")
        if st.st_size > MAX_SPEC_BYTES:
            raise ConfigError(f"{path} is {st.st_size} bytes: too large for a {what}", hint=f"pass a {what} file")
        with open(path, "rb") as fh:
            return fh.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})", hint="check the path and its permissions") from None


def _read_toml(path: Path, where: str) -> dict[str, object]:
    data = read_spec_bytes(path, "TOML profile")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file", hint="a profile is UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})", hint="fix the file's syntax") from None
    except RecursionError:
        raise ConfigError(f"{path}: the TOML nests too deeply", hint="a profile has one level of tables") from None
