"""Inputs -> verl overrides: a bash launch script, a Hydra override list, or a YAML file.

Files, YAML and single overrides are read as every framework reads them (:mod:`grpo_tune.frameworks.base.inputs`:
bounded, linear in the input's size); this module adds what is verl's: its launch scripts and override lists.
"""

from __future__ import annotations

import re
from typing import TypedDict


from grpo_tune.frameworks.verl import snapshot as verl

from grpo_tune.core.errors import ConfigError
from grpo_tune.frameworks.base.findings import Finding, Severity
from grpo_tune.frameworks.base.inputs import OVERRIDE_TOKEN, Override, override
from grpo_tune.frameworks.verl.diagnose.shell import Command, ShellReader, Word

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO

# Hydra's own command-line flags (hydra/_internal/utils.py get_args_parser); value-taking ones map to True.
ASYNC_ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
"""verl 0.9.1's fully-async trainer (separate rollout and training pools; frameworks/verl/fully_async.py)."""
ONE_STEP_ENTRY = "verl.experimental.one_step_off_policy.main_ppo"
"""verl 0.9.1's one-step-off trainer (separate pools, staleness 1; frameworks/verl/one_step_off.py)."""
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


class ScriptFacts(TypedDict):
    """What a launch script says besides its overrides: verl's ``--config-name`` and the verl entry points run."""

    config_name: str | None
    commands: list[str]


def parse_script(text: str) -> tuple[list[Override], list[Finding], ScriptFacts]:
    """Overrides passed to verl in a bash launch script, plus parse-level findings and facts
    (``config_name``, ``commands``)."""
    findings = _layout_findings(text)
    reader = ShellReader(text.replace("\r\n", "\n"))
    overrides: list[Override] = []
    facts = ScriptFacts(config_name=None, commands=[])
    verl_line: int | None = None
    stray: list[int] = []
    try:
        cmds = list(reader.commands())
    except RecursionError:  # ${A:-${A:-...}} thousands deep: bash itself gives up long before
        raise ConfigError(
            "the script nests its expansions too deeply to read (${A:-${B:-...}} thousands of levels)",
            hint="a verl launch nests a few levels at most; check the script",
        ) from None
    for cmd in cmds:
        texts = [w.value.text for w in cmd.words]
        if not texts:
            continue
        args = _verl_args(texts, cmd.line, findings, facts)
        if args is None:
            if verl_line is not None and OVERRIDE_TOKEN.fullmatch(texts[0]) and "." in texts[0].split("=", 1)[0]:
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


def _verl_args(tokens: list[str], lineno: int, findings: list[Finding], facts: ScriptFacts) -> list[str] | None:
    """The arguments after verl's entry point on this command, or None when it runs something else."""
    for i, tok in enumerate(tokens):
        base = tok.rsplit("/", 1)[-1]
        if tok == ONE_STEP_ENTRY and i > 0 and tokens[i - 1] == "-m" or tok.endswith("one_step_off_policy/main_ppo.py"):
            facts["commands"].append("one_step_off")  # separate pools, staleness 1 (frameworks/verl/one_step_off.py)
            return tokens[i + 1 :]
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
    words: list[Word], facts: ScriptFacts, overrides: list[Override], findings: list[Finding], prefixed: set[str]
) -> None:
    i = 0
    while i < len(words):
        w = words[i]
        tok, v, lineno = w.value.text, w.value, w.line
        i += 1
        if not tok and v.unresolved and not v.caller_args:
            findings.append(
                Finding(
                    W,
                    "BAD_CONFIG",
                    f"line {lineno}: {w.raw} expands to nothing: the script does not set {v.unresolved[0]}",
                    "set it in the script (an array cannot come from the caller's environment)",
                    line=lineno,
                )
            )
            continue
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


def _flag(name: str, value: str, takes: bool | None, lineno: int, facts: ScriptFacts, findings: list[Finding]) -> None:
    if name in ("--config-name", "-cn"):
        # Hydra finds `name.yaml` for `name` and for `name.yaml` alike (verl's own examples write both)
        facts["config_name"] = re.sub(r"\.ya?ml$", "", value)
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
