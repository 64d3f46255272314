"""Inputs -> verl overrides: a bash launch script, a Hydra override list, or a YAML file.

Reading is bounded: regular files only, at most :data:`MAX_INPUT_BYTES`; YAML with at most
:data:`MAX_YAML_NODES` nodes once aliases are expanded and :data:`MAX_YAML_DEPTH` levels (a
"billion laughs" file is refused, not expanded). Every step is linear in the input's size.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.core.config import _Loader, flow_depth
from grpo_tune.core.errors import ConfigError

from grpo_tune.frameworks.verl.diagnose.findings import Finding, Severity
from grpo_tune.frameworks.verl.diagnose.shell import Command, ShellReader, Word

MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO

# Hydra's own command-line flags (hydra/_internal/utils.py get_args_parser); value-taking ones map to True.
ASYNC_ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
"""verl 0.9.1's fully-async trainer (separate rollout and training pools; frameworks/verl/fully_async.py)."""
HYDRA_FLAGS = {
    "--config-name": True,
    "-cn": True,
    "--config-path": True,
    "-cp": True,
    "--config-dir": True,
    "-cd": True,
    "--cfg": True,
    "-c": True,
    "--package": True,
    "-p": True,
    "--info": False,
    "-i": False,
    "--resolve": False,
    "--multirun": False,
    "-m": False,
    "--run": False,
    "-r": False,
    "--help": False,
    "-h": False,
    "--hydra-help": False,
    "--version": False,
    "--shell-completion": False,
    "-sc": False,
    "--experimental-rerun": True,
}
DIAGNOSE_PY_FLAGS = ("--check-parallel", "--check-memory", "--check-data-types")


def is_interpolation(raw: str) -> bool:
    """``${oc.env:TP,2}``, ``${actor.tp}``: an OmegaConf interpolation (resolved by Hydra, not by bash)."""
    return bool(re.search(r"\$\{[^}]*[.:][^}]*\}", raw or ""))


@dataclass
class Override:
    key: str
    value: Any
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
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if nid in size:
            continue
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


def load_yaml(text: str, where: str) -> tuple[Any, list[tuple[str, int]]]:
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


def parse_value(raw: str) -> Any:
    """A Hydra override value as Hydra's grammar reads it (bool, null, int, float, list, string)."""
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
        return [parse_value(x) for x in inner.split(",")] if inner else []
    return v


_OVERRIDE = re.compile(r"(\+\+|\+|~)?([A-Za-z_][\w\-@/]*(?:\.[\w\-@/]+)*)=(.*)", re.S | re.ASCII)


def override(
    token: str, line: int | None = None, *, unresolved: bool = False, unevaluable: str | None = None
) -> Override | None:
    m = _OVERRIDE.fullmatch(token)
    if not m:
        return None
    prefix = cast(Literal["", "+", "++", "~"], m.group(1) or "")  # what _OVERRIDE's first group matches
    key, raw = m.group(2), m.group(3)
    value = raw if unevaluable else parse_value(raw)
    return Override(
        key=key, value=value, raw=raw, prefix=prefix, line=line, unresolved=unresolved, unevaluable=unevaluable
    )


def parse_override_list(text: str) -> tuple[list[Override], list[Finding]]:
    """One or more Hydra overrides per line (``#`` comments, optional ``- `` list markers)."""
    out: list[Override] = []
    findings: list[Finding] = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("- "):
            line = line[2:].strip()
        for cmd in ShellReader(line).commands():
            toks = [(f"{name}={w.value.text}", w.value) for name, w in cmd.assigns] + [
                (w.value.text, w.value) for w in cmd.words
            ]
            for tok, v in toks:
                ov = override(tok, i, unresolved=bool(v.unresolved), unevaluable=", ".join(v.unevaluable) or None)
                if ov is None:
                    findings.append(Finding(W, "BAD_CONFIG", f"line {i}: {tok!r} is not a key=value override", line=i))
                elif ov.prefix != "~":
                    out.append(ov)
    return out, findings


def from_mapping(tree: dict, prefix: str = "") -> list[Override]:
    """A verl-style YAML config (nested keys) read as overrides."""
    return [Override(key=k, value=v, raw=str(v)) for k, v in verl.flatten(tree, prefix).items() if k]


# ---------------------------------------------------------------------------------------------
# Launch scripts
# ---------------------------------------------------------------------------------------------


def _layout_findings(text: str) -> list[Finding]:
    """Line-level traps bash springs silently: CRLF, a backslash followed by a blank or a comment."""
    out: list[Finding] = []
    if "\r\n" in text:
        n = text.count("\r\n")
        out.append(
            Finding(
                E,
                "BAD_CONFIG",
                f"the script has Windows (CRLF) line endings on {n} line(s): bash keeps "
                "the \\r in each word and ends the command at every line, so the overrides after the "
                "first line never reach verl",
                "convert it: dos2unix SCRIPT (or sed -i 's/\\r$//')",
            )
        )
    for i, line in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        m = re.search(r"\\[ \t]+(#.*)?$", line)
        if m:
            what = (
                "a comment after the line-continuation backslash"
                if m.group(1)
                else "a blank after the line-continuation backslash"
            )
            out.append(
                Finding(
                    W if m.group(1) else E,
                    "BAD_CONFIG",
                    f"line {i}: {what} ends the command in bash; the lines after it never reach verl",
                    "put comments on their own line, before the command; end the line with the backslash itself",
                    line=i,
                )
            )
    return out


def parse_script(text: str) -> tuple[list[Override], list[Finding], dict[str, Any]]:
    """Overrides passed to verl in a bash launch script, plus parse-level findings and facts
    (``config_name``, ``commands``)."""
    findings = _layout_findings(text)
    reader = ShellReader(text.replace("\r\n", "\n"))
    overrides: list[Override] = []
    facts: dict[str, Any] = {"config_name": None, "commands": []}
    verl_line: int | None = None
    stray: list[int] = []
    for cmd in reader.commands():
        texts = [w.value.text for w in cmd.words]
        if not texts:
            continue
        args = _verl_args(texts, cmd.line, findings, facts)
        if args is None:
            if verl_line is not None and _OVERRIDE.fullmatch(texts[0]) and "." in texts[0].split("=", 1)[0]:
                # what the author meant as part of the verl command: checked too, and reported as cut off
                stray.append(cmd.line)
                _parse_args(cmd.words, facts, overrides, findings, set())
            continue
        verl_line = cmd.line
        words = cmd.words[len(cmd.words) - len(args) :]
        prefixed = {name for name, _ in cmd.assigns}
        _parse_args(words, facts, overrides, findings, prefixed)
    if reader.unclosed is not None:
        findings.append(
            Finding(
                E,
                "BAD_CONFIG",
                f"line {reader.unclosed}: a quote opened here never closes; bash "
                "refuses the whole script (syntax error) and runs nothing",
                "close the quote",
                line=reader.unclosed,
            )
        )
    if stray:
        findings.append(
            Finding(
                E,
                "BAD_CONFIG",
                f"line(s) {', '.join(map(str, stray[:8]))}"
                f"{' ...' if len(stray) > 8 else ''}: overrides that bash runs as their own "
                f"command, after the verl command (line {verl_line}) has ended",
                "end each line of the verl command with a backslash and nothing after it",
                line=stray[0],
            )
        )
    if not facts["commands"]:
        findings.append(
            Finding(
                W,
                "UNKNOWN_COMMAND",
                "no `python3 -m verl.trainer.main_ppo` command found",
                "verl's entry point is `python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer ...`",
            )
        )
    return overrides, findings, facts


def _verl_args(tokens: list[str], lineno: int, findings: list[Finding], facts: dict) -> list[str] | None:
    """The arguments after verl's entry point on this command, or None when it runs something else."""
    for i, tok in enumerate(tokens):
        base = tok.rsplit("/", 1)[-1]
        if tok == "verl.trainer.main_ppo" and i > 0 and tokens[i - 1] == "-m" or base == "main_ppo.py":
            facts["commands"].append("main_ppo")
            return tokens[i + 1 :]
        if tok == ASYNC_ENTRY and i > 0 and tokens[i - 1] == "-m" or base == "fully_async_main.py":
            facts["commands"].append("fully_async_main")  # separate pools (frameworks/verl/fully_async.py)
            return tokens[i + 1 :]
        if base == "verl-train":
            facts["commands"].append("verl-train")
            findings.append(
                Finding(
                    E,
                    "UNKNOWN_COMMAND",
                    f"line {lineno}: `verl-train` is not a verl command",
                    "run `python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer key=value ...`; "
                    "`grpo-tune search` writes such a script (verl.sh)",
                    line=lineno,
                )
            )
            return tokens[i + 1 :]
        if base == "diagnose.py":
            facts["commands"].append("diagnose.py")
            flags = [t for t in tokens[i + 1 :] if t in DIAGNOSE_PY_FLAGS]
            findings.append(
                Finding(
                    E if flags else W,
                    "UNKNOWN_COMMAND",
                    f"line {lineno}: verl's scripts/diagnose.py only checks the environment"
                    + (f"; it has no {', '.join(flags)}" if flags else ""),
                    "`grpo-tune diagnose SCRIPT` checks degrees, batch sizes, memory and dtypes of a verl launch",
                    line=lineno,
                )
            )
            return None
    return None


def _parse_args(
    words: list[Word], facts: dict, overrides: list[Override], findings: list[Finding], prefixed: set[str]
) -> None:
    i = 0
    while i < len(words):
        w = words[i]
        tok, v, lineno = w.value.text, w.value, w.line
        i += 1
        if (v.caller_args and not tok) or not tok.strip(" \t"):
            continue  # "$@" (the caller's extra arguments), or the blank of "\ " (reported by _layout_findings)
        if tok.startswith("-"):
            name, _, inline = tok.partition("=")
            takes = HYDRA_FLAGS.get(name)
            value = inline
            if (
                (takes or takes is None)
                and not inline
                and i < len(words)
                and "=" not in words[i].value.text
                and not words[i].value.text.startswith("-")
            ):
                value = words[i].value.text
                i += 1
            _flag(name, value, takes, lineno, facts, findings)
            continue
        unev = ", ".join(v.unevaluable) or None
        ov = override(tok, lineno, unresolved=bool(v.unresolved), unevaluable=unev)
        if ov is None:
            findings.append(
                Finding(W, "BAD_CONFIG", f"line {lineno}: {tok!r} is not a key=value override", line=lineno)
            )
            continue
        if v.literal_dollar and is_interpolation(ov.raw):
            findings.append(
                Finding(
                    W,
                    "BAD_CONFIG",
                    f"line {lineno}: {ov.key}={ov.raw} is an OmegaConf interpolation: Hydra resolves it when verl "
                    "loads its config, so grpo-tune cannot know the value and prices the key's default",
                    "keep the single quotes (in double quotes bash would expand ${...} itself and stop with "
                    "'bad substitution'); to have it priced, write the value itself",
                    key=ov.key,
                    line=lineno,
                )
            )
        elif v.literal_dollar:
            findings.append(
                Finding(
                    W,
                    "BAD_CONFIG",
                    f"line {lineno}: {ov.key}={ov.raw}: bash does not expand `$` "
                    "inside single quotes, so verl receives the text literally",
                    'use double quotes ("key=$VAR") or none',
                    key=ov.key,
                    line=lineno,
                )
            )
        used = [n for n in v.unresolved if n in prefixed]
        if used:
            findings.append(
                Finding(
                    E,
                    "BAD_CONFIG",
                    f"line {lineno}: {ov.key} uses ${used[0]}, which is set only as "
                    f"a prefix assignment ({used[0]}=... cmd): bash expands the arguments before "
                    "that assignment applies, so verl gets the caller's value or nothing",
                    f"set {used[0]} on its own line before the command",
                    key=ov.key,
                    line=lineno,
                )
            )
        if ov.prefix == "~":
            continue  # deletion: nothing to check
        overrides.append(ov)


def _flag(name: str, value: str, takes: bool | None, lineno: int, facts: dict, findings: list[Finding]) -> None:
    if name in ("--config-name", "-cn"):
        facts["config_name"] = value
    elif name in ("--config-path", "-cp", "--config-dir", "-cd") and value.endswith(
        "experimental/fully_async_policy/config"
    ):
        pass  # the fully-async trainer's own config folder inside the installed verl
    elif name in ("--config-path", "-cp", "--config-dir", "-cd"):
        findings.append(
            Finding(
                I,
                "BAD_CONFIG",
                f"line {lineno}: custom config folder {value!r}",
                f"keys are checked against verl {verl.VERL_VERSION}'s stock config",
                line=lineno,
            )
        )
    elif name == "--dry-run":
        findings.append(
            Finding(
                E,
                "UNKNOWN_COMMAND",
                f"line {lineno}: verl has no --dry-run flag (Hydra rejects it)",
                "Hydra's `--cfg job` prints the composed config without training; "
                "`grpo-tune diagnose SCRIPT` checks it and prints the Parallel Config Summary",
                line=lineno,
            )
        )
    elif takes is None:
        hint = "verl takes Hydra overrides (key=value), not --flags" + (
            "; use --config-path/--config-name for a config file" if name == "--config" else ""
        )
        findings.append(Finding(E, "UNKNOWN_COMMAND", f"line {lineno}: unknown flag {name}", hint, line=lineno))


def script_commands(text: str) -> list[Command]:
    """Every simple command of a script (for tests and tools)."""
    return list(ShellReader(text.replace("\r\n", "\n")).commands())
