"""Writing tuned.sh: the launch with tune's changed overrides rewritten in place."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from grpo_tune.frameworks.verl import diagnose as D
from grpo_tune.frameworks.verl import snapshot as verl

if TYPE_CHECKING:
    from grpo_tune.frameworks.base.inputs import Override
    from grpo_tune.frameworks.verl.launch import Launch

Changes = Mapping[str, tuple[object, object]]
"""verl key -> (the launch's value, the value tune chose)."""


def _fmt(v: object) -> str:
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


def _token(prefix: str, key: str, value: object) -> str:
    return shlex.quote(f"{prefix}{key}={_fmt(value)}")


def key_fixes(launch: Launch) -> dict[str, tuple[str, str] | None]:
    """For each key of the launch that verl's Hydra refuses (diagnose's key errors): ``(prefix, key)`` to write
    instead (a blog-only key's real twin, or the ``+`` Hydra needs or refuses), or None to drop it. tuned.sh
    applies them, so that it passes ``grpo-tune diagnose``."""
    first: dict[str, Override] = {}
    for o in launch.overrides:
        first.setdefault(o.key, o)
    out: dict[str, tuple[str, str] | None] = {}
    for f in launch.refused():
        key = f.key
        if key is None or key in out or key not in first:
            continue
        ov, status = first[key], verl.key_status(key)
        if key in launch.renames:
            out[key] = ("", launch.renames[key])
        elif status == "declared" and ov.prefix:
            out[key] = ("", key)  # `+` on a key verl declares
        elif f.code == "BAD_CONFIG" and status != "parent" and not ov.prefix:
            out[key] = ("+", key)  # a free-form key (or a real TransformerConfig field) Hydra adds only with `+`
        else:
            out[key] = None
    return out


def fixes_header(launch: Launch, fixes: dict[str, tuple[str, str] | None]) -> list[str]:
    """Comment lines saying what tuned.sh changed besides the plan (a renamed or dropped key)."""
    out = []
    for key, fix in fixes.items():
        if fix is None:
            out.append(f"# grpo-tune tune: dropped {key} (verl {verl.VERL_VERSION} refuses it: no such key)")
        elif fix[1] != key:
            out.append(f"# grpo-tune tune: {key} written as {fix[1]} (the key verl {verl.VERL_VERSION} reads)")
        else:
            out.append(f"# grpo-tune tune: {key} written as {fix[0]}{key} (as Hydra requires)")
    return [" ".join(ln.split()) for ln in out]


def _find(lines: list[str], line: int | None, key: str) -> tuple[int, re.Match[str]] | None:
    if line is None:
        return None
    pat = re.compile(r"(?<![\w.+])\+{0,2}" + re.escape(key) + r"=")
    for j in range(line - 1, min(line + 2, len(lines))):
        m = pat.search(lines[j])
        if m:
            return j, m
    return None


def _source_value(lines: list[str], idx: int, m: re.Match[str]) -> str:
    """The value of ``key=`` as the script spells it, up to the end of its shell word (a backtick or ``$(`` word
    may hold blanks: it runs to the matching close)."""
    ln = lines[idx]
    j, depth, tick, quote = m.end(), 0, False, None
    while j < len(ln):
        ch = ln[j]
        if quote:
            if ch == quote:
                quote = None
        elif ch == "`":
            tick = not tick
        elif ln.startswith("$(", j):
            depth += 1
            j += 1
        elif ch == ")" and depth:
            depth -= 1
        elif ch in "'\"" and not tick:
            quote = ch
        elif ch.isspace() and not tick and not depth:
            break
        j += 1
    return ln[m.end() : j]


def computed_at_run_time(src: str) -> bool:
    """A value bash (``$(...)``, backticks, ``$VAR``) or OmegaConf (``${oc.env:TP,2}``) computes when the launch
    runs: tune never rewrites one (splicing into it broke the script), it says what to set instead."""
    return "`" in src or "$" in src


def runtime_values(launch: Launch, changes: Changes) -> list[tuple[str, str, object]]:
    """``(key, value as written, value tune chose)`` for each changed key whose value is computed at run time."""
    lines = launch.text.split("\n")
    out = []
    for key, (_old, new) in changes.items():
        ov = launch.values.get(key)
        hit = _find(lines, ov.line, key) if ov is not None else None
        if hit is None:
            continue
        src = _source_value(lines, *hit)
        if computed_at_run_time(src):
            out.append((key, src, new))
    return out


def runtime_notes(launch: Launch, changes: Changes) -> list[str]:
    """One line per value tune left alone because it is computed at run time."""
    return [
        f"{key}={src}: value computed at run time, left as written: set it yourself to {_fmt(new)}"
        for key, src, new in runtime_values(launch, changes)
    ]


def tuned_text(
    launch: Launch,
    changes: Changes,
    fixes: dict[str, tuple[str, str] | None] | None = None,
    declared: Callable[[str], bool] | None = None,
) -> str:
    """The launch with each changed override rewritten in place; keys it did not set are added after its
    last override (with ``+`` unless ``declared(key)``: the trainer's config has it; verl's base config by
    default). ``fixes`` (:func:`key_fixes`) first renames or drops the keys verl refuses, and a comment at
    the top says so. Everything else (paths, env, comments, unrelated keys) is left byte for byte."""
    lines = launch.text.split("\n")
    first: dict[str, Override] = {}
    for o in launch.overrides:
        first.setdefault(o.key, o)
    for key, fix in (fixes or {}).items():
        ov = first.get(key)
        hit = _find(lines, ov.line if ov else None, key)
        if ov is None or hit is None:
            continue
        idx, m = hit
        ln = lines[idx]
        if fix is None:  # the whole shell word goes (a line left with only its `\` still continues the command)
            a, b = _word_span(ln, m.start())
            lines[idx] = ln[:a] + ln[b:].lstrip(" ")
        else:  # only the key part: the value stays as written (quotes, ${VAR} included)
            lines[idx] = ln[: m.start()] + f"{fix[0]}{fix[1]}=" + ln[m.end() :]
    missing: list[str] = []
    for key, (_old, new) in changes.items():
        ov = launch.values.get(key)
        if ov is None or ov.line is None:
            known = declared(key) if declared is not None else verl.key_status(key) == "declared"
            plus = "" if known else "+"
            missing.append(_token(plus, key, new))
            continue
        hit = _find(lines, ov.line, key)
        if hit is None:
            missing.append(_token("", key, new))
            continue
        idx, m = hit
        if computed_at_run_time(_source_value(lines, idx, m)):
            continue  # byte for byte as written; runtime_notes() tells the user the value to set
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
            if lines and lines[-1] == "":
                lines.pop()
            lines += missing + [""]
    head = fixes_header(launch, fixes or {})
    if head:
        at = 1 if lines and lines[0].startswith("#!") else 0
        lines[at:at] = head
    return "\n".join(lines)


def parse_value_str(raw: str):
    """An override value as Hydra reads it (the inverse of how tuned.sh writes it)."""
    return D.parse_value(raw)


def diff_lines(changes: Changes) -> list[str]:
    out = []
    for key, (old, new) in changes.items():
        out.append(f"- {key}={_fmt(old)}")
        out.append(f"+ {key}={_fmt(new)}")
    return out
