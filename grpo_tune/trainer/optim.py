"""The actor's DDP wrapping and megatron-core optimizer (distributed, hybrid CPU, precision-aware)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import TrainerOptions
    from grpo_tune.core.strategy import Strategy

log = logging.getLogger("grpo_tune.trainer.optim")


def wrap_ddp(chunks, config, s: Strategy) -> list:
    """Each model chunk in megatron's DistributedDataParallel (gradient buffers, the distributed
    optimizer's sharding), with the model-grad finalisation and no-sync hooks set on ``config``."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=s.memory.distributed_optimizer,
        check_for_nan_in_grad=False,
    )
    wrapped = [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=c, disable_bucketing=i > 0)
        for i, c in enumerate(chunks)
    ]
    for w in wrapped:
        w.broadcast_params()
    # Without this, DP / SP-norm / tied-embedding gradient reductions are skipped.
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [w.no_sync for w in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
    return wrapped


def build_optimizer(chunks, config, t: TrainerOptions, s: Strategy, dtype: torch.dtype):
    """Adam over the DDP-wrapped chunks, as megatron-core's ``get_megatron_optimizer`` builds it."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    oc = OptimizerConfig(
        optimizer="adam",
        lr=t.lr,
        min_lr=t.lr,
        weight_decay=t.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_eps=1e-8,
        clip_grad=t.grad_clip,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        use_distributed_optimizer=s.memory.distributed_optimizer,
        **optimizer_offload_kwargs(s, cuda=torch.cuda.is_available()),
    )
    opt = get_megatron_optimizer(oc, chunks, use_gloo_process_groups=False)
    config.grad_scale_func = opt.scale_loss
    return opt


def optimizer_offload_kwargs(s, *, cuda: bool) -> dict:
    """megatron-core OptimizerConfig keywords for Megatron's hybrid CPU optimizer
    (``strategy.cpu_optimizer``: the fraction of the optimizer state and step on the host;
    ``overlap_cpu_optimizer``: overlap its copies) and precision-aware optimizer state.

    On CPU they are no-ops, stated once, like offload: the optimizer state already lives in host
    memory, and the CPU build trains in fp32 (precision-aware state needs TransformerEngine's
    FusedAdam or the hybrid optimizer on a GPU).
    """
    want = [
        n
        for n, on in (
            ("cpu_optimizer", s.memory.cpu_optimizer),
            ("precision_aware_optimizer", s.memory.precision_aware_optimizer),
        )
        if on
    ]
    if not cuda:
        if want:
            log.warning("%s requested: a no-op on CPU (optimizer state already lives in host memory)", ", ".join(want))
        return {}
    kw: dict = {}
    if s.memory.cpu_optimizer:
        kw.update(
            optimizer_cpu_offload=True,
            optimizer_offload_fraction=float(s.memory.cpu_optimizer),
            overlap_cpu_optimizer_d2h_h2d=bool(s.memory.overlap_cpu_optimizer),
        )
    if s.memory.precision_aware_optimizer:
        kw["use_precision_aware_optimizer"] = True
    return kw
