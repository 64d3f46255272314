"""``grpo-tune train``'s work: check the run config, then run the GRPO trainer under torchrun (or write an sbatch
script, or with ``--dry-run`` only say what would run).

:func:`run_train` takes a :class:`TrainRequest` and returns a :class:`TrainOutcome`; ``cli/train.py`` prints it,
and follows the run through a :class:`TrainWatch` (the live progress table). Every check that can fail runs
before a process starts (:func:`load_checked`, ``trainer.launch.preflight``). The workers run in a process group
this process owns (``trainer.launch.run_workers``): it is stopped on every way out, a signal or an error in the
watch included, so no child process outlives the command. ``trainer.launch`` is torch-free; nothing here imports
torch.

:func:`load_checked` and :func:`check_rendezvous` are the preamble ``profile`` shares (``jobs/profile.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Protocol

if TYPE_CHECKING:
    from grpo_tune.core.config import RunConfig
    from grpo_tune.core.ranks import RankLayout


@dataclass(frozen=True)
class Nodes:
    """Where this process sits in a multi-node run (torchrun's rendezvous flags)."""

    nnodes: int | None = None
    """Nodes (None: from the config's cluster.gpus_per_node)."""
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None


@dataclass(frozen=True)
class TrainRequest:
    """What ``train`` was asked: the config and its overrides, where to write, how to run (or not)."""

    config: Path
    steps: int | None = None
    """``--steps`` (None: the config's trainer.steps)."""
    out: Path | None = None
    """``--out`` (None: the config's trainer.out_dir)."""
    nodes: Nodes = Nodes()
    slurm: Path | None = None
    """Write an sbatch script here instead of running."""
    dry_run: bool = False
    resume: bool = True
    sets: list[str] = field(default_factory=list)
    """``--set SECTION.KEY=VALUE`` overrides, checked like the file."""


@dataclass(frozen=True)
class TrainStart:
    """A run about to start: the lock on its folder is held and the checkpoint it resumes from is known."""

    model: str
    world_size: int
    steps: int
    resume_step: int | None
    """The checkpoint's step it continues after (None: from the start)."""
    out_dir: Path

    @property
    def metrics(self) -> Path:
        return self.out_dir / "metrics.jsonl"


class TrainWatch(Protocol):
    """What the CLI is told while a run goes (and nothing else: the outcome says how it ended)."""

    def say(self, line: str) -> None:
        """A message of the run lock (a stale lock taken over)."""

    def started(self, run: TrainStart) -> None:
        """The run is about to start (nothing of it has run yet)."""

    def following(self, run: TrainStart) -> Callable[[], None]:
        """The workers start now; the callable returned is polled while they run."""

    def stop(self) -> None:
        """The workers ended, whichever way (may be told more than once)."""


TrainEnd = Literal["slurm", "dry_run", "done", "failed", "interrupted"]


@dataclass(frozen=True)
class TrainOutcome:
    """How ``train`` ended: the sbatch script written, the dry run's summary, or the run's end."""

    kind: TrainEnd
    config: RunConfig
    layout: RankLayout
    out_dir: Path
    command: list[str] = field(default_factory=list)
    """torchrun's argv (empty for ``--slurm``)."""
    slurm: Path | None = None
    summary: dict[str, object] | None = None
    """The Parallel Config Summary (``--dry-run``): see :func:`summary`."""
    status: str = "ok"
    message: str | None = None
    exit_code: int = 0
    log_tail: str | None = None
    """A failed run's log tail, when its cause is none the machine's known causes (else the log's path is said)."""
    interrupted: str | None = None
    """The line of a run stopped by a signal: the step reached and the checkpoint to resume from."""

    @property
    def log(self) -> Path:
        return self.out_dir / "train.log"


def check_rendezvous(master_addr: str | None, master_port: int | None) -> None:
    """torchrun refuses these only after the launch: a port outside TCP's range, an address with blanks."""
    from grpo_tune.core.errors import ConfigError

    if master_port is not None and not 1 <= master_port <= 65535:
        raise ConfigError(f"--master-port must be a TCP port in 1..65535, got {master_port}")
    if master_addr is not None and (not master_addr or not master_addr.isprintable() or " " in master_addr):
        raise ConfigError(f"--master-addr {master_addr!r} is not a host name or address", hint="e.g. node0 or 10.0.0.1")


def load_checked(
    config: Path,
    *,
    steps: int | None = None,
    out: Path | None = None,
    nnodes: int | None = None,
    node_rank: int = 0,
    resume: bool = True,
    need_torch: bool = True,
    scratch: bool = False,
    sets: list[str] | None = None,
) -> tuple[RunConfig, RankLayout, Path]:
    """Load the config, apply CLI overrides, run every pre-start check. Returns (cfg, layout, out_dir).

    ``scratch``: the output folder is the command's own scratch space (``profile``), reused freely."""
    import dataclasses
    import os

    from grpo_tune.core import config as run_config
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.trainer import launch

    cfg = run_config.load(config, sets or ())
    over: dict[str, int | str] = {}  # TrainerOptions fields, for dataclasses.replace
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {steps}")
        over["steps"] = steps
    if out is not None:
        over["out_dir"] = str(out)
    if over:
        cfg = cfg.replace(trainer=dataclasses.replace(cfg.trainer, **over))  # type: ignore[arg-type]
    out_dir = Path(cfg.trainer.out_dir)
    from grpo_tune.rundir.outputs import check_out_dir

    check_out_dir(out_dir, "--out", inputs={"CONFIG": config})
    if not resume and not scratch:
        held = [n for n in ("checkpoints/latest.json", "metrics.jsonl") if os.path.lexists(out_dir / n)]
        if held:
            raise ConfigError(
                f"{out_dir} already holds {' and '.join(held)} of an earlier run and --no-resume was given",
                hint="choose another --out, or drop --no-resume to continue that run",
            )
    lay = launch.preflight(
        cfg, nnodes=nnodes, node_rank=node_rank, resume_dir=out_dir if resume else None, need_torch=need_torch
    )
    return cfg, lay, out_dir


def run_train(req: TrainRequest, *, watch: TrainWatch | None = None) -> TrainOutcome:
    """Check the config (every check before a process starts), then write the sbatch script, or return the dry
    run's summary, or run the workers under the run folder's lock and return how they ended. A signal (Ctrl-C,
    SIGTERM, ...) while they run stops their process group and ends the run as ``interrupted``, with the step
    reached and the checkpoint to resume from."""
    from grpo_tune.rundir.outputs import check_output
    from grpo_tune.trainer import launch

    config, nodes, resume = req.config, req.nodes, req.resume
    if req.slurm is not None:  # before anything is read or written: never over the config itself
        check_output(req.slurm, "--slurm", inputs={"CONFIG": config})
    check_rendezvous(nodes.master_addr, nodes.master_port)
    cfg, lay, out_dir = load_checked(
        config,
        steps=req.steps,
        out=req.out,
        nnodes=nodes.nnodes,
        node_rank=nodes.node_rank,
        resume=resume,
        need_torch=not (req.dry_run or req.slurm),
        sets=req.sets,
    )
    set_args = [a for kv in req.sets for a in ("--set", kv)]

    def worker_args_for(out_path: Path) -> list[str]:  # the same flags for torchrun here and in the sbatch script
        return [
            "--steps",
            str(cfg.trainer.steps),
            "--out",
            str(out_path),
            *([] if resume else ["--no-resume"]),
            *set_args,
        ]

    worker_args = worker_args_for(out_dir)
    if req.slurm is not None:
        from grpo_tune.core.config import atomic_write

        atomic_write(req.slurm, launch.slurm_script(config, lay, worker_args=worker_args_for(out_dir.resolve())))
        return TrainOutcome(kind="slurm", config=cfg, layout=lay, out_dir=out_dir, slurm=req.slurm)
    cmd = launch.torchrun_command(
        config,
        lay,
        node_rank=nodes.node_rank,
        master_addr=nodes.master_addr,
        master_port=nodes.master_port,
        worker_args=worker_args,
    )
    if req.dry_run:
        return TrainOutcome(
            kind="dry_run", config=cfg, layout=lay, out_dir=out_dir, command=cmd, summary=summary(cfg, lay)
        )
    return _run(req, cfg, lay, out_dir, cmd, watch or _Quiet())


def _run(
    req: TrainRequest, cfg: RunConfig, lay: RankLayout, out_dir: Path, cmd: list[str], watch: TrainWatch
) -> TrainOutcome:
    from grpo_tune.core.runlock import acquire, lock_name
    from grpo_tune.trainer import launch

    stopped: tuple[int, str] | None = None
    with acquire(out_dir, "grpo-tune train", say=watch.say, name=lock_name(req.nodes.node_rank)) as lk:
        start = launch.check_resume(
            out_dir, launch.checkpoint_world(cfg, lay)
        )  # under the lock: no other writer can move it now
        run = TrainStart(
            model=cfg.model.name, world_size=lay.world_size, steps=cfg.trainer.steps, resume_step=start, out_dir=out_dir
        )
        watch.started(run)
        launch.clear_failures(out_dir)
        if req.nodes.node_rank == 0:
            launch.trim_metrics(out_dir, start if req.resume else None)
        poll = watch.following(run)
        try:
            rc = launch.run_workers(cmd, out_dir, poll=poll, pass_fds=(lk.fd,))
        except (KeyboardInterrupt, SystemExit) as exc:
            watch.stop()
            code = interrupted_exit(exc)
            if code is None:
                raise
            stopped = code, interrupted_line(out_dir, launch.checkpoint_world(cfg, lay))
        finally:
            watch.stop()
    base = TrainOutcome(kind="done", config=cfg, layout=lay, out_dir=out_dir, command=cmd)
    if stopped is not None:
        code, line = stopped
        return _with(base, kind="interrupted", exit_code=code, interrupted=line)
    status, message, code = launch.worker_status(rc, out_dir)
    coded = _coded(message)
    if code == launch.EXIT_ERROR and coded:
        code = launch.EXIT_BAD_CONFIG  # a worker refused the input, as the CLI refuses one: exit 2
    if code:
        # a machine cause or a coded error is said in one line (not torchrun's traceback); anything else shows the log
        tail = launch.log_tail(out_dir) if launch.classified(out_dir) is None and not coded else None
        return _with(base, kind="failed", status=status, message=message, exit_code=code, log_tail=tail)
    return _with(base, status=status, message=message)


def _coded(message: str | None) -> bool:
    """A worker's failure message that is a coded error of the input (``[BAD_CONFIG] ...``), not a bug."""
    import re

    from grpo_tune.core.errors import CODES

    m = re.match(r"\[([A-Z_]+)\] ", message or "")
    return (
        m is not None and m.group(1) in CODES and m.group(1) not in ("INTERNAL_ERROR", "WORKER_FAILED", "TRIAL_FAILED")
    )


def _with(o: TrainOutcome, **kw: object) -> TrainOutcome:
    import dataclasses

    return dataclasses.replace(o, **kw)  # type: ignore[arg-type]


class _Quiet:
    """The watch of a caller that wants none: nothing said, nothing polled."""

    def say(self, line: str) -> None:
        pass

    def started(self, run: TrainStart) -> None:
        pass

    def following(self, run: TrainStart) -> Callable[[], None]:
        return lambda: None

    def stop(self) -> None:
        pass


def summary(cfg: RunConfig, lay: RankLayout) -> dict[str, object]:
    """The Parallel Config Summary as data (printed as tables, or as JSON with --json)."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.trainer import launch

    s, w, t = cfg.strategy, cfg.workload, cfg.trainer
    roles: dict[str, dict[str, object]] = {
        "actor": {
            **s.layout.degrees(),
            "sequence_parallel": s.layout.sp,
            "recompute": s.memory.recompute,
            "distributed_optimizer": s.memory.distributed_optimizer,
            "offload": list(s.memory.offload),
        }
    }
    if w.kl:
        # The reference shares the actor's process groups (a mismatch there is a classic verl crash).
        roles["reference"] = dict(s.layout.degrees())
    p = cfg.placement
    rollout_gpus = p.rollout_gpus if p.separate else lay.world_size
    roles["rollout"] = {
        "engine": t.rollout_engine,
        "tp": s.rollout.rollout_tp,
        "replicas": rollout_gpus // s.rollout.rollout_tp,
        "gpus": rollout_gpus,
        "gpu_memory_utilization": s.rollout.gpu_memory_utilization,
    }
    # a separate plan: ranks [0, N - R) train, [N - R, N) roll out (trainer/separate.py); each pool's own GPUs
    pools = (
        {
            "train_gpus": lay.world_size - p.rollout_gpus,
            "rollout_gpus": p.rollout_gpus,
            "rollout_hardware": p.rollout_hardware or cfg.hardware.name,
            "staleness": p.staleness,
            "partial_rollout": p.partial_rollout,
            "sync_interval": p.sync_interval,
            "recompute_logprobs": p.recompute_logprobs,
            "stream": p.stream,
        }
        if p.separate
        else None
    )
    out: dict[str, object] = {
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "world_size": lay.world_size,
        "nnodes": lay.nnodes,
        "nproc_per_node": lay.nproc_per_node,
        "dp": s.layout.dp,
        "mbs": s.batching.mbs,
        "roles": roles,
        "placement": pools,
        "batch": launch.micro_batches(cfg),
        "workload": {
            k: getattr(w, k)
            for k in ("prompts", "n", "prompt_len", "response_len", "mini_batch", "ppo_epochs", "kl", "dtype")
        },
        "memory": None,
        "memory_note": None,
    }
    try:
        from grpo_tune.costmodel.estimate import estimate

        if p.separate:
            from grpo_tune.costmodel.pools import estimate_separate

            est = estimate_separate(
                model=cfg.model,
                hardware=cfg.hardware,
                cluster=cfg.cluster,
                strategy=s,
                workload=w,
                placement=p,
                rollout_hardware=p.rollout_profile(),
            )
        else:
            est = estimate(model=cfg.model, hardware=cfg.hardware, cluster=cfg.cluster, strategy=s, workload=w)
        cap = int(est.capacity_bytes)
        # each pool's phases against its own GPUs' capacity (the rollout pool may be another profile)
        rcap = int(est.placement["rollout_capacity_bytes"]) if p.separate and est.placement else cap
        out["memory"] = {
            "capacity_bytes": cap,
            "fits": est.fits,
            "phases": {k: int(v.total_bytes) for k, v in est.memory.items()},
            "phase_capacity_bytes": {k: rcap if k == "rollout" else cap for k in est.memory},
            "violations": [v.to_dict() for v in est.violations],
        }
    except ImportError as exc:  # the memory model is a separate issue; say so rather than fail
        out["memory_note"] = f"no memory estimate: {exc}"
    except GrpoTuneError as exc:
        out["memory_note"] = f"no memory estimate: [{exc.code}] {exc.message}"
    return out


def interrupted_exit(exc: BaseException) -> int | None:
    """The exit code of a run stopped by a signal (130 for Ctrl-C, 128 + N for signal N), else None."""
    import signal

    if isinstance(exc, KeyboardInterrupt):
        return 128 + signal.SIGINT
    signum = getattr(exc, "signum", None)
    return 128 + signum if isinstance(signum, int) else None


def interrupted_line(out_dir: Path, world_size: int) -> str:
    """``interrupted at step N; the last checkpoint is step M; rerun the same command to resume``."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.trainer import launch

    steps = launch.metric_steps(out_dir)
    try:
        ck = launch.check_resume(out_dir, world_size)
    except GrpoTuneError:
        ck = None
    at = f"interrupted at step {max(steps)}" if steps else "interrupted before the first step finished"
    if ck:
        return f"{at}; the last checkpoint is step {ck}; rerun the same command to resume"
    return f"{at}; no checkpoint was written yet; rerun the same command to start again"
