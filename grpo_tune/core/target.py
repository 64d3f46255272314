"""What a plan is for, and what a plan is priced from, as types.

:class:`Target` is the model, the hardware, the cluster and the workload a plan is searched for (the CLI
reads it from its flags; a search, ``estimate`` and ``compare`` take it apart). It is a named tuple, so
``model, hardware, cluster, workload = target`` reads as the four values did. :class:`Priced` is anything
that carries a plan with its target (an Estimate, a calibration Point, a RunConfig, a parsed launch), and
:func:`inputs_of` turns one into ``costmodel.estimate``'s keywords.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, TypedDict

from .specs import HardwareSpec, ModelSpec
from .strategy import Cluster, Strategy, Workload

__all__ = ["Inputs", "Priced", "Target", "inputs_of"]


class Target(NamedTuple):
    """The model, hardware, cluster and workload a plan is for."""

    model: ModelSpec
    hardware: HardwareSpec
    cluster: Cluster
    workload: Workload


class Inputs(TypedDict):
    """``costmodel.estimate``'s inputs (and the head of a RunConfig or a calibration Point), as keywords."""

    model: ModelSpec
    hardware: HardwareSpec
    cluster: Cluster
    strategy: Strategy
    workload: Workload


class Priced(Protocol):
    """Anything that carries a plan and what it is for."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def hardware(self) -> HardwareSpec: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def strategy(self) -> Strategy: ...
    @property
    def workload(self) -> Workload: ...


def inputs_of(plan: Priced) -> Inputs:
    """The five inputs of ``plan`` as keywords for ``estimate``, ``RunConfig`` or ``Point``."""
    return Inputs(
        model=plan.model,
        hardware=plan.hardware,
        cluster=plan.cluster,
        strategy=plan.strategy,
        workload=plan.workload,
    )
