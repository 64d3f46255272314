"""Output paths checked before anything runs or is written: never a folder, never one of the inputs,
always in a writable folder. (Outputs are then replaced atomically: core.config.atomic_write.)"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from grpo_tune.core.errors import ConfigError

PathIn = str | os.PathLike | None
Inputs = Mapping[str, PathIn | Iterable[PathIn]]
"""The command's inputs, ``{option: path or paths}``: a collision names the option it collides with."""


def _named(inputs: Inputs) -> list[tuple[str, Path]]:
    """(option, path) of every given input."""
    out = []
    for opt, v in inputs.items():
        vals = [v] if v is None or isinstance(v, (str, os.PathLike)) else list(v)
        out += [(opt, Path(i)) for i in vals if i is not None]
    return out


def check_output(path: str | os.PathLike, option: str, *, inputs: Inputs | None = None) -> Path:
    """``path`` can be written as a file: raise BAD_CONFIG now, before any work, when it cannot."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{option} {p} is a folder", hint=f"give {option} a file name")
    for opt, i in _named(inputs or {}):
        if _same(p, i):
            raise ConfigError(
                f"{option} {p} is also an input of this command ({opt} {i}); writing it would destroy the input",
                hint=f"give {option} another file name",
            )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise ConfigError(f"{option} {p}: the folder {parent} does not exist", hint="create it first")
    if not parent.is_dir():
        raise ConfigError(f"{option} {p}: {parent} is not a folder", hint=f"give {option} a path inside a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {p}: the folder {parent} is not writable", hint="choose a writable folder")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{option} {p} is not writable", hint="choose another file name")
    return p


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    try:  # realpath, not resolve(): two links to each other made resolve() raise (RuntimeError: Symlink loop)
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, RuntimeError, ValueError):
        return os.path.abspath(a) == os.path.abspath(b)


def check_out_dir(path: str | os.PathLike, option: str, *, inputs: Inputs | None = None) -> Path:
    """``path`` is (or can become) a writable folder that holds none of the inputs' own paths."""
    p = Path(path)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in str(p)):  # a newline in a folder name breaks every log line
        raise ConfigError(
            f"{option} {str(p)!r} holds a control character (a newline?)",
            hint=f"give {option} a folder name of printable characters",
        )
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{option} {p} is a file, not a folder", hint=f"give {option} a folder (it is created)")
    for opt, i in _named(inputs or {}):
        if i.exists() and p.exists() and _same(p, i):
            # e.g. `search --calibration runs` with the default --out runs: say which input, and how to move --out
            raise ConfigError(
                f"{option} {p} (where the run folder would go) is also an input of this command ({opt} {i})",
                hint=f"give {option} another folder (e.g. {option} {p.name}-out), or pass {opt} a path other than {i}",
            )
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(
            f"{option} {p}: {probe} is a file, so the folder cannot be created",
            hint=f"give {option} a path under a folder",
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {p}: {probe} is not writable", hint="choose a writable folder")
    return p
