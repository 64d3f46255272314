"""verl 0.9.1's separate-pool trainers by their ``--config-name``: what a launch runs when it is not colocated."""

from __future__ import annotations

from grpo_tune.frameworks.verl import fully_async, one_step_off
from grpo_tune.frameworks.verl.experimental import WheelConfig

TRAINERS: tuple[WheelConfig, ...] = (fully_async.CONFIG, one_step_off.CONFIG)
"""The fully-async trainer (what grpo-tune emits) and the one-step-off trainer (read back)."""


def trainer_of(config_name: str | None) -> WheelConfig | None:
    """The separate-pool trainer a launch's ``--config-name`` runs (fully-async or one-step-off), else None."""
    for c in TRAINERS:
        if config_name == c.name:
            return c
    return None
