"""What a refinement produced (:class:`RefineResult`) and the figures read off its trials: grouping by plan,
the best median, the measured noise and the lines that state it (the console summary and report.md print them).

Noise is reported honestly: the spread of repeated trials of one plan ((max - min) / median) is
printed, and two plans are called different only when their measured step times differ by more
than that spread (or by more than the assumed noise when no plan was measured twice).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from grpo_tune.core.config import RunConfig

from grpo_tune.autotune.refine.policy import measured_noise, spread
from grpo_tune.autotune.refine.study import TrialRecord

if TYPE_CHECKING:
    from grpo_tune.autotune.calibrate.fit import CalibrationResult


class Noise(TypedDict, total=False):
    """The measured noise of a refinement (empty until its trials are read): ``spread``, the largest
    (max - min) / median of a plan's repeated trials (None if no plan was repeated), ``per_plan``,
    ``threshold`` (what a difference must exceed), ``assumed`` (True when no plan was repeated)."""

    spread: float | None
    per_plan: dict[str, float]
    threshold: float
    assumed: bool


class WinnerFigures(TypedDict):
    """What the winner measured, in the order ``best.yaml``'s ``measured`` block and report.md list it."""

    trial: int
    """The trial nearest the plan's median (its phases and peak memory are this trial's)."""
    trials_of_plan: list[int]
    study: str
    storage: str
    step_s: float
    """Median over the plan's trials."""
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    phases_s: dict[str, float] | None
    peak_memory_bytes: int | None
    median_trial_tokens_per_s: float | None
    speedup_vs_median_trial: float
    trials_completed: int
    runner_up_step_s: float | None
    chosen_by: str
    beats_runner_up_beyond_noise: bool | None
    noise_threshold: float


@dataclass
class RefineResult:
    """What a refinement produced. ``winner`` is None when no trial completed."""

    study_name: str
    storage: str
    out_dir: Path
    records: list[TrialRecord]
    winner: RunConfig | None = None
    winner_trial: int | None = None
    winner_measured: WinnerFigures | None = None
    median_tokens_per_s: float | None = None
    spearman_step_s: float | None = None
    """Spearman rank correlation of predicted vs measured step time over completed trials."""
    calibration: CalibrationResult | None = None
    """The calibration fitted on the trials, when a fit was possible."""
    noise: Noise = field(default_factory=Noise)
    """The measured noise (:class:`Noise`)."""
    emitted: dict[str, Path] = field(default_factory=dict)
    """Paths written for the winner (best.yaml and whatever search's emitter writes)."""

    def measured(self) -> dict[str, object] | None:
        """The winner's figures as best.yaml's ``measured`` block holds them (a copy; None before a winner)."""
        return None if self.winner_measured is None else dict(self.winner_measured)

    @property
    def completed(self) -> list[TrialRecord]:
        return [r for r in self.records if r.state == "COMPLETE" and r.measured_tokens_per_s]

    def to_dict(self) -> dict[str, object]:
        return {
            "study_name": self.study_name,
            "storage": self.storage,
            "out_dir": str(self.out_dir),
            "winner_trial": self.winner_trial,
            "winner_measured": self.winner_measured,
            "median_tokens_per_s": self.median_tokens_per_s,
            "spearman_step_s": self.spearman_step_s,
            "noise": self.noise,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "emitted": {k: str(v) for k, v in self.emitted.items()},
            "trials": [r.to_dict() for r in self.records],
        }


def trial_tokens_per_s(r: TrialRecord) -> float:
    """A completed trial's measured tokens/s (``RefineResult.completed`` keeps only trials that have one)."""
    assert r.measured_tokens_per_s is not None, f"trial #{r.number} has no measured tokens/s"
    return r.measured_tokens_per_s


def trial_step_s(r: TrialRecord) -> float:
    """A completed trial's measured step time (the loop records it with its tokens/s)."""
    assert r.measured_step_s is not None, f"trial #{r.number} has no measured step time"
    return r.measured_step_s


def by_plan(done: Sequence[TrialRecord]) -> dict[str, list[TrialRecord]]:
    out: dict[str, list[TrialRecord]] = {}
    for r in done:
        out.setdefault(r.plan or f"#{r.number}", []).append(r)
    return out


def noise_of(done: Sequence[TrialRecord], assumed: float) -> Noise:
    groups = by_plan(done)
    per = {k: spread([trial_step_s(r) for r in v]) for k, v in groups.items() if len(v) >= 2}
    s = measured_noise({i: [trial_step_s(r) for r in v] for i, v in enumerate(groups.values())})
    return Noise(spread=s, per_plan=per, threshold=assumed if s is None else s, assumed=s is None)


def differ(a_s: float, b_s: float, threshold: float) -> bool:
    """Are two median step times different beyond the noise threshold (relative to the faster)?"""
    return abs(a_s - b_s) > threshold * min(a_s, b_s)


def best_plan(groups: dict[str, list[TrialRecord]]) -> str:
    """The plan whose completed trials have the best median tokens/s (the refinement's choice)."""
    med = {k: statistics.median(trial_tokens_per_s(r) for r in v) for k, v in groups.items()}
    return max(med, key=lambda k: med[k])


def noise_lines(result: RefineResult) -> list[str]:
    """Plain-text lines on the measured noise and whether the winner is really ahead."""
    n = result.noise
    if not n:
        return []
    if n.get("assumed"):
        out = [f"noise: no plan was measured twice; assuming {n['threshold']:.1%} (differences below it are ties)"]
    else:
        per = ", ".join(f"{v:.1%}" for v in n["per_plan"].values())
        out = [
            (
                f"noise: spread of repeated trials (max-min)/median: {per}; plans closer than "
                f"{n['threshold']:.1%} are called tied"
            )
        ]
    w = result.winner_measured
    runner_up = None if w is None else w["runner_up_step_s"]
    if w is not None and runner_up is not None:
        gap = runner_up / w["step_s"] - 1
        verdict = "faster beyond the noise" if w["beats_runner_up_beyond_noise"] else "tied within the noise"
        out.append(f"winner vs runner-up: {gap:+.1%} step time; {verdict}")
    return out
