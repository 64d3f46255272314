"""Rollout engines behind one registry; an engine's module is imported only when it is chosen.

``get_rollout_engine("megatron", engine=..., tokenizer=...)`` returns the native sampler that runs
on the training model itself (CPU and fallback); ``get_rollout_engine("vllm", ...)`` the colocated
vLLM adapter (GPU). Keyword arguments go to the engine class unchanged; see each class.
"""

from __future__ import annotations

import importlib

from grpo_tune.core.errors import ConfigError, close_matches

from .base import RolloutEngine, SamplingParams

__all__ = [
    "RolloutEngine",
    "SamplingParams",
    "ENGINES",
    "get_rollout_engine",
    "register_rollout_engine",
    "resolve_engine_name",
]

# name -> "module:Class"; modules are imported lazily so that vllm is never imported on CPU.
ENGINES: dict[str, str] = {
    "megatron": "grpo_tune.trainer.rollout.megatron:MegatronRollout",
    "vllm": "grpo_tune.trainer.rollout.vllm:VLLMRollout",
}


def register_rollout_engine(name: str, target: str) -> None:
    """Add an engine as ``"package.module:Class"`` (for third-party backends and test fakes)."""
    if ":" not in target:
        raise ConfigError(f"rollout engine target must look like 'package.module:Class', got {target!r}")
    ENGINES[name] = target


def resolve_engine_name(name: str) -> str:
    """``auto`` -> ``vllm`` when CUDA and vllm are both present, else ``megatron``."""
    if name != "auto":
        return name
    import importlib.util

    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None:
        return "vllm"
    return "megatron"


def get_rollout_engine(name: str, **kw) -> RolloutEngine:
    """Build the engine registered as ``name`` (or ``auto``) with keyword arguments ``kw``."""
    name = resolve_engine_name(name)
    if name not in ENGINES:
        near = close_matches(name, ENGINES)
        raise ConfigError(
            f"unknown rollout engine {name!r}",
            hint=f"did you mean {near[0]!r}?" if near else f"choose one of: {', '.join(ENGINES)}",
        )
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)(**kw)
