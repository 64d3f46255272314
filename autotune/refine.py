"""Refine a ranked search with real profiling runs: an Optuna study over the cost model's plans.

``refine(...)`` is the one entry point; ``grpo-tune search ... --refine`` calls it lazily.

How a study runs:

- The plan space is the ranked list that search produced, kept to plans predicted to fit, as one
  categorical parameter ``plan`` whose choices are stable plan keys (``tp=2,pp=1,...``). Optuna
  needs the same choices every time, so the same command always builds the same space.
- The cost model's top-k plans are enqueued first (``study.enqueue_trial``, skipped if already
  there); then the sampler (TPE) picks among the rest.
- A sampled plan is *not run* and is marked PRUNED, with the reason in ``user_attrs["reason"]``,
  when it duplicates a plan already measured or running, or when its predicted step time is more
  than ``slower_than`` times the prediction for the best plan measured so far (comparing
  predictions with predictions keeps the cost model's absolute error out of the decision).
  Such trials do not count toward ``trials``; the next unmeasured plan in rank order is enqueued
  instead, so the study always makes progress.
- A plan that runs is written as a RunConfig (``trials/<number>/config.yaml``) and profiled with
  ``grpo-tune profile --config X --steps K --json out.json`` in a subprocess (own process group,
  killed on timeout). The objective is the measured tokens/s (maximized). OOM -> PRUNED,
  crash / bad JSON / timeout -> FAIL, each with its reason; the study never dies from a trial.
- ``trials`` is the number of *profiled* trials the study should hold in total. Re-running the
  same command against the same storage resumes: finished trials are kept and not rerun, a trial
  left RUNNING by a killed worker on this host (its pid is gone) is marked FAIL with reason
  ``interrupted`` and its plan re-enqueued; on other hosts the RDB heartbeat marks it stale.
  Several processes (or machines, with a shared SQLAlchemy URL) may work on one study at once.

Storage defaults to ``sqlite:///<out_dir>/study.db``; open it with
``optuna-dashboard sqlite:///<out_dir>/study.db`` (``pip install optuna-dashboard``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from costmodel.errors import ConfigError, GrpoTuneError
from costmodel.estimate import Estimate, estimate as cost_estimate
from costmodel.specs import HardwareSpec, ModelSpec
from costmodel.strategy import Cluster, Strategy, Workload

from .config import RunConfig, TrainerOptions, atomic_write, save as save_config

PHASES = ("rollout", "weight_sync", "old_logprob", "ref_logprob", "update")
PARAM = "plan"
# The profile command, run as `PROFILE_CMD + ["--config", X, "--steps", K, "--json", OUT]`.
PROFILE_CMD = [sys.executable, "-c", "from autotune.cli import run; run()", "profile"]


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

@dataclass
class TrialRecord:
    """One trial of the study, flattened for reports and calibration."""

    number: int
    state: str
    """``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING`` or ``WAITING``."""
    plan: str | None
    reason: str | None
    ran: bool
    """True when the trial profiled its plan (counts toward ``trials``)."""
    strategy: dict[str, Any] | None
    predicted_step_s: float | None
    predicted_tokens_per_s: float | None
    measured_step_s: float | None
    measured_tokens_per_s: float | None
    measured_phases_s: dict[str, float] | None
    peak_memory_bytes: int | None
    duration_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    """An :class:`autotune.calibrate.CalibrationResult`, when a fit was possible."""
    emitted: dict[str, Any] = field(default_factory=dict)
    """Paths written for the winner (best.yaml and whatever search's emitter writes)."""

    @property
    def completed(self) -> list[TrialRecord]:
        return [r for r in self.records if r.state == "COMPLETE" and r.measured_tokens_per_s]

    def to_dict(self) -> dict[str, Any]:
        return {
            "study_name": self.study_name, "storage": self.storage, "out_dir": str(self.out_dir),
            "winner_trial": self.winner_trial, "winner_measured": self.winner_measured,
            "median_tokens_per_s": self.median_tokens_per_s, "spearman_step_s": self.spearman_step_s,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "emitted": {k: str(v) for k, v in self.emitted.items()},
            "trials": [r.to_dict() for r in self.records],
        }


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------

def plan_key(s: Strategy) -> str:
    """A stable, readable key for a resolved strategy (the study's categorical choice)."""
    d = s.to_dict()
    d["offload"] = "+".join(d["offload"]) or "none"
    return ",".join(f"{k}={d[k]}" for k in sorted(d))


def _plans(ranked: Sequence[Estimate]) -> dict[str, Estimate]:
    """Plan key -> estimate, in rank order, fitting plans only, first occurrence wins."""
    out: dict[str, Estimate] = {}
    for e in ranked:
        if e.fits:
            out.setdefault(plan_key(e.strategy), e)
    return out


def default_study_name(model: ModelSpec, hardware: HardwareSpec, cluster: Cluster, workload: Workload) -> str:
    """Deterministic from the inputs, so that re-running the same command resumes the same study."""
    blob = json.dumps([model.name, hardware.name, hardware.bf16_dense_flops_per_s, cluster.gpus,
                       cluster.gpus_per_node, workload.to_dict()], sort_keys=True, default=str)
    return f"grpo-tune-{model.name}-{cluster.gpus}x{hardware.name}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def _predicted(e: Estimate) -> tuple[float | None, float | None]:
    step = e.step_s
    tps = None
    if e.throughput and e.throughput.get("tokens_per_s_per_gpu") is not None:
        tps = float(e.throughput["tokens_per_s_per_gpu"]) * e.cluster.gpus
    return (None if step is None else float(step)), tps


# ---------------------------------------------------------------------------------------------
# One profiling run
# ---------------------------------------------------------------------------------------------

@dataclass
class ProfileOutcome:
    status: str
    """``ok``, ``oom``, ``error`` or ``timeout``."""
    message: str | None
    data: dict[str, Any] | None
    duration_s: float


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_profile(config_path: Path, *, steps: int, timeout_s: float, json_path: Path, log_path: Path,
                profile_cmd: Sequence[str] | None = None, on_start: Callable[[int], None] | None = None) -> ProfileOutcome:
    """Run ``grpo-tune profile`` on one config in its own process group; never raises for a bad run."""
    cmd = [*(profile_cmd or PROFILE_CMD), "--config", str(config_path), "--steps", str(steps), "--json", str(json_path)]
    t0 = time.monotonic()
    json_path.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        log.write(("$ " + shlex.join(cmd) + "\n").encode())
        log.flush()
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            return ProfileOutcome("error", f"cannot start the profile command: {exc}", None, 0.0)
        if on_start:
            on_start(proc.pid)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            return ProfileOutcome("timeout", f"timed out after {timeout_s:g} s", None, time.monotonic() - t0)
        except BaseException:  # Ctrl-C / SIGTERM of the worker: take the trial's processes down with it
            _kill_group(proc.pid)
            raise
        finally:
            # torchrun's workers live in the same group; make sure none outlive the trial.
            _kill_group(proc.pid)
    dt = time.monotonic() - t0
    data = None
    if json_path.exists():
        try:
            data = json.loads(json_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return ProfileOutcome("error", f"unreadable profile JSON ({exc}); exit code {rc}", None, dt)
    if not isinstance(data, dict):
        return ProfileOutcome("oom" if rc == 3 else "error",
                              f"exit code {rc}, no profile JSON; last log lines: {_tail(log_path)}", None, dt)
    status = data.get("status")
    if status == "ok" and rc == 0:
        if not _positive(data.get("tokens_per_s")) or not _positive(data.get("step_s")):
            return ProfileOutcome("error", "profile JSON lacks a positive tokens_per_s/step_s", data, dt)
        return ProfileOutcome("ok", None, data, dt)
    if status == "oom" or rc == 3:
        return ProfileOutcome("oom", data.get("message") or "out of memory", data, dt)
    return ProfileOutcome("error", data.get("message") or f"exit code {rc}: {_tail(log_path)}", data, dt)


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and math.isfinite(x)


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-400:]


# ---------------------------------------------------------------------------------------------
# The study
# ---------------------------------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_study(storage: str, study_name: str, seed: int, heartbeat_s: int, grace_s: int):
    import optuna
    from optuna.storages import RDBStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    try:
        st = RDBStorage(storage, heartbeat_interval=heartbeat_s, grace_period=grace_s,
                        engine_kwargs={"connect_args": {"timeout": 60}} if storage.startswith("sqlite") else None)
    except Exception as exc:  # bad URL, missing driver: a user's mistake
        raise ConfigError(f"cannot open study storage {storage!r}: {exc}",
                          hint="pass a SQLAlchemy URL such as sqlite:///runs/x/study.db or postgresql://...") from None
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    return optuna.create_study(storage=st, study_name=study_name, direction="maximize", sampler=sampler,
                               load_if_exists=True)


def _recover(study, host: str) -> list[str]:
    """Fail trials left RUNNING by dead workers on this host (and stale ones elsewhere); return their plans."""
    import optuna
    from optuna.trial import TrialState

    plans = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker") or {}
        if w.get("host") == host and isinstance(w.get("pid"), int) and not _pid_alive(w["pid"]):
            if isinstance(w.get("pgid"), int):
                _kill_group(w["pgid"])  # orphaned profiling processes of the dead worker
            try:
                study._storage.set_trial_user_attr(t._trial_id, "reason", "interrupted: its worker process died")
                study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            except Exception:  # another worker got there first
                continue
            if t.params.get(PARAM):
                plans.append(t.params[PARAM])
    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    optuna.storages.fail_stale_trials(study)
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if t.number not in before and t.params.get(PARAM):
            try:
                study._storage.set_trial_user_attr(t._trial_id, "reason", "interrupted: heartbeat went stale")
            except Exception:
                pass
            plans.append(t.params[PARAM])
    return plans


def _records(study) -> list[TrialRecord]:
    out = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        out.append(TrialRecord(
            number=t.number, state=t.state.name, plan=t.params.get(PARAM) or (t.system_attrs.get("fixed_params") or {}).get(PARAM),
            reason=a.get("reason"), ran=bool(a.get("ran")), strategy=a.get("strategy"),
            predicted_step_s=a.get("predicted_step_s"), predicted_tokens_per_s=a.get("predicted_tokens_per_s"),
            measured_step_s=a.get("measured_step_s"), measured_tokens_per_s=a.get("measured_tokens_per_s"),
            measured_phases_s=a.get("measured_phases_s"), peak_memory_bytes=a.get("peak_memory_bytes"),
            duration_s=a.get("duration_s")))
    return out


def _counted(study) -> int:
    """Trials that profiled (or are profiling) a plan: the budget ``trials`` refers to."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                                                      TrialState.RUNNING)):
        if t.user_attrs.get("ran") or (t.state == TrialState.RUNNING and t.user_attrs.get("running_profile")):
            if t.user_attrs.get("reason", "").startswith("interrupted"):
                continue
            n += 1
    return n


class _Heartbeat:
    """Records the trial's heartbeat in the RDB storage while it runs (ask/tell has no built-in one)."""

    def __init__(self, storage, trial_id: int, interval_s: float):
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, args=(storage, trial_id, interval_s), daemon=True)

    def _loop(self, storage, trial_id, interval_s):
        while True:
            try:
                storage.record_heartbeat(trial_id)
            except Exception:
                pass
            if self._stop.wait(interval_s):
                return

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (scipy.stats.spearmanr); None below 3 points or for constant input."""
    if len(x) < 3:
        return None
    from scipy.stats import spearmanr

    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    r = spearmanr(x, y).statistic
    return None if r != r else float(r)


def refine(*, ranked: Sequence[Estimate], model: ModelSpec, hardware: HardwareSpec, cluster: Cluster,
           workload: Workload, out_dir: str | os.PathLike, trials: int = 8, storage: str | None = None,
           study_name: str | None = None, trial_steps: int = 3, trial_timeout: float = 600.0, top_k: int = 4,
           calibration: dict[str, float] | None = None, trainer: TrainerOptions | None = None,
           profile_cmd: Sequence[str] | None = None, slower_than: float = 3.0, seed: int = 0,
           heartbeat_s: int = 10, console=None, emit: bool = True, calibrate: bool = True,
           progress: bool = True) -> RefineResult:
    """Measure the most promising plans of ``ranked`` with real profiling runs and pick the fastest.

    Args:
        ranked: Estimates from search, best first (plans predicted not to fit are ignored). They
            should have been made with ``calibration`` when one was given.
        model, hardware, cluster, workload: the inputs the estimates were made for.
        out_dir: the run folder; trial configs, logs and JSON go to ``out_dir/trials/<number>/``,
            the study to ``out_dir/study.db`` unless ``storage`` says otherwise.
        trials: total profiled trials the study should hold (resumed studies count their old ones).
        storage: any SQLAlchemy URL; default ``sqlite:///<out_dir>/study.db``.
        study_name: default :func:`default_study_name` (stable for the same inputs).
        trial_steps: ``--steps`` for each profiling run (the first step is warm-up).
        trial_timeout: seconds before a profiling run is killed and marked FAIL.
        top_k: how many of the cost model's best plans are enqueued before sampling.
        calibration: efficiency parameters the estimates were made with (recorded on the study).
        trainer: trainer options for trial configs (``steps``/``out_dir`` are set per trial).
        profile_cmd: argv prefix of the profile command (default ``grpo-tune profile``).
        slower_than: skip a plan predicted this many times slower than the best measured plan's prediction.
        emit: write the winner through search's emitter (``autotune.emit``) into ``out_dir``.
        calibrate: fit the cost model to the completed trials (:mod:`autotune.calibrate`) and save
            ``out_dir/calibration.json``.

    Returns:
        A :class:`RefineResult` with every trial, the winner's RunConfig with ``measured`` filled,
        the winner's measured figures, the median trial's tokens/s and the rank correlation.
    """
    from optuna.trial import TrialState
    import optuna

    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    if trial_steps < 2:
        raise ConfigError(f"--trial-steps must be >= 2 (the first step is warm-up), got {trial_steps}")
    if trial_timeout <= 0:
        raise ConfigError(f"--trial-timeout must be > 0, got {trial_timeout}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plans = _plans(ranked)
    if not plans:
        from costmodel.errors import NoFeasiblePlanError

        raise NoFeasiblePlanError("no plan predicted to fit: nothing to refine",
                                  hint="add GPUs, shrink the workload, or relax pinned degrees")
    keys = list(plans)
    storage = storage or f"sqlite:///{(out / 'study.db').resolve()}"
    study_name = study_name or default_study_name(model, hardware, cluster, workload)
    study = _open_study(storage, study_name, seed, heartbeat_s, max(3 * heartbeat_s, 30))
    host = socket.gethostname()
    console = console or _console()
    base_trainer = trainer or TrainerOptions()

    if not study.user_attrs.get("inputs"):
        study.set_user_attr("inputs", {"model": model.name, "hardware": hardware.name, "gpus": cluster.gpus,
                                       "gpus_per_node": cluster.gpus_per_node, "workload": workload.to_dict(),
                                       "calibration": calibration, "plans": len(keys)})
    for plan in _recover(study, host):
        study.enqueue_trial({PARAM: plan}, user_attrs={"requeued": True})
        console.print(f"[yellow]requeued interrupted plan[/] {plan}")
    for k in keys[:top_k]:
        study.enqueue_trial({PARAM: k}, user_attrs={"seed": "cost-model top-k"}, skip_if_exists=True)

    done_before = _counted(study)
    if done_before:
        console.print(f"resuming study [bold]{study_name}[/]: {done_before} profiled trial(s) already recorded")

    def best_complete():
        best = None
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if best is None or t.value > best.value:
                best = t
        return best

    def next_unattempted() -> str | None:
        seen = set()
        for t in study.get_trials(deepcopy=False):
            p = t.params.get(PARAM) or (t.system_attrs.get("fixed_params") or {}).get(PARAM)
            if t.state in (TrialState.WAITING, TrialState.RUNNING) or t.user_attrs.get("ran"):
                seen.add(p)
        for k in keys:
            if k not in seen and not _too_slow(k):
                return k
        return None

    def _too_slow(k: str) -> str | None:
        best = best_complete()
        if best is None:
            return None
        p_best = best.user_attrs.get("predicted_step_s")
        p = _predicted(plans[k])[0]
        if p_best and p and p > slower_than * p_best:
            return (f"predicted {p / p_best:.1f}x slower than the best measured plan "
                    f"(trial #{best.number}) in the cost model's own terms; not run")
        return None

    budget_skips = 10 * len(keys) + 10  # hard stop for sampling loops that find nothing new
    latest = "-"
    prog_ctx = _progress(console, total=trials, enabled=progress)
    with prog_ctx as prog:
        task = prog.add_task("trials", total=trials, completed=min(done_before, trials), best="-", latest=latest)
        while _counted(study) < trials and budget_skips > 0:
            trial = study.ask({PARAM: optuna.distributions.CategoricalDistribution(keys)})
            key = trial.params[PARAM]
            est = plans[key]
            pred_step, pred_tps = _predicted(est)
            trial.set_user_attr("worker", {"host": host, "pid": os.getpid()})
            trial.set_user_attr("strategy", est.strategy.to_dict())
            trial.set_user_attr("predicted_step_s", pred_step)
            trial.set_user_attr("predicted_tokens_per_s", pred_tps)
            trial.set_user_attr("predicted_rank", keys.index(key) + 1)
            reason = _duplicate(study, trial, key) or _too_slow(key)
            if reason:
                budget_skips -= 1
                trial.set_user_attr("reason", reason)
                trial.set_user_attr("ran", False)
                study.tell(trial, state=TrialState.PRUNED)
                nxt = next_unattempted()
                if nxt is None:
                    console.print("[yellow]every plan worth running has been tried; stopping early[/]")
                    break
                study.enqueue_trial({PARAM: nxt}, user_attrs={"seed": "next unmeasured plan in rank order"})
                continue
            tdir = out / "trials" / f"{trial.number:04d}"
            tdir.mkdir(parents=True, exist_ok=True)
            cfg = RunConfig(model=model, hardware=hardware, cluster=cluster, strategy=est.strategy, workload=workload,
                            trainer=dataclasses.replace(base_trainer, steps=trial_steps, out_dir=str(tdir / "train")),
                            predicted=_predicted_block(est), meta={"study": study_name, "trial": trial.number,
                                                                   "plan": key})
            cfg_path = save_config(cfg, tdir / "config.yaml")
            trial.set_user_attr("config", str(cfg_path))
            trial.set_user_attr("running_profile", True)

            def started(pid: int, _t=trial):
                _t.set_user_attr("worker", {"host": host, "pid": os.getpid(), "pgid": pid})

            with _Heartbeat(study._storage, trial._trial_id, heartbeat_s):
                res = run_profile(cfg_path, steps=trial_steps, timeout_s=trial_timeout, json_path=tdir / "profile.json",
                                  log_path=tdir / "profile.log", profile_cmd=profile_cmd, on_start=started)
            trial.set_user_attr("ran", True)
            trial.set_user_attr("duration_s", round(res.duration_s, 3))
            if res.status == "ok":
                d = res.data
                trial.set_user_attr("measured_step_s", float(d["step_s"]))
                trial.set_user_attr("measured_tokens_per_s", float(d["tokens_per_s"]))
                trial.set_user_attr("measured_phases_s", {k: float(v) for k, v in (d.get("phases_s") or {}).items()
                                                          if _positive(v) or v == 0})
                peak = (d.get("peak_memory_bytes") or {}).get("max")
                trial.set_user_attr("peak_memory_bytes", int(peak) if isinstance(peak, (int, float)) else None)
                study.tell(trial, float(d["tokens_per_s"]))
                latest = _fmt_latest(trial.number, pred_step, float(d["step_s"]))
            else:
                trial.set_user_attr("reason", f"{res.status}: {res.message}")
                study.tell(trial, state=TrialState.PRUNED if res.status == "oom" else TrialState.FAIL)
                latest = f"#{trial.number} {res.status}"
                console.print(f"[yellow]trial #{trial.number} {res.status}[/]: {res.message}  ({key})",
                              highlight=False)
            b = best_complete()
            prog.update(task, completed=min(_counted(study), trials),
                        best="-" if b is None else f"#{b.number} {b.value:,.0f} tok/s", latest=latest)

    return finish(study, study_name=study_name, storage=storage, out=out, model=model, hardware=hardware,
                  cluster=cluster, workload=workload, plans=plans, base_trainer=base_trainer, calibration=calibration,
                  console=console, emit=emit, calibrate=calibrate)


def _duplicate(study, trial, key: str) -> str | None:
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED,
                                                      TrialState.FAIL)):
        if t.number == trial.number or t.params.get(PARAM) != key:
            continue
        if t.state == TrialState.RUNNING and t.user_attrs.get("running_profile"):
            return f"duplicate: trial #{t.number} is profiling this plan now; not run"
        if t.user_attrs.get("ran") and not str(t.user_attrs.get("reason", "")).startswith("interrupted"):
            return f"duplicate of trial #{t.number} ({t.state.name}); not run again"
    return None


def _fmt_latest(number: int, pred: float | None, meas: float) -> str:
    p = "-" if pred is None else f"{pred:.3g}"
    return f"#{number} step predicted {p} s / measured {meas:.3g} s"


def _predicted_block(e: Estimate) -> dict[str, Any]:
    return {"step_s": e.step_s, "peak_bytes": int(e.peak_bytes), "fits": e.fits,
            "phases": (e.time or {}).get("phases"), "throughput": e.throughput}


def _console():
    from rich.console import Console

    return Console(stderr=True)


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *a, **k):
        return 0

    def update(self, *a, **k):
        pass


def _progress(console, *, total: int, enabled: bool):
    if not enabled:
        return _NoProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]refine[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("best {task.fields[best]}"), TextColumn("| latest {task.fields[latest]}"),
                    console=console, transient=False)


# ---------------------------------------------------------------------------------------------
# After the trials: winner, rank correlation, calibration, emit
# ---------------------------------------------------------------------------------------------

def finish(study, *, study_name: str, storage: str, out: Path, model, hardware, cluster, workload,
           plans: dict[str, Estimate], base_trainer: TrainerOptions, calibration, console, emit: bool,
           calibrate: bool) -> RefineResult:
    records = _records(study)
    result = RefineResult(study_name=study_name, storage=storage, out_dir=out, records=records)
    done = result.completed
    if not done:
        console.print("[red]no trial completed[/]; see the reasons in the table (and trials/*/profile.log)")
        return result
    pairs = [(r.predicted_step_s, r.measured_step_s) for r in done if r.predicted_step_s and r.measured_step_s]
    result.spearman_step_s = spearman([p for p, _ in pairs], [m for _, m in pairs])
    result.median_tokens_per_s = statistics.median(r.measured_tokens_per_s for r in done)
    best = max(done, key=lambda r: r.measured_tokens_per_s)
    result.winner_trial = best.number
    result.winner_measured = {
        "trial": best.number, "study": study_name, "storage": storage,
        "step_s": best.measured_step_s, "tokens_per_s": best.measured_tokens_per_s,
        "tokens_per_s_per_gpu": best.measured_tokens_per_s / cluster.gpus,
        "phases_s": best.measured_phases_s, "peak_memory_bytes": best.peak_memory_bytes,
        "median_trial_tokens_per_s": result.median_tokens_per_s,
        "speedup_vs_median_trial": best.measured_tokens_per_s / result.median_tokens_per_s,
        "trials_completed": len(done),
    }
    est = plans.get(best.plan) if best.plan else None
    strategy = est.strategy if est is not None else Strategy.from_dict(best.strategy or {})
    result.winner = RunConfig(model=model, hardware=hardware, cluster=cluster, strategy=strategy, workload=workload,
                              trainer=base_trainer, predicted=_predicted_block(est) if est else None,
                              measured=result.winner_measured,
                              meta={"study": study_name, "trial": best.number, "storage": storage})
    if calibrate:
        try:
            from .calibrate import fit_records

            result.calibration = fit_records(done, model=model, hardware=hardware, cluster=cluster, workload=workload,
                                             base=calibration)
        except GrpoTuneError as exc:
            console.print(f"[yellow]calibration skipped[/]: {exc.message}", highlight=False)
        if result.calibration is not None:
            result.calibration.save(out / "calibration.json", hardware=hardware.name)
            result.emitted["calibration"] = out / "calibration.json"
    atomic_write(out / "refine.json", json.dumps(result.to_dict(), indent=2, default=str))
    result.emitted["refine_json"] = out / "refine.json"
    if emit:
        result.emitted.update(_emit(result, est))
    return result


def _emit(result: RefineResult, est: Estimate | None) -> dict[str, Path]:
    """Write the winner as search writes its best plan, then add the measured figures to best.yaml."""
    out = result.out_dir
    paths: dict[str, Path] = {}
    try:
        from . import emit as emitter  # the search engineer's module
    except ModuleNotFoundError:
        emitter = None
    if emitter is not None and est is not None and hasattr(emitter, "emit"):
        got = emitter.emit(est, out, measured=result.winner_measured)
        if isinstance(got, dict):
            paths.update({k: Path(v) for k, v in got.items()})
    best = out / "best.yaml"
    if best.exists():
        from .config import load

        cfg = load(best)
        cfg = cfg.replace(measured=result.winner_measured, meta={**(cfg.meta or {}), **(result.winner.meta or {})})
    else:
        cfg = result.winner
    paths["best"] = save_config(cfg, best)
    return paths
