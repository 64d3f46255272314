"""Software-stack profiles: what a framework release costs on any GPU (``profiles/stacks/*.toml``).

A hardware profile holds what belongs to the chip and the box (GEMM curve, HBM and attention
efficiency, links, capacities). A stack profile holds what belongs to the software that runs on it
(:data:`core.efficiency.STACK_KEYS`): host costs per layer, micro-batch and MoE layer, the rollout
engine's sleep, wake and scheduling costs, the refit's per-tensor and per-bucket costs, packing
efficiency, and framework properties such as the gradient dtype. ``--stack`` chooses one; the
default is the verl release grpo-tune exports to (:data:`DEFAULT_STACK`), or a hardware profile's
own ``default_stack`` (the ``cpu`` profile prices grpo-tune's own CPU trainer).

The time model reads one merged :class:`core.efficiency.Efficiency`: ``core.hardware.apply_stack`` overlays
the stack's parameters on the hardware profile's, so the cost model's signature does not change.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .errors import ConfigError, close_matches
from .efficiency import ENGINE_KEYS, OLD_STACK_KEYS, STACK_KEYS, Efficiency
from .specfiles import _read_toml

DEFAULT_STACK = "verl-0.9.1"
"""The stack priced when none is chosen: the verl release grpo-tune exports launches for."""

STACKS_DIR = Path(__file__).resolve().parent.parent / "profiles" / "stacks"
TRAINER = "grpo-tune"
"""grpo-tune's own trainer, which owns a stack (``grpo-tune-cpu``) but no framework integration."""
FRAMEWORKS = ("verl", "nemo-rl", "megatron-lm", TRAINER)
"""Every framework's name, once: a stack profile's ``framework``, and the order of ``frameworks.REGISTRY``
(which holds one integration per name but the trainer's, built from this tuple)."""
ENGINES = ("vllm", "sglang", "megatron")
"""A stack's ``[engine] name``: the names of ``engines.REGISTRY`` (tests/test_seams.py holds them equal; core sits
below engines/ and cannot import it)."""


@dataclass(frozen=True)
class EngineCosts:
    """One ``[engines.<name>]`` table of a stack: the stack's parameters as they are where ``name`` samples,
    with where they come from and the command that refits them."""

    params: dict[str, float]
    source: str = ""
    command: str = ""
    """The command that reproduces ``params`` (a fit prints them)."""
    provenance: str = "spec-only"


ENGINE_NAMES = ("vllm", "sglang")
"""The engines a stack may price beside its own (core.choices.Engine)."""


@dataclass(frozen=True, kw_only=True)
class StackSpec:
    """One software stack (framework release + rollout engine) and its time-model parameters."""

    name: str
    framework: str
    release: str
    source: str
    aliases: tuple[str, ...] = ()
    provenance: str = "spec-only"
    """How ``params`` were obtained: ``fitted`` (``grpo-tune validate --grpo --refit``), or priors only."""
    engine: str = "vllm"
    """The rollout engine its figures were fitted on (its ``[engine]`` table's ``name``): its ``[engine]`` sleep and
    wake price plans on that engine; a plan on another engine is priced with that engine's own (engines/)."""
    params: dict[str, float] = field(default_factory=dict)
    """Values of :data:`core.efficiency.STACK_KEYS` (the rest keep Efficiency's defaults); the ``[engine]`` table's
    figures under their Efficiency names (:data:`core.efficiency.ENGINE_KEYS`)."""
    engines: dict[str, EngineCosts] = field(default_factory=dict)
    """Costs that replace ``params`` where a rollout engine other than the stack's own samples (its
    ``[engines.<name>]`` tables: the ``grpo-tune-cpu`` stack's vLLM-on-CPU decode costs)."""

    def __hash__(self) -> int:
        eng = tuple(sorted((n, tuple(sorted(e.params.items()))) for n, e in self.engines.items()))
        return hash((self.name, self.engine, tuple(sorted(self.params.items())), eng))

    def efficiency(self, base: Efficiency, engine: str = "") -> Efficiency:
        """``base`` (a hardware profile's) with every stack parameter set from this stack (its value, or
        Efficiency's default where the stack is silent: no stale value of another stack survives); where
        ``engine`` has an ``[engines.<engine>]`` table, its values replace the stack's."""
        defaults = Efficiency()
        own = self.engines[engine].params if engine in self.engines else {}
        vals = {k: own.get(k, self.params.get(k, getattr(defaults, k))) for k in STACK_KEYS}
        return dataclasses.replace(base, **vals)

    @classmethod
    def from_dict(cls, data: object, *, where: str) -> "StackSpec":
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a table")
        data = dict(data)
        known = {"name", "framework", "release", "source", "aliases", "provenance", "params", "engine", "engines"}
        known.add("notes")
        extra = sorted(set(data) - known)
        if extra:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}", hint="known: " + ", ".join(sorted(known)))
        for k in ("name", "framework", "release", "source"):
            if not isinstance(data.get(k), str) or not data[k].strip():
                raise ConfigError(f"{where}: {k} must be a non-empty string")
        if data["framework"] not in FRAMEWORKS:
            raise ConfigError(f"{where}.framework must be one of {', '.join(FRAMEWORKS)}, got {data['framework']!r}")
        params = data.get("params", {})
        if not isinstance(params, dict):
            raise ConfigError(f"{where}.params must be a table of numbers")
        engine, params = _engine_table(data.get("engine"), dict(params), where)
        eff = _stack_params(params, where=f"{where}.params")
        al = data.get("aliases", [])
        if not isinstance(al, list) or not all(isinstance(a, str) for a in al):
            raise ConfigError(f"{where}.aliases must be a list of names")
        prov = data.get("provenance", "spec-only")
        if prov not in ("fitted", "spec-only"):
            raise ConfigError(f"{where}.provenance must be fitted or spec-only, got {prov!r}")
        return cls(
            name=data["name"],
            framework=data["framework"],
            release=data["release"],
            source=data["source"],
            aliases=tuple(al),
            provenance=prov,
            engine=engine,
            params={k: getattr(eff, k) for k in params},
            engines=_engines(data.get("engines", {}), where=f"{where}.engines"),
        )


def _stack_params(params: object, *, where: str) -> Efficiency:
    if not isinstance(params, dict):
        raise ConfigError(f"{where} must be a table of numbers")
    bad = sorted(set(params) - STACK_KEYS)
    if bad:
        raise ConfigError(
            f"{where}: {', '.join(bad)} not a stack parameter",
            hint="a stack sets: " + ", ".join(sorted(STACK_KEYS)) + " (chip figures go in profiles/hardware/)",
        )
    return Efficiency.from_dict(params, where=where)  # the same checks as a hardware profile's


def _engines(data: object, *, where: str) -> dict[str, EngineCosts]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table of [engines.<name>] tables")
    out: dict[str, EngineCosts] = {}
    for name, t in data.items():
        w = f"{where}.{name}"
        if name not in ENGINE_NAMES:
            raise ConfigError(f"{where}: unknown engine {name!r}", hint="known: " + ", ".join(ENGINE_NAMES))
        if not isinstance(t, dict):
            raise ConfigError(f"{w} must be a table")
        extra = sorted(set(t) - {"params", "source", "command", "provenance"})
        if extra:
            known = "command, params, provenance, source"
            raise ConfigError(f"{w}: unknown key(s) {', '.join(extra)}", hint=f"known: {known}")
        for k in ("source", "command"):
            if not isinstance(t.get(k, ""), str):
                raise ConfigError(f"{w}.{k} must be a string")
        if t.get("provenance", "spec-only") not in ("fitted", "spec-only"):
            raise ConfigError(f"{w}.provenance must be fitted or spec-only, got {t['provenance']!r}")
        p = t.get("params", {})
        eff = _stack_params(p, where=f"{w}.params")
        out[name] = EngineCosts(
            params={k: getattr(eff, k) for k in p},
            source=t.get("source", ""),
            command=t.get("command", ""),
            provenance=t.get("provenance", "spec-only"),
        )
    return out


def _engine_table(table: object, params: dict[str, object], where: str) -> tuple[str, dict[str, object]]:
    """The ``[engine]`` table's engine name, and ``params`` with its figures under their Efficiency names. A file
    written before the table existed sets ``[params] vllm_sleep_s`` / ``vllm_wake_s``: read as a vLLM ``[engine]``
    table's ``sleep_s`` / ``wake_s``; both spellings of one figure is a coded error."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError(f"{where}.engine must be a table (name, sleep_s, wake_s)")
    table = dict(table)
    name = table.pop("name", "vllm")
    if name not in ENGINES:
        raise ConfigError(f"{where}.engine.name must be one of {', '.join(ENGINES)}, got {name!r}")
    for old, key in OLD_STACK_KEYS.items():
        if old not in params:
            continue
        if key in table:
            raise ConfigError(
                f"{where}: both [params] {old} and [engine] {key} are set",
                hint=f"keep [engine] {key} (the older spelling {old} names vLLM's figure)",
            )
        if name != "vllm":
            raise ConfigError(
                f"{where}: [params] {old} prices vLLM, but the stack's engine is {name!r}",
                hint=f"set it as [engine] {key}",
            )
        table[key] = params.pop(old)
    for key in sorted(set(table) - set(ENGINE_KEYS)):
        raise ConfigError(
            f"{where}.engine: unknown key {key!r}", hint="an [engine] table sets: name, " + ", ".join(ENGINE_KEYS)
        )
    moved = sorted(set(params) & set(ENGINE_KEYS.values()))
    if moved:
        raise ConfigError(
            f"{where}.params: {', '.join(moved)} are the engine's figures",
            hint="set them in the [engine] table as " + ", ".join(k for k, v in ENGINE_KEYS.items() if v in moved),
        )
    params.update({ENGINE_KEYS[k]: v for k, v in table.items()})
    return str(name), params


def _dirs() -> list[Path]:
    dirs = [STACKS_DIR]
    extra = os.environ.get("GRPO_TUNE_PROFILES")
    if extra:
        dirs += [Path(d) / "stacks" for d in extra.split(os.pathsep)]
    return dirs


@lru_cache(maxsize=None)
def _catalog(env: str | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for d in _dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.toml")):
            try:
                data = _read_toml(p, "stack")
            except ConfigError:
                out[p.stem.lower()] = p
                continue
            al = data.get("aliases", [])
            for n in [data.get("name", p.stem), p.stem, *(al if isinstance(al, list) else [])]:
                out[str(n).lower()] = p
    return out


def list_stacks() -> list[str]:
    return sorted({load_stack(str(p)).name for p in set(_catalog(os.environ.get("GRPO_TUNE_PROFILES")).values())})


@lru_cache(maxsize=64)
def _load_file(path: str) -> StackSpec:
    return StackSpec.from_dict(_read_toml(Path(path), "stack"), where=f"stack file {path}")


def load_stack(name_or_path: str | None = None) -> StackSpec:
    """A stack by name, alias or .toml path; None: :data:`DEFAULT_STACK`."""
    name = name_or_path or DEFAULT_STACK
    if name.endswith(".toml"):
        p = Path(name)
        if not p.is_file():
            raise ConfigError(f"stack file {name} not found", hint="pass a profiles/stacks/*.toml or a stack name")
        return _load_file(str(p.resolve()))
    cat = _catalog(os.environ.get("GRPO_TUNE_PROFILES"))
    found = cat.get(name.lower())
    if found is None:
        near = close_matches(name.lower(), cat)
        raise ConfigError(
            f"unknown stack {name!r}",
            hint=(f"did you mean {near[0]!r}? " if near else "") + "known: " + ", ".join(sorted(set(cat))),
        )
    return _load_file(str(found))
