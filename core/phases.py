"""The phases of a GRPO step, one name each (the cost model, best.yaml, the trainer's metrics)."""
from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    ROLLOUT = "rollout"
    WEIGHT_SYNC = "weight_sync"
    OLD_LOGPROB = "old_logprob"
    REF_LOGPROB = "ref_logprob"
    UPDATE = "update"
    OFFLOAD = "offload"
