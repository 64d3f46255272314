"""A framework's file read back into the plan grpo-tune prices: :class:`LaunchPlan`, and the :class:`Source` it
was read from (a verl launch, a NeMo-RL recipe), which ``tune`` edits.

Every framework's reader (:meth:`grpo_tune.frameworks.base.Framework.read_plan`) returns one; ``tune`` and
``calibrate`` price it, whatever framework wrote the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from grpo_tune.core.knobs import names
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload


@dataclass(frozen=True)
class ReadRequest:
    """What to read back and how: a framework's file (with trailing ``key=value`` overrides, for the frameworks that
    take them), the model and hardware to assume where the file does not say, the mean lengths, and the stack
    profile the hardware is priced under (None: the framework's own, or the run config's)."""

    path: Path
    overrides: Sequence[str] = ()
    model: str | None = None
    hardware: str | None = None
    prompt_len_mean: int | None = None
    response_len_mean: int | None = None
    stack: str | None = None


# What tune does with each plan knob is its row's ``tune`` role (core/knobs.py): the fields the search may change
# and tune writes back (``search``, and ``keep``: pinned to the launch's, written back so that unset follows a new
# plan); the rest (dynamic-batching caps, the CPU optimizer, vLLM engine knobs) is the user's and stays as launched.
SEARCHED = names(tune=("search", "keep"))
PINNED = names(tune=("keep", "user"))
"""The knobs the search prices at the launch's values."""
USER_FIELDS = names(tune=("keep", "user", "reapply"))
"""The knobs that stay the user's (PINNED, and sequence parallel: searched by its default rule, then put back)."""


class Source(Protocol):
    """The file a plan was read from, as its framework reads it: each key's value (the file's, else the
    framework's default) and the keys the file itself sets."""

    @property
    def path(self) -> Path: ...
    @property
    def kind(self) -> str: ...
    @property
    def values(self) -> Mapping[str, object]: ...
    def get(self, key: str) -> object: ...


@dataclass
class LaunchPlan:
    launch: Source | None
    """None for a run config (best.yaml), which has no framework keys to edit."""
    model: ModelSpec
    model_note: str
    hardware: HardwareSpec
    cluster: Cluster
    strategy: Strategy
    workload: Workload
    placement: Placement | None = None
    """Separate pools (a fully-async launch): the Placement it runs; None: colocated."""
    framework: str = ""
    """The registered framework whose file it was read from (``verl``, ``nemo-rl``); empty for a run config."""
    ahead: float | None = None
    """How many parameter versions' batches the rollout pool may run ahead, where the launch sets it as a fraction
    the integer :attr:`Placement.staleness` rounds up: verl 0.9.1's fully-async ``staleness_threshold`` (its
    rollouter pauses at ``(1 + staleness_threshold)`` x a version's samples, fully_async_rollouter.py
    ``max_required_samples``). None: the staleness itself. Priced by :meth:`async_knobs`."""

    def async_knobs(self):
        """The separate plan's asynchronous knobs (costmodel.pools.AsyncKnobs) with the launch's own run-ahead
        (:attr:`ahead`); None where the placement's integer staleness says it all."""
        if self.placement is None or self.ahead is None:
            return None
        from grpo_tune.costmodel.pools import AsyncKnobs

        return AsyncKnobs(ahead=self.ahead, no_drain=bool(self.placement.partial_rollout and self.ahead > 0))
