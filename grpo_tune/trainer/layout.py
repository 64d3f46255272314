"""Where the ranks go: one ``Layout`` for the launcher and the workers. Torch-free.

The launcher (trainer/launch.py) fills the placement (nodes x processes per node) and the degrees
from the run config before any process starts; a worker (trainer/parallel.py) fills the same type
from megatron-core's process groups, adding this rank's coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Layout:
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
