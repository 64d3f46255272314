"""``grpo-tune profile --config X --steps K --json out.json``: measure a config with a short real run.

Runs the trainer (torchrun) on a synthetic workload with the config's prompt and response lengths
and writes the profile JSON (see trainer/profile.py for the contract). Exit codes: 0 ok, 3 out of
memory, 4 any other failure, 2 a bad config (coded error, before any process starts). When the
workers die without writing the JSON, this command writes it from their failure records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from grpo_tune.cli.train import ConfigOpt, MasterAddrOpt, MasterPortOpt, NnodesOpt, NodeRankOpt


def profile(
    config: ConfigOpt,
    steps: Annotated[int, typer.Option("--steps", help="Steps to run; the first is excluded from the medians.")] = 3,
    json_path: Annotated[Path, typer.Option("--json", help="Where to write the profile JSON.")] = Path("profile.json"),
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Scratch folder for logs and metrics (default: next to --json).")
    ] = None,
    nnodes: NnodesOpt = None,
    node_rank: NodeRankOpt = 0,
    master_addr: MasterAddrOpt = None,
    master_port: MasterPortOpt = None,
    timeout: Annotated[
        Optional[float],
        typer.Option(
            "--timeout",
            help="Stop the workers after this many seconds (refine passes its --trial-timeout).",
            hidden=True,
        ),
    ] = None,
) -> None:
    """Profile a run config: time per phase, tokens/s, peak memory per rank -> JSON."""
    from grpo_tune.rundir.outputs import check_output
    from grpo_tune.cli.train import check_rendezvous, load_checked
    from grpo_tune.trainer import launch
    from grpo_tune.trainer import profile as tprofile

    check_output(json_path, "--json", inputs={"CONFIG": config})  # before anything runs: never over the config itself
    check_rendezvous(master_addr, master_port)
    if out is None:
        out = json_path.parent / f"{json_path.stem}.run"
    cfg, lay, out_dir = load_checked(
        config, steps=steps, out=out, nnodes=nnodes, node_rank=node_rank, resume=False, scratch=True
    )
    if timeout is not None and not (timeout > 0 and timeout < float("inf")):
        from grpo_tune.core.errors import ConfigError

        raise ConfigError(f"--timeout must be a finite number of seconds > 0, got {timeout}")
    cmd = launch.torchrun_command(
        config,
        lay,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        worker_args=[
            "--steps",
            str(steps),
            "--out",
            str(out_dir),
            "--no-resume",
            "--profile-json",
            str(json_path.resolve()),
        ],
    )
    from grpo_tune.core.runlock import acquire, lock_name

    console = Console(stderr=True)
    with acquire(
        out_dir, "grpo-tune profile", say=lambda s: console.print(s, highlight=False), name=lock_name(node_rank)
    ) as lk:
        if node_rank == 0:  # node 0 holds global rank 0, which writes the JSON; the others leave it alone
            json_path.unlink(missing_ok=True)  # never report a previous run's figures
            launch.trim_metrics(out_dir, None)  # a scratch folder: this run's steps only
        launch.clear_failures(out_dir)
        console.print(
            f"profiling {cfg.model.name} on {lay.world_size} rank(s), {steps} steps; log: {out_dir / 'train.log'}",
            highlight=False,
        )
        rc = launch.run_workers(cmd, out_dir, deadline_s=timeout, pass_fds=(lk.fd,))
    message: str | None
    status, message, code = launch.worker_status(rc, out_dir)
    if rc == 124 and timeout is not None:
        status, message, code = "error", f"timed out: stopped after --timeout {timeout:g} s", launch.EXIT_ERROR
    if node_rank > 0:
        if code != launch.EXIT_OK:
            console.print(f"[bold red]profile {status}[/] on node {node_rank}: " + escape(str(message)), soft_wrap=True)
            raise typer.Exit(code)
        console.print(f"node {node_rank}: done (node 0 writes {json_path})", highlight=False)
        return
    if code == launch.EXIT_OK and not json_path.exists():
        status, message, code = (
            "error",
            "the workers exited cleanly without writing the profile JSON",
            launch.EXIT_ERROR,
        )
    if code != launch.EXIT_OK:
        tprofile.write(
            json_path,
            tprofile.result(status, message=message, config=str(config), steps=steps, world_size=lay.world_size),
        )
        console.print(f"[bold red]profile {status}[/]: " + escape(str(message)), highlight=False, soft_wrap=True)
        console.print(launch.log_tail(out_dir, 15), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(code)
    import json

    res = json.loads(json_path.read_text())
    ph = ", ".join(f"{k} {v:.3f}s" for k, v in res["phases_s"].items() if v is not None)
    console.print(
        f"ok: step {res['step_s']:.3f}s ({ph}); {res['tokens_per_s']:.0f} tokens/s; "
        f"peak {res['peak_memory_bytes']['max'] / 2**20:.0f} MiB; wrote {json_path}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
