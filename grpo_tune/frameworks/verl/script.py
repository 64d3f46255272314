"""Writing tuned.sh: the launch with tune's changed overrides rewritten in place."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_tune.core.errors import ConfigError
from grpo_tune.frameworks.base.inputs import Override, override
from grpo_tune.frameworks.verl import diagnose as D
from grpo_tune.frameworks.verl import snapshot as verl

if TYPE_CHECKING:
    from grpo_tune.frameworks.verl.launch import Launch

Changes = Mapping[str, tuple[object, object]]
"""verl key -> (the launch's value, the value tune chose)."""
Fixes = Mapping[str, "tuple[str, str] | None"]
"""A refused key -> ``(prefix, key)`` to write instead, or None to drop it (:func:`key_fixes`)."""


def _fmt(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "True" if v else "False"
    return str(v)


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


@dataclass(frozen=True)
class _Arg:
    """One argument of the verl command as the reader splits it (bash's word boundaries)."""

    text: str
    """What bash passes (quotes removed, variables expanded)."""
    start: int
    end: int
    """Its span in the launch's text: the whole shell word, over every line it spans."""
    raw: str

    @property
    def runtime(self) -> bool:
        return computed_at_run_time(self.raw)

    def override(self) -> Override | None:
        return override(self.text)


@dataclass
class _Read:
    """A launch's text read for rewriting: the arguments of each verl command and every other command's words."""

    args: list[list[_Arg]]
    """One list per verl command (an override list: one list, every line's words)."""
    others: list[tuple[object, ...]]
    """Every command of the script as (words, assignments, what ended it), the verl commands without their
    arguments: what must not change."""
    tails: list[int]
    """Where each verl command's last word ends (for a key added to a command that has no override)."""


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _read(text: str, kind: str) -> _Read:
    from grpo_tune.frameworks.verl.diagnose.parse import ScriptFacts, _verl_args
    from grpo_tune.frameworks.verl.diagnose.shell import ShellReader, Word

    def arg(w: Word, text_: str, off: int) -> _Arg:
        return _Arg(text_, w.start + off, w.end + off, w.raw)

    if kind != "verl_script":  # an override list: each line read on its own, as parse_override_list reads it
        args: list[_Arg] = []
        off = 0
        for raw in text.splitlines(keepends=True):
            line = raw.strip()
            at = off + len(raw) - len(raw.lstrip())
            off += len(raw)
            if not line or line.startswith("#"):
                continue
            if line.startswith("- "):
                inner = line[2:]
                at += 2 + len(inner) - len(inner.lstrip())
                line = inner.strip()
            for cmd in ShellReader(line).commands():
                args += [arg(w, f"{name}={w.value.text}", at) for name, w in cmd.assigns]
                args += [arg(w, w.value.text, at) for w in cmd.words]
        return _Read([args], [], [])
    reader = ShellReader(text)
    try:
        cmds = list(reader.commands())
    except RecursionError:
        raise ConfigError("the script nests its expansions too deeply to read") from None
    out = _Read([], [], [])
    for cmd in cmds:
        texts = [w.value.text for w in cmd.words]
        found = _verl_args(texts, cmd.line, [], ScriptFacts(config_name=None, commands=[])) if texts else None
        head = texts if found is None else texts[: len(texts) - len(found)]
        out.others.append((tuple(head), tuple((n, w.value.text) for n, w in cmd.assigns), cmd.end, found is None))
        if found is not None:
            words = cmd.words[len(cmd.words) - len(found) :]
            out.args.append([arg(w, w.value.text, 0) for w in words])
            out.tails.append(cmd.words[-1].end)
    return out


def computed_at_run_time(src: str) -> bool:
    """A value bash (``$(...)``, backticks, ``$VAR``) or OmegaConf (``${oc.env:TP,2}``) computes when the launch
    runs: tune never rewrites one (splicing into it broke the script), it says what to set instead."""
    return "`" in src or "$" in src


def _effective(a: _Arg, fixes: Fixes) -> tuple[Override, str, str] | None:
    """``(override, prefix, key)`` an argument is written with once ``fixes`` renamed its key; None for an
    argument that is no override (a flag, ``"$@"``) or one ``fixes`` drops."""
    ov = a.override()
    if ov is None or ov.prefix == "~":
        return None
    if ov.key in fixes:
        fix = fixes[ov.key]
        if fix is None:
            return None
        return ov, fix[0], fix[1]
    return ov, ov.prefix, ov.key


def runtime_values(launch: Launch, changes: Changes) -> list[tuple[str, str, object]]:
    """``(key, value as written, value tune chose)`` for each changed key whose value is computed at run time."""
    out = []
    seen: set[str] = set()
    for a in (a for cmd in _read(launch.text, launch.kind).args for a in cmd):
        eff = _effective(a, {})
        if eff is None or eff[2] not in changes or not a.runtime or eff[2] in seen:
            continue
        seen.add(eff[2])
        out.append((eff[2], a.raw.partition("=")[2] or a.raw, changes[eff[2]][1]))
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
    fixes: Fixes | None = None,
    declared: Callable[[str], bool] | None = None,
) -> str:
    """The launch with each changed override rewritten in place; keys it did not set are added just before its
    last override (with ``+`` unless ``declared(key)``: the trainer's config has it; verl's base config by
    default). ``fixes`` (:func:`key_fixes`) first renames or drops the keys verl refuses, and a comment at
    the top says so. Everything else (paths, env, comments, unrelated keys, line endings) is left byte for byte.

    Each edit replaces one whole shell word as the reader splits the script (a word continued over several lines
    by a backslash, inside quotes or not, is replaced whole). The result is read back: unless its verl command
    passes exactly the original's arguments with those edits, and every other command is unchanged, the launch
    is refused (``BAD_CONFIG``) rather than written."""
    fixes = dict(fixes or {})
    text = launch.text
    nl = _newline(text)
    before = _read(text, launch.kind)
    edits: list[tuple[int, int, str]] = []
    expected: list[list[str]] = []
    found: set[str] = set()
    for cmd in before.args:
        exp: list[str] = []
        for a in cmd:
            ov = a.override()
            if ov is not None and ov.key in fixes and fixes[ov.key] is None:  # dropped: the word and its blanks
                end = a.end
                while end < len(text) and text[end] in " \t":
                    end += 1
                edits.append((a.start, end, ""))
                continue
            eff = _effective(a, fixes)
            if eff is None:
                exp.append(a.text)
                continue
            ov, prefix, key = eff
            found.add(key)
            if key in changes and not a.runtime:
                new = changes[key][1]
                edits.append((a.start, a.end, _token(prefix, key, new)))
                exp.append(f"{prefix}{key}={_fmt(new)}")
            elif (prefix, key) != (ov.prefix, ov.key):  # renamed: the value stays as written
                m = re.match(r"['\"]?(\+{0,2}" + re.escape(ov.key) + ")=", a.raw)
                if m:
                    edits.append((a.start + m.start(1), a.start + m.end(1), f"{prefix}{key}"))
                elif not a.runtime:
                    edits.append((a.start, a.end, shlex.quote(f"{prefix}{key}={ov.raw}")))
                exp.append(f"{prefix}{key}={ov.raw}")
            else:
                exp.append(a.text)
        expected.append(exp)
    missing = []
    for key, (_old, new) in changes.items():
        if key not in found:
            known = declared(key) if declared is not None else verl.key_status(key) == "declared"
            plus = "" if known else "+"
            missing.append((_token(plus, key, new), f"{plus}{key}={_fmt(new)}"))
    if missing and launch.kind == "verl_script" and before.args:
        cmd, exp = before.args[-1], expected[-1]
        last = next((a for a in reversed(cmd) if a.override() is not None), None)
        if last is not None:  # new lines go just above the last override, which stays as the user wrote it
            bol = text.rfind("\n", 0, last.start) + 1
            indent = text[bol : last.start] if not text[bol : last.start].strip() else "    "
            edits.append((last.start, last.start, "".join(f"{t} \\{nl}{indent}" for t, _ in missing)))
            k = len([a for a in cmd[: cmd.index(last)] if not _dropped(a, fixes)])
            exp[k:k] = [e for _, e in missing]
        else:
            at = before.tails[-1]
            edits.append((at, at, "".join(f" {t}" for t, _ in missing)))
            exp += [e for _, e in missing]
    elif missing:
        tail = "" if not text or text.endswith(("\n", "\r")) else nl
        edits.append((len(text), len(text), tail + "".join(f"{t}{nl}" for t, _ in missing)))
        expected[-1:] = [(expected[-1] if expected else []) + [e for _, e in missing]]
    out = text
    for a0, b0, rep in sorted(set(edits), reverse=True):  # a word an array passes twice is edited once
        out = out[:a0] + rep + out[b0:]
    after = _read(out, launch.kind)
    got = [[a.text for a in cmd] for cmd in after.args]
    if got != expected or after.others != before.others:
        raise ConfigError(
            f"{launch.path}: tune cannot rewrite this launch so that it passes exactly the arguments it passed, "
            "with only the changed values: no tuned file written",
            hint="write each override tune changes as one plain word on one line (key=value, no quote or "
            "backslash that spans lines), or set the values it prints yourself",
        )
    head = fixes_header(launch, fixes)
    if head:
        at = out.find("\n") + 1 if out.startswith("#!") else 0
        if out.startswith("#!") and at == 0:
            out, at = out + nl, len(out) + len(nl)
        out = out[:at] + "".join(h + nl for h in head) + out[at:]
    return out


def _dropped(a: _Arg, fixes: Fixes) -> bool:
    ov = a.override()
    return ov is not None and ov.key in fixes and fixes[ov.key] is None


def parse_value_str(raw: str):
    """An override value as Hydra reads it (the inverse of how tuned.sh writes it)."""
    return D.parse_value(raw)


def diff_lines(changes: Changes) -> list[str]:
    out = []
    for key, (old, new) in changes.items():
        out.append(f"- {key}={_fmt(old)}")
        out.append(f"+ {key}={_fmt(new)}")
    return out
