"""``grpo-tune compare``: the best plan on each hardware profile, side by side.

Runs the same search once per profile and reports step time, tokens/s/GPU, the cost per million
tokens where the profile has a price, and the winner's memory headroom; a table (or ``--json``)
and a PNG.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.core.placement import PlacementAsk
from grpo_tune.cli.options import (
    PLACEMENT_FLAGS,
    placement_flags,
    MIN_HEADROOM_DEFAULT,
    Framework,
    Json,
    MinHeadroom,
    pins_from_flags,
    plan_inputs,
    workload_flags,
)
from grpo_tune.cli.plan_options import flags_after, plan_flags, plan_options
from grpo_tune.autotune.calibrate.fit import load as load_calibration
from grpo_tune.core.errors import ConfigError, NoFeasiblePlanError
from grpo_tune.validate.grpo import BAND_PCT
from grpo_tune.core.units import GiB


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


def usd_per_million_tokens(price_per_gpu_hour: float | None, tokens_per_s_per_gpu: float) -> float | None:
    """$/GPU-hour / (3600 s/h x tokens/s/GPU) x 1e6."""
    if price_per_gpu_hour is None or tokens_per_s_per_gpu <= 0:
        return None
    return price_per_gpu_hour / (3600.0 * tokens_per_s_per_gpu) * 1e6


def compare_rows(
    *,
    model: str,
    gpus: int,
    hardware: list[str],
    gpus_per_node: int | None,
    pins: dict[str, Any],
    workload_kw: dict[str, Any],
    calibration: dict[str, float] | None = None,
    min_headroom: float = 0.0,
    calibration_hardware: str | None = None,
    place: PlacementAsk | None = None,
    stack: str | None = None,
) -> list[dict[str, Any]]:
    """One row per hardware profile: the best plan's figures, or why none fits."""
    from grpo_tune.rundir.report import plan_label
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.autotune.search.rank import step_s, tokens_per_s_per_gpu

    rows = []
    for name in hardware:
        m, hw, cluster, wl = plan_inputs(
            model=model, hardware=name, gpus=gpus, gpus_per_node=gpus_per_node, stack=stack, **workload_kw
        )
        row: dict[str, Any] = {
            "hardware": hw.name,
            "gpus": cluster.gpus,
            "gpus_per_node": cluster.gpus_per_node,
            "price_per_gpu_hour_usd": hw.price_per_gpu_hour_usd,
            "provenance": hw.provenance,
            "provenance_note": hw.provenance_note,
            "stack": hw.stack,
            "band_pct": BAND_PCT[hw.provenance],
        }
        try:
            # a calibration file is fitted on one hardware: it applies to that profile's row only
            cal = calibration if calibration_hardware in (None, hw.name) else None
            res = search(m, hw, cluster, wl, pins=pins, top=1, calibration=cal, min_headroom=min_headroom)
            placed = None
            if place and (place.placement != "colocated" or place.pool_options):
                placed = _placed(m, hw, cluster, wl, pins, cal, min_headroom, place, res)
        except NoFeasiblePlanError as exc:
            row.update(fits=False, error=exc.to_dict())
            rows.append(row)
            continue
        b = res.best if placed is None else placed.best
        tps = tokens_per_s_per_gpu(b)
        row.update(
            fits=True,
            plan=plan_label(b.strategy),
            strategy=b.strategy.to_dict(),
            step_s=step_s(b),
            tokens_per_s_per_gpu=tps,
            mfu=None if b.throughput is None else b.throughput.mfu,
            usd_per_million_tokens=usd_per_million_tokens(hw.price_per_gpu_hour_usd, tps),
            peak_bytes=int(b.peak_bytes),
            peak_phase=b.peak_phase,
            capacity_bytes=int(b.capacity_bytes),
            headroom_bytes=int(b.headroom_bytes),
            search=res.stats(),
        )
        if b.placement:
            row["placement"] = dict(b.placement)
        rows.append(row)
    _flag_within_band(rows)
    return rows


def _placed(m, hw, cluster, wl, pins, cal, min_headroom, place, colocated):
    """The best plan of the placement asked for (auto: the better of colocated and separate pools)."""
    from grpo_tune.autotune.search.placement import search_placement
    from grpo_tune.core.specs import load_hardware

    return search_placement(
        m,
        hw,
        cluster,
        wl,
        placement=place.require_separate(),
        staleness=place.staleness,
        rollout_gpus=place.rollout_gpus,
        rollout_hardware=load_hardware(place.rollout_hardware) if place.rollout_hardware else None,
        partial_rollout=place.partial_rollout,
        pins=pins,
        top=1,
        calibration=cal,
        min_headroom=min_headroom,
        colocated=colocated if place.placement == "auto" else None,
    )


def _flag_within_band(rows: list[dict[str, Any]]) -> None:
    """A less-known profile called faster than a better-known one by less than its error band gets a
    ``note`` saying the two are not told apart (the bands: BAND_PCT)."""
    rank = {"fitted": 0, "transferred": 1, "spec-only": 2}
    ok = [r for r in rows if r.get("fits")]
    for r in ok:
        for o in ok:
            if rank[r["provenance"]] > rank[o["provenance"]] and r["tokens_per_s_per_gpu"] > o["tokens_per_s_per_gpu"]:
                gain = 100.0 * (r["tokens_per_s_per_gpu"] / o["tokens_per_s_per_gpu"] - 1)
                if gain < r["band_pct"]:
                    r["note"] = (
                        f"{gain:.0f}% faster than {o['hardware']} ({o['provenance']}), inside its "
                        f"{r['provenance']} band of {r['band_pct']:.0f}%: not told apart"
                    )


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
    from grpo_tune import frameworks as F

    fws = F.select(framework)
    from grpo_tune.core.config import atomic_write
    from grpo_tune.rundir.report import plot_compare

    names = [h.strip() for h in hardware.split(",") if h.strip()]
    if not names:
        raise ConfigError("--hardware needs at least one profile", hint="e.g. --hardware h100,h200,a100")
    if out is not None:
        from grpo_tune.rundir.outputs import check_out_dir

        # before the searches, not after them
        check_out_dir(out, "--out", inputs={"--calibration": calibration})
    place = placement_flags(plan)
    plan["stack"] = F.default_stack(fws, plan.get("stack"))
    flags = plan_flags(plan)
    model, gpus = flags["model"], flags["gpus"]
    pins, wkw = F.check_pins(fws, pins_from_flags(flags)), workload_flags(flags)
    cal, cal_hw = None, None
    if calibration is not None:
        cal = load_calibration(calibration)
        cal_hw = json.loads(calibration.read_text()).get("hardware")
    rows = compare_rows(
        model=model,
        gpus=gpus,
        hardware=names,
        gpus_per_node=flags["gpus_per_node"],
        pins=pins,
        workload_kw=wkw,
        min_headroom=min_headroom,
        calibration=cal,
        calibration_hardware=cal_hw,
        place=place,
        stack=flags.get("stack"),
    )
    if out is None:
        from grpo_tune.core.specs import load_model

        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"compare-{load_model(model).name}-{gpus}g-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    png = plot_compare(rows, out / "compare.png")
    doc = {"model": model, "gpus": gpus, "rows": rows, "png": str(png)}
    atomic_write(out / "compare.json", json.dumps(doc, indent=2, default=str) + "\n")
    if json_out:
        print(json.dumps(doc, indent=2, default=str))
        return
    t = Table(title=f"Best plan per hardware: {model} on {gpus} GPUs", title_justify="left")
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
            t.add_row(hw, f"[red]{r['error']['code']}[/]: no plan fits", "-", "-", "-", "-")
            continue
        cost = r["usd_per_million_tokens"]
        t.add_row(
            hw,
            r["plan"],
            f"{r['step_s']:.2f}",
            f"{r['tokens_per_s_per_gpu']:,.0f}",
            "-" if cost is None else f"{cost:.2f}",
            f"{r['headroom_bytes'] / GiB:.1f}",
        )
    console = Console()
    from grpo_tune.autotune.calibrate.lengths import lengths_note, workload_line
    from grpo_tune.cli.options import plan_inputs

    _, _, _, wl = plan_inputs(model=model, hardware=names[0], gpus=gpus, gpus_per_node=flags["gpus_per_node"], **wkw)
    if wl.kind == "grpo":  # the lengths every row is priced on, and where they come from
        console.print(f"Workload: {workload_line(wl)}", highlight=False)
        console.print(f"Lengths: {lengths_note(wl)}", highlight=False)
    console.print(t)
    console.print(
        "under each hardware: how its profile was obtained (fitted on measurements, transferred from another "
        "profile by stated ratios, or spec-only) and the error band of that class (the leave-one-out step "
        "error of `grpo-tune validate --grpo` on its rows)",
        highlight=False,
    )
    for r in rows:
        if r.get("note"):
            console.print(f"[yellow]note[/]: {r['hardware']} {r['note']}", highlight=False)
    console.print(f"wrote {png} and {out / 'compare.json'}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
