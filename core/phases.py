"""The phases of one GRPO step: one name each, shared by the cost model, the trainer and refine."""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """A phase of one GRPO step. A ``str`` subclass, so ``Phase.ROLLOUT == "rollout"`` and JSON keys stay plain."""

    ROLLOUT = "rollout"
    WEIGHT_SYNC = "weight_sync"
    OLD_LOGPROB = "old_logprob"
    REF_LOGPROB = "ref_logprob"
    UPDATE = "update"
    OFFLOAD = "offload"

    def __str__(self) -> str:
        # f-strings and str() print "rollout", not "Phase.ROLLOUT".
        return self.value


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
