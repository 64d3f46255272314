"""``grpo-tune validate``'s work: the time model against published measurements, pretraining (Megatron-LM's
papers) or the GRPO step (published verl and NeMo-RL runs, and their separate-pool pairs).

:func:`run_validate` takes a :class:`ValidateRequest` and returns a :class:`ValidateOutcome`; ``cli/validate.py``
prints it (tables, or the report as JSON) and exits 1 when it did not pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PRETRAINING_TOLERANCE_PCT = 10.0
"""The pretraining rows' default tolerance (MAPE of all or held-out rows, percent)."""


@dataclass(frozen=True)
class ValidateRequest:
    """What ``validate`` was asked: which measurements, against which tolerance, refitted or not."""

    grpo: bool = False
    """The GRPO step (``--grpo``) rather than the pretraining rows."""
    data: str | None = None
    """``--data``: the measurements CSV (None: the shipped rows)."""
    hardware: str = "a100"
    """The hardware profile the pretraining rows ran on (the GRPO rows name their own)."""
    tolerance: float | None = None
    """``--tolerance`` in percent (None: the default of the kind of rows)."""
    refit: bool = False


@dataclass(frozen=True)
class ValidateOutcome:
    """The validation report (as ``--json`` prints it) and which kind of rows it scored."""

    kind: Literal["pretraining", "grpo"]
    report: dict[str, object]

    @property
    def passed(self) -> bool:
        return bool(self.report["passed"])


def run_validate(req: ValidateRequest) -> ValidateOutcome:
    """Score the rows; for the shipped GRPO rows, their separate-pool pairs too (scored apart, printed per pair)."""
    if req.grpo:
        from grpo_tune.validate.grpo import TOLERANCE_PCT, run_grpo

        tol = TOLERANCE_PCT if req.tolerance is None else req.tolerance
        rep = run_grpo(path=req.data, tolerance_pct=tol, refit=req.refit)
        if req.data is None:
            from grpo_tune.validate.placement_pairs import score_pairs, score_rollout_ratios

            rep["placement_pairs"] = score_pairs()
            rep["rollout_ratios"] = score_rollout_ratios()
        return ValidateOutcome(kind="grpo", report=rep)
    from grpo_tune.validate.pretraining import run

    tol = PRETRAINING_TOLERANCE_PCT if req.tolerance is None else req.tolerance
    rep = run(hardware=req.hardware, path=req.data, tolerance_pct=tol, refit=req.refit)
    return ValidateOutcome(kind="pretraining", report=rep)
