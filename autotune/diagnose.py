"""``diagnose``: coded findings for a grpo-tune run config, a verl launch script or a Hydra override list.

Every input becomes a set of verl 0.9.1 overrides (a run config through :func:`export.verl_overrides`),
which are checked against verl's real key tree (the shipped snapshot, see :mod:`autotune.verl`),
verl's and Megatron's own divisibility rules, and the cost model's memory estimate when the model
maps to a preset or a local config.json.

Severity rules, decided here:
- the reference's degrees must equal the actor's (verl builds Megatron's process groups once, from
  the actor's degrees): any difference is an **error** (TP/PP/CP/EP_MISMATCH);
- the rollout only has TP in verl's vLLM path; a rollout TP that differs from the actor's TP is
  legal (weights are resharded at weight sync) and is reported as **info**; a rollout TP that does
  not divide the world size is an **error**, and one wider than a node is a **warning**;
- rollout PP > 1 with vLLM is an **error** (not implemented in verl).
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from core.config import yaml_load
from autotune import verl
from core.errors import CODES, ConfigError, GrpoTuneError, InvalidDegreesError, close_matches
from core.specs import HardwareSpec, ModelSpec, from_hf_config, list_models, load_hardware, load_model
from core.strategy import Cluster, Strategy, Workload, validate

ARO = "actor_rollout_ref"
ACTOR = f"{ARO}.actor"
REF = f"{ARO}.ref"
ROLLOUT = f"{ARO}.rollout"
OTC = f"{ACTOR}.megatron.override_transformer_config"
REF_OTC = f"{REF}.megatron.override_transformer_config"

SEVERITIES = ("error", "warning", "info")

# verl engine key -> our degree name
DEGREES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
           "vpp": "virtual_pipeline_model_parallel_size", "cp": "context_parallel_size",
           "ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size"}
MISMATCH_CODE = {"tp": "TP_MISMATCH", "pp": "PP_MISMATCH", "vpp": "PP_MISMATCH", "cp": "CP_MISMATCH",
                 "ep": "EP_MISMATCH", "etp": "EP_MISMATCH"}

# Keys that circulate in blog posts but do not exist in verl 0.9.1: key -> (real key or None, why).
RENAMES: dict[str, tuple[str | None, str]] = {
    "algorithm.group_size": (f"{ROLLOUT}.n", "GRPO's group size is the number of rollouts per prompt"),
    "training.batch_size": ("data.train_batch_size", "prompts per step"),
    "training.epochs": ("trainer.total_epochs", "epochs over the dataset"),
    "training.gradient_accumulation_steps": (
        None, "verl derives it: each update runs ppo_mini_batch_size x n / (DP x ppo_micro_batch_size_per_gpu) "
              "micro-batches; set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu instead"),
    f"{ACTOR}.megatron.grad_offload": (
        f"{ACTOR}.megatron.param_offload",
        "verl 0.9.1 has no grad_offload: param_offload also releases the gradient buffers while inactive"),
    f"{REF}.megatron.grad_offload": (f"{REF}.megatron.param_offload", "verl 0.9.1 has no grad_offload"),
}
# Last key component -> (real key, why), wherever it appears.
LEAF_RENAMES: dict[str, tuple[str | None, str]] = {
    "kl_coeff": (f"{ACTOR}.kl_loss_coef",
                 "or algorithm.kl_ctrl.kl_coef (with algorithm.use_kl_in_reward=True) for a KL penalty in the reward"),
    "group_size": (f"{ROLLOUT}.n", "GRPO's group size is the number of rollouts per prompt"),
    "moe_router_load_balance": (f"{OTC}.moe_router_load_balancing_type",
                                "Megatron's field takes aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none"),
}

# Hydra's own command-line flags (hydra/_internal/utils.py get_args_parser); value-taking ones map to True.
HYDRA_FLAGS = {"--config-name": True, "-cn": True, "--config-path": True, "-cp": True, "--config-dir": True,
               "-cd": True, "--cfg": True, "-c": True, "--package": True, "-p": True, "--info": False, "-i": False,
               "--resolve": False, "--multirun": False, "-m": False, "--run": False, "-r": False, "--help": False,
               "-h": False, "--hydra-help": False, "--version": False, "--shell-completion": False, "-sc": False,
               "--experimental-rerun": True}
DIAGNOSE_PY_FLAGS = ("--check-parallel", "--check-memory", "--check-data-types")


@dataclass
class Finding:
    severity: str
    code: str
    message: str
    hint: str = ""
    key: str | None = None
    phase: str | None = None
    bytes: int | None = None
    line: int | None = None

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"bad severity {self.severity!r}")
        if self.code not in CODES:
            raise ValueError(f"unregistered code {self.code!r}")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ""}


@dataclass
class Report:
    source: str
    kind: str
    """``run_config``, ``verl_script``, ``overrides`` or ``verl_yaml``."""
    findings: list[Finding] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def count(self, severity: str) -> int:
        return sum(f.severity == severity for f in self.findings)

    @property
    def has_errors(self) -> bool:
        return self.count("error") > 0

    @property
    def exit_code(self) -> int:
        return 1 if self.has_errors else 0

    def codes(self, severity: str | None = None) -> set[str]:
        return {f.code for f in self.findings if severity is None or f.severity == severity}

    def to_dict(self) -> dict[str, Any]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return {"source": self.source, "kind": self.kind, "summary": self.summary,
                "errors": self.count("error"), "warnings": self.count("warning"),
                "findings": [f.to_dict() for f in sorted(self.findings, key=lambda f: order[f.severity])]}


@dataclass
class Override:
    key: str
    value: Any
    raw: str
    prefix: str = ""
    """``""``, ``+`` (add) or ``++`` (add or override)."""
    line: int | None = None
    unresolved: bool = False
    """The value still holds a ``$VAR`` the script does not define."""


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def parse_value(raw: str) -> Any:
    """A Hydra override value as Hydra's grammar reads it (bool, null, int, float, list, string)."""
    v = raw.strip()
    low = v.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    if low in ("null", "~"):
        return None
    if _INT.match(v):
        return int(v)
    if _FLOAT.match(v):
        return float(v)
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    if v.startswith("[") and v.endswith("]"):
        inner = v[1:-1].strip()
        return [parse_value(x) for x in inner.split(",")] if inner else []
    return v


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, env: dict[str, str]) -> tuple[str, bool]:
    """Expand ``$VAR``, ``${VAR}`` and ``${VAR:-default}`` from the script's own assignments.

    Returns the text and whether a variable stayed unresolved (left as written). ``$HOME`` is
    left alone without counting as unresolved: it only appears in paths.
    """
    unresolved = False

    def sub(m: re.Match) -> str:
        nonlocal unresolved
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        if m.group(2) is not None:
            return expand(m.group(2), env)[0]
        if name not in ("HOME", "PWD", "USER"):
            unresolved = True
        return m.group(0)

    return _VAR.sub(sub, text), unresolved


def _logical_lines(text: str) -> tuple[list[tuple[int, str]], list[Finding]]:
    """Join backslash continuations; flag ``\\  # comment``, which ends the command in bash."""
    out: list[tuple[int, str]] = []
    findings: list[Finding] = []
    buf, start = "", None
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw
        m = re.search(r"\\[ \t]+#.*$", line)
        if m:
            findings.append(Finding(
                "warning", "BAD_CONFIG",
                f"line {i}: a comment after the line-continuation backslash ends the command in bash; "
                "the lines after it never reach verl", "put comments on their own line, before the command", line=i))
            line = line[:m.start()] + "\\"
        if start is None:
            start = i
        stripped = line.rstrip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            buf += stripped[:-1] + " "
            continue
        buf += line
        out.append((start, buf))
        buf, start = "", None
    if buf.strip():
        out.append((start or 1, buf))
    return out, findings


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][\w\-@/]*(?:\.[\w\-@/]+)*)=(.*)$", re.S)


def _override(token: str, env: dict[str, str], line: int | None) -> Override | None:
    m = _OVERRIDE.match(token)
    if not m:
        return None
    prefix, key, raw = m.group(1) or "", m.group(2), m.group(3)
    text, unresolved = expand(raw, env)
    return Override(key=key, value=parse_value(text), raw=text, prefix=prefix, line=line, unresolved=unresolved)


def parse_script(text: str) -> tuple[list[Override], list[Finding], dict[str, Any]]:
    """Overrides passed to verl in a bash launch script, plus parse-level findings and facts
    (``config_name``, ``commands``)."""
    lines, findings = _logical_lines(text)
    physical = text.splitlines()

    def line_of(token: str, start: int) -> int:
        """The physical line (1-based) at or after ``start`` where ``token`` is written."""
        needle = token.split("=", 1)[0] + ("=" if "=" in token else "")
        for j in range(start - 1, len(physical)):
            if needle in physical[j]:
                return j + 1
        return start

    env: dict[str, str] = {}
    overrides: list[Override] = []
    facts: dict[str, Any] = {"config_name": None, "commands": []}
    for lineno, line in lines:
        try:
            tokens = shlex.split(line, comments=True, posix=True)
        except ValueError as exc:
            findings.append(Finding("error", "BAD_CONFIG", f"line {lineno}: cannot split the shell line ({exc})",
                                    "close the quote", line=lineno))
            continue
        if not tokens:
            continue
        if tokens[0] == "export":
            tokens = tokens[1:]
        # leading NAME=value words are shell assignments (for the rest of the script, or this command)
        k = 0
        while k < len(tokens) and _ASSIGN.match(tokens[k]) and "." not in tokens[k].split("=", 1)[0]:
            name, val = _ASSIGN.match(tokens[k]).groups()
            env[name] = expand(val, env)[0]
            k += 1
        tokens = tokens[k:]
        if not tokens:
            continue
        args = _verl_args(tokens, lineno, findings, facts)
        if args is None:
            continue
        _parse_args(args, env, lambda tok, _l=lineno: line_of(tok, _l), overrides, findings, facts)
    if not facts["commands"]:
        findings.append(Finding("warning", "UNKNOWN_COMMAND", "no `python3 -m verl.trainer.main_ppo` command found",
                                "verl's entry point is `python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer ...`"))
    return overrides, findings, facts


def _verl_args(tokens: list[str], lineno: int, findings: list[Finding], facts: dict) -> list[str] | None:
    """The arguments after verl's entry point on this line, or None when the line runs something else."""
    for i, tok in enumerate(tokens):
        base = tok.rsplit("/", 1)[-1]
        if tok == "verl.trainer.main_ppo" and i > 0 and tokens[i - 1] == "-m" or base == "main_ppo.py":
            facts["commands"].append("main_ppo")
            return tokens[i + 1:]
        if base == "verl-train":
            facts["commands"].append("verl-train")
            findings.append(Finding(
                "error", "UNKNOWN_COMMAND", f"line {lineno}: `verl-train` is not a verl command",
                "run `python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer key=value ...`; "
                "`grpo-tune search` writes such a script (verl.sh)", line=lineno))
            return tokens[i + 1:]
        if base == "diagnose.py":
            facts["commands"].append("diagnose.py")
            flags = [t for t in tokens[i + 1:] if t in DIAGNOSE_PY_FLAGS]
            findings.append(Finding(
                "error" if flags else "warning", "UNKNOWN_COMMAND",
                f"line {lineno}: verl's scripts/diagnose.py only checks the environment"
                + (f"; it has no {', '.join(flags)}" if flags else ""),
                "`grpo-tune diagnose SCRIPT` checks degrees, batch sizes, memory and dtypes of a verl launch",
                line=lineno))
            return None
    return None


def _parse_args(args: list[str], env: dict[str, str], line_of, overrides: list[Override],
                findings: list[Finding], facts: dict) -> None:
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        lineno = line_of(tok)
        if re.fullmatch(r"\$\{?[@*]\}?", tok):
            continue  # the caller's extra arguments
        if tok in ("|", "||", "&&", ";", "&") or re.match(r"^\d*[<>]", tok):
            break  # a pipe or redirection ends verl's arguments

        if tok.startswith("-"):
            name, _, inline = tok.partition("=")
            takes = HYDRA_FLAGS.get(name)
            value = inline
            if (takes or takes is None) and not inline and i < len(args) and "=" not in args[i] \
                    and not args[i].startswith("-"):
                value = args[i]
                i += 1
            if name in ("--config-name", "-cn"):
                facts["config_name"] = expand(value, env)[0]
            elif name in ("--config-path", "-cp", "--config-dir", "-cd"):
                findings.append(Finding("info", "BAD_CONFIG", f"line {lineno}: custom config folder {value!r}",
                                        f"keys are checked against verl {verl.VERL_VERSION}'s stock config", line=lineno))
            elif name == "--dry-run":
                findings.append(Finding(
                    "error", "UNKNOWN_COMMAND", f"line {lineno}: verl has no --dry-run flag (Hydra rejects it)",
                    "Hydra's `--cfg job` prints the composed config without training; "
                    "`grpo-tune diagnose SCRIPT` checks it and prints the Parallel Config Summary", line=lineno))
            elif takes is None:
                hint = ("verl takes Hydra overrides (key=value), not --flags"
                        + ("; use --config-path/--config-name for a config file" if name == "--config" else ""))
                findings.append(Finding("error", "UNKNOWN_COMMAND", f"line {lineno}: unknown flag {name}", hint,
                                        line=lineno))
            continue
        ov = _override(tok, env, lineno)
        if ov is None:
            findings.append(Finding("warning", "BAD_CONFIG", f"line {lineno}: {tok!r} is not a key=value override",
                                    line=lineno))
            continue
        if ov.prefix == "~":
            continue  # deletion: nothing to check
        overrides.append(ov)


def parse_override_list(text: str) -> tuple[list[Override], list[Finding]]:
    """One Hydra override per line (``#`` comments, optional ``- `` list markers)."""
    out: list[Override] = []
    findings: list[Finding] = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("- "):
            line = line[2:].strip()
        try:
            toks = shlex.split(line, comments=True)
        except ValueError:
            toks = [line]
        for tok in toks:
            ov = _override(tok, {}, i)
            if ov is None:
                findings.append(Finding("warning", "BAD_CONFIG", f"line {i}: {tok!r} is not a key=value override", line=i))
            elif ov.prefix != "~":
                out.append(ov)
    return out, findings


def _from_mapping(tree: dict, prefix: str = "") -> list[Override]:
    """A verl-style YAML config (nested keys) read as overrides."""
    return [Override(key=k, value=v, raw=str(v)) for k, v in verl.flatten(tree, prefix).items() if k]


# ---------------------------------------------------------------------------------------------
# Model lookup
# ---------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _hf_ids() -> dict[str, str]:
    out = {}
    for name in list_models():
        m = load_model(name)
        if m.hf_id:
            out[m.hf_id.lower()] = name
    return out


_SUFFIXES = ("-instruct", "-chat", "-base", "-it", "-hf", "-fp8", "-bf16")


def resolve_model(path: Any) -> tuple[ModelSpec | None, str]:
    """Map verl's ``actor_rollout_ref.model.path`` to a preset or a local config.json."""
    if path is None or not isinstance(path, str) or not path.strip() or path == "???":
        return None, "actor_rollout_ref.model.path is not set"
    p = Path(os.path.expanduser(path))
    try:
        if p.is_dir() and (p / "config.json").is_file():
            return from_hf_config(p / "config.json"), f"read {p / 'config.json'}"
        if p.name == "config.json" and p.is_file():
            return from_hf_config(p), f"read {p}"
    except (GrpoTuneError, OSError, ValueError) as exc:
        return None, f"{p}: {exc}"
    key = path.strip().rstrip("/").lower()
    names = [key, key.rsplit("/", 1)[-1]]
    for n in list(names):
        for suf in _SUFFIXES:
            if n.endswith(suf):
                names.append(n[: -len(suf)])
    for n in names:
        if n in _hf_ids():
            return load_model(_hf_ids()[n]), f"{path} -> preset {_hf_ids()[n]}"
        if "/" not in n and "$" not in n:
            try:
                m = load_model(n)
                return m, f"{path} -> preset {m.name}"
            except GrpoTuneError:
                pass
    if "$" in path:
        return None, f"model path {path} comes from an unset variable"
    return None, f"model path {path} maps to no preset and has no local config.json"


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def transformer_config_fields() -> frozenset[str]:
    path = verl.DATA_DIR / "megatron-core-0.16.1-transformer-config-fields.txt"
    return frozenset(l.strip() for l in path.read_text().splitlines() if l.strip() and not l.startswith("#"))


class _Ctx:
    def __init__(self, overrides: list[Override], findings: list[Finding]):
        self.items: dict[str, Override] = {}
        for ov in overrides:
            self.items[ov.key] = ov  # the last one wins, as in Hydra
        self.f = findings

    def add(self, severity: str, code: str, message: str, hint: str = "", key: str | None = None, **kw) -> None:
        line = self.items[key].line if key in self.items else None
        self.f.append(Finding(severity, code, message, hint, key=key, line=line, **kw))

    def raw(self, key: str) -> Any:
        return self.items[key].value if key in self.items else verl.default(key)

    def set(self, key: str) -> bool:
        return key in self.items

    def int_(self, key: str, *, allow_none: bool = False, inherit: Any = "<none>") -> int | None:
        """A positive int, or None (reported) when the value cannot be used."""
        if key not in self.items and inherit != "<none>":
            return inherit
        v = self.raw(key)
        ov = self.items.get(key)
        if ov is not None and ov.unresolved:
            self.add("warning", "BAD_CONFIG", f"{key}={ov.raw} comes from a variable the script does not set; "
                     "checks that need it are skipped", "give the variable a default: ${VAR:-4}", key=key)
            return None
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            self.add("error", "BAD_CONFIG", f"{key}={v!r} must be a positive integer", key=key)
            return None
        return v

    def bool_(self, key: str) -> bool | None:
        v = self.raw(key)
        if isinstance(v, bool):
            return v
        if v is None:
            return None
        self.add("error", "BAD_CONFIG", f"{key}={v!r} must be true or false", key=key)
        return None


def _check_keys(c: _Ctx) -> None:
    fields = transformer_config_fields()
    for key, ov in c.items.items():
        status = verl.key_status(key)
        leaf = key.rsplit(".", 1)[-1]
        if status == "declared":
            # Hydra's `+` merges a list/dict value into an existing key but refuses a scalar
            # (hydra/_internal/config_loader_impl.py, _apply_overrides_to_config)
            if ov.prefix == "+" and verl.default(key) is not None and not isinstance(ov.value, (list, dict)):
                c.add("error", "BAD_CONFIG", f"+{key}: the key already exists in verl's config, and Hydra refuses "
                      "to add it again", f"drop the `+`: {key}={ov.raw}", key=key)
            continue
        if status == "parent":
            if not isinstance(ov.value, (list, dict)) and ov.value is not None:
                c.add("error", "BAD_CONFIG", f"{key}={ov.raw} replaces a whole section of verl's config with a value",
                      f"set a key inside it, e.g. {next(k for k in verl.snapshot() if k.startswith(key + '.'))}=...",
                      key=key)
            continue
        otc = next((p for p in (OTC, REF_OTC) if key.startswith(p + ".")), None)
        if otc is not None:
            sub = key[len(otc) + 1:]
            name = sub.split(".", 1)[0]
            if name in LEAF_RENAMES:
                real, why = LEAF_RENAMES[name]
                c.add("error", "UNKNOWN_KEY", f"{key}: Megatron's TransformerConfig has no field {name!r}",
                      f"use +{real}=... ({why})", key=key)
            elif name not in fields:
                near = close_matches(name, fields, n=1)
                c.add("error", "UNKNOWN_KEY",
                      f"{key}: Megatron's TransformerConfig (megatron-core 0.16.1) has no field {name!r}; "
                      "verl passes it on and the model build fails",
                      f"did you mean {otc}.{near[0]}?" if near else "remove it", key=key)
            elif not ov.prefix:
                c.add("error", "BAD_CONFIG", f"{key} is not declared in verl's config: Hydra refuses it without `+`",
                      f"write +{key}={ov.raw}", key=key)
            continue
        if status == "open":
            if not ov.prefix:
                c.add("error", "BAD_CONFIG", f"{key} is not declared in verl's config: Hydra refuses it without `+`",
                      f"write +{key}={ov.raw}", key=key)
            continue
        # unknown
        real, why = RENAMES.get(key) or LEAF_RENAMES.get(leaf) or (None, "")
        sev = "warning" if ov.prefix else "error"
        tail = " (Hydra adds it with `+`, but verl never reads it)" if ov.prefix else ""
        if real or why:
            hint = (f"use {real}" if real else "") + (f" ({why})" if real and why else why)
            c.add(sev, "UNKNOWN_KEY", f"{key} does not exist in verl {verl.VERL_VERSION}{tail}", hint, key=key)
            continue
        cands = verl.leaf_names().get(leaf, [])
        if cands:
            best = max(cands, key=lambda k: len(os.path.commonprefix([k, key])))
            hint = f"did you mean {best}?"
        else:
            near = close_matches(key, verl.snapshot().keys(), n=1)
            hint = f"did you mean {near[0]}?" if near else "see verl's ppo_megatron_trainer config"
        c.add(sev, "UNKNOWN_KEY", f"{key} does not exist in verl {verl.VERL_VERSION}{tail}", hint, key=key)


def _degrees(c: _Ctx) -> dict[str, dict[str, Any]]:
    actor = {d: c.int_(f"{ACTOR}.megatron.{k}", allow_none=d in ("vpp", "etp")) for d, k in DEGREES.items()}
    ref = {d: c.int_(f"{REF}.megatron.{k}", allow_none=d in ("vpp", "etp"), inherit=actor[d])
           for d, k in DEGREES.items()}
    for role in (actor, ref):
        role["vpp"] = role["vpp"] or 1
        if role["etp"] is None:
            role["etp"] = role["tp"]
    rollout = {"tp": c.int_(f"{ROLLOUT}.tensor_model_parallel_size"),
               "pp": c.int_(f"{ROLLOUT}.pipeline_model_parallel_size"),
               "gpu_memory_utilization": c.raw(f"{ROLLOUT}.gpu_memory_utilization"),
               "name": c.raw(f"{ROLLOUT}.name")}
    return {"actor": actor, "ref": ref, "rollout": rollout}


def _check_degrees(c: _Ctx, roles: dict, world: int | None, gpn: int | None, model: ModelSpec | None) -> bool:
    """Returns True when the degrees are sound enough for a memory estimate."""
    actor, ref, rollout = roles["actor"], roles["ref"], roles["rollout"]
    ok = all(actor[d] is not None for d in DEGREES) and world is not None
    for d, k in DEGREES.items():
        key = f"{REF}.megatron.{k}"
        if c.set(key) and ref[d] is not None and actor[d] is not None and ref[d] != actor[d]:
            c.add("error", MISMATCH_CODE[d], f"reference {k}={ref[d]} differs from the actor's {actor[d]}",
                  f"verl builds Megatron's process groups once, from the actor's degrees: set {key}={actor[d]} "
                  "or drop the line (it defaults to the actor's)", key=key)
            ok = False
    tp, pp, cp, ep, etp, vpp = (actor[d] for d in ("tp", "pp", "cp", "ep", "etp", "vpp"))
    if world is not None and None not in (tp, pp, cp):
        mp = tp * pp * cp
        if world % mp:
            c.add("error", "INVALID_DEGREES",
                  f"world size {world} is not divisible by TP x PP x CP = {tp} x {pp} x {cp} = {mp}",
                  "choose degrees whose product divides trainer.n_gpus_per_node x trainer.nnodes",
                  key=f"{ACTOR}.megatron.tensor_model_parallel_size")
            ok = False
        elif None not in (ep, etp):
            dp = world // mp
            # Megatron's MoE parallel folding: world % (ETP x EP x PP) == 0
            # (megatron/core/parallel_state.py, initialize_model_parallel)
            if (tp * cp * dp) % (ep * etp):
                c.add("error", "EXPERT_DEGREES",
                      f"EP x ETP = {ep} x {etp} = {ep * etp} does not divide TP x CP x DP = {tp} x {cp} x {dp} = {tp * cp * dp}",
                      "lower expert_model_parallel_size or expert_tensor_parallel_size (ETP may differ from TP; "
                      "Moonlight runs TP4/EP4/ETP1)", key=f"{ACTOR}.megatron.expert_model_parallel_size")
                ok = False
    if vpp > 1 and pp is not None and pp == 1:
        c.add("error", "INVALID_DEGREES", "virtual_pipeline_model_parallel_size > 1 needs pipeline_model_parallel_size > 1",
              key=f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size")
        ok = False
    if model is not None and ep is not None:
        if model.is_moe and model.experts % ep:
            c.add("error", "EXPERT_IMBALANCE", f"EP={ep} does not divide the {model.experts} experts of {model.name}",
                  f"use an EP among {', '.join(str(d) for d in range(1, model.experts + 1) if model.experts % d == 0)}",
                  key=f"{ACTOR}.megatron.expert_model_parallel_size")
            ok = False
    elif model is None and ep and ep > 1:
        c.add("info", "EXPERT_IMBALANCE", f"EP={ep}: the model is unknown, so EP against the expert count is not checked")
    sp = c.raw(f"{ACTOR}.megatron.sequence_parallel")
    if sp is True and tp == 1 and c.set(f"{ACTOR}.megatron.sequence_parallel"):
        c.add("info", "BAD_CONFIG", "sequence_parallel=True has no effect at TP=1 (verl turns it off)",
              key=f"{ACTOR}.megatron.sequence_parallel")
    # rollout
    rtp, rpp = rollout["tp"], rollout["pp"]
    if rtp is not None and world is not None:
        if world % rtp:
            c.add("error", "INVALID_DEGREES", f"rollout TP={rtp} does not divide the world size {world}",
                  "verl requires rollout world % rollout TP == 0", key=f"{ROLLOUT}.tensor_model_parallel_size")
            ok = False
        if gpn is not None and rtp > gpn:
            c.add("warning", "TP_MISMATCH", f"rollout TP={rtp} spans nodes of {gpn} GPUs",
                  "vLLM all-reduces every decoded token across TP: keep rollout TP within a node",
                  key=f"{ROLLOUT}.tensor_model_parallel_size")
    if rtp is not None and tp is not None and rtp != tp:
        c.add("info", "TP_MISMATCH", f"rollout TP={rtp} differs from the actor's TP={tp}: legal in verl "
              "(weights are resharded at each weight sync)",
              "a smaller rollout TP gives more vLLM replicas (throughput) but more KV-cache memory per GPU",
              key=f"{ROLLOUT}.tensor_model_parallel_size")
    if rpp is not None and rpp > 1 and rollout["name"] == "vllm":
        c.add("error", "PP_MISMATCH", f"rollout pipeline_model_parallel_size={rpp}: verl's vLLM rollout has no PP",
              f"set {ROLLOUT}.pipeline_model_parallel_size=1 and raise rollout TP", key=f"{ROLLOUT}.pipeline_model_parallel_size")
        ok = False
    if rollout["name"] in ("???", None):
        c.add("error", "BAD_CONFIG", f"{ROLLOUT}.name is mandatory in verl {verl.VERL_VERSION}",
              f"add {ROLLOUT}.name=vllm (or sglang)")
    gmu = rollout["gpu_memory_utilization"]
    if isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0 < gmu <= 1:
        c.add("error", "BAD_CONFIG", f"{ROLLOUT}.gpu_memory_utilization={gmu!r} must be a fraction in (0, 1]",
              key=f"{ROLLOUT}.gpu_memory_utilization")
        ok = False
    # model-dependent degree rules (heads, layers, VPP, rollout TP vs heads) via the cost model's validator
    if ok and model is not None and rtp is not None:
        try:
            validate(model, _strategy(c, roles), world, gpus_per_node=gpn, allow_cross_node_tp=True)
        except InvalidDegreesError as exc:
            c.add("error", "INVALID_DEGREES", exc.message, exc.hint)
            ok = False
        except ConfigError as exc:
            c.add("error", exc.code, exc.message, exc.hint)
            ok = False
    return ok


def _strategy(c: _Ctx, roles: dict) -> Strategy:
    a, r = roles["actor"], roles["rollout"]
    gran = c.raw(f"{OTC}.recompute_granularity")
    method = c.raw(f"{OTC}.recompute_method")
    nlayers = c.raw(f"{OTC}.recompute_num_layers")
    recompute = gran if gran in ("selective", "full") else "none"
    rlayers = nlayers if recompute == "full" and method == "block" and isinstance(nlayers, int) and nlayers > 0 else None
    offload = []
    if c.raw(f"{ACTOR}.megatron.param_offload") is True:
        offload += ["param", "grad"]
    if c.raw(f"{ACTOR}.megatron.optimizer_offload") is True:
        offload.append("optimizer")
    first = c.raw(f"{OTC}.num_layers_in_first_pipeline_stage")
    last = c.raw(f"{OTC}.num_layers_in_last_pipeline_stage")
    mbs = c.raw(f"{ACTOR}.ppo_micro_batch_size_per_gpu")
    sp = c.raw(f"{ACTOR}.megatron.sequence_parallel")
    return Strategy.from_dict(dict(
        tp=a["tp"], pp=a["pp"], vpp=a["vpp"], cp=a["cp"], ep=a["ep"], etp=a["etp"],
        mbs=mbs if isinstance(mbs, int) and not isinstance(mbs, bool) and mbs > 0 else 1,
        sequence_parallel=bool(sp) if isinstance(sp, bool) else None, recompute=recompute, recompute_layers=rlayers,
        distributed_optimizer=c.raw(f"{ACTOR}.megatron.use_distributed_optimizer") is not False,
        offload=offload, first_stage_layers=first if isinstance(first, int) and first > 0 else None,
        last_stage_layers=last if isinstance(last, int) and last > 0 else None,
        rollout_tp=r["tp"], gpu_memory_utilization=float(r["gpu_memory_utilization"])))


def _check_batches(c: _Ctx, dp: int | None) -> dict[str, Any]:
    """verl 0.9.1's batch rules (verl/utils/config.py validate_config, workers/config/actor.py
    ActorConfig.validate, workers/engine_workers.py train_mini_batch)."""
    tb = c.int_("data.train_batch_size")
    n = c.int_(f"{ROLLOUT}.n")
    mini = c.int_(f"{ACTOR}.ppo_mini_batch_size")
    micro = c.int_(f"{ACTOR}.ppo_micro_batch_size_per_gpu", allow_none=True)
    dyn = c.bool_(f"{ACTOR}.use_dynamic_bsz")
    out = {"train_batch_size": tb, "n": n, "ppo_mini_batch_size": mini, "ppo_micro_batch_size_per_gpu": micro,
           "use_dynamic_bsz": dyn}
    if n == 1 and c.raw("algorithm.adv_estimator") == "grpo":
        c.add("warning", "BAD_CONFIG", f"{ROLLOUT}.n=1: with one response per prompt every GRPO advantage is 0",
              f"set {ROLLOUT}.n to the group size (e.g. 5 or 8)", key=f"{ROLLOUT}.n")
    if dyn:
        return out
    mkey = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    if micro is None and c.raw(mkey) is None:
        c.add("error", "BATCH_DIVISIBILITY", f"{mkey} is not set; verl requires it unless use_dynamic_bsz=True",
              f"add {mkey}=1 (or more if memory allows)")
    for role in (ROLLOUT, REF):
        k = f"{role}.log_prob_micro_batch_size_per_gpu"
        if role == REF and c.raw(f"{ACTOR}.use_kl_loss") is not True and c.raw("algorithm.use_kl_in_reward") is not True:
            continue
        if c.raw(k) is None and c.raw(f"{role}.log_prob_micro_batch_size") is None:
            c.add("error", "BATCH_DIVISIBILITY", f"{k} is not set; verl requires it unless use_dynamic_bsz=True",
                  f"add {k}={micro or 1}")
    if None in (tb, n, mini):
        return out
    if mini > tb:
        c.add("error", "BATCH_DIVISIBILITY", f"ppo_mini_batch_size={mini} exceeds data.train_batch_size={tb}",
              "verl requires mini <= train batch (both count prompts)", key=f"{ACTOR}.ppo_mini_batch_size")
    elif tb % mini:
        c.add("warning", "BATCH_DIVISIBILITY", f"data.train_batch_size={tb} is not a multiple of ppo_mini_batch_size={mini}",
              "the last mini-batch of each step is smaller", key=f"{ACTOR}.ppo_mini_batch_size")
    if dp is None or micro is None:
        return out
    if (tb * n) % (dp * micro):
        c.add("error", "BATCH_DIVISIBILITY",
              f"train_batch_size x n = {tb} x {n} = {tb * n} is not divisible by DP x micro = {dp} x {micro} = {dp * micro}",
              "verl asserts (train_batch_size * n) % (DP * ppo_micro_batch_size_per_gpu) == 0",
              key="data.train_batch_size")
    if (mini * n) % dp:
        c.add("error", "BATCH_DIVISIBILITY",
              f"ppo_mini_batch_size x n = {mini} x {n} = {mini * n} sequences do not split over DP={dp}",
              "verl's engine asserts mini_batch_size % DP == 0 at the first update", key=f"{ACTOR}.ppo_mini_batch_size")
    elif ((mini * n) // dp) % micro:
        c.add("warning", "BATCH_DIVISIBILITY",
              f"each rank's mini-batch ({mini * n // dp} sequences) is not a multiple of the micro-batch {micro}",
              "the last micro-batch of each update is smaller", key=mkey)
    return out


_FP32 = ("fp32", "float32", "torch.float32")


def _check_dtypes(c: _Ctx) -> None:
    dtype = c.raw(f"{ACTOR}.megatron.dtype")
    ref_dtype = c.raw(f"{REF}.megatron.dtype")  # not inherited from the actor (engine/megatron.yaml default)
    if dtype not in ("bfloat16", "float16"):
        c.add("error", "DTYPE_CONFLICT", f"{ACTOR}.megatron.dtype={dtype!r}: verl's Megatron engine trains in bfloat16 or float16",
              key=f"{ACTOR}.megatron.dtype")
    if ref_dtype != dtype:
        c.add("warning", "DTYPE_CONFLICT", f"reference dtype {ref_dtype} differs from the actor's {dtype}",
              "the KL term then compares log-probs computed in two precisions", key=f"{REF}.megatron.dtype")
    rdtype = c.raw(f"{ROLLOUT}.dtype")
    if rdtype != dtype:
        c.add("warning", "DTYPE_CONFLICT", f"rollout dtype {rdtype} differs from the actor's {dtype}",
              "rollout and training log-probs drift apart; keep them equal", key=f"{ROLLOUT}.dtype")
    for otc, role_dtype in ((OTC, dtype), (REF_OTC, ref_dtype)):
        fp16 = c.raw(f"{otc}.fp16") is True
        bf16 = c.raw(f"{otc}.bf16") is True
        pd = c.raw(f"{otc}.params_dtype")
        if fp16 and bf16:
            c.add("error", "DTYPE_CONFLICT", f"{otc}: fp16 and bf16 are both on",
                  "Megatron's TransformerConfig rejects both; choose one with megatron.dtype", key=f"{otc}.fp16")
        elif fp16 and role_dtype == "bfloat16":
            c.add("error", "DTYPE_CONFLICT",
                  f"{otc}.fp16=True while megatron.dtype=bfloat16: verl sets bf16 from dtype, so either both are on "
                  "(Megatron's TransformerConfig refuses) or the override is silently overwritten",
                  f"to train in fp16 set {ACTOR}.megatron.dtype=float16 (and the reference's) and drop the override; "
                  "bf16 needs no loss scaling", key=f"{otc}.fp16")
        if pd is not None and str(pd).lower() in _FP32 and (fp16 or role_dtype == "float16"):
            c.add("error", "DTYPE_CONFLICT", f"{otc}.params_dtype={pd} with fp16 on: the weights stay fp32 while "
                  "the compute is fp16, the float16/float32 mismatch in attention that it was meant to fix",
                  "drop params_dtype: verl derives it from megatron.dtype (attention_softmax_in_fp32 is fine)",
                  key=f"{otc}.params_dtype")


def _memory(c: _Ctx, model: ModelSpec, hw: HardwareSpec, roles: dict, world: int, gpn: int,
            batches: dict) -> dict[str, Any] | None:
    try:
        from costmodel.estimate import estimate
    except ImportError:  # pragma: no cover
        return None
    tb, n, mini = batches["train_batch_size"], batches["n"], batches["ppo_mini_batch_size"]
    plen, rlen = c.raw("data.max_prompt_length"), c.raw("data.max_response_length")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (tb, n, mini, plen, rlen)):
        c.add("info", "OOM_RISK", "batch sizes or lengths are not all known: memory not estimated")
        return None
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(c.raw(f"{ACTOR}.megatron.dtype"), "bf16")
    kl = c.raw(f"{ACTOR}.use_kl_loss") is True or c.raw("algorithm.use_kl_in_reward") is True
    epochs = c.raw(f"{ACTOR}.ppo_epochs")
    try:
        wl = Workload.from_dict(dict(prompts=tb, n=n, prompt_len=plen, response_len=rlen,
                                     mini_batch=mini if tb % mini == 0 else tb,
                                     ppo_epochs=epochs if isinstance(epochs, int) and epochs > 0 else 1,
                                     kl=kl, dtype=dtype))
        est = estimate(model=model, hardware=hw, cluster=Cluster(gpus=world, gpus_per_node=gpn),
                       strategy=_strategy(c, roles), workload=wl)
    except ImportError as exc:
        c.add("info", "OOM_RISK", f"memory model not available ({exc}); memory not checked")
        return None
    except GrpoTuneError as exc:
        c.add("info", "OOM_RISK", f"memory not estimated: [{exc.code}] {exc.message}")
        return None
    for v in est.violations:
        if v.code == "OOM_RISK":
            c.add("error", "OOM_RISK", v.message, _oom_hint(v.phase), phase=v.phase,
                  bytes=None if v.bytes_over is None else int(v.bytes_over))
        elif v.code in CODES:
            c.add("warning", v.code, v.message, phase=v.phase)
    return {"capacity_bytes": int(est.capacity_bytes), "peak_phase": est.peak_phase, "peak_bytes": int(est.peak_bytes),
            "phases": {k: int(p.total_bytes) for k, p in est.memory.items()}}


def _oom_hint(phase: str | None) -> str:
    if phase == "rollout":
        return f"lower {ROLLOUT}.gpu_memory_utilization or raise rollout TP, or offload params during rollout"
    if phase == "update":
        return "lower ppo_micro_batch_size_per_gpu, turn on recompute, offload the optimizer, or raise TP/PP"
    return "lower the micro-batch, raise TP/PP, or offload (param_offload, optimizer_offload)"


def diagnose_overrides(overrides: list[Override] | list[str], *, hardware: str | HardwareSpec | None = None,
                       model: str | ModelSpec | None = None, source: str = "<overrides>", kind: str = "overrides",
                       findings: list[Finding] | None = None, config_name: str | None = None) -> Report:
    """Check a list of verl overrides (strings ``key=value`` or parsed :class:`Override`)."""
    findings = list(findings or [])
    items: list[Override] = []
    for o in overrides:
        if isinstance(o, Override):
            items.append(o)
            continue
        ov = _override(str(o).strip(), {}, None)
        if ov is None:
            findings.append(Finding("warning", "BAD_CONFIG", f"{o!r} is not a key=value override"))
        elif ov.prefix != "~":
            items.append(ov)
    report = Report(source=source, kind=kind, findings=findings)
    c = _Ctx(items, report.findings)
    if config_name not in (None, verl.CONFIG_NAME):
        engine = c.raw("model_engine")
        if not (config_name == "ppo_trainer" and engine == "megatron"):
            c.add("warning", "BAD_CONFIG", f"--config-name={config_name}: diagnose checks verl's {verl.CONFIG_NAME}",
                  f"use --config-name={verl.CONFIG_NAME} (or ppo_trainer with model_engine=megatron) for Megatron")
    _check_keys(c)
    if c.raw("algorithm.adv_estimator") != "grpo":
        c.add("warning", "BAD_CONFIG", f"algorithm.adv_estimator={c.raw('algorithm.adv_estimator')!r}: "
              "verl's default is gae (PPO with a critic)", "add algorithm.adv_estimator=grpo")
    # model and hardware
    mspec: ModelSpec | None
    if isinstance(model, ModelSpec):
        mspec, note = model, f"preset {model.name}"
    elif model:
        mspec = load_model(model)
        note = f"--model {model}"
    else:
        mspec, note = resolve_model(c.raw(f"{ARO}.model.path"))
    if mspec is None:
        c.add("info", "UNKNOWN_MODEL", f"{note}: memory checks skipped",
              "pass --model PRESET, or point actor_rollout_ref.model.path at a folder with config.json")
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware or "h100")
    gpn = c.int_("trainer.n_gpus_per_node")
    nn = c.int_("trainer.nnodes")
    world = gpn * nn if gpn and nn else None
    roles = _degrees(c)
    sound = _check_degrees(c, roles, world, gpn, mspec)
    a = roles["actor"]
    dp = world // (a["tp"] * a["pp"] * a["cp"]) if world and None not in (a["tp"], a["pp"], a["cp"]) \
        and world % (a["tp"] * a["pp"] * a["cp"]) == 0 else None
    batches = _check_batches(c, dp)
    _check_dtypes(c)
    memory = None
    if mspec is not None and sound and not any(f.severity == "error" and f.code == "BAD_CONFIG" for f in report.findings):
        memory = _memory(c, mspec, hw, roles, world, gpn, batches)
    rtp = roles["rollout"]["tp"]
    report.summary = {
        "model": mspec.name if mspec else None, "model_note": note, "hardware": hw.name,
        "world_size": world, "nnodes": nn, "gpus_per_node": gpn, "dp": dp,
        "roles": {
            "actor": {**a, "dp": dp},
            "ref": {**roles["ref"], "dp": dp},
            "rollout": {"tp": rtp, "pp": roles["rollout"]["pp"],
                        "replicas": world // rtp if world and rtp and world % rtp == 0 else None,
                        "gpu_memory_utilization": roles["rollout"]["gpu_memory_utilization"],
                        "name": roles["rollout"]["name"]},
        },
        "batch": batches,
        "memory": memory,
    }
    return report


def diagnose_config(cfg, *, source: str = "<run config>", hardware: str | None = None) -> Report:
    """A grpo-tune run config: checked as the verl launch it exports to, with its own model and hardware."""
    from autotune.export import verl_overrides

    ovs = verl_overrides(cfg, model_path=cfg.model.hf_id or cfg.model.name, train_files="train.parquet",
                         val_files="test.parquet")
    return diagnose_overrides(ovs, hardware=hardware or cfg.hardware, model=cfg.model, source=source,
                              kind="run_config")


def diagnose_path(path: str | os.PathLike, *, hardware: str | None = None, model: str | None = None) -> Report:
    """Read a run config (YAML with ``schema_version``), a verl YAML config, a launch script or an
    override list, and diagnose it. Unreadable input raises a coded error."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no file at {p}", hint="pass a best.yaml, a verl launch script or an override list")
    if p.is_dir():
        raise ConfigError(f"{p} is a folder", hint="pass a file (for a search run: runs/<id>/best.yaml)")
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{p} is not a text file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror}") from None
    if not text.strip():
        raise ConfigError(f"{p} is empty")
    if p.suffix in (".yaml", ".yml", ".json"):
        try:
            data = yaml_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if isinstance(data, dict) and ("schema_version" in data or "strategy" in data):
            return _run_config(p, data, hardware)
        if isinstance(data, dict) and "model_type" in data and "hidden_size" in data:
            raise ConfigError(f"{p} is a Hugging Face model config, not a launch",
                              hint=f"pass the launch script, and --model {p} if its model path maps to no preset")
        if isinstance(data, dict):
            return diagnose_overrides(_from_mapping(data), hardware=hardware, model=model, source=str(p),
                                      kind="verl_yaml")
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            ovs, fnd = parse_override_list("\n".join(data))
            return diagnose_overrides(ovs, hardware=hardware, model=model, source=str(p), findings=fnd)
        raise ConfigError(f"{p}: neither a run config, a verl config nor an override list")
    if re.search(r"main_ppo|verl-train|diagnose\.py|^#!", text, re.M):
        ovs, fnd, facts = parse_script(text)
        return diagnose_overrides(ovs, hardware=hardware, model=model, source=str(p), kind="verl_script",
                                  findings=fnd, config_name=facts["config_name"])
    ovs, fnd = parse_override_list(text)
    if not ovs:
        raise ConfigError(f"{p}: no key=value overrides found",
                          hint="pass a best.yaml, a verl launch script or a file with one override per line")
    return diagnose_overrides(ovs, hardware=hardware, model=model, source=str(p), findings=fnd)


def _run_config(p: Path, data: dict, hardware: str | None) -> Report:
    from core.config import RunConfig

    try:
        cfg = RunConfig.from_dict(data, where=str(p))
    except InvalidDegreesError as exc:
        # The file is readable but its degrees cannot exist: that is a finding, not a crash.
        rep = Report(source=str(p), kind="run_config",
                     findings=[Finding("error", "INVALID_DEGREES", exc.message, exc.hint)])
        rep.summary = {"strategy": data.get("strategy"), "cluster": data.get("cluster")}
        return rep
    except GrpoTuneError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{p}: {exc}") from None
    return diagnose_config(cfg, source=str(p), hardware=hardware)
