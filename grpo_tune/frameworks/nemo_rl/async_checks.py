"""NeMo-RL 0.7.0's own checks on an async GRPO run, reproduced (its PyPI package is an empty placeholder, so they
cannot be imported): what ``examples/run_grpo.py`` and ``async_grpo_train`` refuse before a step runs. Sources, all
at tag v0.7.0 of NVIDIA-NeMo/RL:

- ``examples/run_grpo.py`` (lines 159-185): with ``grpo.async_grpo.enabled``, ``grpo.use_dynamic_sampling``,
  ``grpo.reward_scaling.enabled``, ``grpo.reward_shaping.enabled`` and ``data.use_multiple_dataloader`` raise
  NotImplementedError;
- ``nemo_rl/algorithms/grpo.py`` ``async_grpo_train`` (lines 3362-3378): the generation backend is vllm or megatron
  and ``_should_use_async_rollouts`` holds (vLLM: ``policy.generation.vllm_cfg.async_engine`` true; Megatron:
  ``policy.generation.mcore_generation_config.async_engine``), and ``loss_fn.use_importance_sampling_correction``
  is true; ``max_trajectory_age_steps > 1`` without ``grpo.async_grpo.in_flight_weight_updates`` only prints a
  warning (lines 3383-3388);
- ``nemo_rl/models/generation/vllm/vllm_generation.py`` (lines 117-134): vLLM pipeline parallel > 1 needs
  ``async_engine``; an expert-parallel size other than the TP (vLLM's DP inside the engine) refuses it.

:func:`check` takes the recipe as NeMo-RL loads it (a nested mapping, interpolations resolved) and returns the
failures as ``(severity, message, hint)``; diagnose reports them, and tests run them on every async recipe emitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ASYNC_ENGINE = "policy.generation.vllm_cfg.async_engine"


def _get(cfg: Mapping[str, object], dotted: str, default: object = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def check(cfg: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """NeMo-RL 0.7.0's refusals (``error``) and warnings (``warning``) for an async GRPO recipe; empty when async
    GRPO is off or every check passes."""
    if _get(cfg, "grpo.async_grpo.enabled") is not True:
        return []
    out: list[tuple[str, str, str]] = []
    # examples/run_grpo.py: DAPO features and multiple dataloaders are refused with async GRPO
    if _get(cfg, "grpo.use_dynamic_sampling"):
        out.append(("error", "grpo.use_dynamic_sampling is not supported with async GRPO", "set it to false"))
    for feat in ("reward_scaling", "reward_shaping"):
        if _get(cfg, f"grpo.{feat}.enabled"):
            out.append(("error", f"grpo.{feat} is not supported with async GRPO", f"set grpo.{feat}.enabled: false"))
    if _get(cfg, "data.use_multiple_dataloader"):
        out.append(("error", "data.use_multiple_dataloader is not supported with async GRPO", "set it to false"))
    # grpo.py async_grpo_train: an async engine, and importance sampling correction
    backend = _get(cfg, "policy.generation.backend", "")
    if backend == "vllm":
        engine = bool(_get(cfg, ASYNC_ENGINE, False))
    elif backend == "megatron":
        engine = bool(_get(cfg, "policy.generation.mcore_generation_config.async_engine", False))
    else:
        engine = False
    if not engine:
        out.append(
            (
                "error",
                "async GRPO (grpo.async_grpo.enabled) needs an async generation engine: NeMo-RL's async_grpo_train "
                "asserts it",
                f"set {ASYNC_ENGINE}: true",
            )
        )
    if _get(cfg, "loss_fn.use_importance_sampling_correction") is not True:
        out.append(
            (
                "error",
                "async GRPO needs loss_fn.use_importance_sampling_correction: NeMo-RL's async_grpo_train asserts it",
                "set loss_fn.use_importance_sampling_correction: true",
            )
        )
    age = _get(cfg, "grpo.async_grpo.max_trajectory_age_steps", 1)
    if isinstance(age, int) and age > 1 and not _get(cfg, "grpo.async_grpo.in_flight_weight_updates", False):
        out.append(
            (
                "warning",
                f"max_trajectory_age_steps={age} without grpo.async_grpo.in_flight_weight_updates: NeMo-RL warns "
                "that the older trajectories then bring no speed-up",
                "set grpo.async_grpo.in_flight_weight_updates: true, or max_trajectory_age_steps: 1",
            )
        )
    # vllm_generation.py: vLLM's own parallelism and the async engine
    if backend == "vllm":
        pp = _get(cfg, "policy.generation.vllm_cfg.pipeline_parallel_size", 1) or 1
        tp = _get(cfg, "policy.generation.vllm_cfg.tensor_parallel_size", 1) or 1
        ep = _get(cfg, "policy.generation.vllm_cfg.expert_parallel_size", 1) or 1
        if isinstance(pp, int) and pp > 1 and not engine:
            out.append(("error", "vLLM pipeline_parallel_size > 1 needs the async engine", f"set {ASYNC_ENGINE}: true"))
        if isinstance(ep, int) and isinstance(tp, int) and ep > 1 and ep != tp and engine:
            out.append(
                (
                    "error",
                    f"vLLM expert_parallel_size={ep} differs from its tensor_parallel_size={tp} (DP inside vLLM), "
                    "which NeMo-RL refuses with the async engine",
                    "set policy.generation.vllm_cfg.expert_parallel_size equal to tensor_parallel_size",
                )
            )
    return out
