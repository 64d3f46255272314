"""``grpo-tune calibrate --from-log FILE... --launch LAUNCH``: fit the time model to the user's own verl logs.

Parses the flags, calls :func:`grpo_tune.jobs.calibrate.run_calibrate` once (each log's warnings on stderr as it is
read) and prints the fit (tables, or JSON with ``--json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.cli.options import Json
from grpo_tune.jobs.calibrate import CalibrateRequest, run_calibrate

if TYPE_CHECKING:
    from grpo_tune.autotune.calibrate.runlog import MemoryCheck

FromLog = Annotated[
    list[Path],
    typer.Option(
        "--from-log",
        help="verl console log, verl file-logger JSONL or our metrics.jsonl (repeat, or list files after it).",
    ),
]
LaunchOpt = Annotated[
    list[Path],
    typer.Option("--launch", help="The launch each log ran (once for all logs, or once per --from-log, in order)."),
]
Extra = Annotated[
    list[Path] | None, typer.Argument(help="More log files (`--from-log a.jsonl b.jsonl`).", show_default=False)
]
Hardware = Annotated[
    str | None,
    typer.Option(
        "--hardware", help="Hardware profile of the GPUs the logs ran on (default: a best.yaml's own, else h100)."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Preset, HF id or config.json folder (default: the launch's model path)."),
]
OutOpt = Annotated[
    Path,
    typer.Option("--out", help="Calibration JSON to write (--calibration of estimate/search/tune/compare reads it)."),
]
Warmup = Annotated[
    int,
    typer.Option("--warmup", help="Logged steps to drop at the start of each log (CUDA graphs, allocator, compile)."),
]
Params = Annotated[str | None, typer.Option("--params", help="Comma list of calibration knobs to fit (default: all).")]


def calibrate(
    from_log: FromLog,
    launch: LaunchOpt,
    extra: Extra = None,
    hardware: Hardware = None,
    model: ModelOpt = None,
    out: OutOpt = Path("calibration.json"),
    warmup: Warmup = 1,
    params: Params = None,
    json_out: Json = False,
) -> None:
    """Fit the time model's calibration knobs to verl logs of your own runs; write CAL.json."""
    logs = list(from_log) + list(extra or [])
    err = Console(stderr=True)
    req = CalibrateRequest(
        logs=logs, launches=list(launch), hardware=hardware, model=model, out=out, warmup=warmup, params=params
    )
    res = run_calibrate(req, warn=lambda w: err.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True))
    if json_out:
        print(json.dumps(res.to_dict(), indent=2, default=str))
        return
    c = Console()
    c.print(
        f"{res.logs} log(s), {res.steps_kept} steps after dropping {res.warmup} warm-up "
        f"step(s) per log; {res.model} on {res.hardware}",
        highlight=False,
    )
    before, after = res.phase_mape_before_pct, res.phase_mape_after_pct
    _print_fit(c, before, after, res.defaults, res.fit.params, res.memory)
    for w in res.fit.warnings:
        c.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    c.print(f"wrote [bold]{out}[/] (use it with --calibration {out})", highlight=False)


def _print_fit(c: Console, before: dict, after: dict, base: dict, fitted: dict, mem: list[MemoryCheck]) -> None:
    t = Table(title="Per-phase MAPE, predicted vs logged", title_justify="left")
    for col in ("phase", "before %", "after %"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for k in before:
        t.add_row(k, f"{before[k]:.1f}", f"{after.get(k, float('nan')):.1f}")
    c.print(t)
    t2 = Table(title="Fitted knobs (those that moved)", title_justify="left")
    t2.add_column("knob")
    t2.add_column("default", justify="right")
    t2.add_column("fitted", justify="right")
    for k, v in fitted.items():
        if abs(v - base[k]) > 1e-6 * max(1.0, abs(base[k])):
            t2.add_row(k, f"{base[k]:.4g}", f"{v:.4g}")
    c.print(t2)
    for m in mem:
        verdict = (
            "[red]memory model optimistic[/]: the run allocated more than predicted"
            if m["optimistic"]
            else "memory model not optimistic"
        )
        peaks = f"logged peak {m['logged_gib']:.1f} GiB vs predicted {m['predicted_gib']:.1f} GiB ({m['phase']})"
        c.print(f"{Path(m['log']).name}: {peaks}: {verdict}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
