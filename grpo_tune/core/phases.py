"""The phases of one GRPO step: one name each, shared by the cost model, the trainer and refine."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """A phase of one GRPO step. A ``str`` (StrEnum), so ``Phase.ROLLOUT == "rollout"``, ``str()`` and f-strings
    give the value, and JSON keys stay plain."""

    ROLLOUT = "rollout"
    WEIGHT_SYNC = "weight_sync"
    OLD_LOGPROB = "old_logprob"
    REF_LOGPROB = "ref_logprob"
    UPDATE = "update"
    OFFLOAD = "offload"


# Every phase, in step order (the cost model prices all of them).
ALL_PHASES: tuple[Phase, ...] = tuple(Phase)

# The phases the trainer reports per step and the profile report carries (``phases_s``): offload is
# timed by trainer/loop.py's PhaseTimer but counted only in the step time.
MEASURED_PHASES: tuple[Phase, ...] = (
    Phase.ROLLOUT,
    Phase.WEIGHT_SYNC,
    Phase.OLD_LOGPROB,
    Phase.REF_LOGPROB,
    Phase.UPDATE,
)
