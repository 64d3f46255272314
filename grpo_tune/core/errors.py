"""One error hierarchy with stable codes, shared by every layer.

A user's mistake raises a :class:`GrpoTuneError` subclass. The CLI prints
``[CODE] message`` and ``hint: ...`` and exits 2, with no traceback.
"""

from __future__ import annotations

from types import ModuleType

import difflib
from typing import Iterable

# Stable codes. Tests and scripts match on these strings; never rename one.
CODES = {
    "BAD_CONFIG": "the run config is malformed or has an impossible value",
    "IO_ERROR": "a file could not be read or written (permissions, a missing folder, a full disk)",
    "INTERNAL_ERROR": "a bug in grpo-tune, not in the input",
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
    "USAGE": "a command line that cannot be parsed: an unknown command or option, a missing one, a wrong type",
    "RUN_LOCKED": "another live process is writing to the same run folder",
    "STORAGE_ERROR": "the study database cannot be opened or is held by another process",
    "WORKER_FAILED": "a training worker failed for a reason of its machine (disk, files, memory)",
    "NOT_PRICED": "a launch setting the cost model does not price (LoRA, a rollout engine other than vLLM)",
    "UNSUPPORTED_PRECISION": "a precision the GPU has no tensor cores for (FP8 on an A100)",
    "NO_GPU": "a plan for GPUs started where there are fewer CUDA GPUs per node than it has ranks",
}


# What to do, for an error raised without its own hint (each code has one; tests/test_errors.py checks it).
HINTS = {
    "UNSUPPORTED_PRECISION": "use --precision/--rollout-precision bf16 on this GPU, or an FP8 GPU (H100, H200, "
    "B200, ...): `grpo-tune hardware` lists each profile's FP8 FLOP/s",
    "BAD_CONFIG": "fix the value named above; `grpo-tune diagnose CONFIG` lists every problem of a config at once",
    "IO_ERROR": "check that the path exists and is writable, and that the disk has space",
    "INTERNAL_ERROR": "please report it with the command line; GRPO_TUNE_DEBUG=1 prints the traceback",
    "UNKNOWN_KEY": "check the key's spelling; `grpo-tune diagnose` names the closest valid key",
    "UNKNOWN_COMMAND": "use verl's own entry point and flags (python3 -m verl.trainer.main_ppo key=value ...)",
    "UNKNOWN_MODEL": "`grpo-tune models` lists the presets; a path to a Hugging Face config.json works too",
    "UNKNOWN_HARDWARE": "`grpo-tune hardware` lists the profiles; `grpo-tune probe-hardware` writes one for this "
    "machine",
    "INVALID_DEGREES": "choose degrees that divide the GPU count and the model's heads/layers/experts "
    "(`grpo-tune search` only proposes valid ones)",
    "NO_FEASIBLE_PLAN": "add GPUs, shorten the sequences, or allow offload/recompute; `--json` shows each plan's "
    "memory",
    "TP_MISMATCH": "give the actor, the reference and the rollout the same tensor-parallel degree",
    "PP_MISMATCH": "give the actor and the reference the same pipeline degree",
    "CP_MISMATCH": "give the actor and the reference the same context-parallel degree",
    "EP_MISMATCH": "give the actor and the reference the same expert-parallel degree",
    "BATCH_DIVISIBILITY": "make prompts x n and mini_batch x n multiples of dp x mbs",
    "OOM_RISK": "lower mbs, turn on recompute or offload, or raise tp/pp; `grpo-tune estimate` shows each phase",
    "DTYPE_CONFLICT": "use one precision (bf16) for the actor, the reference and the rollout",
    "EXPERT_IMBALANCE": "choose an ep that divides the number of experts",
    "EXPERT_DEGREES": "lower ep or etp so that ep x etp divides tp x cp x dp",
    "MISSING_DATASET": "give an existing .jsonl/.parquet file, or 'synthetic'",
    "MISSING_DEPENDENCY": "install the extra named in the message (e.g. pip install -e '.[train]' in a clone)",
    "TRIAL_FAILED": "read the trial's profile.log in the run folder's trials/<number>/",
    "CHECKPOINT_ERROR": "check the checkpoint folder (or start without --resume)",
    "TRAINER_UNSUPPORTED": "choose a plan the trainer runs; `grpo-tune search` proposes only those",
    "USAGE": "run `grpo-tune --help` for the commands, `grpo-tune <command> --help` for a command's options",
    "RUN_LOCKED": "wait for the other run to end (or stop it), or give this one another --out",
    "STORAGE_ERROR": "check the database URL, that the server is up, and that no other program holds a lock on it",
    "WORKER_FAILED": "free the resource named in the message (disk space, open-file limit, memory) and rerun",
    "NOT_PRICED": "read the figures as the plan without that setting; grpo-tune prices and emits full-parameter "
    "training with vLLM rollout",
    "NO_GPU": "run it on the GPUs it was planned for; on CPU, train a plan of the cpu profile "
    "(`grpo-tune search --hardware cpu ...`)",
}


def _registered(code: str) -> str:
    if code not in CODES:
        raise ValueError(f"unregistered error code {code!r}")
    return code


class GrpoTuneError(Exception):
    """Base of every user-facing error. ``code`` is stable, ``hint`` says what to do."""

    code = "BAD_CONFIG"

    def __init_subclass__(cls, code: str | None = None, **kw: object) -> None:
        # A subclass names its code in its class line; an unregistered one fails at import, not when raised.
        super().__init_subclass__(**kw)
        if code is not None:
            cls.code = _registered(code)

    def __init__(self, message: str, hint: str = "", *, code: str | None = None):
        if code is not None:
            self.code = _registered(code)
        self.message = message
        self.hint = hint or HINTS.get(self.code, "")
        super().__init__(f"[{self.code}] {message}")

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "hint": self.hint}


class ConfigError(GrpoTuneError, code="BAD_CONFIG"):
    """A config, flag or file with a malformed or impossible value."""


class UnknownKeyError(ConfigError, code="UNKNOWN_KEY"):
    """A config or override key that the schema does not have."""


class UnknownModelError(GrpoTuneError, code="UNKNOWN_MODEL"):
    """A model name that is neither a preset nor a config.json."""


class UnknownHardwareError(GrpoTuneError, code="UNKNOWN_HARDWARE"):
    """A hardware name that is no profile."""


class InvalidDegreesError(GrpoTuneError, code="INVALID_DEGREES"):
    """Degrees that cannot exist for the model and the GPU count."""


class NoFeasiblePlanError(GrpoTuneError, code="NO_FEASIBLE_PLAN"):
    """A search in which no plan fits."""


class MissingDependencyError(GrpoTuneError, code="MISSING_DEPENDENCY"):
    """An optional package that the feature needs is not installed."""


class UnsupportedPrecisionError(GrpoTuneError, code="UNSUPPORTED_PRECISION"):
    """A training or rollout precision the hardware profile gives no peak FLOP/s for."""


class StorageError(GrpoTuneError, code="STORAGE_ERROR"):
    """A study database that cannot be opened, is damaged, or stays locked by another process."""


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Names close to ``word``, for 'did you mean' hints."""
    choices = list(choices)
    found = difflib.get_close_matches(word.lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
    lower = {c.lower(): c for c in choices}
    subs = [c for c in choices if word.lower() in c.lower() and c not in found]
    return ([lower[f] for f in found] + subs)[:n]


def install_hint(extra: str) -> str:
    """How to install an optional extra: from a clone (the README's way) or from a built wheel."""
    return f"pip install -e '.[{extra}]' in a clone of grpo-tune (from a wheel: pip install 'grpo-tune[{extra}]')"


def try_import(module: str, extra: str) -> ModuleType:
    """Import an optional dependency or raise a coded error with the install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module} is not installed ({exc})",
            hint=install_hint(extra),
        ) from exc
