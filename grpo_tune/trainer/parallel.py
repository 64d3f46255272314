"""megatron-core ``parallel_state`` from a Strategy: TP/PP/VPP/CP/EP/ETP and the DP that remains.

``init(cfg)`` starts torch.distributed from torchrun's environment (gloo on CPU, NCCL on GPU),
enables the CPU compatibility layer when there is no CUDA, and builds megatron's process groups.
``reinit(strategy)`` tears the groups down and builds new ones in the same processes, so that a
test can run several layouts in one launch (process start-up dominates small runs).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from grpo_tune.core.errors import InvalidDegreesError
from grpo_tune.core.config import RunConfig
from grpo_tune.core.ranks import RankLayout
from grpo_tune.core.strategy import Strategy

from . import compat


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed(timeout_s: float = 600.0) -> None:
    """Start the default process group from torchrun's env (or a 1-process group without it)."""
    compat.enable()
    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def megatron_degrees(s: Strategy) -> dict[str, int | None]:
    """The strategy's degrees under megatron-core's names (initialize_model_parallel and
    TransformerConfig take the same keywords)."""
    return dict(
        tensor_model_parallel_size=s.layout.tp,
        pipeline_model_parallel_size=s.layout.pp,
        virtual_pipeline_model_parallel_size=s.layout.vpp if s.layout.vpp > 1 else None,
        context_parallel_size=s.layout.cp,
        expert_model_parallel_size=s.layout.ep,
        expert_tensor_parallel_size=s.layout.etp_,
    )


def init(cfg_or_strategy: RunConfig | Strategy, *, seed: int | None = None) -> RankLayout:
    """Distributed start-up plus megatron's groups for ``cfg.strategy``; returns this rank's layout."""
    strategy = getattr(cfg_or_strategy, "strategy", cfg_or_strategy)
    if seed is None:
        seed = getattr(getattr(cfg_or_strategy, "trainer", None), "seed", 1234)
    init_distributed()
    return reinit(strategy, seed=seed)


def reinit(s: Strategy, *, seed: int = 1234) -> RankLayout:
    """(Re)build megatron's process groups for ``s`` in the running processes."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    world = dist.get_world_size()
    mp = s.layout.tp * s.layout.pp * s.layout.cp
    if world % mp:
        raise InvalidDegreesError(f"tp*pp*cp = {mp} does not divide the world size {world}")
    if s.layout.dp is not None and s.layout.dp * mp != world:
        raise InvalidDegreesError(
            f"tp*pp*cp*dp = {mp * s.layout.dp} differs from the world size {world}",
            hint=f"launch {mp * s.layout.dp} processes (cluster.gpus)",
        )
    if s.layout.cp > 1 and compat.active():
        # megatron's context parallel needs TransformerEngine's attention (CUDA only).
        raise InvalidDegreesError(
            "cp > 1 needs TransformerEngine on a GPU; the CPU backend has none", hint="set cp: 1 for CPU runs"
        )
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(**megatron_degrees(s), create_gloo_process_groups=False)
    # Same seed on every rank: dropout is off and weights come from a layout-free init
    # (trainer.model.init_weights), so the RNG only needs to be valid, not rank-specific.
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)
    return layout()


def layout() -> RankLayout:
    from megatron.core import parallel_state as ps

    world = dist.get_world_size()
    return RankLayout(
        world_size=world,
        nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        nnodes=world // int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        rank=dist.get_rank(),
        tp=ps.get_tensor_model_parallel_world_size(),
        pp=ps.get_pipeline_model_parallel_world_size(),
        vpp=ps.get_virtual_pipeline_model_parallel_world_size() or 1,
        cp=ps.get_context_parallel_world_size(),
        ep=ps.get_expert_model_parallel_world_size(),
        etp=ps.get_expert_tensor_parallel_world_size(),
        dp=ps.get_data_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
        ep_rank=ps.get_expert_model_parallel_rank(),
    )


def destroy() -> None:
    """Tear down megatron's groups and the default process group."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
