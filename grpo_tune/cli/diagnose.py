"""``grpo-tune diagnose PATH``: coded findings for a run config, a verl launch script or an override list.

Parses the arguments, calls :func:`grpo_tune.jobs.diagnose.run_diagnose` once, prints the report (tables, or JSON
with ``--json``) and exits with its exit code."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.frameworks.base.findings import Report
from grpo_tune.cli.options import Json
from grpo_tune.jobs.diagnose import DiagnoseRequest, run_diagnose
from grpo_tune.core.units import GiB

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_ROWS = 200
"""Findings drawn in the table (errors first); rich took ~0.7 ms a row, so 200k unknown keys printed for minutes.
The counts below the table and ``--json`` cover every finding."""


def _deg(role: Mapping[str, object], keys: tuple[str, ...]) -> str:
    return " ".join(f"{k}={'?' if role.get(k) is None else role[k]}" for k in keys if k in role)


def render(report: Report, console: Console) -> None:
    s = report.summary
    t = Table(title=f"Parallel Config Summary: {report.source}", title_justify="left")
    t.add_column("role")
    t.add_column("degrees")
    roles = s.get("roles") or {}
    for name in ("actor", "ref"):
        if name in roles:
            t.add_row(name, _deg(roles[name], ("tp", "pp", "vpp", "cp", "ep", "etp", "dp")))
    if "rollout" in roles:
        r = roles["rollout"]
        t.add_row(
            "rollout",
            f"{_deg(r, ('tp', 'pp', 'replicas'))} gpu_memory_utilization={r.get('gpu_memory_utilization')} "
            f"engine={r.get('name')}",
        )
    if roles:
        pl = s.get("placement")
        if pl:  # the whole cluster, then the training pool (the rollout pool is the placement row's)
            total = int(pl.get("rollout_gpus") or 0) + int(pl.get("train_gpus") or 0)  # type: ignore[call-overload]
            tgpn = pl.get("train_gpus_per_node") or s.get("gpus_per_node")
            cluster = f"{total} GPUs; training pool {pl.get('train_gpus')} GPUs ({tgpn}/node), DP={s.get('dp')}"
        else:
            cluster = f"world={s.get('world_size')} = {s.get('nnodes')} node(s) x {s.get('gpus_per_node')} GPUs, "
            cluster += f"DP={s.get('dp')}"
        t.add_row("cluster", cluster)
        if pl:
            trainer = pl.get("trainer")
            if trainer == "one-step-off":
                schedule = "sync after every step (verl one-step-off trainer)"
            elif trainer == "fully-async":
                schedule = f"sync every {pl.get('trigger_parameter_sync_step')} mini-batches (verl fully-async trainer)"
            else:
                schedule = f"refit after every step ({trainer})"
            t.add_row(
                "placement",
                f"separate pools: rollout {pl.get('rollout_gpus')} GPUs ({pl.get('rollout_gpus_per_node')}/node), "
                f"training {pl.get('train_gpus')} GPUs; staleness {pl.get('staleness')}, partial rollout "
                f"{'on' if pl.get('partial_rollout') else 'off'}, {schedule}",
            )
        b = s.get("batch") or {}
        t.add_row("batch", " ".join(f"{k}={v}" for k, v in b.items()))
        rhw = f" (rollout pool {s['rollout_hardware']})" if s.get("rollout_hardware") else ""
        t.add_row("model", f"{s.get('model') or '-'} ({s.get('model_note')}), hardware {s.get('hardware')}{rhw}")
    elif s:
        t.add_row("config", json.dumps(s, default=str))
    mem = s.get("memory")
    if mem:
        cap = mem["capacity_bytes"]
        parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in mem["phases"].items())
        t.add_row("memory (GiB/rank)", f"{parts}  | capacity {cap / GiB:.1f}, peak {mem['peak_phase']}")
    else:
        t.add_row("memory", "not estimated")
    console.print(t)
    if not report.findings:
        console.print("[green]no findings[/]")
        return
    f = Table(title="Findings", title_justify="left")
    for c in ("severity", "code", "line", "message", "hint"):
        f.add_column(c, overflow="fold")
    order = {"error": 0, "warning": 1, "info": 2}
    shown = sorted(report.findings, key=lambda x: order[x.severity])[:MAX_ROWS]
    for x in shown:
        f.add_row(
            f"[{STYLE[x.severity]}]{x.severity}[/]", x.code, "" if x.line is None else str(x.line), x.message, x.hint
        )
    console.print(f)
    if len(report.findings) > len(shown):
        console.print(f"... {len(report.findings) - len(shown)} more finding(s) not shown; --json lists them all")
    console.print(f"{report.count('error')} error(s), {report.count('warning')} warning(s)")


def diagnose(
    path: Annotated[
        str,
        typer.Argument(
            help="A run config (best.yaml), a verl launch script, a Hydra override list, or a NeMo-RL recipe."
        ),
    ],
    overrides: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Hydra-style overrides for a NeMo-RL recipe (key=value, +key=value, ~key).", show_default=False
        ),
    ] = None,
    hardware: Annotated[
        Optional[str],
        typer.Option(
            "--hardware", help="Hardware profile for the memory check (default: the run config's, else h100)."
        ),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option("--model", "-m", help="Model preset or config.json when the script's model path maps to none."),
    ] = None,
    json_out: Json = False,
) -> None:
    """Check a GRPO launch: degrees per role, batch rules, dtypes, unknown keys, memory per phase."""
    report = run_diagnose(DiagnoseRequest(path=path, overrides=list(overrides or []), hardware=hardware, model=model))
    if json_out:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        render(report, Console())
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose)
