"""Writing tuned.sh: the launch with tune's changed overrides rewritten in place (split from autotune/tune.py)."""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Any

from grpo_tune.autotune import diagnose as D
from grpo_tune.autotune import verl

if TYPE_CHECKING:
    from grpo_tune.autotune.tune_launch import Launch


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "True" if v else "False"
    return str(v)


def _word_span(line: str, start: int) -> tuple[int, int]:
    """The shell word of ``line`` that contains position ``start`` (quotes respected)."""
    i = start
    # walk back to the word's start (a quote that opens it belongs to it)
    while i > 0 and not line[i - 1].isspace():
        i -= 1
    j, quote = i, None
    while j < len(line):
        ch = line[j]
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                j += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "\\" and j + 1 < len(line) and not line[j + 1].isspace():
            j += 1
        elif ch.isspace():
            break
        j += 1
    return i, j


def _token(prefix: str, key: str, value: Any) -> str:
    return shlex.quote(f"{prefix}{key}={_fmt(value)}")


def tuned_text(launch: Launch, changes: dict[str, tuple[Any, Any]]) -> str:
    """The launch with each changed override rewritten in place; keys it did not set are added after its
    last override. Everything else (paths, env, comments, unrelated keys) is left byte for byte."""
    lines = launch.text.split("\n")
    missing: list[str] = []
    for key, (_old, new) in changes.items():
        ov = launch.values.get(key)
        if ov is None or ov.line is None:
            plus = "+" if verl.key_status(key) != "declared" else ""
            missing.append(_token(plus, key, new))
            continue
        idx = ov.line - 1
        pat = re.compile(r"(?<![\w.+])\+{0,2}" + re.escape(key) + r"=")
        m = None
        for j in range(idx, min(idx + 3, len(lines))):
            m = pat.search(lines[j])
            if m:
                idx = j
                break
        if m is None:
            missing.append(_token("", key, new))
            continue
        a, b = _word_span(lines[idx], m.start())
        lines[idx] = lines[idx][:a] + _token(ov.prefix or "", key, new) + lines[idx][b:]
    if missing:
        last = max((o.line for o in launch.overrides if o.line), default=None)
        if launch.kind == "verl_script" and last is not None:
            src = lines[last - 1]
            indent = src[: len(src) - len(src.lstrip())]
            if last >= 2 and lines[last - 2].rstrip().endswith("\\"):
                # new lines go just above the last override line, which stays as the user wrote it
                lines[last - 1 : last - 1] = [f"{indent}{t} \\" for t in missing]
            else:
                lines[last - 1] = src.rstrip() + " \\"
                lines[last:last] = [f"{indent}{t} \\" for t in missing[:-1]] + [f"{indent}{missing[-1]}"]
        else:
            tail = "" if launch.text.endswith("\n") else "\n"
            return launch.text + tail + "\n".join(missing) + "\n"
    return "\n".join(lines)


def parse_value_str(raw: str):
    """An override value as Hydra reads it (the inverse of how tuned.sh writes it)."""
    return D.parse_value(raw)


def diff_lines(changes: dict[str, tuple[Any, Any]]) -> list[str]:
    out = []
    for key, (old, new) in changes.items():
        out.append(f"- {key}={_fmt(old)}")
        out.append(f"+ {key}={_fmt(new)}")
    return out
