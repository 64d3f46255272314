"""A small TOML writer (the standard library only reads TOML): every string is escaped by the TOML
1.0 rules, so a value can never start a new key, table or line."""

from __future__ import annotations

import math
import re
from typing import Mapping

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def string(s: str) -> str:
    """A TOML basic string: quotes, backslashes and every control character escaped."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else string(k)


def value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as a TOML value")


def comment(text: str) -> str:
    """One ``#`` comment line: control characters (a newline would end the comment) become spaces."""
    return "# " + "".join(" " if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in text)


def dumps(data: Mapping[str, object], *, comments: tuple[str, ...] | list[str] = ()) -> str:
    """Top-level keys first, then one ``[table]`` per mapping value (one level, as the profiles use)."""
    lines = [comment(c) for c in comments]
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    lines += [f"{key(k)} = {value(v)}" for k, v in data.items() if k not in tables]
    for name, table in tables.items():
        lines += ["", f"[{key(name)}]"]
        lines += [f"{key(k)} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
