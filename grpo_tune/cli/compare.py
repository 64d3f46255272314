"""``grpo-tune compare``: the best plan on each hardware profile, side by side.

Runs the same search once per profile and reports step time, tokens/s/GPU, the cost per million
tokens where the profile has a price, and the winner's memory headroom; a table (or ``--json``)
and a PNG.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional, cast

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.cli.options import (
    PLACEMENT_FLAGS,
    placement_flags,
    MIN_HEADROOM_DEFAULT,
    Framework,
    Json,
    MinHeadroom,
    pins_from_flags,
    workload_flags,
)
from grpo_tune.cli.plan_options import flags_after, plan_flags, plan_options
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.units import GiB
from grpo_tune.jobs.compare import CompareOutcome, CompareRequest, run_compare
from grpo_tune.jobs.inputs import WorkloadFlags
from grpo_tune.jobs.setup import prepare


HardwareList = Annotated[
    str,
    typer.Option(
        "--hardware", help="Comma list of hardware profiles (names, aliases or .toml files).", rich_help_panel="Model"
    ),
]
CompareOut = Annotated[
    Optional[Path],
    typer.Option(
        "--out",
        help="Folder for compare.png and compare.json (default runs/compare-<model>-<gpus>g-<time>).",
        rich_help_panel="Output",
    ),
]


CalibrationFile = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="Calibration JSON (grpo-tune calibrate); applied to the row of the hardware it was fitted on.",
    ),
]


@flags_after("calibration", PLACEMENT_FLAGS)
@plan_options(degrees_after="hardware", workload_before="json_out", target=True)
def compare(
    hardware: HardwareList = "h100,h200,a100",
    min_headroom: MinHeadroom = MIN_HEADROOM_DEFAULT,
    json_out: Json = False,
    out: CompareOut = None,
    calibration: CalibrationFile = None,
    framework: Framework = "verl",
    **plan: Any,
) -> None:
    """Best plan per hardware: step time, tokens/s/GPU, $ per million tokens, memory headroom."""
    names = [h.strip() for h in hardware.split(",") if h.strip()]
    if not names:
        raise ConfigError("--hardware needs at least one profile", hint="e.g. --hardware h100,h200,a100")
    setup = prepare(framework, stack=plan.get("stack"), out=out, calibration=calibration)  # before the searches
    place = placement_flags(plan)
    plan["stack"] = setup.stack
    flags = plan_flags(plan)
    req = CompareRequest(
        model=flags["model"],
        gpus=flags["gpus"],
        hardware=names,
        gpus_per_node=flags["gpus_per_node"],
        pins=pins_from_flags(flags),
        workload=cast("WorkloadFlags", workload_flags(flags)),  # typer parsed each flag to its declared type
        setup=setup,
        place=place,
        min_headroom=min_headroom,
        out=out,
    )
    o = run_compare(req)
    if json_out:
        print(json.dumps(o.doc, indent=2, default=str))
        return
    if line := setup.stack_line(str(o.rows[0]["stack"]) if o.rows and o.rows[0].get("stack") else None):
        Console().print(line, highlight=False)
    _print_rows(o, f"Best plan per hardware: {req.model} on {req.gpus} GPUs")


def _print_rows(o: CompareOutcome, title: str) -> None:
    """The rows' table under the workload they are priced on, the close calls, the files written."""
    rows, wl = o.rows, o.workload
    t = Table(title=title, title_justify="left")
    for c in ("hardware", "best plan", "step s", "tok/s/GPU", "$/M tok", "free GiB"):
        t.add_column(
            c,
            justify="left" if c in ("hardware", "best plan") else "right",
            overflow="fold" if c == "hardware" else "ellipsis",  # a profile name is never cut short
        )
    for r in rows:
        # the profile's provenance and its class's error band, under its name
        hw = f"{r['hardware']}\n[dim]{r['provenance']} ±{r['band_pct']:.0f}%[/]"
        if not r["fits"]:
            err = r["error"]
            code = err["code"] if isinstance(err, dict) else err
            t.add_row(hw, f"[red]{code}[/]: no plan fits", "-", "-", "-", "-")
            continue
        cost, headroom = r["usd_per_million_tokens"], r["headroom_bytes"]
        assert isinstance(headroom, int)  # compare_rows writes int(headroom) for a plan that fits
        t.add_row(
            hw,
            str(r["plan"]),
            f"{r['step_s']:.2f}",
            f"{r['tokens_per_s_per_gpu']:,.0f}",
            "-" if cost is None else f"{cost:.2f}",
            f"{headroom / GiB:.1f}",
        )
    console = Console()
    from grpo_tune.costmodel.lengths import lengths_note, workload_line

    if wl.kind == "grpo":  # the lengths every row is priced on, and where they come from
        console.print(f"Workload: {workload_line(wl)}", highlight=False)
        console.print(f"Lengths: {lengths_note(wl)}", highlight=False)
    console.print(t)
    console.print(
        "under each hardware: how its profile was obtained (fitted on measurements, transferred from another "
        "profile by stated ratios, or spec-only) and the error band of that class: fitted, the cross-validated step "
        "error of `grpo-tune validate --grpo`; transferred, the step error measured by leaving each GPU type's rows "
        "out of the fit (the worst GPU: profiles/data/transfer_bands.toml); spec-only, 1.5x that",
        highlight=False,
    )
    for r in rows:
        if r.get("note"):
            console.print(f"[yellow]note[/]: {r['hardware']} {r['note']}", highlight=False)
    console.print(f"wrote {o.png} and {o.out / 'compare.json'}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
