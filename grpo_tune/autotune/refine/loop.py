"""The refinement loop: options, the plan-choosing loop (with any measuring function), ``refine()``."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_tune.core.config import RunConfig, TrainerOptions
from grpo_tune.core.config import atomic_write
from grpo_tune.core.config import save as save_config
from grpo_tune.core.errors import ConfigError, NoFeasiblePlanError
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Workload
from grpo_tune.costmodel.estimate import Estimate

from grpo_tune.autotune.refine import space as S
from grpo_tune.autotune.refine.policy import ModelGuided
from grpo_tune.autotune.refine.runner import ProfileOutcome, positive, run_profile
from grpo_tune.autotune.refine.study import StudyHandle, counted, open_study, recover, redact, worker_host

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

POLICIES = ("model", "tpe")


@dataclass(frozen=True)
class RefineOptions:
    """How a refinement runs (``grpo-tune search --refine`` flags map onto these)."""

    trials: int = 8
    """Profiled trials the study should hold in total (a resumed study counts its old ones)."""
    trial_steps: int = 6
    """``--steps`` of each profiling run (the first step is warm-up)."""
    trial_timeout_s: float = 600.0
    policy: str = "tpe"
    """``tpe`` (the default: benchmarks/bench_refine.py measured it closer to the best than ``model`` at
    every budget): the model's top-k distinct plans, then Optuna's TPE over plan ranks. ``model``: the
    cost model as a prior, re-calibrated after every trial by a GP on its error (autotune.refine.policy)."""
    noise: float = 0.05
    """Relative noise assumed until repeated trials measure it."""
    top_k: int = 4
    """``tpe``: how many of the model's best plans (with distinct predictions) are enqueued first."""
    slower_than: float = 3.0
    """``tpe``: skip a plan predicted this many times slower than the best measured plan's prediction."""
    storage: str | None = None
    """Any SQLAlchemy URL; default ``sqlite:///<out_dir>/study.db``."""
    study_name: str | None = None
    seed: int | None = None
    heartbeat_s: int = 10
    calibration: dict[str, float] | None = None
    """Efficiency parameters the estimates were made with (recorded on the study, base of the fit)."""
    trainer: TrainerOptions | None = None
    profile_cmd: Sequence[str] | None = None
    emit: bool = True
    calibrate: bool = True
    progress: bool = True
    pins: dict[str, object] | None = None
    allow_cross_node_tp: bool = False
    launcher: str = "local"
    """``local``: each trial's profile runs here; ``slurm``: as one sbatch job sized to the plan (refine/slurm.py)."""

    def check(self) -> None:
        if self.trials < 1:
            raise ConfigError(f"--trials must be >= 1, got {self.trials}")
        if self.trial_steps < 2:
            raise ConfigError(f"--trial-steps must be >= 2 (the first step is warm-up), got {self.trial_steps}")
        if not (math.isfinite(self.trial_timeout_s) and self.trial_timeout_s > 0):  # nan passed `<= 0`
            raise ConfigError(f"--trial-timeout must be a finite number of seconds > 0, got {self.trial_timeout_s}")
        from grpo_tune.autotune.refine.slurm import LAUNCHERS

        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"unknown --launcher {self.launcher!r}", hint=f"one of {', '.join(LAUNCHERS)}")
        if self.launcher == "slurm":
            from grpo_tune.autotune.refine.slurm import check_available

            check_available()
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown refine policy {self.policy!r}", hint=f"one of {', '.join(POLICIES)}")
        if not 0 <= self.noise < 1:
            raise ConfigError(f"noise must be in [0, 1), got {self.noise}")
        if self.storage is not None:
            _check_storage_url(self.storage)
        name = self.study_name
        if name is not None and (
            not name.strip() or name in (".", "..") or any(c in name for c in "/\\") or not name.isprintable()
        ):  # it names the run folder under --out: "../../x" wrote outside it, "a/b" nested folders
            raise ConfigError(
                f"--study-name {name!r} must be one folder name (no '/', '..' or control characters)",
                hint="e.g. --study-name qwen7b-8gpu",
            )


def _check_storage_url(url: str) -> None:
    """Refuse a --storage that SQLAlchemy cannot parse, or whose driver is missing, before any file is written."""
    from grpo_tune.autotune.refine.study import check_url

    check_url(url)


Measure = Callable[[StudyHandle, int, Estimate], ProfileOutcome]
"""(study, trial number, plan) -> outcome: a real profiling run, or the benchmark's cached one."""


@dataclass
class PlanIndex:
    """The ranked plans a loop chooses from, indexed: by plan key (a trial's ``plan`` attribute) and by knob values
    (a sampled trial's parameters), each to the plan's rank in ``space``; with the chooser and the study's
    parameters."""

    space: list[Estimate]
    keys: list[str]
    index: dict[str, int]
    chooser: ModelGuided | None
    dists: dict[str, BaseDistribution] = dataclasses.field(default_factory=dict)
    """The study's parameters: the plans' real knobs (refine.space.knob_distributions)."""
    by_knobs: dict[tuple, int] = dataclasses.field(default_factory=dict)
    """Knob values -> the best-ranked plan with them (a sampled trial's plan)."""

    @classmethod
    def of(cls, space: Sequence[Estimate], opts: RefineOptions) -> PlanIndex:
        keys = [S.plan_key(e.strategy) for e in space]
        chooser = ModelGuided(space, noise=opts.noise) if opts.policy == "model" else None
        by_knobs: dict[tuple, int] = {}
        for i, e in enumerate(space):
            by_knobs.setdefault(S.knob_tuple(S.knob_params(e.strategy)), i)
        dists = S.knob_distributions(space) if space else {}
        return cls(list(space), keys, {k: i for i, k in enumerate(keys)}, chooser, dists, by_knobs)

    def rank_of(self, trial: optuna.trial.Trial) -> int | None:
        """The rank in ``space`` of the plan a trial runs: the one it was enqueued with, else the best-ranked plan
        whose knobs the sampler chose (None: no plan of the space has them)."""
        key = trial.user_attrs.get("plan")
        i = self.index.get(key) if isinstance(key, str) else None
        return i if i is not None else self.by_knobs.get(S.knob_tuple(trial.params))


def _measured(h: StudyHandle, plans: PlanIndex) -> tuple[list[tuple[int, float]], set[int]]:
    """Completed measurements ``(plan index, step_s)``, and plans not to choose (profiling now, or failed)."""
    from optuna.trial import TrialState

    obs, busy = [], set()
    for t in h.study.get_trials(deepcopy=False):
        plan = t.user_attrs.get("plan")
        i = plans.index.get(plan) if isinstance(plan, str) else None
        if i is None:
            continue
        if t.state == TrialState.RUNNING:
            if t.user_attrs.get("running_profile"):
                busy.add(i)
        elif t.state == TrialState.COMPLETE and positive(t.user_attrs.get("measured_step_s")):
            obs.append((i, float(t.user_attrs["measured_step_s"])))
        elif t.user_attrs.get("ran") and not str(t.user_attrs.get("reason", "")).startswith("interrupted"):
            busy.add(i)  # it crashed, ran out of memory or timed out: not again
    return obs, busy


def enqueue(h: StudyHandle, plans: PlanIndex, index: int, *, skip_if_exists: bool = False, **attrs: object) -> None:
    """Queue plan ``index`` for the next ask; the WAITING trial carries its plan key (public user attrs)."""
    h.study.enqueue_trial(
        S.knob_params(plans.space[index].strategy),
        user_attrs={"plan": plans.keys[index], "plan_rank": index, **attrs},
        skip_if_exists=skip_if_exists,
    )


def winner_plan(h: StudyHandle, plans: PlanIndex) -> str | None:
    """The refinement's choice. ``model``: the measured plan with the fastest posterior mean
    (measurements weighed against their noise and the model); ``tpe``: the best median tokens/s."""
    from grpo_tune.autotune.refine.results import best_plan, by_plan
    from grpo_tune.autotune.refine.study import records

    obs, _ = _measured(h, plans)
    best = plans.chooser.recommend(obs) if plans.chooser is not None and obs else None
    if best is not None:
        return plans.keys[best]
    done = [r for r in records(h.study) if r.state == "COMPLETE" and r.measured_tokens_per_s]
    return best_plan(by_plan(done)) if done else None


def _next_plan(h: StudyHandle, plans: PlanIndex, opts: RefineOptions) -> tuple[int, str, bool] | None:
    """``tpe``: the next unmeasured plan in rank order (preferring a prediction unlike those measured)."""
    from optuna.trial import TrialState

    seen = set()
    for t in h.study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            seen.add(t.user_attrs.get("plan"))  # set by enqueue()
        elif t.state == TrialState.RUNNING or t.user_attrs.get("ran"):
            seen.add(t.user_attrs.get("plan"))
    taken = [plans.space[plans.index[k]] for k in seen if k in plans.index]
    fallback = None
    for i, k in enumerate(plans.keys):
        if k in seen or _too_slow(h, plans, opts, i):
            continue
        if fallback is None:
            fallback = i
        if all(not S.close(plans.space[i], e) for e in taken):
            return i, "next unmeasured plan in rank order", False
    return None if fallback is None else (fallback, "next unmeasured plan in rank order", False)


def _nearest_unseen(h: StudyHandle, plans: PlanIndex, params: dict[str, int | float | str]) -> int | None:
    """The untried plan closest to a sampled set of knobs (integer knobs on a log2 scale, a differing
    choice counts 1), the better-ranked one on a tie."""
    import math

    from optuna.trial import TrialState

    seen = {
        t.user_attrs.get("plan")
        for t in h.study.get_trials(deepcopy=False)
        if t.state in (TrialState.WAITING, TrialState.RUNNING) or t.user_attrs.get("ran")
    }

    def dist(i: int) -> float:
        mine = S.knob_params(plans.space[i].strategy)
        d = 0.0
        for k, v in mine.items():
            w = params.get(k, v)
            if isinstance(v, bool) or isinstance(v, str):
                d += float(v != w)
            elif k in S.INT_KNOBS:
                d += abs(math.log2(1 + float(v)) - math.log2(1 + float(w)))
            else:
                d += abs(float(v) - float(w)) * 10
        return d

    todo = [i for i, k in enumerate(plans.keys) if k not in seen]
    return min(todo, key=lambda i: (dist(i), i), default=None)


def _best(h: StudyHandle):
    from optuna.trial import TrialState

    done = h.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return max(done, key=lambda t: t.value if t.value is not None else float("-inf"), default=None)


def _too_slow(h: StudyHandle, plans: PlanIndex, opts: RefineOptions, i: int) -> str | None:
    best = _best(h)
    if best is None:
        return None
    p_best = best.user_attrs.get("predicted_step_s")
    p = S.predicted(plans.space[i])[0]
    if p_best and p and p > opts.slower_than * p_best:
        return (
            f"predicted {p / p_best:.1f}x slower than the best measured plan "
            f"(trial #{best.number}) in the cost model's own terms; not run"
        )
    return None


def _duplicate(h: StudyHandle, number: int, key: str, repeat: bool) -> str | None:
    from optuna.trial import TrialState

    for t in h.study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED, TrialState.FAIL)
    ):
        if t.number == number or t.user_attrs.get("plan") != key:
            continue
        if t.state == TrialState.RUNNING and t.user_attrs.get("running_profile"):
            return f"duplicate: trial #{t.number} is profiling this plan now; not run"
        if repeat:
            continue
        if t.user_attrs.get("ran") and not str(t.user_attrs.get("reason", "")).startswith("interrupted"):
            return f"duplicate of trial #{t.number} ({t.state.name}); not run again"
    return None


def _ask(h: StudyHandle, plans: PlanIndex, chooser: ModelGuided) -> tuple[optuna.trial.Trial, bool] | None:
    """``model``: enqueue the chooser's pick and ask for it; None when nothing is worth a trial."""
    from optuna.trial import TrialState

    if h.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):  # a requeued plan goes first
        trial = h.study.ask(plans.dists)
        return trial, bool(trial.user_attrs.get("repeat"))
    obs, busy = _measured(h, plans)
    pick = chooser.choose(obs, busy)
    if pick is None:
        return None
    enqueue(h, plans, pick.index, seed=pick.why, repeat=pick.repeat)
    trial = h.study.ask(plans.dists)
    return trial, bool(trial.user_attrs.get("repeat"))


def _start_trial(h: StudyHandle, trial, est: Estimate, key: str, rank: int, host: str) -> None:
    import time

    pred_step, pred_tps = S.predicted(est)
    for k, v in (
        ("plan", key),
        ("plan_rank", rank),
        ("worker", {"host": host, "pid": os.getpid()}),
        ("strategy", est.strategy.to_dict()),
        ("predicted_step_s", pred_step),
        ("predicted_tokens_per_s", pred_tps),
        ("heartbeat_utc", time.time()),
    ):
        trial.set_user_attr(k, v)


def _tell(h: StudyHandle, trial, res: ProfileOutcome) -> str:
    """Record a profiling outcome on the trial (attributes first), finish it; return a one-line summary."""
    from optuna.trial import TrialState

    trial.set_user_attr("ran", True)
    trial.set_user_attr("duration_s", round(res.duration_s, 3))
    if res.status != "ok" or not res.data:
        trial.set_user_attr("reason", f"{res.status}: {res.message}")
        h.study.tell(trial, state=TrialState.PRUNED if res.status == "oom" else TrialState.FAIL)
        return f"#{trial.number} {res.status}"
    d = res.data
    step, tokens_per_s = _real(d["step_s"]), _real(d["tokens_per_s"])
    phases, peak_of = d.get("phases_s") or {}, d.get("peak_memory_bytes") or {}
    if not isinstance(phases, Mapping) or not isinstance(peak_of, Mapping):
        raise TypeError("a profile report's phases_s and peak_memory_bytes are mappings")
    trial.set_user_attr("measured_step_s", step)
    trial.set_user_attr("measured_tokens_per_s", tokens_per_s)
    trial.set_user_attr(
        "measured_phases_s",
        {k: float(v) for k, v in phases.items() if isinstance(v, (int, float)) and (positive(v) or v == 0)},
    )
    peak = peak_of.get("max")
    trial.set_user_attr("peak_memory_bytes", int(peak) if isinstance(peak, (int, float)) else None)
    h.study.tell(trial, tokens_per_s)
    pred = trial.user_attrs.get("predicted_step_s")
    return f"#{trial.number} step predicted {'-' if pred is None else f'{pred:.3g}'} s / measured {step:.3g} s"


def _real(v: object) -> float:
    """``float(v)`` for a report's figure (a number, or a numeric string as float() reads it)."""
    if isinstance(v, (int, float, str)):
        return float(v)
    raise TypeError(f"float() argument must be a string or a real number, not {type(v).__name__!r}")


def run_trials(
    h: StudyHandle,
    plans: PlanIndex,
    opts: RefineOptions,
    measure: Measure,
    *,
    host: str,
    say: Callable[[str], None] = lambda s: None,
    on_trial: Callable[[str], None] = lambda s: None,
    requeue: Callable[[], list[optuna.trial.Trial]] | None = None,
) -> None:
    """Choose, measure and record trials until the study holds ``opts.trials`` profiled ones.

    ``measure`` does the measuring; everything else (the choice of plan, duplicate and slow-plan
    skips, the study's records) is the same whether it profiles for real or reads a cache.
    ``requeue()``: trials of dead workers this worker has taken over (see :func:`_take_over`), measured first.
    """
    from optuna.trial import TrialState

    skips = 20 * opts.trials + 20  # hard stop for sampling loops that find nothing new
    while skips > 0:
        if requeue is not None:
            for trial in requeue():  # a dead worker's trial: its plan is measured here, before any other
                on_trial(_tell(h, trial, measure(h, trial.number, plans.space[plans.index[trial.user_attrs["plan"]]])))
        if counted(h.study) >= opts.trials:
            if requeue is None or not _profiling_elsewhere(h):
                break
            # the budget is reached only if the trials other workers are profiling finish: wait for them, and
            # take one over if its worker dies (requeue() above fails it, and the count drops)
            import time

            time.sleep(max(0.2, min(h.heartbeat_s or 1.0, 5.0)))
            continue
        repeat = False
        if plans.chooser is not None:
            asked = _ask(h, plans, plans.chooser)
            if asked is None:
                say("no untried plan is likely to beat the best by more than the noise; stopping early")
                return
            trial, repeat = asked
        else:
            trial = h.study.ask(plans.dists)
        found = plans.rank_of(trial)
        if found is None:  # the sampler combined knobs no plan has: queue the nearest untried plan instead
            skips -= 1
            near = _nearest_unseen(h, plans, trial.params)
            trial.set_user_attr(
                "reason", "no plan of the space has these knobs; " + ("none left" if near is None else "nearest queued")
            )
            trial.set_user_attr("ran", False)
            h.study.tell(trial, state=TrialState.PRUNED)
            if near is None:
                say("every plan worth running has been tried; stopping early")
                return
            enqueue(h, plans, near, seed="nearest plan to the sampler's proposal")
            continue
        rank = found
        est, key = plans.space[rank], plans.keys[rank]
        _start_trial(h, trial, est, key, rank, host)
        reason = _duplicate(h, trial.number, key, repeat) or (
            None if repeat or plans.chooser else _too_slow(h, plans, opts, rank)
        )
        if not reason:
            # claim the plan, then look again: of two workers (on two machines) that took the same plan at the same
            # moment, each sees the other's claim at least once the second looks, so at most one of them profiles it
            trial.set_user_attr("running_profile", True)
            reason = _duplicate(h, trial.number, key, repeat)
            if not reason and counted(h.study) > opts.trials:
                # the same race on the budget: workers that claimed the last slot at once all see the overshoot
                # once the last claim lands, so the study never holds more than `trials` (one that sees it backs off)
                trial.set_user_attr("running_profile", False)
                trial.set_user_attr("reason", "over budget: other workers claimed the last trial(s) at once; not run")
                trial.set_user_attr("ran", False)
                h.study.tell(trial, state=TrialState.PRUNED)
                continue
            if reason:
                trial.set_user_attr("running_profile", False)
        if reason:
            skips -= 1
            trial.set_user_attr("reason", reason)
            trial.set_user_attr("ran", False)
            h.study.tell(trial, state=TrialState.PRUNED)
            nxt = _next_plan(h, plans, opts) if plans.chooser is None else None
            if plans.chooser is None and nxt is None:
                say("every plan worth running has been tried; stopping early")
                return
            if nxt is not None:
                enqueue(h, plans, nxt[0], seed=nxt[1])
            continue
        res = measure(h, trial.number, est)
        on_trial(_tell(h, trial, res))
        _stop_if_machine_refused(res)
    if skips <= 0:
        say("stopped sampling: the sampler kept proposing plans already measured or predicted far slower")


MACHINE_REFUSALS = ("NO_GPU",)
"""Codes of a trial's pre-start check that are about this machine, not the plan: every trial would meet them."""


def _stop_if_machine_refused(res: ProfileOutcome) -> None:
    """Stop the refinement at the first trial refused for a reason of this machine (a GPU plan where there is no
    GPU), with that refusal, instead of failing every trial the same way."""
    import re

    from grpo_tune.core.errors import GrpoTuneError

    for code in MACHINE_REFUSALS:
        found = re.search(rf"\[{code}\] (.*?)(?: \| hint: (.*?))?(?: \||$)", res.message or "")
        if res.status == "error" and found:
            raise GrpoTuneError(found.group(1), hint=found.group(2) or "", code=code)


def _profiling_elsewhere(h: StudyHandle) -> bool:
    """Does some worker hold a RUNNING trial that is profiling (and so counts toward the budget)?"""
    from optuna.trial import TrialState

    return any(
        t.user_attrs.get("running_profile") for t in h.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    )


def profile_measure(out: Path, inputs: tuple, opts: RefineOptions, study_name: str, *, watchdog=None) -> Measure:
    """The real measuring function: write the trial's RunConfig and run ``grpo-tune profile`` on it."""
    model, hardware, cluster, workload = inputs
    base = opts.trainer or TrainerOptions()

    def measure(h: StudyHandle, number: int, est: Estimate) -> ProfileOutcome:
        from grpo_tune.rundir.emit import predicted as predicted_block

        tdir = out / "trials" / f"{number:04d}"
        tdir.mkdir(parents=True, exist_ok=True)
        cfg = RunConfig(
            model=model,
            hardware=hardware,
            cluster=cluster,
            strategy=est.strategy,
            workload=workload,
            trainer=dataclasses.replace(base, steps=opts.trial_steps, out_dir=str(tdir / "train")),
            predicted=predicted_block(est),
            meta={"study": study_name, "trial": number, "plan": S.plan_key(est.strategy)},
        )
        path = save_config(cfg, tdir / "config.yaml")
        h.set_attr(number, "config", str(path))
        host = worker_host()

        def started(pid: int) -> None:
            h.set_attr(number, "worker", {"host": host, "pid": os.getpid(), "pgid": pid})

        command = cleanup = stop_cmd = None
        if opts.launcher == "slurm":
            from grpo_tune.autotune.refine import slurm

            job = f"grpo-tune-{study_name}-{number:04d}"[:120]
            script = tdir / "job.sbatch"
            atomic_write(
                script,
                slurm.job_script(
                    path,
                    cfg,
                    steps=opts.trial_steps,
                    json_path=tdir / "profile.json",
                    timeout_s=opts.trial_timeout_s,
                    job_name=job,
                    log_path=tdir / "slurm.log",
                ),
            )
            command = slurm.submit_command(script)
            stop_cmd = slurm.cancel_command(job)

            def cleanup() -> None:
                slurm.cancel(job)

        with h.heartbeat(number):
            return run_profile(
                path,
                steps=opts.trial_steps,
                timeout_s=opts.trial_timeout_s,
                json_path=tdir / "profile.json",
                log_path=tdir / "profile.log",
                profile_cmd=opts.profile_cmd,
                on_start=started,
                watchdog=watchdog,
                command=command,
                cleanup=cleanup,
                stop_cmd=stop_cmd,
            )

    return measure


def plan_space(ranked: Sequence[Estimate], inputs: tuple, opts: RefineOptions) -> tuple[list[Estimate], list[str]]:
    """The study's plans: fitting (cost model) and accepted by the trainer (its preflight)."""
    space = S.build_space(  # inputs: (model, hardware, cluster, workload), build_space's order
        ranked, *inputs, calibration=opts.calibration, pins=opts.pins, allow_cross_node_tp=opts.allow_cross_node_tp
    )
    if not space:
        raise NoFeasiblePlanError(
            "no plan predicted to fit: nothing to refine", hint="add GPUs, shrink the workload, or relax pinned degrees"
        )
    space, rejected = S.runnable(space, opts.trainer or TrainerOptions())
    if not space:
        raise NoFeasiblePlanError(
            "the trainer rejects every plan predicted to fit: nothing to refine",
            hint=f"e.g. {rejected[0]}" if rejected else "",
        )
    return space, rejected


def refine(
    ranked: Sequence[Estimate],
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    workload: Workload,
    out_dir: str | os.PathLike,
    opts: RefineOptions = RefineOptions(),
    *,
    console=None,
    search=None,
):
    """Measure the most promising plans of ``ranked`` with real profiling runs and pick the fastest.

    ``ranked``: search's estimates, best first (made with ``opts.calibration`` when given).
    ``search``: the :class:`autotune.search.driver.SearchResult` they came from, for the emitted
    report's tables. Returns a :class:`autotune.refine.results.RefineResult`.
    """
    from grpo_tune.autotune.refine.report import finish, progress_bar

    opts.check()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = (model, hardware, cluster, workload)
    space, rejected = plan_space(ranked, inputs, opts)
    plans = PlanIndex.of(space, opts)
    storage = opts.storage or f"sqlite:///{(out / 'study.db').resolve()}"
    name = opts.study_name or S.default_study_name(model, hardware, cluster, workload)
    h = open_study(storage, name, opts.seed, opts.heartbeat_s, max(3 * opts.heartbeat_s, 30))
    host = worker_host()
    console = console or _console()
    if rejected:
        console.print(
            f"{len(rejected)} plan(s) the trainer cannot run were left out (e.g. {rejected[0]})", highlight=False
        )
    from grpo_tune.core import lifeline
    from grpo_tune.core.runlock import acquire

    # the workers of one study share its folder (they coordinate through the study); train/profile may not
    lock = acquire(out, "grpo-tune search --refine", shared=True, say=lambda s: console.print(s, highlight=False))
    with lock, lifeline.Watchdog() as wd:
        _prepare(h, plans, opts, inputs, host, console)
        with progress_bar(console, total=opts.trials, enabled=opts.progress, done=counted(h.study)) as bar:
            run_trials(
                h,
                plans,
                opts,
                profile_measure(out, inputs, opts, name, watchdog=wd),
                host=host,
                say=lambda s: console.print(f"[yellow]{s}[/]"),
                on_trial=lambda s: bar.advance(h, s),
                requeue=lambda: _take_over(h, plans, host, console),
            )
    shown = redact(
        storage
    )  # what finish prints and writes (report.md, refine.json, best.yaml) never holds the password
    return finish(
        h,
        name=name,
        storage=shown,
        out=out,
        inputs=inputs,
        plans=plans,
        chosen=winner_plan(h, plans),
        opts=opts,
        console=console,
        search=search,
    )


def _prepare(h: StudyHandle, plans: PlanIndex, opts: RefineOptions, inputs: tuple, host: str, console) -> None:
    """Record the study's inputs, recover dead workers' trials, seed the TPE study, say if resuming."""
    model, hardware, cluster, workload = inputs
    sid = S.space_id(plans.keys)
    study = h.study
    if not study.user_attrs.get("inputs"):
        study.set_user_attr(
            "inputs",
            {
                "model": model.name,
                "hardware": hardware.name,
                "gpus": cluster.gpus,
                "gpus_per_node": cluster.gpus_per_node,
                "workload": workload.to_dict(),
                "calibration": opts.calibration,
                "plans": len(plans.keys),
                "space": sid,
                "policy": opts.policy,
            },
        )
    elif study.user_attrs["inputs"].get("space") != sid:
        console.print(
            "[yellow]the plan space differs from the one this study started with (another calibration "
            "or profile?); plan_rank values are not comparable across the two, plan keys still are[/]"
        )
    _requeue(h, plans, host, console)
    seed_study(h, plans, opts)
    done = counted(study)
    if done:
        console.print(
            f"resuming study [bold]{h.study.study_name}[/]: {done} profiled trial(s) already recorded", highlight=False
        )


def _requeue(h: StudyHandle, plans: PlanIndex, host: str, console) -> None:
    """Fail the trials of dead workers (this host: the pid is gone; elsewhere: the heartbeat went stale) and
    queue their plans again. Run at start and before every trial, so the live workers of a study take over the
    trial of one that was killed."""

    def again(plan: str) -> None:
        if plan in plans.index:
            # an interrupted re-measurement of a plan measured before stays a repeat
            rep = any(i == plans.index[plan] for i, _ in _measured(h, plans)[0])
            enqueue(h, plans, plans.index[plan], requeued=True, repeat=rep)
            console.print(f"[yellow]requeued interrupted plan[/] {plan}", highlight=False)

    recover(h, host, requeue=again)


def _take_over(h: StudyHandle, plans: PlanIndex, host: str, console) -> list[optuna.trial.Trial]:
    """Trials of dead workers (pid gone on this host, heartbeat stale elsewhere), taken over by this worker.

    For each, a RUNNING trial of the same plan is created for this worker first (it counts toward the budget at
    once), then the dead one is failed: the budget never shows a free slot that a live worker could fill with
    another plan, and the dead worker's plan is measured next, here. Of two workers that find the same dead trial,
    the one whose ``fail`` lands takes it; the other closes its copy as a duplicate."""

    import optuna
    from optuna.trial import TrialState

    taken: list[optuna.trial.Trial] = []
    mine: dict[str, optuna.trial.Trial] = {}

    def grab(plan: str) -> None:
        if plan not in plans.index:
            return
        idx = plans.index[plan]
        rep = any(i == idx for i, _ in _measured(h, plans)[0])  # an interrupted re-measurement stays a repeat
        params = S.knob_params(plans.space[idx].strategy)
        tmpl = optuna.trial.create_trial(
            state=TrialState.RUNNING,
            params=params,
            distributions={k: plans.dists[k] for k in params},
            user_attrs={"plan": plan, "plan_rank": idx, "requeued": True, "repeat": rep, "running_profile": True},
        )
        tid = h.storage.create_new_trial(h.study_id, template_trial=tmpl)
        trial = optuna.trial.Trial(h.study, tid)
        _start_trial(h, trial, plans.space[idx], plan, idx, host)
        mine[plan] = trial

    for plan in recover(h, host, requeue=grab):
        t = mine.pop(plan, None)
        if t is not None:
            console.print(f"[yellow]took over the interrupted plan[/] {plan} (trial #{t.number})", highlight=False)
            taken.append(t)
    for plan, t in mine.items():  # another worker failed the dead trial first and took it over
        t.set_user_attr("running_profile", False)
        t.set_user_attr("ran", False)
        t.set_user_attr("reason", f"duplicate: another worker took over the interrupted plan {plan}; not run")
        h.study.tell(t, state=TrialState.PRUNED)
    return taken


def seed_study(h: StudyHandle, plans: PlanIndex, opts: RefineOptions) -> None:
    """``tpe``: enqueue the cost model's top-k plans with distinct predictions (skipped if already there)."""
    if plans.chooser is None:
        for i in S.distinct(plans.space, min(opts.top_k, opts.trials)):
            enqueue(h, plans, i, skip_if_exists=True, seed="cost-model top-k")


def _console():
    from rich.console import Console

    return Console(stderr=True)
