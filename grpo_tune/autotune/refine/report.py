"""After the trials: the winner's figures, the calibration, the console summary and the emitted run folder
(the result and its measured noise are in :mod:`.results`)."""

from __future__ import annotations

import shlex

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_tune.core.config import RunConfig, TrainerOptions, atomic_write
from grpo_tune.core.config import save as save_config
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.strategy import Strategy
from grpo_tune.costmodel.estimate import Estimate

from grpo_tune.autotune.calibrate.stats import spearman
from grpo_tune.autotune.refine.results import (
    RefineResult,
    best_plan,
    by_plan,
    differ,
    noise_lines,
    noise_of,
    trial_step_s,
    trial_tokens_per_s,
)
from grpo_tune.autotune.refine.study import StudyHandle, TrialRecord, counted, records

if TYPE_CHECKING:  # rich is imported lazily, only when a bar is shown
    from rich.progress import Progress


def _winner(
    result: RefineResult, groups: dict[str, list[TrialRecord]], gpus: int, study_name: str, plan: str | None = None
) -> TrialRecord:
    """The chosen plan (default: the best median tokens/s over its trials); figures are its medians."""
    med = {k: statistics.median(trial_tokens_per_s(r) for r in v) for k, v in groups.items()}
    chosen = plan if plan is not None and plan in groups else best_plan(groups)
    trials = groups[chosen]
    rep = min(trials, key=lambda r: abs(trial_tokens_per_s(r) - med[chosen]))
    step = statistics.median(trial_step_s(r) for r in trials)
    runner = sorted(((statistics.median(trial_step_s(r) for r in v), k) for k, v in groups.items() if k != chosen))
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
    h: StudyHandle,
    *,
    name: str,
    storage: str,
    out: Path,
    inputs: tuple,
    plans,
    chosen: str | None,
    opts,
    console,
    search=None,
) -> RefineResult:
    """The result of the trials: ``chosen`` is the plan the loop picked (loop.winner_plan; None: the best median)."""
    model, hardware, cluster, workload = inputs
    result = RefineResult(study_name=name, storage=storage, out_dir=out, records=records(h.study))
    done = result.completed
    if not done:
        console.print("[red]no trial completed[/]; see the reasons in the table (and trials/*/profile.log)")
        return result
    pairs = [(r.predicted_step_s, r.measured_step_s) for r in done if r.predicted_step_s and r.measured_step_s]
    result.spearman_step_s = spearman([p for p, _ in pairs], [m for _, m in pairs])
    result.median_tokens_per_s = statistics.median(trial_tokens_per_s(r) for r in done)
    result.noise = noise_of(done, opts.noise)
    best = _winner(result, by_plan(done), cluster.gpus, name, chosen)
    est = plans.space[plans.index[best.plan]] if best.plan in plans.index else None
    strategy = est.strategy if est is not None else Strategy.from_dict(best.strategy or {})
    winner = RunConfig(
        model=model,
        hardware=hardware,
        cluster=cluster,
        strategy=strategy,
        workload=workload,
        trainer=opts.trainer or TrainerOptions(),
        measured=result.measured(),
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
        for warning in cal.warnings:
            console.print(f"[yellow]calibration warning[/]: {warning}", highlight=False)
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
    import shutil

    from grpo_tune.autotune.refine.markdown import append_report
    from grpo_tune.rundir.emit import emit as emit_plan
    from grpo_tune.rundir.emit import place_files, staging

    out = Path(result.out_dir)
    meta = {"refine": {k: v for k, v in (winner.meta or {}).items()}}
    # staged as search's folders are: every file is written into a stage inside the run folder, then moved in
    stage = staging(out)
    try:
        if est is not None:
            paths = dict(
                emit_plan(est, out, stage=stage, search=search, measured=result.measured(), meta=meta, trainer=None)
            )
        else:  # the winner's plan is not in this space (a resumed study with another space): config only
            if (out / "report.md").is_file():
                shutil.copyfile(out / "report.md", stage / "report.md")
            paths = {"best": save_config(winner, stage / "best.yaml")}
        paths.update(append_report(stage, result))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return place_files(stage, out, paths)


class _Bar:
    def __init__(self, prog, task, total: int):
        self.prog, self.task, self.total = prog, task, total

    def advance(self, h: StudyHandle, latest: str) -> None:
        if self.prog is None:
            return
        from optuna.trial import TrialState

        done = h.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        b = max(done, key=lambda t: t.value if t.value is not None else float("-inf"), default=None)
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
