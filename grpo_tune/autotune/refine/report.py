"""After the trials: the result (winner, noise, rank correlation, calibration), the console summary, emit.

Noise is reported honestly: the spread of repeated trials of one plan ((max - min) / median) is
printed, and two plans are called different only when their measured step times differ by more
than that spread (or by more than the assumed noise when no plan was measured twice).
"""

from __future__ import annotations

import shlex

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_tune.core.config import RunConfig, TrainerOptions, atomic_write
from grpo_tune.core.config import save as save_config
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.strategy import Strategy
from grpo_tune.costmodel.estimate import Estimate

from grpo_tune.autotune.calibrate.stats import spearman
from grpo_tune.autotune.refine.policy import measured_noise, spread
from grpo_tune.autotune.refine.study import StudyHandle, TrialRecord, counted, records

if TYPE_CHECKING:  # rich is imported lazily, only when a bar is shown
    from rich.progress import Progress


@dataclass
class RefineResult:
    """What a refinement produced. ``winner`` is None when no trial completed."""

    study_name: str
    storage: str
    out_dir: Path
    records: list[TrialRecord]
    winner: RunConfig | None = None
    winner_trial: int | None = None
    winner_measured: dict[str, Any] | None = None
    median_tokens_per_s: float | None = None
    spearman_step_s: float | None = None
    """Spearman rank correlation of predicted vs measured step time over completed trials."""
    calibration: Any = None
    """An :class:`autotune.calibrate.fit.CalibrationResult`, when a fit was possible."""
    noise: dict[str, Any] = field(default_factory=dict)
    """``spread`` (largest (max - min) / median of a plan's repeated trials, None if none), ``per_plan``,
    ``threshold`` (what a difference must exceed), ``assumed`` (True when no plan was repeated)."""
    emitted: dict[str, Any] = field(default_factory=dict)
    """Paths written for the winner (best.yaml and whatever search's emitter writes)."""

    @property
    def completed(self) -> list[TrialRecord]:
        return [r for r in self.records if r.state == "COMPLETE" and r.measured_tokens_per_s]

    def to_dict(self) -> dict[str, Any]:
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


def _tps(r: TrialRecord) -> float:
    """A completed trial's measured tokens/s (``RefineResult.completed`` keeps only trials that have one)."""
    assert r.measured_tokens_per_s is not None, f"trial #{r.number} has no measured tokens/s"
    return r.measured_tokens_per_s


def _step_s(r: TrialRecord) -> float:
    """A completed trial's measured step time (the loop records it with its tokens/s)."""
    assert r.measured_step_s is not None, f"trial #{r.number} has no measured step time"
    return r.measured_step_s


def by_plan(done: Sequence[TrialRecord]) -> dict[str, list[TrialRecord]]:
    out: dict[str, list[TrialRecord]] = {}
    for r in done:
        out.setdefault(r.plan or f"#{r.number}", []).append(r)
    return out


def noise_of(done: Sequence[TrialRecord], assumed: float) -> dict[str, Any]:
    groups = by_plan(done)
    per = {k: spread([_step_s(r) for r in v]) for k, v in groups.items() if len(v) >= 2}
    s = measured_noise({i: [_step_s(r) for r in v] for i, v in enumerate(groups.values())})
    return {"spread": s, "per_plan": per, "threshold": assumed if s is None else s, "assumed": s is None}


def differ(a_s: float, b_s: float, threshold: float) -> bool:
    """Are two median step times different beyond the noise threshold (relative to the faster)?"""
    return abs(a_s - b_s) > threshold * min(a_s, b_s)


def best_plan(groups: dict[str, list[TrialRecord]]) -> str:
    """The plan whose completed trials have the best median tokens/s (the refinement's choice)."""
    med = {k: statistics.median(_tps(r) for r in v) for k, v in groups.items()}
    return max(med, key=lambda k: med[k])


def _winner(
    result: RefineResult, groups: dict[str, list[TrialRecord]], gpus: int, study_name: str, plan: str | None = None
) -> TrialRecord:
    """The chosen plan (default: the best median tokens/s over its trials); figures are its medians."""
    med = {k: statistics.median(_tps(r) for r in v) for k, v in groups.items()}
    chosen = plan if plan is not None and plan in groups else best_plan(groups)
    trials = groups[chosen]
    rep = min(trials, key=lambda r: abs(_tps(r) - med[chosen]))
    step = statistics.median(_step_s(r) for r in trials)
    runner = sorted(((statistics.median(_step_s(r) for r in v), k) for k, v in groups.items() if k != chosen))
    thr = result.noise["threshold"]
    median_all = result.median_tokens_per_s
    assert median_all is not None, "finish sets the median before it chooses the winner"
    result.winner_trial = rep.number
    result.winner_measured = {
        "trial": rep.number,
        "trials_of_plan": [r.number for r in trials],
        "study": study_name,
        "storage": result.storage,
        "step_s": step,
        "tokens_per_s": med[chosen],
        "tokens_per_s_per_gpu": med[chosen] / gpus,
        "phases_s": rep.measured_phases_s,
        "peak_memory_bytes": rep.peak_memory_bytes,
        "median_trial_tokens_per_s": result.median_tokens_per_s,
        "speedup_vs_median_trial": med[chosen] / median_all,
        "trials_completed": len(result.completed),
        "runner_up_step_s": runner[0][0] if runner else None,
        "chosen_by": "posterior mean (model prior + measurements)" if chosen != best_plan(groups) else "best median",
        "beats_runner_up_beyond_noise": differ(step, runner[0][0], thr) if runner else None,
        "noise_threshold": thr,
    }
    return rep


def finish(
    h: StudyHandle, *, name: str, storage: str, out: Path, inputs: tuple, plans, opts, console, search=None
) -> RefineResult:
    model, hardware, cluster, workload = inputs
    result = RefineResult(study_name=name, storage=storage, out_dir=out, records=records(h.study))
    done = result.completed
    if not done:
        console.print("[red]no trial completed[/]; see the reasons in the table (and trials/*/profile.log)")
        return result
    pairs = [(r.predicted_step_s, r.measured_step_s) for r in done if r.predicted_step_s and r.measured_step_s]
    result.spearman_step_s = spearman([p for p, _ in pairs], [m for _, m in pairs])
    result.median_tokens_per_s = statistics.median(_tps(r) for r in done)
    result.noise = noise_of(done, opts.noise)
    from grpo_tune.autotune.refine.loop import winner_plan

    best = _winner(result, by_plan(done), cluster.gpus, name, winner_plan(h, plans))
    est = plans.space[plans.index[best.plan]] if best.plan in plans.index else None
    strategy = est.strategy if est is not None else Strategy.from_dict(best.strategy or {})
    winner = RunConfig(
        model=model,
        hardware=hardware,
        cluster=cluster,
        strategy=strategy,
        workload=workload,
        trainer=opts.trainer or TrainerOptions(),
        measured=result.winner_measured,
        meta={"study": name, "trial": best.number, "storage": storage},
    )
    result.winner = winner
    if opts.calibrate:
        _calibrate(result, done, inputs, opts, console)
    atomic_write(out / "refine.json", json.dumps(result.to_dict(), indent=2, default=str))
    result.emitted["refine_json"] = out / "refine.json"
    if opts.emit:
        result.emitted.update(_emit(result, winner, est, search))
    print_summary(result, console)
    return result


def _calibrate(result: RefineResult, done, inputs: tuple, opts, console) -> None:
    model, hardware, cluster, workload = inputs
    try:
        from grpo_tune.autotune.calibrate.fit import fit_records

        result.calibration = fit_records(
            done, model=model, hardware=hardware, cluster=cluster, workload=workload, base=opts.calibration
        )
    except GrpoTuneError as exc:
        console.print(f"[yellow]calibration skipped[/]: {exc.message}", highlight=False)
    if result.calibration is not None:
        result.calibration.save(result.out_dir / "calibration.json", hardware=hardware.name)
        result.emitted["calibration"] = result.out_dir / "calibration.json"


def _label(r: TrialRecord) -> str | None:
    if not r.strategy:
        return r.plan
    from grpo_tune.rundir.report import plan_label

    return plan_label(Strategy.from_dict(r.strategy))


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
    w = result.winner_measured or {}
    if w.get("runner_up_step_s") is not None:
        gap = w["runner_up_step_s"] / w["step_s"] - 1
        verdict = "faster beyond the noise" if w["beats_runner_up_beyond_noise"] else "tied within the noise"
        out.append(f"winner vs runner-up: {gap:+.1%} step time; {verdict}")
    return out


def print_summary(result: RefineResult, console) -> None:
    """Trials table, rank correlation before/after calibration, noise, winner vs the median trial."""
    from rich.table import Table

    t = Table(title=f"Refinement: study {result.study_name}", title_justify="left")
    for c in ("#", "state", "predicted s", "measured s", "tokens/s", "plan / reason"):
        t.add_column(c, justify="left" if c in ("state", "plan / reason") else "right")
    for r in result.records:
        f = lambda x: "-" if x is None else f"{x:.3g}"
        t.add_row(
            str(r.number),
            r.state + (" (repeat)" if r.repeat and r.ran else ""),
            f(r.predicted_step_s),
            f(r.measured_step_s),
            "-" if r.measured_tokens_per_s is None else f"{r.measured_tokens_per_s:,.1f}",
            (r.reason or _label(r) or "")[:90],
        )
    console.print(t)
    sp = "-" if result.spearman_step_s is None else f"{result.spearman_step_s:.3f}"
    console.print(
        f"Spearman rank correlation, predicted vs measured step time ({len(result.completed)} trials): [bold]{sp}[/]",
        highlight=False,
    )
    cal = result.calibration
    if cal is not None:
        b, a = cal.before, cal.after
        fs = lambda x: "-" if x is None else f"{x:.3f}"
        console.print(
            f"calibration: MAPE {b['mape_pct']:.1f}% -> {a['mape_pct']:.1f}%, Spearman {fs(b['spearman'])} -> "
            f"[bold]{fs(a['spearman'])}[/] (saved {result.out_dir / 'calibration.json'})",
            highlight=False,
        )
        for w in cal.warnings:
            console.print(f"[yellow]calibration warning[/]: {w}", highlight=False)
    for line in noise_lines(result):
        console.print(line, highlight=False)
    w = result.winner_measured
    if w:
        console.print(
            f"winner: trial #{w['trial']} measured [bold]{w['tokens_per_s']:,.1f} tokens/s[/] "
            f"({w['tokens_per_s_per_gpu']:,.1f}/GPU, {w['step_s']:.3g} s/step, median of "
            f"{len(w['trials_of_plan'])} trial(s)) vs median trial {w['median_trial_tokens_per_s']:,.1f} "
            f"tokens/s: [bold]{w['speedup_vs_median_trial']:.2f}x[/]",
            highlight=False,
        )
    console.print(
        f"study: {result.storage} (optuna-dashboard {shlex.quote(result.storage)})", highlight=False, markup=False
    )


def _emit(result: RefineResult, winner: RunConfig, est: Estimate | None, search) -> dict[str, Path]:
    """Write the winner through search's emitter (best.yaml with ``measured``, exports, report.md),
    then append the refinement to report.md."""
    out = result.out_dir
    meta = {"refine": {k: v for k, v in (winner.meta or {}).items()}}
    if est is not None:
        from grpo_tune.rundir.emit import emit as emit_plan

        paths = dict(emit_plan(est, out, search=search, measured=result.winner_measured, meta=meta, trainer=None))
    else:  # the winner's plan is not in this space (a resumed study with another space): config only
        paths = {"best": save_config(winner, out / "best.yaml")}
    from grpo_tune.autotune.refine.markdown import append_report

    paths.update(append_report(out, result))
    return paths


class _Bar:
    def __init__(self, prog, task, total: int):
        self.prog, self.task, self.total = prog, task, total

    def advance(self, h: StudyHandle, latest: str) -> None:
        if self.prog is None:
            return
        from optuna.trial import TrialState

        done = h.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        b = max(done, key=lambda t: t.value, default=None)
        self.prog.update(
            self.task,
            completed=min(counted(h.study), self.total),
            best="-" if b is None else f"#{b.number} {b.value:,.0f} tok/s",
            latest=latest,
        )


class progress_bar:
    """A rich progress bar over the profiled trials (or nothing when disabled)."""

    def __init__(self, console, *, total: int, enabled: bool, done: int = 0):
        self.console, self.total, self.enabled, self.done = console, total, enabled, done
        self.prog: Progress | None = None

    def __enter__(self) -> _Bar:
        if not self.enabled:
            return _Bar(None, 0, self.total)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        prog = Progress(
            TextColumn("[bold]refine[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("best {task.fields[best]}"),
            TextColumn("| latest {task.fields[latest]}"),
            console=self.console,
            transient=False,
        )
        self.prog = prog
        prog.__enter__()
        task = prog.add_task("trials", total=self.total, completed=min(self.done, self.total), best="-", latest="-")
        return _Bar(prog, task, self.total)

    def __exit__(self, *exc):
        if self.prog is not None:
            self.prog.__exit__(*exc)
        return False
