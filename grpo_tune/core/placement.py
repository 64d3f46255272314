"""Placement: where the rollout and the training run, and how stale the samples they exchange may be.

``colocated`` (one pool: vLLM sleeps while Megatron trains on the same GPUs, verl's hybrid engine) or
``separate`` (a rollout pool of ``rollout_gpus`` GPUs, possibly of another hardware profile, and a
training pool of the rest), with the staleness bound (0 = on-policy: a sample is produced by the
weights it trains; k = at most k policy versions old), partial rollout (an unfinished response is
carried into the next step instead of holding the batch) and the weight-sync interval in steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from .choices import PlacementMode
from .errors import ConfigError
from .validation import NON_NEGATIVE, Schema, check_keys, from_mapping, to_mapping

__all__ = ["Placement"]


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where each role runs. The default is verl's hybrid engine: one colocated, synchronous pool."""

    mode: str = "colocated"
    """``colocated`` (rollout and training share every GPU) or ``separate`` (two pools)."""
    rollout_gpus: int = 0
    """GPUs of the rollout pool (``separate`` only; the training pool is the rest of the cluster)."""
    rollout_hardware: str | None = None
    """Hardware profile of the rollout pool when it differs from the training pool's (``separate`` only)."""
    staleness: int = 0
    """Policy versions a sample may lag the weights it trains (0 = on-policy)."""
    partial_rollout: bool = False
    """Unfinished responses carry over to the next step (needs ``staleness >= 1``)."""
    sync_interval: int = 1
    """Optimizer steps between weight syncs to the rollout pool."""

    @property
    def separate(self) -> bool:
        return self.mode == "separate"

    def to_dict(self) -> dict[str, object]:
        return to_mapping(self)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "placement") -> "Placement":
        data = check_keys(cls, data, where)
        return check(from_mapping(cls, data, where, _PLACEMENT_SCHEMA), where)


_PLACEMENT_SCHEMA = Schema(
    ranges={"rollout_gpus": NON_NEGATIVE, "staleness": NON_NEGATIVE},
    choices={"mode": PlacementMode},
)


def check(p: Placement, where: str = "placement", *, gpus: int | None = None) -> Placement:
    """The rules between a placement's fields, and (given the cluster's ``gpus``) against the cluster."""
    if not p.separate:
        if p.rollout_gpus or p.rollout_hardware is not None or p.staleness or p.partial_rollout:
            raise ConfigError(
                f"{where}: rollout_gpus, rollout_hardware, staleness and partial_rollout need mode 'separate'",
                hint="colocated rollout shares every GPU with training and is on-policy",
            )
        return p
    if p.rollout_gpus < 1:
        raise ConfigError(f"{where}: a separate placement needs rollout_gpus >= 1", hint="e.g. --rollout-gpus 8")
    if gpus is not None and p.rollout_gpus >= gpus:
        raise ConfigError(
            f"{where}: rollout_gpus ({p.rollout_gpus}) leaves no GPU of {gpus} for training",
            hint="the training pool is the cluster's GPUs minus the rollout pool's",
        )
    if p.partial_rollout and p.staleness < 1:
        raise ConfigError(
            f"{where}: partial_rollout needs staleness >= 1",
            hint="a response carried into the next step is produced by older weights",
        )
    return p
