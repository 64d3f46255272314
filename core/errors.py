"""One error hierarchy with stable codes, shared by every layer.

A user's mistake raises a :class:`GrpoTuneError` subclass. The CLI prints
``[CODE] message`` and ``hint: ...`` and exits 2, with no traceback.
"""
from __future__ import annotations

import difflib
from typing import Iterable

# Stable codes. Tests and scripts match on these strings; never rename one.
CODES = {
    "BAD_CONFIG": "the run config is malformed or has an impossible value",
    "UNKNOWN_KEY": "a key that the schema (or verl) does not have",
    "UNKNOWN_COMMAND": "a command or flag that verl does not have (verl-train, --dry-run, ...)",
    "UNKNOWN_MODEL": "no model preset or config.json by that name",
    "UNKNOWN_HARDWARE": "no hardware profile by that name",
    "INVALID_DEGREES": "the parallel degrees cannot exist for this model and GPU count",
    "NO_FEASIBLE_PLAN": "no plan fits in memory",
    "TP_MISMATCH": "actor, reference and rollout tensor-parallel degrees disagree",
    "PP_MISMATCH": "actor and reference pipeline degrees disagree",
    "CP_MISMATCH": "actor and reference context-parallel degrees disagree",
    "EP_MISMATCH": "actor and reference expert-parallel degrees disagree",
    "BATCH_DIVISIBILITY": "batch sizes break verl's divisibility rules",
    "OOM_RISK": "a phase needs more memory than the GPU has",
    "DTYPE_CONFLICT": "conflicting precision settings",
    "EXPERT_IMBALANCE": "EP does not divide the experts evenly",
    "EXPERT_DEGREES": "EP x ETP does not fit in TP x CP x DP",
    "MISSING_DATASET": "the dataset path does not exist",
    "MISSING_DEPENDENCY": "an optional dependency is not installed",
    "TRIAL_FAILED": "a profiling trial failed",
    "CHECKPOINT_ERROR": "a checkpoint could not be read or written",
    "TRAINER_UNSUPPORTED": "a valid plan that grpo-tune's megatron-core trainer cannot run (core/support.py)",
}


class GrpoTuneError(Exception):
    """Base of every user-facing error. ``code`` is stable, ``hint`` says what to do."""

    code = "BAD_CONFIG"

    def __init__(self, message: str, hint: str = "", *, code: str | None = None):
        if code is not None:
            if code not in CODES:
                raise ValueError(f"unregistered error code {code!r}")
            self.code = code
        self.message = message
        self.hint = hint
        super().__init__(f"[{self.code}] {message}")

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "hint": self.hint}


class ConfigError(GrpoTuneError):
    code = "BAD_CONFIG"


class UnknownKeyError(ConfigError):
    code = "UNKNOWN_KEY"


class UnknownModelError(GrpoTuneError):
    code = "UNKNOWN_MODEL"


class UnknownHardwareError(GrpoTuneError):
    code = "UNKNOWN_HARDWARE"


class InvalidDegreesError(GrpoTuneError):
    code = "INVALID_DEGREES"


class NoFeasiblePlanError(GrpoTuneError):
    code = "NO_FEASIBLE_PLAN"


class MissingDependencyError(GrpoTuneError):
    code = "MISSING_DEPENDENCY"


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Names close to ``word``, for 'did you mean' hints."""
    choices = list(choices)
    found = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
    lower = {c.lower(): c for c in choices}
    subs = [c for c in choices if word.lower() in c.lower() and c not in found]
    return ([lower[f] for f in found] + subs)[:n]


def try_import(module: str, extra: str):
    """Import an optional dependency or raise a coded error with the install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module} is not installed ({exc})",
            hint=f"pip install 'grpo-tune[{extra}]'",
        ) from exc
