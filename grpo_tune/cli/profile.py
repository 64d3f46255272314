"""``grpo-tune profile --config X --steps K --json out.json``: measure a config with a short real run.

Parses the flags and calls :func:`grpo_tune.jobs.profile.run_profile` once, which runs the trainer (torchrun)
on a synthetic workload with the config's prompt and response lengths and writes the profile JSON (see
trainer/profile.py for the contract); prints how it ended. Exit codes: 0 ok, 3 out of
memory, 4 any other failure, 2 a bad config (coded error, before any process starts). When the
workers die without writing the JSON, the job writes it from their failure records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from grpo_tune.cli.train import ConfigOpt, MasterAddrOpt, MasterPortOpt, NnodesOpt, NodeRankOpt
from grpo_tune.jobs.profile import ProfileRequest, ProfileStart, run_profile
from grpo_tune.jobs.train import Nodes


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
    console = Console(stderr=True)
    req = ProfileRequest(
        config=config,
        steps=steps,
        json_path=json_path,
        out=out,
        nodes=Nodes(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port),
        timeout=timeout,
    )

    def started(run: ProfileStart) -> None:
        console.print(
            f"profiling {run.model} on {run.world_size} rank(s), {run.steps} steps; log: {run.log}", highlight=False
        )

    res = run_profile(req, say=lambda s: console.print(s, highlight=False), started=started)
    if res.node_rank > 0:
        if res.exit_code:
            console.print(
                f"[bold red]profile {res.status}[/] on node {res.node_rank}: " + escape(str(res.message)),
                soft_wrap=True,
            )
            raise typer.Exit(res.exit_code)
        console.print(f"node {res.node_rank}: done (node 0 writes {json_path})", highlight=False)
        return
    if res.exit_code or res.report is None:
        console.print(
            f"[bold red]profile {res.status}[/]: " + escape(str(res.message)), highlight=False, soft_wrap=True
        )
        console.print(res.log_tail or "", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(res.exit_code)
    rep: dict[str, Any] = res.report  # the profile JSON (core/profile_report.py)
    ph = ", ".join(f"{k} {v:.3f}s" for k, v in rep["phases_s"].items() if v is not None)
    console.print(
        f"ok: step {rep['step_s']:.3f}s ({ph}); {rep['tokens_per_s']:.0f} tokens/s; "
        f"peak {rep['peak_memory_bytes']['max'] / 2**20:.0f} MiB; wrote {json_path}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
