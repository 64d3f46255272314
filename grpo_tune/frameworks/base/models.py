"""A launch's model setting (verl's model path, NeMo-RL's model name) -> a model preset or a local config.json."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.specs import ModelSpec, from_hf_config, list_models, load_model, name_variants

if TYPE_CHECKING:
    from grpo_tune.core.config import RunConfig


@lru_cache(maxsize=1)
def _hf_ids() -> dict[str, str]:
    out = {}
    for name in list_models():
        try:
            m = load_model(name)
        except GrpoTuneError:  # one bad user preset must not break every diagnosis
            continue
        if m.hf_id:
            out[m.hf_id.lower()] = name
    return out


_SUFFIXES = ("-instruct", "-chat", "-base", "-it", "-hf", "-fp8", "-bf16")


def resolve_model(path: object, *, key: str) -> tuple[ModelSpec | None, str]:
    """Map a launch's model setting (``key`` names it in the notes) to a preset or a local config.json."""
    if path is None or not isinstance(path, str) or not path.strip() or path == "???":
        return None, f"{key} is not set"
    p = Path(os.path.expanduser(path))
    try:
        if p.is_dir() and (p / "config.json").is_file():
            return from_hf_config(p / "config.json"), f"read {p / 'config.json'}"
        if p.name == "config.json" and p.is_file():
            return from_hf_config(p), f"read {p}"
    except (GrpoTuneError, OSError, ValueError) as exc:
        return None, f"{p}: {exc}"
    for n in name_variants(path, _SUFFIXES):
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


def with_positions(
    spec: ModelSpec, positions: object, note: str, key: str = "override_config"
) -> tuple[ModelSpec, str]:
    """The model with a launch's ``max_position_embeddings`` override (``key`` names where it was set in the note),
    when it sets one."""
    if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0:
        if positions != spec.max_seq_len:
            import dataclasses

            return dataclasses.replace(spec, max_seq_len=positions), f"{note}, {positions} positions ({key})"
    return spec, note


def positions_override(cfg: "RunConfig") -> int | None:
    """The model's positions, where they exceed its preset's (read from a launch's override, as verl's DAPO recipes
    raise Qwen2.5-Math-7B's 4,096 to 32,768): the framework must be told, or vLLM refuses the longer sequences."""
    try:
        stock = load_model(cfg.model.name).max_seq_len
    except GrpoTuneError:
        return None  # a config.json's own value
    return cfg.model.max_seq_len if cfg.model.max_seq_len > stock else None
