"""The closed sets of names a run config may use, each defined once.

Config fields stay plain strings (YAML and JSON round-trip them unchanged); these enums are the
allowed values, which the validator (core/validation.py), the search space and the trainer read.
Each is a StrEnum, so ``Recompute.FULL == "full"``.
"""

from __future__ import annotations

from enum import StrEnum


class _Choice(StrEnum):
    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The allowed strings, in definition order."""
        return tuple(m.value for m in cls)


class Recompute(_Choice):
    """Activation recomputation (Megatron's ``recompute_granularity``; none = off)."""

    NONE = "none"
    SELECTIVE = "selective"  # core attention only (Korthikanti et al. 2022, sec. 5)
    FULL = "full"


class Offload(_Choice):
    """Training state moved to host memory between phases (verl's ``*_offload`` switches)."""

    PARAM = "param"
    GRAD = "grad"
    OPTIMIZER = "optimizer"


class LossAgg(_Choice):
    """verl's ``actor.loss_agg_mode`` (verl 0.9.1 trainer/ppo/core_algos.py agg_loss)."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"


class KlType(_Choice):
    """verl's ``kl_loss_type`` estimators (verl 0.9.1 trainer/ppo/core_algos.py kl_penalty)."""

    LOW_VAR_KL = "low_var_kl"
    K3 = "k3"
    K1 = "k1"
    KL = "kl"
    K2 = "k2"
    MSE = "mse"
    ABS = "abs"


class RolloutEngine(_Choice):
    """Who samples the responses: ``auto`` = vllm on GPU, the training model itself (megatron) on CPU."""

    AUTO = "auto"
    VLLM = "vllm"
    MEGATRON = "megatron"


class WorkloadKind(_Choice):
    GRPO = "grpo"
    PRETRAIN = "pretrain"


class Dtype(_Choice):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
