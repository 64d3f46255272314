"""Where the ranks go: one ``RankLayout`` for the launcher, the workers and the schedulers that size their jobs.

:func:`layout` fills the placement (nodes x processes per node) and the degrees from the run config
before any process starts (the trainer's launcher, refine's Slurm jobs); a worker (trainer/parallel.py)
fills the same type from megatron-core's process groups, adding this rank's coordinates. (The plan's
``core.strategy.Layout`` is the degrees a plan chooses; a ``RankLayout`` is where its ranks run.)
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import RunConfig
from .errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    """Ranks, their placement on nodes, the parallel degrees, and (in a worker) this rank's coordinates."""

    world_size: int
    nnodes: int = 1
    nproc_per_node: int | None = None
    """Processes per node (torchrun's ``--nproc-per-node``); None = ``world_size // nnodes``."""
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1
    rank: int = 0
    """This process's global rank (0 in the launcher)."""
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0
    ep_rank: int = 0

    def __post_init__(self) -> None:
        if self.nproc_per_node is None:
            object.__setattr__(self, "nproc_per_node", self.world_size // max(self.nnodes, 1))

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def layout(cfg: RunConfig, *, nnodes: int | None = None) -> RankLayout:
    """World size from the config; nodes from ``--nnodes`` or from ``cluster.gpus_per_node``."""
    gpus = cfg.cluster.gpus
    if nnodes is None:
        nnodes = cfg.cluster.nnodes
        per = min(gpus, cfg.cluster.gpus_per_node)
    else:
        if nnodes < 1:
            raise ConfigError(f"--nnodes must be >= 1, got {nnodes}")
        per = gpus // nnodes
    if per * nnodes != gpus:
        raise ConfigError(
            f"the config's {gpus} GPUs do not split evenly over {nnodes} nodes",
            hint="make cluster.gpus a multiple of the node count (torchrun starts the same "
            "number of processes on every node)",
        )
    lay = cfg.strategy.layout
    dp = lay.dp or gpus // (lay.tp * lay.pp * lay.cp)
    return RankLayout(
        world_size=gpus,
        nnodes=nnodes,
        nproc_per_node=per,
        tp=lay.tp,
        pp=lay.pp,
        vpp=lay.vpp,
        cp=lay.cp,
        ep=lay.ep,
        etp=lay.etp_,
        dp=dp,
    )
