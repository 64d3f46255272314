"""Inputs every framework reads the same way: bounded text files, YAML with limits, Hydra-style overrides.

Reading is bounded: regular files only, at most :data:`MAX_INPUT_BYTES`; YAML with at most
:data:`MAX_YAML_NODES` nodes once aliases are expanded and :data:`MAX_YAML_DEPTH` levels (a
"billion laughs" file is refused, not expanded). Every step is linear in the input's size.
Also the text guards of the files a framework writes (:func:`check_name`, :func:`comment_safe`).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from grpo_tune.core.config import _Loader, flow_depth
from grpo_tune.core.errors import ConfigError

MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64


@dataclass
class Override:
    key: str
    value: object
    raw: str
    prefix: Literal["", "+", "++", "~"] = ""
    """Hydra's: ``""``, ``+`` (add), ``++`` (add or override) or ``~`` (delete; diagnose drops those)."""
    line: int | None = None
    unresolved: bool = False
    """The value holds a variable the script does not set (it may come from the caller)."""
    unevaluable: str | None = None
    """A construct diagnose does not evaluate (``$(...)``): the value is unknown, not wrong."""


# ---------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------


def read_text(path: str | os.PathLike, *, limit: int = MAX_INPUT_BYTES, what: str = "input") -> str:
    """A regular file's text, at most ``limit`` bytes; FIFOs, devices and folders are refused unread."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(f"no file at {p}", hint=f"pass an existing {what} file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror}", hint="check the path and its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{p} is a folder", hint="pass a file (for a search run: runs/<id>/best.yaml)")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{p} is not a regular file (a device, FIFO or socket)", hint=f"pass a {what} file")
    if st.st_size > limit:
        raise ConfigError(
            f"{p} is {st.st_size} bytes, over the {limit}-byte limit for a {what}",
            hint="pass the launch script or config itself, not a log or data file",
        )
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror}", hint="check the path and its permissions") from None
    if len(data) > limit:
        raise ConfigError(f"{p} grew over the {limit}-byte limit while being read", hint=f"pass a {what} file")
    if b"\x00" in data:
        raise ConfigError(f"{p} is not a text file (it holds NUL bytes)", hint=f"pass a {what} file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p} is not UTF-8 text", hint=f"pass a {what} file") from None


class _StrictLoader(_Loader):
    """core's YAML loader, recording duplicate keys instead of silently keeping the last one."""

    duplicates: list[tuple[str, int]]

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                k = key_node.value
                if k in seen:
                    self.duplicates.append((k, key_node.start_mark.line + 1))
                seen.add(k)
        return super().construct_mapping(node, deep=deep)


def _check_size(root: yaml.Node | None, where: str) -> None:
    """Refuse YAML whose alias-expanded size or depth is over the limits (iterative, memoised: linear)."""
    if root is None:
        return
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    """Nodes entered and not yet finished: the ancestors of the node popped (a depth-first walk)."""
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if nid in size:
            continue
        if not done and nid in open_:  # an alias inside the node it names (`rec: &r` / `  - *r`)
            raise ConfigError(
                f"{where}: line {node.start_mark.line + 1}: the YAML refers to itself (an alias used inside the "
                "node its anchor names): a loop, not a config",
                hint="replace the alias (*name) inside its own anchor (&name) by the values themselves",
            )
        open_.add(nid)
        kids = (
            [c for kv in node.value for c in kv]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if not done:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            if len(stack) > 4 * MAX_YAML_NODES:
                break
            continue
        open_.discard(nid)
        size[nid] = 1 + sum(size.get(id(k), 1) for k in kids)
        depth[nid] = 1 + max((depth.get(id(k), 1) for k in kids), default=0)
        if size[nid] > MAX_YAML_NODES:
            raise ConfigError(
                f"{where}: the YAML expands to more than {MAX_YAML_NODES} nodes (aliases)",
                hint="a verl config has a few hundred keys; remove the alias chain",
            )
        if depth[nid] > MAX_YAML_DEPTH:
            raise ConfigError(
                f"{where}: the YAML nests deeper than {MAX_YAML_DEPTH} levels",
                hint="a verl config nests a few levels; check the file",
            )


def load_yaml(text: str, where: str) -> tuple[object, list[tuple[str, int]]]:
    """(data, duplicate keys with their lines). Refuses over-deep or over-large (aliased) documents."""
    if flow_depth(text) > MAX_YAML_DEPTH:
        raise ConfigError(
            f"{where}: the YAML nests deeper than {MAX_YAML_DEPTH} levels",
            hint="a verl config nests a few levels; check the file",
        )
    loader = _StrictLoader(text)
    loader.duplicates = []
    try:
        root = loader.get_single_node()
        _check_size(root, where)
        data = loader.construct_document(root) if root is not None else None
    except RecursionError:
        raise ConfigError(
            f"{where}: the YAML nests too deeply to read",
            hint=f"a verl config nests a few levels (limit {MAX_YAML_DEPTH})",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{where}: not valid YAML ({str(exc).splitlines()[0]})",
            hint="check the indentation and quoting near that line",
        ) from None
    finally:
        loader.dispose()
    return data, loader.duplicates


# ---------------------------------------------------------------------------------------------
# Values and overrides
# ---------------------------------------------------------------------------------------------

# ASCII digits only: Hydra's grammar reads "４" (full-width) as a string, and so must we.
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


MAX_VALUE_DEPTH = 64
"""The deepest list an override value may nest (``[[[...]]]``); a config nests a few levels."""


def parse_value(raw: str, _depth: int = 0) -> object:
    """A Hydra override value as Hydra's grammar reads it (bool, null, int, float, list, string)."""
    if _depth > MAX_VALUE_DEPTH:
        raise ConfigError(
            f"an override value nests lists deeper than {MAX_VALUE_DEPTH} levels ({raw[:40]}...)",
            hint="a verl or NeMo-RL value nests a few levels at most; check the override",
        )
    v = raw.strip(" \t")
    low = v.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if low in ("null", "~"):
        return None
    if _INT.fullmatch(v):
        # Python refuses int() of over 4300 digits; no verl setting has more than a handful: keep the text
        return int(v) if len(v) <= 64 else v
    if _FLOAT.fullmatch(v):
        return float(v)
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    if v.startswith("[") and v.endswith("]"):
        inner = v[1:-1].strip()
        return [parse_value(x, _depth + 1) for x in inner.split(",")] if inner else []
    return v


OVERRIDE_TOKEN = re.compile(r"(\+\+|\+|~)?([A-Za-z_][\w\-@/]*(?:\.[\w\-@/]+)*)=(.*)", re.S | re.ASCII)


def override(
    token: str, line: int | None = None, *, unresolved: bool = False, unevaluable: str | None = None
) -> Override | None:
    m = OVERRIDE_TOKEN.fullmatch(token)
    if not m:
        return None
    prefix = cast(Literal["", "+", "++", "~"], m.group(1) or "")  # what OVERRIDE_TOKEN's first group matches
    key, raw = m.group(2), m.group(3)
    value = raw if unevaluable else parse_value(raw)
    return Override(
        key=key, value=value, raw=raw, prefix=prefix, line=line, unresolved=unresolved, unevaluable=unevaluable
    )


# ---------------------------------------------------------------------------------------------
# Text written into launch files
# ---------------------------------------------------------------------------------------------


def check_name(value: str, what: str) -> str:
    """Refuse control characters (a newline in a name starts a new shell command or TOML key)."""
    bad = next((ch for ch in value if ord(ch) < 32 or ord(ch) == 127), None)
    if bad is not None:
        raise ConfigError(
            f"{what} {value!r} holds a control character ({ord(bad):#04x})", hint="use printable characters only"
        )
    return value


def comment_safe(text: str) -> str:
    """Text safe inside one ``#`` comment line."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def as_int(v: object, key: str) -> int:
    """A value read from a framework's config as the integer the plan needs (a coded error otherwise)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise ConfigError(f"{key} must be an integer, got {v!r}", hint=f"set {key} to a whole number")


def as_names(v: object, key: str) -> tuple[str, ...]:
    """A value read from a framework's config as a list of names (None: none)."""
    if v is None:
        return ()
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise ConfigError(f"{key} must be a list of names, got {v!r}")
