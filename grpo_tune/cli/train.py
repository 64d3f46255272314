"""``grpo-tune train --config best.yaml``: check the config, then run the GRPO trainer under torchrun.

Parses the flags, calls :func:`grpo_tune.jobs.train.run_train` once (following the run with a live progress
table) and prints how it ended. ``--dry-run`` prints the Parallel Config Summary (degrees per role, world size,
DP, micro-batches, the cost model's memory per phase) and the torchrun command, and starts nothing. Every check
that can fail runs in the job before a process starts; nothing here imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grpo_tune.jobs.train import Nodes, TrainRequest, TrainStart, run_train

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


def _human(b: float) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def print_summary(sm: dict, cmd: list[str], console: Console) -> None:
    pools = sm.get("placement")
    where = (
        f"{pools['train_gpus']} x {sm['hardware']} (training) + {pools['rollout_gpus']} x "
        f"{pools['rollout_hardware']} (rollout)"
        if pools
        else f"{sm['world_size']} x {sm['hardware']}"
    )
    t = Table(
        title=f"Parallel Config Summary: {sm['model']} on {where} ({sm['nnodes']} node(s) x {sm['nproc_per_node']})"
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
                f"engine={r['engine']}, {r['replicas']} replica(s)"
                + (f" on the {r['gpus']} rollout GPUs" if pools else "")
                + f", gpu_memory_utilization={r['gpu_memory_utilization']}",
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
    if pools:
        console.print(
            f"separate pools: ranks 0-{pools['train_gpus'] - 1} train, {pools['train_gpus']}-{sm['world_size'] - 1} "
            f"roll out; staleness {pools['staleness']}, weights synced every {pools['sync_interval']} update(s), "
            f"partial rollout {'on' if pools['partial_rollout'] else 'off'}, old log-probs "
            + ("recomputed (importance-weighted)" if pools["recompute_logprobs"] else "the rollout's")
            + (", each mini-batch trained as it arrives (streamed)" if pools.get("stream") else ""),
            highlight=False,
        )
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
        caps = sm["memory"].get("phase_capacity_bytes") or {}
        for ph, b_ in sm["memory"]["phases"].items():
            m.add_row(ph, _human(b_), f"{100 * b_ / caps.get(ph, cap):.1f}%")
        console.print(m)
        rcap = caps.get("rollout", cap)
        what = f"capacity {_human(cap)}" + (
            f" (training pool), {_human(rcap)} (rollout pool)" if pools and rcap != cap else ""
        )
        console.print(f"{what}: {'fits' if sm['memory']['fits'] else '[red]does not fit[/]'}")
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
    POOL_COLS = (("sample_age", "{:d}"), ("weight_version", "{:d}"))
    """A separate-pool run's: how many versions old its batch was, and the weights it trained."""

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
        self.cols: tuple[tuple[str, str], ...] = self.COLS
        self.live = None
        if console.is_terminal:
            from rich.live import Live

            self.live = Live(self._table(), console=console, refresh_per_second=4, transient=False)
            self.live.start()

    def _table(self) -> Table:
        done = self.rows[-1]["step"] if self.rows else 0
        t = Table(title=f"GRPO step {done}/{self.total}")
        for c, _ in self.cols:
            t.add_column(c, justify="right")
        for r in self.rows[-10:]:
            t.add_row(*(self._fmt(r, c, f) for c, f in self.cols))
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
            if "sample_age" in r and self.cols is self.COLS:
                self.cols = self.COLS + self.POOL_COLS
            if self.live is None:
                self.console.print(
                    "  ".join(f"{c}={self._fmt(r, c, f)}" for c, f in self.cols), highlight=False, soft_wrap=True
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
    console = Console()
    err = Console(stderr=True)
    req = TrainRequest(
        config=config,
        steps=steps,
        out=out,
        nodes=Nodes(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port),
        slurm=slurm,
        dry_run=dry_run,
        resume=resume,
        sets=list(sets or ()),
    )
    res = run_train(req, watch=_Watch(console, err))
    lay = res.layout
    if res.kind == "slurm":
        console.print(
            f"wrote {res.slurm}: sbatch {res.slurm}  ({lay.nnodes} node(s) x {lay.nproc_per_node} ranks)",
            highlight=False,
        )
        return
    if res.kind == "dry_run":
        sm = res.summary or {}
        if json_out:
            print(json.dumps({**sm, "command": res.command}, indent=2))
        else:
            print_summary(sm, res.command, console)
        return
    if res.kind == "interrupted":
        from grpo_tune.cli.main import say_error

        say_error([res.interrupted or ""])  # COLUMNS=0 or a pipe: it still arrives
        raise typer.Exit(res.exit_code)
    if res.exit_code:
        err.print(
            f"[bold red]training failed ({res.status})[/]: " + escape(str(res.message)), highlight=False, soft_wrap=True
        )
        if res.log_tail is not None:  # a machine cause is said in one line; anything else shows the log
            err.print(res.log_tail, highlight=False, markup=False, soft_wrap=True)
        else:
            err.print(f"log: {res.log}", highlight=False, soft_wrap=True)
        raise typer.Exit(res.exit_code)
    console.print(
        f"done: metrics in {res.out_dir / 'metrics.jsonl'}, checkpoints in {res.out_dir / 'checkpoints'}",
        highlight=False,
        soft_wrap=True,
    )


class _Watch:
    """A run as the terminal follows it: the run lock's messages on stderr, the start line, the live progress."""

    def __init__(self, console: Console, err: Console):
        self.console, self.err = console, err
        self.progress: Progress | None = None

    def say(self, line: str) -> None:
        self.err.print(line, highlight=False)

    def started(self, run: TrainStart) -> None:
        self.console.print(
            f"training {run.model}: {run.world_size} rank(s), {run.steps} steps"
            + (f", resuming after step {run.resume_step}" if run.resume_step else "")
            + f"; logs in {run.out_dir}",
            highlight=False,
        )

    def following(self, run: TrainStart) -> Callable[[], None]:
        self.progress = Progress(run.metrics, run.steps, self.console, after=run.resume_step or 0)
        return self.progress.poll

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def register(app: typer.Typer) -> None:
    app.command("train")(train)
