"""``grpo-tune calibrate --from-log FILE... --launch LAUNCH``: fit the time model to the user's own verl logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.cli.options import Json
from grpo_tune.core.errors import ConfigError, close_matches

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
    from grpo_tune.autotune.calibrate import runlog as R
    from grpo_tune.autotune.calibrate.fit import defaults, save
    from grpo_tune.rundir.outputs import check_output

    logs = list(from_log) + list(extra or [])
    if not launch:
        raise ConfigError("--launch is required", hint="the launch (verl script or override list) each log ran")
    if len(launch) not in (1, len(logs)):
        raise ConfigError(f"{len(logs)} log(s) but {len(launch)} --launch: give one launch for all logs or one per log")
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup}")
    launches = list(launch) * len(logs) if len(launch) == 1 else list(launch)
    # before the fit: never over a log or a launch
    check_output(out, "--out", inputs={"--from-log": logs, "--launch": launch})
    base = defaults()
    names = _knobs(params, base)
    points = _read_points(logs, launches, model=model, hardware=hardware, warmup=warmup)
    res = R.calibrate_logs(points, names=names)
    before, after = R.phase_mape(points, base), R.phase_mape(points, res.params)
    mem = [m for p in points if (m := R.memory_check(p)) is not None]
    hw_name = points[0].plan.hardware.name
    logs_doc = [_log_doc(p, lp) for p, lp in zip(points, launches)]
    mape = {"phase_mape_before_pct": before, "phase_mape_after_pct": after, "memory": mem}
    save(
        out, params=res.params, hardware=hw_name, fit={**res.to_dict(), "source": "verl logs", "logs": logs_doc, **mape}
    )
    if json_out:
        changed = {k: v for k, v in res.params.items() if abs(v - base[k]) > 1e-9}
        doc = {
            "out": str(out),
            "hardware": hw_name,
            "params": res.params,
            "changed": changed,
            "at_bound": res.at_bound,
            "warnings": res.warnings,
            **mape,
            "logs": logs_doc,
        }
        print(json.dumps(doc, indent=2, default=str))
        return
    c = Console()
    c.print(
        f"{len(points)} log(s), {sum(p.kept_steps for p in points)} steps after dropping {warmup} warm-up "
        f"step(s) per log; {points[0].plan.model.name} on {hw_name}",
        highlight=False,
    )
    _print_fit(c, before, after, base, res.params, mem)
    for w in res.warnings:
        c.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    c.print(f"wrote [bold]{out}[/] (use it with --calibration {out})", highlight=False)


def _knobs(params: str | None, base: dict[str, float]) -> list[str] | None:
    """--params as knob names (None: all). An empty list (``--params ,``) or an unknown name is an error, not
    a fit of every knob."""
    if params is None:
        return None
    names = [n.strip() for n in params.split(",") if n.strip()]
    known = ", ".join(sorted(base))
    if not names:
        raise ConfigError(f"--params {params!r} names no calibration knob", hint=f"name some of: {known}")
    for n in names:
        if n not in base:
            near = close_matches(n, base)
            maybe = f"did you mean {', '.join(near)}? " if near else ""
            raise ConfigError(f"--params: unknown calibration knob {n!r}", hint=f"{maybe}known knobs: {known}")
    return names


def _read_points(logs: list[Path], launches: list[Path], *, model, hardware, warmup: int) -> list:
    """One calibration point per log (its plan from its launch), warnings (a cut last line) on stderr."""
    from grpo_tune.autotune.calibrate import runlog as R

    err = Console(stderr=True)
    points = []
    for i, (log_path, lp) in enumerate(zip(logs, launches)):
        log = R.read_log(log_path)
        point = R.log_point(
            log, lp, model=model, hardware=hardware, skip_warmup=warmup, label=f"{i + 1}:{Path(log_path).name}"
        )
        R.check_same_model(point)
        for w in log.warnings:
            err.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
        points.append(point)
    return points


def _log_doc(p, launch: Path) -> dict:
    """What the calibration file records of one log: where it came from and what it measured."""
    return {
        "log": str(p.log.path),
        "format": p.log.format,
        "launch": str(launch),
        "steps_kept": p.kept_steps,
        "model": p.plan.model.name,
        "gpus": p.plan.cluster.gpus,
        "measured_phases_s": p.point.measured_phases_s,
        "measured_step_s": p.point.measured_step_s,
        "response_len_mean": p.plan.workload.response_len_mean,
        "prompt_len_mean": p.plan.workload.prompt_len_mean,
    }


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
