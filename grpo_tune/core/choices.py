"""The closed sets of names a run config may use, each defined once.

Config fields stay plain strings (YAML and JSON round-trip them unchanged); these enums are the
allowed values, which the validator (core/validation.py), the search space and the trainer read.
Each is a StrEnum, so ``Recompute.FULL == "full"``. They are sets of values and nothing more, so each
is built from its values (:func:`_choice`): a member's name is its value in capitals, ``-`` read as ``_``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import cast


class _Choice(StrEnum):
    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The allowed strings, in definition order."""
        return tuple(m.value for m in cls)


def _choice(name: str, values: tuple[str, ...]) -> type[_Choice]:
    members = [(v.upper().replace("-", "_"), v) for v in values]
    # Enum's functional API (a call with a name and members makes a subclass); mypy reads the call as an instance's
    return cast(type[_Choice], _Choice(name, members, module=__name__, qualname=name))  # type: ignore[call-arg]


# Activation recomputation (Megatron's ``recompute_granularity``; none = off); selective = core attention
# only (Korthikanti et al. 2022, sec. 5).
Recompute = _choice("Recompute", ("none", "selective", "full"))

# Training state moved to host memory between phases (verl's ``*_offload`` switches).
Offload = _choice("Offload", ("param", "grad", "optimizer"))

# verl's ``actor.loss_agg_mode`` (verl 0.9.1 trainer/ppo/core_algos.py agg_loss).
LossAgg = _choice("LossAgg", ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"))

# verl's ``kl_loss_type`` estimators (verl 0.9.1 trainer/ppo/core_algos.py kl_penalty).
KlType = _choice("KlType", ("low_var_kl", "k3", "k1", "kl", "k2", "mse", "abs"))

# Who samples the responses in grpo-tune's own trainer (its run config's ``rollout_engine``): ``auto`` = vllm on
# GPU, the training model itself (megatron) on CPU. Not the plan's engine (``Engine`` below, engines/).
TrainerRolloutEngine = _choice("TrainerRolloutEngine", ("auto", "vllm", "megatron"))

# The rollout engine of a plan (engines/): vLLM or SGLang; ``auto`` on the command line searches both. The CPU
# trainer's own sampler (megatron) is a plan's engine too (``PlanEngine``), the default of plans on a platform
# whose ranks compute in host memory (``HardwareSpec.default_engine``); the command line does not offer it.
Engine = _choice("Engine", ("vllm", "sglang"))
PlanEngine = _choice("PlanEngine", ("vllm", "sglang", "megatron"))

# Training GEMM precision (Megatron + TransformerEngine): bf16, or FP8 e4m3 with the blockwise recipe and bf16
# master weights (docs/precision.md).
TrainPrecision = _choice("TrainPrecision", ("bf16", "fp8"))

# The rollout engine's weight precision: bf16, or FP8 block-wise quantized weights (W8A8, 128x128 blocks).
RolloutPrecision = _choice("RolloutPrecision", ("bf16", "fp8"))

# The rollout engine's KV-cache dtype: auto (the weights' activation dtype, bf16) or FP8 e4m3.
KvCacheDtype = _choice("KvCacheDtype", ("auto", "fp8"))

WorkloadKind = _choice("WorkloadKind", ("grpo", "pretrain"))

Dtype = _choice("Dtype", ("bf16", "fp16", "fp32"))

# Where rollout and training run (core/placement.py): one shared pool, or a rollout pool and a training pool.
PlacementMode = _choice("PlacementMode", ("colocated", "separate"))
