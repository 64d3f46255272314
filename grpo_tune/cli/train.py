"""``grpo-tune train --config best.yaml``: check the config, then run the GRPO trainer under torchrun.

``--dry-run`` prints the Parallel Config Summary (degrees per role, world size, DP, micro-batches,
the cost model's memory per phase) and the torchrun command, and starts nothing. Every check that
can fail runs before a process starts (:func:`trainer.launch.preflight`). The trainer is imported
lazily here, and trainer.launch is torch-free, so ``autotune`` never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

ConfigOpt = Annotated[
    Path, typer.Option("--config", "-c", help="Run config written by `grpo-tune search` (best.yaml).")
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--set",
        metavar="SECTION.KEY=VALUE",
        help="Override one key of the config, checked like the file (repeatable): "
        "--set trainer.lr=3e-3 --set trainer.dataset=data/train.jsonl.",
    ),
]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", help="GRPO steps (default: trainer.steps).")]
OutOpt = Annotated[
    Optional[Path],
    typer.Option("--out", help="Output folder: metrics.jsonl, checkpoints, train.log (default: trainer.out_dir)."),
]
NnodesOpt = Annotated[
    Optional[int],
    typer.Option(
        "--nnodes", help="Nodes (torchrun --nnodes; default: from cluster.gpus_per_node).", rich_help_panel="Multi-node"
    ),
]
NodeRankOpt = Annotated[
    int, typer.Option("--node-rank", help="This node's rank (torchrun --node-rank).", rich_help_panel="Multi-node")
]
MasterAddrOpt = Annotated[
    Optional[str],
    typer.Option("--master-addr", help="Node 0's address (torchrun --master-addr).", rich_help_panel="Multi-node"),
]
MasterPortOpt = Annotated[
    Optional[int],
    typer.Option("--master-port", help="Rendezvous port (torchrun --master-port).", rich_help_panel="Multi-node"),
]


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
):
    """Load the config, apply CLI overrides, run every pre-start check. Returns (cfg, layout, out_dir).

    ``scratch``: the output folder is the command's own scratch space (``profile``), reused freely."""
    import dataclasses
    import os

    from grpo_tune.core import config as run_config
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.trainer import launch

    cfg = run_config.load(config, sets or ())
    over: dict[str, Any] = {}  # TrainerOptions fields of mixed types, for dataclasses.replace
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {steps}")
        over["steps"] = steps
    if out is not None:
        over["out_dir"] = str(out)
    if over:
        cfg = cfg.replace(trainer=dataclasses.replace(cfg.trainer, **over))
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


def summary(cfg, lay) -> dict:
    """The Parallel Config Summary as data (printed as tables, or as JSON with --json)."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.trainer import launch

    s, w, t = cfg.strategy, cfg.workload, cfg.trainer
    roles = {
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
        roles["reference"] = s.layout.degrees()
    roles["rollout"] = {
        "engine": t.rollout_engine,
        "tp": s.rollout.rollout_tp,
        "replicas": lay.world_size // s.rollout.rollout_tp,
        "gpu_memory_utilization": s.rollout.gpu_memory_utilization,
    }
    out = {
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "world_size": lay.world_size,
        "nnodes": lay.nnodes,
        "nproc_per_node": lay.nproc_per_node,
        "dp": s.layout.dp,
        "mbs": s.batching.mbs,
        "roles": roles,
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

        est = estimate(model=cfg.model, hardware=cfg.hardware, cluster=cfg.cluster, strategy=s, workload=w)
        out["memory"] = {
            "capacity_bytes": int(est.capacity_bytes),
            "fits": est.fits,
            "phases": {k: int(v.total_bytes) for k, v in est.memory.items()},
            "violations": [v.to_dict() for v in est.violations],
        }
    except ImportError as exc:  # the memory model is a separate issue; say so rather than fail
        out["memory_note"] = f"no memory estimate: {exc}"
    except GrpoTuneError as exc:
        out["memory_note"] = f"no memory estimate: [{exc.code}] {exc.message}"
    return out


def _human(b: float) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def print_summary(sm: dict, cmd: list[str], console: Console) -> None:
    t = Table(
        title=f"Parallel Config Summary: {sm['model']} on {sm['world_size']} x {sm['hardware']} "
        f"({sm['nnodes']} node(s) x {sm['nproc_per_node']})"
    )
    t.add_column("role")
    for c in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp"):
        t.add_column(c, justify="right")
    t.add_column("notes")
    for role, r in sm["roles"].items():
        if role == "rollout":
            t.add_row(
                "rollout",
                str(r["tp"]),
                "1",
                "-",
                "-",
                "-",
                "-",
                str(r["replicas"]),
                f"engine={r['engine']}, {r['replicas']} replica(s), gpu_memory_utilization={r['gpu_memory_utilization']}",
            )
            continue
        notes = (
            "forward-only, actor's groups"
            if role == "reference"
            else (
                f"SP={'on' if r['sequence_parallel'] else 'off'}, recompute={r['recompute']}, "
                f"dist-opt={'on' if r['distributed_optimizer'] else 'off'}, offload={','.join(r['offload']) or 'none'}"
            )
        )
        t.add_row(role, *(str(r[c]) for c in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp")), notes)
    console.print(t)
    b, w = sm["batch"], sm["workload"]
    console.print(
        f"world size {sm['world_size']}  DP {sm['dp']}  micro-batch {sm['mbs']}  |  "
        f"{w['prompts']} prompts x n={w['n']} = {b['sequences_per_step']} sequences/step, "
        f"{b['mini_batches_per_step']} mini-batch(es) of {b['sequences_per_mini_batch']}, "
        f"{b['micro_batches_per_mini_batch']} micro-batch(es) per mini-batch per DP rank, "
        + (
            f"log-prob micro-batch {b['log_prob_mbs']} ({b['log_prob_micro_batches_per_dp_rank']} per DP rank), "
            if b["log_prob_mbs"] != sm["mbs"] and not b.get("packing")
            else ""
        )
        + f"ppo_epochs {w['ppo_epochs']}, lengths {w['prompt_len']}+{w['response_len']}",
        highlight=False,
    )
    if b.get("packing"):
        console.print(
            f"dynamic batching: {b['max_tokens_per_gpu']} tokens per update micro-batch, "
            f"{b['log_prob_max_tokens_per_gpu']} per log-prob micro-batch; {b['packing']}",
            highlight=False,
        )
    if sm["memory"]:
        m = Table(title="Memory estimate per phase (cost model, most loaded rank)")
        m.add_column("phase")
        m.add_column("bytes", justify="right")
        m.add_column("of capacity", justify="right")
        cap = sm["memory"]["capacity_bytes"]
        for ph, b_ in sm["memory"]["phases"].items():
            m.add_row(ph, _human(b_), f"{100 * b_ / cap:.1f}%")
        console.print(m)
        console.print(f"capacity {_human(cap)}: {'fits' if sm['memory']['fits'] else '[red]does not fit[/]'}")
        for v in sm["memory"]["violations"]:
            console.print(f"[yellow][{v['code']}][/] {v['message']}", highlight=False)
    else:
        console.print(f"[dim]{sm['memory_note']}[/]")
    console.print("would run: " + " ".join(cmd), highlight=False, soft_wrap=True)


class Progress:
    """Follows metrics.jsonl while the workers run: a rich live table on a terminal, one line per step otherwise."""

    COLS = (
        ("step", "{:d}"),
        ("loss", "{:+.4f}"),
        ("reward_mean", "{:.3f}"),
        ("kl", "{:.4f}"),
        ("entropy", "{:.3f}"),
        ("clip_frac", "{:.3f}"),
        ("response_len", "{:.1f}"),
        ("step_s", "{:.2f}"),
        ("tokens_per_s", "{:.0f}"),
    )

    def __init__(self, path: Path, total: int, console: Console, *, after: int = 0):
        """Shows the steps after ``after`` (the checkpoint resumed from). The file is followed by the steps it
        holds, not by a byte offset alone: the trainer rewrites it when it resumes (a new file), and every step
        it logs after ``after`` is shown once."""
        self.path, self.total, self.console = path, total, console
        self.after = after
        self.offset = 0
        self.ident: tuple[int, int] | None = None
        self.shown: set[int] = set()
        self.rows: list[dict] = []
        self.live = None
        if console.is_terminal:
            from rich.live import Live

            self.live = Live(self._table(), console=console, refresh_per_second=4, transient=False)
            self.live.start()

    def _table(self) -> Table:
        done = self.rows[-1]["step"] if self.rows else 0
        t = Table(title=f"GRPO step {done}/{self.total}")
        for c, _ in self.COLS:
            t.add_column(c, justify="right")
        for r in self.rows[-10:]:
            t.add_row(*(self._fmt(r, c, f) for c, f in self.COLS))
        return t

    @staticmethod
    def _fmt(r: dict, c: str, f: str) -> str:
        v = r.get(c)
        return "-" if v is None else f.format(v)

    def poll(self) -> None:
        import os

        from grpo_tune.core import safeio
        from grpo_tune.core.errors import GrpoTuneError

        try:
            st = os.lstat(self.path)
            ident = (st.st_dev, st.st_ino)
            if ident != self.ident or st.st_size < self.offset:  # replaced (trimmed on resume) or truncated
                self.ident, self.offset = ident, 0
            data = safeio.read_bytes(self.path, offset=self.offset, max_bytes=safeio.MAX_READ_BYTES)
        except (OSError, GrpoTuneError):
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[:end].decode(errors="replace").splitlines():
            try:
                r = json.loads(line)
                step = r["step"]
            except (ValueError, KeyError, TypeError):
                continue
            if not isinstance(step, int) or step <= self.after or step in self.shown:
                continue
            self.shown.add(step)
            self.rows.append(r)
            if self.live is None:
                self.console.print(
                    "  ".join(f"{c}={self._fmt(r, c, f)}" for c, f in self.COLS), highlight=False, soft_wrap=True
                )
        if self.live is not None:
            self.live.update(self._table())

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def train(
    config: ConfigOpt,
    steps: StepsOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the Parallel Config Summary and check the config; start nothing.")
    ] = False,
    out: OutOpt = None,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = 0,
    master_addr: MasterAddrOpt = None,
    master_port: MasterPortOpt = None,
    slurm: Annotated[
        Optional[Path],
        typer.Option(
            "--slurm", help="Write an sbatch script to this file instead of running.", rich_help_panel="Multi-node"
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume/--no-resume", help="Continue from the latest checkpoint in the output folder.")
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="With --dry-run: print the summary as JSON.")] = False,
    sets: SetOpt = None,
) -> None:
    """Run GRPO training with the config's parallel strategy (torchrun; megatron-core)."""
    from grpo_tune.rundir.outputs import check_output
    from grpo_tune.trainer import launch

    if slurm is not None:  # before anything is read or written: never over the config itself
        check_output(slurm, "--slurm", inputs={"CONFIG": config})
    check_rendezvous(master_addr, master_port)
    cfg, lay, out_dir = load_checked(
        config,
        steps=steps,
        out=out,
        nnodes=nnodes,
        node_rank=node_rank,
        resume=resume,
        need_torch=not (dry_run or slurm),
        sets=sets,
    )
    set_args = [a for kv in sets or () for a in ("--set", kv)]

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
    console = Console()
    if slurm is not None:
        from grpo_tune.core.config import atomic_write

        atomic_write(slurm, launch.slurm_script(config, lay, worker_args=worker_args_for(out_dir.resolve())))
        console.print(
            f"wrote {slurm}: sbatch {slurm}  ({lay.nnodes} node(s) x {lay.nproc_per_node} ranks)", highlight=False
        )
        return
    cmd = launch.torchrun_command(
        config, lay, node_rank=node_rank, master_addr=master_addr, master_port=master_port, worker_args=worker_args
    )
    if dry_run:
        sm = summary(cfg, lay)
        if json_out:
            print(json.dumps({**sm, "command": cmd}, indent=2))
        else:
            print_summary(sm, cmd, console)
        return
    from grpo_tune.core.runlock import acquire, lock_name

    err = Console(stderr=True)
    with acquire(
        out_dir, "grpo-tune train", say=lambda s: err.print(s, highlight=False), name=lock_name(node_rank)
    ) as lk:
        start = launch.check_resume(
            out_dir, launch.checkpoint_world(cfg, lay)
        )  # under the lock: no other writer can move it now
        console.print(
            f"training {cfg.model.name}: {lay.world_size} rank(s), {cfg.trainer.steps} steps"
            + (f", resuming after step {start}" if start else "")
            + f"; logs in {out_dir}",
            highlight=False,
        )
        launch.clear_failures(out_dir)
        if node_rank == 0:
            launch.trim_metrics(out_dir, start if resume else None)
        prog = Progress(out_dir / "metrics.jsonl", cfg.trainer.steps, console, after=start or 0)
        try:
            rc = launch.run_workers(cmd, out_dir, poll=prog.poll, pass_fds=(lk.fd,))
        except (KeyboardInterrupt, SystemExit) as exc:
            prog.stop()
            code = interrupted_exit(exc)
            if code is None:
                raise
            from grpo_tune.cli.main import say_error

            say_error(
                [interrupted_line(out_dir, launch.checkpoint_world(cfg, lay))]
            )  # COLUMNS=0 or a pipe: it still arrives
            raise typer.Exit(code) from None
        finally:
            prog.stop()
    status, message, code = launch.worker_status(rc, out_dir)
    if code:
        err.print(f"[bold red]training failed ({status})[/]: " + escape(str(message)), highlight=False, soft_wrap=True)
        if launch.classified(out_dir) is None:  # a machine cause is said in one line; anything else shows the log
            err.print(launch.log_tail(out_dir), highlight=False, markup=False, soft_wrap=True)
        else:
            err.print(f"log: {out_dir / 'train.log'}", highlight=False, soft_wrap=True)
        raise typer.Exit(code)
    console.print(
        f"done: metrics in {out_dir / 'metrics.jsonl'}, checkpoints in {out_dir / 'checkpoints'}",
        highlight=False,
        soft_wrap=True,
    )


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


def register(app: typer.Typer) -> None:
    app.command("train")(train)
