"""Refine a ranked search with real profiling runs: an Optuna study over the cost model's plans.

``refine(...)`` is the one entry point; ``grpo-tune search ... --refine`` calls it lazily.

How a study runs:

- The plan space is every valid plan of the search space (:class:`autotune.search.Space`, the
  user's pins applied, the rollout memory fraction fixed to the best plan's, which on CPU changes
  nothing measurable) plus search's ranked list, kept to plans predicted to fit, one plan per
  distinct key, sorted by predicted step time. The study has one integer parameter
  ``plan_rank``: the plan's position in that order, so TPE sees neighbouring ranks as similar
  plans. Each trial also records the plan's stable key (``tp=2,pp=1,...``) in ``user_attrs``;
  duplicates are detected by key, so a re-ranked space (a new calibration) cannot fool them.
- Plans the trainer would reject before starting (``trainer.launch.preflight``, torch-free) are
  left out of the space.
- The cost model's top-k plans with distinct predictions (more than 3% apart: the model cannot
  rank closer ones) are enqueued first (``study.enqueue_trial``, skipped if already there); then
  the sampler (TPE) picks among the rest.
- A sampled plan is *not run* and is marked PRUNED, with the reason in ``user_attrs["reason"]``,
  when it duplicates a plan already measured or running, or when its predicted step time is more
  than ``slower_than`` times the prediction for the best plan measured so far (comparing
  predictions with predictions keeps the cost model's absolute error out of the decision).
  Such trials do not count toward ``trials``; the next unmeasured plan in rank order (preferring
  one whose prediction differs from those measured) is enqueued instead, so the study always
  makes progress.
- Up to ``MAX_SPACE`` candidates are enumerated; a larger space uses search's ranked list only.
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

from core.errors import ConfigError, GrpoTuneError
from costmodel.estimate import Estimate, estimate as cost_estimate
from core.specs import HardwareSpec, ModelSpec
from core.strategy import Cluster, Strategy, Workload

from core.config import RunConfig, TrainerOptions, atomic_write, save as save_config
from .emit import SearchTables, Tables

from core.phases import MEASURED_PHASES as PHASES  # named once, in core/phases.py
PARAM = "plan_rank"
MAX_SPACE = 20000  # beyond this many candidates only search's ranked list is used
# The profile command, run as `PROFILE_CMD + ["--config", X, "--steps", K, "--json", OUT]`.
PROFILE_CMD = [sys.executable, "-c", "from cli.main import run; run()", "profile"]


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
    """A stable, readable key for a resolved strategy (stored on each trial; duplicates compare it)."""
    d = s.to_dict()
    d["offload"] = "+".join(d["offload"]) or "none"
    return ",".join(f"{k}={d[k]}" for k in sorted(d))


def build_space(ranked: Sequence[Estimate], model: ModelSpec, hardware: HardwareSpec, cluster: Cluster,
                workload: Workload, *, calibration: dict[str, float] | None = None,
                pins: dict[str, Any] | None = None, allow_cross_node_tp: bool = False) -> list[Estimate]:
    """The refinement's plan space: fitting plans, one per key, fastest predicted first (see module doc)."""
    from .search import Space, step_s

    pool: list[Estimate] = list(ranked)
    pins = dict(pins or {})
    if ranked and "gpu_memory_utilization" not in pins:
        pins["gpu_memory_utilization"] = ranked[0].strategy.gpu_memory_utilization
    space = Space(model, hardware, cluster, workload, pins, allow_cross_node_tp)
    if space.candidate_count() <= MAX_SPACE:
        for s in space.candidates():
            try:
                pool.append(cost_estimate(model=model, hardware=hardware, cluster=cluster, strategy=s,
                                          workload=workload, calibration=calibration))
            except GrpoTuneError:
                continue
    out: dict[str, Estimate] = {}
    for e in pool:
        if e.fits:  # one memory fraction per plan: the best-ranked one
            out.setdefault(plan_key(e.strategy.replace(gpu_memory_utilization=1.0)), e)
    # stable: equal predictions keep search's order (ranked first)
    return sorted(out.values(), key=lambda e: round(step_s(e), 9))


SAME_PREDICTION = 0.03
"""Plans predicted within 3% of each other are ones the cost model cannot tell apart."""


def _close(a: Estimate, b: Estimate) -> bool:
    pa, pb = _predicted(a)[0], _predicted(b)[0]
    return pa is not None and pb is not None and abs(pa - pb) <= SAME_PREDICTION * min(pa, pb)


def _distinct(space: Sequence[Estimate], k: int) -> list[int]:
    """Indices of the cost model's top-k plans with distinct predictions (the seeds of the study).

    Measuring two plans the model predicts alike teaches it nothing about its ranking; the sampler
    can still reach the near-ties later.
    """
    out: list[int] = []
    for i, e in enumerate(space):
        if len(out) >= k:
            break
        if all(not _close(e, space[j]) for j in out):
            out.append(i)
    return out


def _runnable(space: list[Estimate], trainer: TrainerOptions) -> tuple[list[Estimate], list[str]]:
    """Plans the trainer accepts (its torch-free pre-start checks, ``trainer.launch.preflight``)."""
    try:
        from trainer.launch import preflight  # torch-free; imported here, never at autotune import time
    except ImportError:
        return space, []
    keep, why = [], []
    for e in space:
        cfg = RunConfig(model=e.model, hardware=e.hardware, cluster=e.cluster, strategy=e.strategy,
                        workload=e.workload, trainer=trainer)
        try:
            preflight(cfg, need_torch=False)
        except GrpoTuneError as exc:
            why.append(f"[{exc.code}] {exc.message}")
            continue
        keep.append(e)
    return keep, why


def default_study_name(model: ModelSpec, hardware: HardwareSpec, cluster: Cluster, workload: Workload) -> str:
    """Deterministic from the inputs, so that re-running the same command resumes the same study."""
    blob = json.dumps([model.name, hardware.name, hardware.bf16_dense_flops_per_s, cluster.gpus,
                       cluster.gpus_per_node, workload.to_dict()], sort_keys=True, default=str)
    return f"grpo-tune-{model.name}-{cluster.gpus}x{hardware.name}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def _predicted(e: Estimate) -> tuple[float | None, float | None]:
    step = e.step_s
    tps = None
    if e.throughput is not None:
        tps = float(e.throughput.tokens_per_s_per_gpu) * e.cluster.gpus
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

    import warnings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats are used deliberately with ask/tell (see _Heartbeat); silence optuna's notices about it.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    last = None
    for attempt in range(6):  # two workers starting together race to create the schema: retry
        try:
            st = RDBStorage(storage, heartbeat_interval=heartbeat_s, grace_period=grace_s,
                            engine_kwargs={"connect_args": {"timeout": 60}} if storage.startswith("sqlite") else None)
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
            return optuna.create_study(storage=st, study_name=study_name, direction="maximize", sampler=sampler,
                                       load_if_exists=True)
        except Exception as exc:
            last = exc
            if "IntegrityError" not in type(exc).__name__ + str(exc) and "locked" not in str(exc):
                break
            time.sleep(0.5 * (attempt + 1))
    # bad URL, missing driver: a user's mistake
    raise ConfigError(f"cannot open study storage {storage!r}: {last}",
                      hint="pass a SQLAlchemy URL such as sqlite:///runs/x/study.db or postgresql://...")


def _group_runs(pgid: int, config: str | None) -> bool:
    """Is process group ``pgid`` still running this trial's profile (Linux /proc; a reused id is left alone)?"""
    if not config:
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of /proc/<pid>/stat: the process group
                continue
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if config in cmd or "trainer" in cmd:
            return True
    return False


def _recover(study, host: str) -> list[str]:
    """Fail trials left RUNNING by dead workers on this host (and stale ones elsewhere); return their plans."""
    import optuna
    from optuna.trial import TrialState

    plans = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker") or {}
        if w.get("host") == host and isinstance(w.get("pid"), int) and not _pid_alive(w["pid"]):
            if isinstance(w.get("pgid"), int) and _group_runs(w["pgid"], t.user_attrs.get("config")):
                _kill_group(w["pgid"])  # orphaned profiling processes of the dead worker
            try:
                study._storage.set_trial_user_attr(t._trial_id, "reason", "interrupted: its worker process died")
                study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            except Exception:  # another worker got there first
                continue
            if t.user_attrs.get("plan"):
                plans.append(t.user_attrs["plan"])
    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    optuna.storages.fail_stale_trials(study)
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if t.number not in before and t.user_attrs.get("plan"):
            try:
                study._storage.set_trial_user_attr(t._trial_id, "reason", "interrupted: heartbeat went stale")
            except Exception:
                pass
            plans.append(t.user_attrs["plan"])
    return plans


def _records(study) -> list[TrialRecord]:
    out = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        out.append(TrialRecord(
            number=t.number, state=t.state.name, plan=a.get("plan"),
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
           study_name: str | None = None, trial_steps: int = 6, trial_timeout: float = 600.0, top_k: int = 4,
           calibration: dict[str, float] | None = None, trainer: TrainerOptions | None = None,
           profile_cmd: Sequence[str] | None = None, slower_than: float = 3.0, seed: int | None = None,
           heartbeat_s: int = 10, console=None, emit: bool = True, calibrate: bool = True,
           progress: bool = True, pins: dict[str, Any] | None = None,
           allow_cross_node_tp: bool = False, search: SearchTables | None = None) -> RefineResult:
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
        top_k: how many of the cost model's best plans (with distinct predictions) are enqueued first.
        calibration: efficiency parameters the estimates were made with (recorded on the study).
        trainer: trainer options for trial configs (``steps``/``out_dir`` are set per trial).
        profile_cmd: argv prefix of the profile command (default ``grpo-tune profile``).
        slower_than: skip a plan predicted this many times slower than the best measured plan's prediction.
        emit: write the winner through search's emitter (``autotune.emit``) into ``out_dir``.
        calibrate: fit the cost model to the completed trials (:mod:`autotune.calibrate`) and save
            ``out_dir/calibration.json``.
        pins, allow_cross_node_tp: the search's pins and TP rule, so the plan space matches search's.
        search: the search result whose tables the emitted report shows (default: the top of ``ranked``).

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
    space = build_space(ranked, model, hardware, cluster, workload, calibration=calibration, pins=pins,
                        allow_cross_node_tp=allow_cross_node_tp)
    if not space:
        from core.errors import NoFeasiblePlanError

        raise NoFeasiblePlanError("no plan predicted to fit: nothing to refine",
                                  hint="add GPUs, shrink the workload, or relax pinned degrees")
    base_trainer = trainer or TrainerOptions()
    space, rejected = _runnable(space, base_trainer)
    if not space:
        from core.errors import NoFeasiblePlanError

        raise NoFeasiblePlanError("the trainer rejects every plan predicted to fit: nothing to refine",
                                  hint=f"e.g. {rejected[0]}" if rejected else "")
    keys = [plan_key(e.strategy) for e in space]
    index = {k: i for i, k in enumerate(keys)}
    storage = storage or f"sqlite:///{(out / 'study.db').resolve()}"
    study_name = study_name or default_study_name(model, hardware, cluster, workload)
    study = _open_study(storage, study_name, seed, heartbeat_s, max(3 * heartbeat_s, 30))
    host = socket.gethostname()
    console = console or _console()
    if rejected:
        console.print(f"{len(rejected)} plan(s) the trainer cannot run were left out (e.g. {rejected[0]})",
                      highlight=False)
    dist = optuna.distributions.IntDistribution(0, len(keys) - 1)
    space_id = hashlib.sha1("\n".join(keys).encode()).hexdigest()[:12]

    if not study.user_attrs.get("inputs"):
        study.set_user_attr("inputs", {"model": model.name, "hardware": hardware.name, "gpus": cluster.gpus,
                                       "gpus_per_node": cluster.gpus_per_node, "workload": workload.to_dict(),
                                       "calibration": calibration, "plans": len(keys), "space": space_id})
    elif study.user_attrs["inputs"].get("space") != space_id:
        console.print("[yellow]the plan space differs from the one this study started with (another calibration "
                      "or profile?); plan_rank values are not comparable across the two, plan keys still are[/]")
    for plan in _recover(study, host):
        if plan in index:
            study.enqueue_trial({PARAM: index[plan]}, user_attrs={"requeued": True})
            console.print(f"[yellow]requeued interrupted plan[/] {plan}", highlight=False)
    for i in _distinct(space, min(top_k, trials)):
        study.enqueue_trial({PARAM: i}, user_attrs={"seed": "cost-model top-k"}, skip_if_exists=True)

    done_before = _counted(study)
    if done_before:
        console.print(f"resuming study [bold]{study_name}[/]: {done_before} profiled trial(s) already recorded",
                      highlight=False)

    def best_complete():
        best = None
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if best is None or t.value > best.value:
                best = t
        return best

    def next_unattempted() -> int | None:
        seen = set()
        for t in study.get_trials(deepcopy=False):
            if t.state == TrialState.WAITING:
                i = (t.system_attrs.get("fixed_params") or {}).get(PARAM)
                if isinstance(i, int) and 0 <= i < len(keys):
                    seen.add(keys[i])
            elif t.state == TrialState.RUNNING or t.user_attrs.get("ran"):
                seen.add(t.user_attrs.get("plan"))
        taken = [space[index[k]] for k in seen if k in index]
        fallback = None
        for i, k in enumerate(keys):
            if k in seen or _too_slow(i):
                continue
            if fallback is None:
                fallback = i
            if all(not _close(space[i], e) for e in taken):
                return i
        return fallback

    def _too_slow(i: int) -> str | None:
        best = best_complete()
        if best is None:
            return None
        p_best = best.user_attrs.get("predicted_step_s")
        p = _predicted(space[i])[0]
        if p_best and p and p > slower_than * p_best:
            return (f"predicted {p / p_best:.1f}x slower than the best measured plan "
                    f"(trial #{best.number}) in the cost model's own terms; not run")
        return None

    budget_skips = 20 * trials + 20  # hard stop for sampling loops that find nothing new
    latest = "-"
    prog_ctx = _progress(console, total=trials, enabled=progress)
    with prog_ctx as prog:
        task = prog.add_task("trials", total=trials, completed=min(done_before, trials), best="-", latest=latest)
        while _counted(study) < trials and budget_skips > 0:
            trial = study.ask({PARAM: dist})
            rank = trial.params[PARAM]
            est, key = space[rank], keys[rank]
            pred_step, pred_tps = _predicted(est)
            trial.set_user_attr("plan", key)
            trial.set_user_attr("worker", {"host": host, "pid": os.getpid()})
            trial.set_user_attr("strategy", est.strategy.to_dict())
            trial.set_user_attr("predicted_step_s", pred_step)
            trial.set_user_attr("predicted_tokens_per_s", pred_tps)
            reason = _duplicate(study, trial, key) or _too_slow(rank)
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

    if budget_skips <= 0:
        console.print("[yellow]stopped sampling: the sampler kept proposing plans already measured or predicted "
                      "far slower[/]")
    return finish(study, study_name=study_name, storage=storage, out=out, model=model, hardware=hardware,
                  cluster=cluster, workload=workload, space=dict(zip(keys, space)), ranked=space, search=search,
                  base_trainer=base_trainer, calibration=calibration,
                  console=console, emit=emit, calibrate=calibrate)


def _duplicate(study, trial, key: str) -> str | None:
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED,
                                                      TrialState.FAIL)):
        if t.number == trial.number or t.user_attrs.get("plan") != key:
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
            "phases": None if e.time is None else dict(e.time.phases),
            "throughput": None if e.throughput is None else e.throughput.to_dict()}


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
           space: dict[str, Estimate], base_trainer: TrainerOptions, calibration, console, emit: bool,
           calibrate: bool, ranked: Sequence[Estimate] = (), search: SearchTables | None = None) -> RefineResult:
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
    est = space.get(best.plan) if best.plan else None
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
        result.emitted.update(_emit(result, est, search or Tables(ranked=list(ranked)[:10])))
    print_summary(result, console)
    return result


def _label(r: TrialRecord) -> str | None:
    if not r.strategy:
        return r.plan
    from .report import plan_label

    return plan_label(Strategy.from_dict(r.strategy))


def print_summary(result: RefineResult, console) -> None:
    """Trials table, rank correlation before/after calibration, winner vs the median trial."""
    from rich.table import Table

    t = Table(title=f"Refinement: study {result.study_name}", title_justify="left")
    for c in ("#", "state", "predicted s", "measured s", "tokens/s", "plan / reason"):
        t.add_column(c, justify="left" if c in ("state", "plan / reason") else "right")
    for r in result.records:
        f = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
        t.add_row(str(r.number), r.state, f(r.predicted_step_s), f(r.measured_step_s),
                  "-" if r.measured_tokens_per_s is None else f"{r.measured_tokens_per_s:,.1f}",
                  (r.reason or _label(r) or "")[:90])
    console.print(t)
    sp = "-" if result.spearman_step_s is None else f"{result.spearman_step_s:.3f}"
    console.print(f"Spearman rank correlation, predicted vs measured step time ({len(result.completed)} trials): "
                  f"[bold]{sp}[/]", highlight=False)
    cal = result.calibration
    if cal is not None:
        b, a = cal.before, cal.after
        fs = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        console.print(f"calibration: MAPE {b['mape_pct']:.1f}% -> {a['mape_pct']:.1f}%, Spearman {fs(b['spearman'])} -> "
                      f"[bold]{fs(a['spearman'])}[/] (saved {result.out_dir / 'calibration.json'})", highlight=False)
    w = result.winner_measured
    if w:
        console.print(f"winner: trial #{w['trial']} measured [bold]{w['tokens_per_s']:,.1f} tokens/s[/] "
                      f"({w['tokens_per_s_per_gpu']:,.1f}/GPU, {w['step_s']:.3g} s/step) vs median trial "
                      f"{w['median_trial_tokens_per_s']:,.1f} tokens/s: [bold]{w['speedup_vs_median_trial']:.2f}x[/]",
                      highlight=False)
    console.print(f"study: {result.storage} (optuna-dashboard {result.storage})", highlight=False)


def _emit(result: RefineResult, est: Estimate | None, search: SearchTables) -> dict[str, Path]:
    """Write the winner through search's emitter (best.yaml with ``measured``, exports, report.md),
    then append the refinement to report.md."""
    out = result.out_dir
    meta = {"refine": {k: v for k, v in (result.winner.meta or {}).items()}}
    if est is not None:
        from .emit import emit as emit_plan

        paths = dict(emit_plan(est, out, measured=result.winner_measured, search=search, meta=meta,
                               trainer=None))
    else:  # the winner's plan is not in this space (a resumed study with another space): config only
        paths = {"best": save_config(result.winner, out / "best.yaml")}
    from .refine_report import append_report

    paths.update(append_report(out, result))
    return paths
