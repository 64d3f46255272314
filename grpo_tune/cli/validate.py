"""``grpo-tune validate``: the time model against published Megatron-LM measurements (or, with ``--grpo``, published
GRPO runs). Parses the flags, calls :func:`grpo_tune.jobs.validate.run_validate` once, prints the tables or the
JSON report, and exits 1 when it did not pass."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from grpo_tune.cli.options import Json
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.jobs.validate import ValidateRequest, run_validate

Tolerance = Annotated[
    float,
    typer.Option(
        "--tolerance", help="Fail (exit 1) when the MAPE (all rows or held-out rows) exceeds this many percent."
    ),
]
DataFile = Annotated[
    Optional[str], typer.Option("--data", help="Measurements CSV (default: the shipped profiles/data/published.csv).")
]
HardwareOpt = Annotated[
    Optional[str],
    typer.Option(
        "--hardware",
        help="Hardware profile the pretraining rows ran on (default a100, the shipped rows'; pass yours with "
        "--data). Not with --grpo: each GRPO row names its own GPU.",
    ),
]
Refit = Annotated[
    bool, typer.Option("--refit", help="Refit the efficiency curve on the rows marked fit, then report every row.")
]
Grpo = Annotated[
    bool,
    typer.Option(
        "--grpo",
        help="The GRPO step against published verl/NeMo-RL runs (profiles/data/published_grpo.csv): step and per-phase errors, leave-one-out step MAPE against the tolerance (default 12%).",
    ),
]


def validate(
    json_out: Json = False,
    tolerance: Optional[float] = typer.Option(
        None,
        "--tolerance",
        help="Fail (exit 1) above this MAPE in percent (pretraining: all or held-out rows, default 10; "
        "--grpo: held-out step time, default 12).",
    ),
    data: DataFile = None,
    hardware: HardwareOpt = None,
    refit: Refit = False,
    grpo: Grpo = False,
) -> None:
    """Predicted vs published throughput and iteration times (Narayanan et al. 2021, Korthikanti et al. 2022), or
    with --grpo the GRPO step against published verl and NeMo-RL runs."""
    if grpo and hardware is not None:
        raise GrpoTuneError(
            "validate --grpo takes no --hardware: each GRPO row names the GPU it ran on",
            hint="drop --hardware (it selects the profile of the pretraining rows)",
            code="USAGE",
        )
    req = ValidateRequest(grpo=grpo, data=data, hardware=hardware or "a100", tolerance=tolerance, refit=refit)
    res = run_validate(req)
    if json_out:
        print(json.dumps(res.report, indent=2))
    else:
        (_print_grpo if res.kind == "grpo" else _print)(res.report)
    if not res.passed:
        raise typer.Exit(1)


_UNITS = {"tflops_per_gpu": ("{:.1f}", "TF/s"), "iteration_s": ("{:.2f}", "s"), "mfu_pct": ("{:.1f}", "MFU%")}
_PAPERS = (
    "rows: n21 = Narayanan et al. 2021 (arXiv 2104.04473), TF/s per GPU by their eq. 3; k22 = Korthikanti "
    "et al. 2022 (arXiv 2205.05198), seconds per iteration or MFU; t1/t2/t5 = table, abs = abstract. "
    "Sources per row: profiles/data/published.csv"
)


def _print(rep: dict) -> None:
    con = Console()
    t = Table(title=f"Time model vs published ({rep['hardware']})", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    for c in ("row", "split", "t/p/GPUs", "batch", "recomp", "unit", "published", "predicted", "error"):
        t.add_column(
            c,
            justify="left" if c in ("row", "split", "t/p/GPUs", "recomp", "unit") else "right",
            no_wrap=True,
            min_width=len(c),
        )
    for r in rep["rows"]:
        fmt, unit = _UNITS[r["metric"]]
        err = r["error_pct"]
        colour = "green" if abs(err) <= rep["tolerance_pct"] else "red"
        t.add_row(
            r["id"],
            "fit" if r["split"] == "fit" else "held",
            f"{r['tp']}/{r['pp']}/{r['gpus']}",
            str(r["gbs"]),
            {"selective": "sel"}.get(r["recompute"], r["recompute"]),
            unit,
            fmt.format(r["published"]),
            fmt.format(r["predicted"]),
            f"[{colour}]{err:+.1f}%[/]",
        )
    con.print(t)
    con.print(_PAPERS, highlight=False)
    m = rep["mape_pct"]
    eff = ", ".join(f"{k}={v}" for k, v in rep["efficiency"].items())
    con.print(f"efficiency curve: {eff}" + (" (refitted on the fit rows)" if rep["refit"] else ""), highlight=False)
    con.print(
        f"MAPE: all rows {m['all']:.1f}%, fit rows {m['fit']:.1f}%, held-out rows {m['holdout']:.1f}% "
        f"(tolerance {rep['tolerance_pct']:g}%): " + ("[green]pass[/]" if rep["passed"] else "[red]FAIL[/]"),
        highlight=False,
    )


_GRPO_COLS = (
    ("step_s", "step"),
    ("gen_s", "gen"),
    ("train_s", "train"),
    ("old_lp_s", "logprob"),
    ("ref_lp_s", "ref"),
    ("refit_s", "refit"),
    ("train_mfu", "mfu"),
)


def _short(row_id: str, width: int) -> str:
    """A row id cut to ``width`` characters in the middle, so that ids sharing a long prefix stay apart."""
    if len(row_id) <= width:
        return row_id
    head = (width - 1) // 2
    return row_id[:head] + "…" + row_id[-(width - 1 - head) :]


_POOL_PHASE = {"rollout": "gen", "old_logprob": "old lp", "ref_logprob": "ref lp", "weight_sync": "sync"}


def _pool_table(title: str, columns: tuple[str, ...], left: tuple[str, ...]) -> Table:
    """A placement table: title on the left, one space between columns, ``left`` columns left-aligned."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right", no_wrap=True)
    return t


def _print_pairs(con: Console, pp: dict) -> None:
    """Separate pools vs colocated: the published and predicted speed-up of each pair."""
    t = _pool_table(
        f"Separate pools vs colocated: speed-up per pair (within {pp['tolerance_pct']:g}%)",
        ("pair", "R+T", "K", "steps", "pub", "pred", "error", "range"),
        ("pair", "R+T"),
    )
    ok = 0
    for r in pp["pairs"]:
        good = abs(r["error_pct"]) <= pp["tolerance_pct"]
        ok += good
        lo, hi = r["range"] or (r["predicted_speedup"], r["predicted_speedup"])
        pl = r["pools"]
        t.add_row(
            _short(r["id"], 20),
            f"{pl['rollout_gpus']}+{pl['train_gpus']}",
            str(pl["staleness"]),
            str(r["steps"]) if r.get("basis") == "total" else "step",
            f"{r['published_speedup']:.2f}x",
            f"{r['predicted_speedup']:.2f}x",
            f"[{'green' if good else 'red'}]{r['error_pct']:+.1f}%[/]",
            f"{lo:.2f}-{hi:.2f}",
        )
    con.print(t)
    con.print(
        f"pairs within {pp['tolerance_pct']:g}%: {ok}/{len(pp['pairs'])} (speed-up = colocated over separate: the two "
        "runs' wall-clock over the published steps, the separate run's pipeline fill included, or one step where "
        "steps says step; both rows at the pair's mean response length: its colocated row's solved mean unless the "
        "pair states one; range: over the pair's mean_low..mean_high; profiles/data/published_placement_pairs.csv)",
        highlight=False,
    )
    steps = [r for r in pp["pairs"] if r.get("step_reading")]
    if steps:
        con.print(
            "the tables' step column (one logged step, outside the pass/fail; docs/placement.md): "
            + "; ".join(
                f"{_short(r['id'], 24)} {r['step_reading']['published']:.2f}x published, "
                f"{r['step_reading']['predicted']:.2f}x predicted ({r['step_reading']['error_pct']:+.1f}%)"
                for r in steps
            ),
            highlight=False,
        )
    t = _pool_table(
        "Per pool: published vs predicted seconds (the pairs' assumed lengths)",
        ("pair", "side", "phase", "published", "predicted", "error"),
        ("pair", "side", "phase"),
    )
    for r in pp["pairs"]:
        for ph in r.get("per_pool", []):
            pub, pred = ph["published_s"], ph["predicted_s"]
            err = "" if pred is None or not pub else f"{100.0 * (pred / pub - 1.0):+.0f}%"
            pl = r["pools"]
            side = f"sep {pl['rollout_gpus']}+{pl['train_gpus']}" if ph["side"] == "separate" else "colocated"
            label = _POOL_PHASE.get(ph["phase"], ph["phase"])
            t.add_row(_short(r["id"], 24), side, label, f"{pub:.1f}", "-" if pred is None else f"{pred:.1f}", err)
    con.print(t)


def _print_rollout_ratios(con: Console, rr: dict) -> None:
    """Rollout-side ratio checks: FSDP rows and generation timers whose ratio the rollout side prices alone."""
    t = _pool_table(
        "Rollout side only: generation-time ratios (not in the pass/fail)",
        ("check", "backend", "pub", "pred", "error", "pred s a / b"),
        ("check", "backend"),
    )
    for r in rr["checks"]:
        pa, pb = r["predicted_s"]
        t.add_row(
            _short(r["id"], 24),
            r["backend"],
            f"{r['published_ratio']:.2f}",
            f"{r['predicted_ratio']:.2f}",
            f"{r['error_pct']:+.0f}%",
            f"{pa:.0f} / {pb:.0f}",
        )
    con.print(t)
    con.print(
        "rollout-side ratio = generation time of row a / row b (verl's generate_sequences or gen timer), both at "
        "the check's stated mean response length; "
        "FSDP2 rows serve as checks of the rollout side only (the cost model does not price an FSDP2 trainer); "
        "profiles/data/published_rollout_ratios.csv",
        highlight=False,
    )


def _print_grpo(rep: dict) -> None:
    con = Console()
    t = Table(
        title="GRPO step vs published runs (seconds)",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        pad_edge=False,
    )
    for c in ("row", "gpu", "phase", "pub", "pred", "error", "cv"):
        t.add_column(c, justify="left" if c in ("row", "gpu", "phase") else "right", no_wrap=True)
    for r in rep["rows"]:
        if r["split"] == "excluded":
            continue
        first = True
        for key, label in _GRPO_COLS:
            if key not in r["published"]:
                continue
            err, cv = r["error_pct"][key], r.get("cv_error_pct", {}).get(key)
            colour = "green" if abs(cv if cv is not None else err) <= rep["tolerance_pct"] else "red"
            t.add_row(
                _short(r["id"], 32) if first else "",
                r["hardware"].split("-")[0] if first else "",
                label,
                f"{r['published'][key]:,.2f}" if key == "train_mfu" else f"{r['published'][key]:,.1f}",
                f"{r['predicted'][key]:,.2f}" if key == "train_mfu" else f"{r['predicted'][key]:,.1f}",
                f"{err:+.1f}%",
                f"[{colour}]{cv:+.1f}%[/]" if cv is not None else "",
            )
            first = False
    con.print(t)
    con.print(
        "pub: published; pred: predicted; cv: the row's error when the fit is redone without its configuration",
        highlight=False,
    )
    excl = [r["id"] for r in rep["rows"] if r["split"] == "excluded"]
    con.print(
        f"not scored ({len(excl)}): " + ", ".join(excl) + " (FSDP2/DTensor backends, or settings not "
        "published; see each row's assumptions in profiles/data/published_grpo.csv; the separate halves score as "
        "speed-up pairs and the FSDP2 rows' generation as rollout-side ratios, below)",
        highlight=False,
    )
    m = rep["mape_pct"]
    cvname = rep.get("cv_method", "leave-one-out")
    for split, name in (("fit", "in-sample"), ("cv", f"cross-validated ({cvname})")):
        parts = ", ".join(f"{label} {m[split][key]:.1f}%" for key, label in _GRPO_COLS if m[split].get(key) is not None)
        con.print(f"MAPE {name}: {parts}", highlight=False)
    groups = rep["cv_groups"]["step_s"]
    con.print(
        "cross-validated step MAPE by group: "
        + ", ".join(f"{g} {v['mape']:.1f}% ({v['rows']} rows)" for g, v in sorted(groups.items()) if g != "all"),
        highlight=False,
    )
    names = sorted({g for k, _ in _GRPO_COLS for g in rep["cv_groups"].get(k, {}) if g != "all"})
    gt = Table(title="cross-validated MAPE % / rows", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    gt.add_column("figure", no_wrap=True)
    for g in ("all", *names):
        gt.add_column(g.split(":", 1)[-1], justify="right", no_wrap=True)
    for key, label in _GRPO_COLS:
        cells = rep["cv_groups"].get(key, {})
        if not cells:
            continue
        gt.add_row(
            label,
            *(f"{cells[g]['mape']:.0f}/{cells[g]['rows']}" if g in cells else "" for g in ("all", *names)),
        )
    con.print(gt)
    for name, rows in rep["movers"].items():
        pr = rep["priors"][name]
        state = f"{len(rows)} rows move it" if len(rows) >= 2 else "fewer than 2 rows move it: kept at its prior"
        con.print(f"  {name} in [{pr['lo']:g}, {pr['hi']:g}]: {state} ({', '.join(rows) or 'none'})", highlight=False)
    if rep["refit"]:
        con.print("refitted parameters: " + ", ".join(f"{k}={v}" for k, v in rep["refit"].items()), highlight=False)
    step = m["cv"]["step_s"]
    scored = [r for r in rep["rows"] if r["split"] != "excluded"]
    stepped = sum(1 for r in scored if "step_s" in r["published"])
    gpus = len({r["hardware"] for r in scored})
    counts = rep.get("counts")
    if counts:
        c = counts
        con.print(
            f"parameters vs data: {c['fitted_parameters']} fitted parameters + {c['self_solved_means']} mean lengths "
            f"solved from a row's own published time ({', '.join(c['self_solved_rows']) or 'none'}) against "
            f"{c['configs']} distinct configurations ({c['scored_rows']} scored rows); the step is published by "
            f"{c['step_rows']} rows of {c['step_configs']} configurations",
            highlight=False,
        )
    per_phase = ", ".join(
        f"{label} {m['cv'][key]:.1f}%" for key, label in _GRPO_COLS if key != "step_s" and m["cv"].get(key) is not None
    )
    con.print(
        f"cross-validated step MAPE {step:.1f}% ({cvname}) over the {stepped} rows that publish a step "
        f"({len(scored)} scored rows on {gpus} GPU types; tolerance {rep['tolerance_pct']:g}%): "
        + ("[green]pass[/]" if rep["passed"] else "[red]FAIL[/]")
        + f"; per phase: {per_phase}",
        highlight=False,
    )
    if rep.get("placement_pairs"):
        _print_pairs(con, rep["placement_pairs"])
    if rep.get("rollout_ratios"):
        _print_rollout_ratios(con, rep["rollout_ratios"])


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
