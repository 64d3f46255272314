"""``grpo-tune diagnose``'s work: the coded findings for a run config, a verl launch script, an override list or
a NeMo-RL recipe, from the framework that reads the file.

:func:`run_diagnose` takes a :class:`DiagnoseRequest` and returns the findings' :class:`Report`;
``cli/diagnose.py`` prints it (tables, or JSON) and exits with the report's exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_tune.frameworks.base.findings import Report


@dataclass(frozen=True)
class DiagnoseRequest:
    """What ``diagnose`` was asked: the file, a recipe's overrides, the hardware and model to check it against."""

    path: str
    overrides: list[str] = field(default_factory=list)
    hardware: str | None = None
    """The memory check's hardware (None: the run config's, else h100)."""
    model: str | None = None
    """A model preset or config.json for a script whose model path maps to none."""


def run_diagnose(req: DiagnoseRequest) -> Report:
    """The file's findings, from the framework whose reader claims it."""
    from grpo_tune.frameworks import diagnose_path

    return diagnose_path(req.path, hardware=req.hardware, model=req.model, overrides=req.overrides)


def absent_flag_note(option: str) -> str | None:
    """What a framework's own diagnose script does instead, where ``option`` is a flag that articles on it describe and
    it does not have (``Framework.absent_diagnose_flags``); None for any other option."""
    from grpo_tune.frameworks import REGISTRY

    return next((f.absent_diagnose_note for f in REGISTRY if option in f.absent_diagnose_flags), None)
