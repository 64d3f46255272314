"""Rollout engines behind one small contract (:mod:`.base`), beside the frameworks: vLLM (:mod:`.vllm`), SGLang
(:mod:`.sglang`) and the trainer's own Megatron sampler (:mod:`.megatron`).

A plan names its engine (``Strategy.rollout.engine``: vllm | sglang); a hardware profile whose ranks sample with
the training model (``rollout_engine = "megatron"``, the ``cpu`` profile) overrides it. :func:`of` is the one place
that decides which engine a plan's rollout runs on.
"""

from __future__ import annotations

from grpo_tune.core.specs import HardwareSpec
from grpo_tune.core.strategy import Strategy
from grpo_tune.engines.base import KV_BYTES, WEIGHT_BYTES, RolloutEngineSpec
from grpo_tune.engines.megatron import ENGINE as MEGATRON
from grpo_tune.engines.sglang import ENGINE as SGLANG
from grpo_tune.engines.vllm import ENGINE as VLLM

__all__ = ["KV_BYTES", "REGISTRY", "WEIGHT_BYTES", "RolloutEngineSpec", "named", "of"]

REGISTRY: dict[str, RolloutEngineSpec] = {e.name: e for e in (VLLM, SGLANG, MEGATRON)}
DEFAULT = "vllm"


def named(name: str) -> RolloutEngineSpec:
    """The engine called ``name`` (``auto``: the default, vLLM)."""
    return REGISTRY[DEFAULT if name in ("auto", "") else name]


def of(s: Strategy, hw: HardwareSpec) -> RolloutEngineSpec:
    """The engine a plan's rollout runs on: the hardware's own sampler where the profile says so, else the plan's."""
    if hw.rollout_engine == "megatron":  # HardwareSpec.native_rollout, inlined: every estimate asks
        return MEGATRON
    return REGISTRY.get(s.rollout.engine) or named(s.rollout.engine)
