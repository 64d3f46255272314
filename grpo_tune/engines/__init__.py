"""Rollout engines behind one small contract (:mod:`.base`), beside the frameworks: vLLM (:mod:`.vllm`), SGLang
(:mod:`.sglang`) and the trainer's own Megatron sampler (:mod:`.megatron`).

A plan names its engine (``Strategy.rollout.engine``: vllm | sglang | megatron); the hardware profile does not. A
platform only sets the default engine of the plans built on it (``HardwareSpec.default_engine``: the trainer's own
sampler where the ranks compute in host memory, the ``cpu`` profile). :func:`of` is the one place that turns a
plan's engine into its spec.
"""

from __future__ import annotations

from grpo_tune.core.specs import HardwareSpec
from grpo_tune.core.strategy import Strategy
from grpo_tune.engines.base import KV_BYTES, WEIGHT_BYTES, RolloutEngineSpec
from grpo_tune.engines.megatron import ENGINE as MEGATRON
from grpo_tune.engines.sglang import ENGINE as SGLANG
from grpo_tune.engines.vllm import ENGINE as VLLM

__all__ = [
    "KV_BYTES",
    "REGISTRY",
    "WEIGHT_BYTES",
    "RolloutEngineSpec",
    "for_framework",
    "named",
    "of",
    "sleep_wake_s",
]

REGISTRY: dict[str, RolloutEngineSpec] = {e.name: e for e in (VLLM, SGLANG, MEGATRON)}
DEFAULT = "vllm"


def named(name: str) -> RolloutEngineSpec:
    """The engine called ``name`` (``auto``: the default, vLLM)."""
    return REGISTRY[DEFAULT if name in ("auto", "") else name]


def for_framework(name: str) -> RolloutEngineSpec:
    """The engine a framework's launch (verl, NeMo-RL) names for a plan's engine ``name``: the engine itself, or the
    default (vLLM) for the trainer's own sampler (``megatron``, grpo-tune's CPU trainer only), as those launches
    said before the engine became the plan's."""
    e = named(name)
    return e if e.verl_name else REGISTRY[DEFAULT]


def of(s: Strategy, hw: HardwareSpec | None = None) -> RolloutEngineSpec:
    """The engine a plan's rollout runs on: the plan's (``hw`` no longer decides; kept for the callers' shape)."""
    return REGISTRY.get(s.rollout.engine) or named(s.rollout.engine)


def sleep_wake_s(s: Strategy, hw: HardwareSpec) -> tuple[float, float]:
    """(sleep, wake) seconds of the plan's rollout engine: the stack's ``[engine]`` figures where the stack was fitted
    on this engine (``hw.stack_engine``) or the engine has no figures of its own, else the engine's own
    (:meth:`RolloutEngineSpec.own_sleep_wake_s` over its memory pool, ``gpu_memory_utilization`` of the GPU)."""
    e = of(s, hw)
    own = None if e.name == hw.stack_engine else e.own_sleep_wake_s(s.rollout.gpu_memory_utilization * hw.hbm_bytes)
    return own if own is not None else (hw.efficiency.engine_sleep_s, hw.efficiency.engine_wake_s)
