"""A plan as a NeMo-RL recipe (``nemo_rl.yaml``), and a NeMo-RL recipe read back as NeMo-RL reads it.

Writing: ``defaults:`` names the GRPO base config of the pinned release (``grpo_math_1B.yaml``, as every
performance recipe of v0.7.0 does), then our overrides set every key the plan prices
(:mod:`frameworks.nemo_rl.table`), defaults included. The recipe is meant to live where NeMo-RL keeps its
own recipes, ``examples/configs/recipes/llm/``, so its ``defaults`` path is ``../../grpo_math_1B.yaml``.

Reading: NeMo-RL's ``load_config`` (``nemo_rl/utils/config.py``) loads the file, pops ``defaults`` (a path or
a list, relative to the file's folder), loads each parent the same way, merges parents in order and the file
last with ``OmegaConf.merge`` (a mapping marked ``_override_: true`` replaces its parent's instead of
merging), then applies the command line's Hydra overrides and resolves interpolations with its ``mul``,
``div`` and ``max`` resolvers. :func:`load` does the same with OmegaConf. A parent that is not on disk and
is the pinned base config comes from the shipped key snapshot; any other missing parent is a coded error.
Reads are bounded (4 MiB per file, the diagnose YAML limits, at most 16 levels of ``defaults``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_tune.core.errors import ConfigError, MissingDependencyError
from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base.models import positions_override
from grpo_tune.frameworks.base.sections import sections_of

from . import snapshot as snap
from . import table

MAX_DEPTH = 16
RECIPE_DIR = "examples/configs/recipes/llm"
DEFAULTS = "../../grpo_math_1B.yaml"


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def recipe_values(cfg: RunConfig) -> dict[str, object]:
    """Every NeMo-RL key grpo-tune sets for this run config -> value (fixed keys, model, then the plan's)."""
    name = cfg.model.hf_id or cfg.model.name
    from grpo_tune.core.placement import Placement

    out: dict[str, object] = {f"{table.P}.model_name": name, **table.FIXED}
    out.update(table.write_placement(getattr(cfg, "placement", None) or Placement(), cfg.cluster))
    out.update(table.write_sections(sections_of(cfg)))
    positions = positions_override(cfg)
    if positions is not None:  # the plan's sequences need more positions than the checkpoint's config.json says
        out[f"{table.P}.hf_config_overrides.max_position_embeddings"] = positions
    return out


def recipe_text(cfg: RunConfig, *, run_id: str = "") -> str:
    """``nemo_rl.yaml``: a header, ``defaults:``, then the overrides as one nested mapping."""
    from grpo_tune.frameworks.base.inputs import check_name, comment_safe

    m, c, s = cfg.model, cfg.cluster, cfg.strategy
    for value, what in ((m.name, "model name"), (m.hf_id or "", "model hf_id"), (cfg.hardware.name, "hardware")):
        check_name(value, what)
    tree = snap.unflatten(recipe_values(cfg))
    target = f"{RECIPE_DIR}/grpo-tune-{run_id or 'plan'}.yaml"
    head = [
        comment_safe(
            f"# GRPO for {m.name} on {c.gpus} x {cfg.hardware.name} ({c.nnodes} node(s)), "
            f"NeMo-RL {snap.RELEASE} (Megatron-Core path), {_where(cfg)}."
        ),
        comment_safe(
            f"# Emitted by grpo-tune. Plan: {s.layout_text()} recompute={s.memory.recompute} "
            f"rollout_tp={s.rollout.rollout_tp} gpu_memory_utilization={s.rollout.gpu_memory_utilization} "
            f"max_tokens_per_gpu={s.batching.max_tokens_per_gpu}"
        ),
        *([comment_safe(f"# {s.precision.note()}")] if s.precision.note() else []),
        f"# Place it at {target} in a NeMo-RL {snap.TAG} checkout (its defaults path is relative to it),",
        f"# then: uv run examples/run_grpo.py --config {target}",
        "# Check it before a run: grpo-tune diagnose THIS_FILE",
    ]
    body = yaml.safe_dump({"defaults": DEFAULTS, **tree}, sort_keys=False, default_flow_style=False, width=1000)
    return "\n".join(head) + "\n" + body


def _where(cfg: Any) -> str:
    p = getattr(cfg, "placement", None)
    if p is None or not p.separate:
        return "colocated vLLM generation"
    lag = f", samples up to {p.staleness} step(s) stale" if p.staleness else ", on-policy"
    return f"vLLM generation on {p.rollout_gpus} GPUs of its own{lag}"


def launch_line(run_dir: str | os.PathLike, run_id: str) -> str:
    """One shell line (run from a NeMo-RL checkout, ``$NEMO_RL``) that places the recipe and starts it."""
    import shlex

    target = f"{RECIPE_DIR}/grpo-tune-{run_id}.yaml"
    src = shlex.quote(str(Path(run_dir).resolve() / "nemo_rl.yaml"))
    return f'cd "$NEMO_RL" && cp {src} {target} && uv run examples/run_grpo.py --config {target}'


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


@dataclass
class Recipe:
    """A NeMo-RL recipe as NeMo-RL resolves it, plus what the user's own file and overrides set."""

    path: Path
    text: str
    resolved: dict[str, object]
    """Dotted key -> value after defaults, overrides and interpolation (what NeMo-RL's MasterConfig gets)."""
    own: dict[str, object]
    """Dotted key -> value the file itself sets (not its parents), then the CLI overrides."""
    overrides: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    """Where each ``defaults`` entry came from (a file, or the shipped snapshot of the base config)."""
    duplicates: list[tuple[str, int]] = field(default_factory=list)
    kind: str = "nemo_rl_recipe"

    @property
    def values(self) -> dict[str, object]:
        return self.own

    def get(self, key: str) -> object:
        return self.resolved.get(key)


def _omegaconf():
    try:
        import omegaconf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        raise MissingDependencyError(
            "reading a NeMo-RL recipe needs omegaconf", hint="pip install omegaconf (a grpo-tune dependency)"
        ) from None
    from omegaconf import OmegaConf

    import warnings

    for name, fn in (("mul", lambda a, b: a * b), ("div", lambda a, b: a / b), ("max", lambda a, b: max(a, b))):
        if not OmegaConf.has_resolver(name):
            # NeMo-RL's resolvers, registered as it does; an OmegaConf that calls this API deprecated says so on
            # every command (issue 38): the user cannot act on it, so it is not shown
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                OmegaConf.register_new_resolver(name, fn)
    return omegaconf


def _read_mapping(p: Path) -> tuple[str, dict[str, Any], list[tuple[str, int]]]:
    from grpo_tune.frameworks.base.inputs import load_yaml, read_text

    text = read_text(p, what="NeMo-RL recipe")
    data, dups = load_yaml(text, str(p))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a NeMo-RL recipe is a YAML mapping", hint="NeMo-RL's load_config refuses lists")
    return text, data, dups


def _defaults_list(data: dict[str, Any], p: Path) -> list[str]:
    d = data.pop("defaults", None)
    if d is None:
        return []
    if isinstance(d, str):
        return [d]
    if isinstance(d, list) and all(isinstance(x, str) for x in d):
        return list(d)
    raise ConfigError(f"{p}: defaults must be a path or a list of paths, got {d!r}")


def _merge(base, over):
    """NeMo-RL's merge_with_override: ``_override_: true`` on a mapping replaces the base's mapping."""
    from omegaconf import DictConfig, OmegaConf

    for key in list(over.keys()):
        node = over[key]
        if isinstance(node, DictConfig) and node.get("_override_", False):
            node.pop("_override_")
            if key in base:
                base.pop(key)
    return OmegaConf.merge(base, over)


def _load_chain(p: Path, depth: int, parents: list[str]):
    from omegaconf import OmegaConf

    if depth > MAX_DEPTH:
        raise ConfigError(f"{p}: more than {MAX_DEPTH} levels of defaults (a cycle?)")
    _, data, _ = _read_mapping(p)
    cfg = _chain(p, data, depth, parents)
    return cfg if cfg is not None else OmegaConf.create(data)


def _chain(p: Path, data: dict[str, Any], depth: int, parents: list[str]):
    from omegaconf import OmegaConf

    defaults = _defaults_list(data, p)
    if not defaults:
        return None
    base = OmegaConf.create({})
    for d in defaults:
        parent = Path(d) if d.startswith("/") else p.parent / d
        if parent.is_file():
            parents.append(str(parent))
            pc = _load_chain(parent, depth + 1, parents)
        elif Path(d).name == Path(snap.BASE_CONFIG).name:
            parents.append(f"{snap.BASE_CONFIG} ({snap.REPO}@{snap.TAG}, shipped key snapshot)")
            pc = OmegaConf.create(snap.base_tree())
        else:
            raise ConfigError(
                f"{p}: its defaults {d!r} is not at {parent}",
                hint=f"read the recipe where NeMo-RL keeps it (a {snap.TAG} checkout), or inline its parent",
            )
        base = _merge(base, pc)
    return _merge(base, OmegaConf.create(data))


def _apply_overrides(cfg, overrides: list[str], where: str) -> dict[str, Any]:
    """Hydra-style overrides as NeMo-RL applies them to its struct config: ``key=v`` needs the key,
    ``+key=v`` adds it, ``++key=v`` adds or sets, ``~key`` deletes. Returns the flat overrides applied."""
    from omegaconf import OmegaConf

    from grpo_tune.frameworks.base.inputs import override

    applied: dict[str, Any] = {}
    for raw in overrides:
        tok = raw.strip()
        if tok.startswith("~") and "=" not in tok:
            key = tok[1:]
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is None or leaf not in node:
                raise ConfigError(f"{where}: override {raw!r} deletes a key the config does not have")
            node.pop(leaf)
            continue
        ov = override(tok)
        if ov is None:
            raise ConfigError(f"{where}: {raw!r} is not a key=value override", hint="NeMo-RL takes key=value")
        exists = OmegaConf.select(cfg, ov.key, default="__missing__", throw_on_missing=False) != "__missing__"
        if ov.prefix == "" and not exists:
            raise ConfigError(
                f"{where}: override {raw!r}: key {ov.key!r} is not in the config",
                hint=f"NeMo-RL (struct mode) refuses it; add it with +{ov.key}=... if it is meant",
            )
        if ov.prefix == "+" and exists:
            raise ConfigError(f"{where}: override {raw!r} adds a key that exists", hint=f"use {ov.key}=...")
        OmegaConf.update(cfg, ov.key, ov.value, force_add=True)
        applied[ov.key] = ov.value
    return applied


def load(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """A NeMo-RL recipe and CLI overrides, resolved as NeMo-RL's ``load_config`` + ``parse_hydra_overrides``."""
    _omegaconf()
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    p = Path(path)
    text, data, dups = _read_mapping(p)
    own = snap.flatten({k: v for k, v in data.items() if k != "defaults"})
    parents: list[str] = []
    try:
        cfg = _chain(p, dict(data), 0, parents)
        if cfg is None:
            cfg = OmegaConf.create(data)
        applied = _apply_overrides(cfg, list(overrides), str(p))
        tree = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        msg = str(exc).splitlines()[0]
        raise ConfigError(
            f"{p}: NeMo-RL could not resolve this recipe: {msg}", hint="check the interpolations"
        ) from None
    own.update(applied)
    return Recipe(
        path=p,
        text=text,
        resolved=snap.flatten(tree),
        own=own,
        overrides=list(overrides),
        parents=parents,
        duplicates=dups,
    )


def is_recipe_text(path: Path, text: str) -> bool:
    """Whether the file ``path`` with contents ``text`` is a NeMo-RL recipe: YAML (or JSON) that parses to a mapping
    shaped like one, and not a grpo-tune run config (``strategy``); False for anything unreadable."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.frameworks.base.inputs import load_yaml

    if path.suffix not in (".yaml", ".yml", ".json"):
        return False
    try:
        data, _ = load_yaml(text, str(path))
    except GrpoTuneError:
        return False
    return isinstance(data, dict) and "strategy" not in data and looks_like_recipe(data)


def looks_like_recipe(data: object) -> bool:
    """A NeMo-RL GRPO recipe: a mapping with ``defaults`` or NeMo-RL's own sections (``policy`` + ``grpo``,
    or ``policy.megatron_cfg`` / ``policy.generation``), not a grpo-tune run config. (A verl config never gets
    here: verl, first in the registry, claims its own.)"""
    if not isinstance(data, dict) or "schema_version" in data:
        return False
    pol = data.get("policy")
    if isinstance(pol, dict) and ("grpo" in data or "megatron_cfg" in pol or "generation" in pol):
        return True
    d = data.get("defaults")
    return isinstance(d, (str, list)) and any("grpo" in str(x) for x in ([d] if isinstance(d, str) else d))
