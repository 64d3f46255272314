"""``grpo-tune tune LAUNCH``: price the user's verl launch, search with the same workload, and hand back only
the overrides that change (a diff, and tuned.sh: the script with those overrides edited in place)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grpo_tune.core.placement import PlacementAsk
from grpo_tune.frameworks.base.plan import LaunchPlan
from grpo_tune.jobs.setup import prepare
from grpo_tune.jobs.tune import TuneOutcome, TuneRequest, key_report, run_tune
from grpo_tune.cli.options import (
    MIN_HEADROOM_DEFAULT,
    PLACEMENT_FLAGS,
    Json,
    MinHeadroom,
    Stack,
    pins_from_flags,
    placement_flags,
)
from grpo_tune.cli.plan_options import flags_after, pin_options
from grpo_tune.core.units import GiB


Launch = Annotated[
    Path, typer.Argument(help="A verl launch script (bash), a file of Hydra overrides, or a NeMo-RL recipe (YAML).")
]
Overrides = Annotated[
    list[str] | None,
    typer.Argument(help="Hydra-style overrides for a NeMo-RL recipe (key=value, +key=value).", show_default=False),
]
Hardware = Annotated[
    str | None,
    typer.Option(
        "--hardware",
        help="Hardware profile of the GPUs the launch runs on (h100, h200, a100, ...); a launch does not say, so "
        "h100 is assumed without it, and the output says so.",
        show_default=False,
    ),
]
DEFAULT_HARDWARE = "h100"
"""The GPU a launch is priced on without --hardware (a verl script or NeMo-RL recipe does not name its GPU)."""
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Preset, HF id or config.json folder (default: the launch's actor_rollout_ref.model.path).",
    ),
]
Keep = Annotated[
    str | None,
    typer.Option("--keep", help="Comma list of plan fields to keep as the launch has them (tp,pp,offload,...)."),
]
Out = Annotated[Path, typer.Option("--out", help="Parent folder of the run folder (runs/<id>/ with tuned.sh).")]
Calibration = Annotated[
    Path | None, typer.Option("--calibration", help="Calibration JSON (grpo-tune calibrate) applied to the time model.")
]
PromptLenMean = Annotated[
    int | None,
    typer.Option("--prompt-len-mean", help="Mean prompt tokens (default: 20% of the max, typical of math GRPO)."),
]
ResponseLenMean = Annotated[
    int | None,
    typer.Option("--response-len-mean", help="Mean response tokens (default: 20% of the max, typical of math GRPO)."),
]
Emit = Annotated[bool, typer.Option("--emit/--no-emit", help="Write runs/<id>/ with tuned.sh.")]
IgnoreUnknown = Annotated[
    bool,
    typer.Option(
        "--ignore-unknown",
        help="Tune a launch with keys verl refuses anyway: blog-only keys are read (and written) as their real "
        "twins, other refused keys are dropped from tuned.sh. Without it such a launch exits 1.",
    ),
]


def _plan_row(est) -> dict[str, Any]:
    from grpo_tune.rundir.report import batch_cell

    s = est.strategy
    return {
        "degrees": f"tp{s.layout.tp} pp{s.layout.pp}"
        + (f" vpp{s.layout.vpp}" if s.layout.vpp > 1 else "")
        + (f" cp{s.layout.cp}" if s.layout.cp > 1 else "")
        + (f" ep{s.layout.ep} etp{s.layout.etp_}" if est.model.is_moe else "")
        + f" dp{s.layout.dp}",
        "mbs": batch_cell(s)
        + (
            f" (log-prob {s.batching.log_prob_mbs})"
            if not s.batching.max_tokens_per_gpu and s.batching.log_prob_mbs not in (None, s.batching.mbs)
            else ""
        ),
        "recompute": s.memory.recompute,
        "offload": ",".join(o[0] for o in s.memory.offload) or "none",
        "rollout": f"tp{s.rollout.rollout_tp} mem{s.rollout.gpu_memory_utilization:g}",
    }


def _summary(est) -> dict[str, Any]:
    from grpo_tune.costmodel.results import step_s, tokens_per_s_per_gpu

    fits = not any(v.code == "OOM_RISK" for v in est.violations)
    t = step_s(est)
    return {
        "step_s": round(t, 3) if t != float("inf") else None,
        "fits": fits,
        "tokens_per_s_per_gpu": round(tokens_per_s_per_gpu(est), 1),
        "peak_gib": round(est.peak_bytes / GiB, 2),
        "peak_phase": est.peak_phase,
        "headroom_gib": round((est.capacity_bytes - est.peak_bytes) / GiB, 2),
        "phases_s": {} if est.time is None else {k: round(float(v), 3) for k, v in est.time.phases.items()},
        "plan": _plan_row(est),
        "strategy": est.strategy.to_dict(),
        "oom": [
            {"phase": v.phase, "bytes_over": v.bytes_over, "message": v.message}
            for v in est.violations
            if v.code == "OOM_RISK"
        ],
    }


# The plan fields a user may pin, then the placement flags.
@flags_after(None, PLACEMENT_FLAGS)
@pin_options(
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "mbs",
    "log_prob_mbs",
    "recompute",
    "offload",
    "rollout_tp",
    "gpu_memory_utilization",
    "sync_bucket_mb",
)
def tune(
    launch: Launch,
    overrides: Overrides = None,
    hardware: Hardware = None,
    model: ModelOpt = None,
    keep: Keep = None,
    out: Out = Path("runs"),
    json_out: Json = False,
    calibration: Calibration = None,
    min_headroom: MinHeadroom = MIN_HEADROOM_DEFAULT,
    prompt_len_mean: PromptLenMean = None,
    response_len_mean: ResponseLenMean = None,
    emit: Emit = True,
    ignore_unknown: IgnoreUnknown = False,
    stack: Stack = None,
    **pins: Any,
) -> None:
    """Price your verl launch, find a faster plan for the same workload, and print only the overrides that change."""
    place = placement_flags(pins)
    # before the search, not after it
    setup = prepare(None, stack=stack, out=out if emit else None, calibration=calibration, inputs={"LAUNCH": launch})
    req = TuneRequest(
        launch=launch,
        overrides=list(overrides or []),
        hardware=hardware or DEFAULT_HARDWARE,
        model=model,
        prompt_len_mean=prompt_len_mean,
        response_len_mean=response_len_mean,
        keep=[k.strip() for k in (keep or "").split(",") if k.strip()],
        pins=pins_from_flags(pins),
        place=place,
        setup=setup,
        min_headroom=min_headroom,
        out=out,
        emit=emit,
    )

    def read(plan: LaunchPlan) -> None:  # the launch's key findings, before any search
        keys = key_report(plan)
        if keys is not None:
            _report_keys(*keys, refuse=not ignore_unknown, json_out=json_out)

    o = run_tune(req, read=read)
    if hardware is None and not json_out:  # stated, not silently assumed: the launch does not name its GPU
        Console(stderr=True).print(
            f"[yellow]note:[/] priced on {o.plan.hardware.name}: the launch does not say which GPU it runs on "
            f"(--hardware {DEFAULT_HARDWARE} assumed); pass --hardware for yours",
            highlight=False,
        )
    if o.separate is not None:
        _print_separate(o, json_out=json_out)
        return
    _print_tuned(o, json_out=json_out)


def _ratio(a: float | None, b: float | None) -> float:
    assert a is not None and b is not None  # the cost model times every plan it prices
    return a / b


def _print_tuned(o: TuneOutcome, *, json_out: bool) -> None:
    """The launch as priced next to the best plan, the verdict and the overrides; the split proposal."""
    launch, plan, res, fw, place = o.request.launch, o.plan, o.result, o.framework, o.request.place
    assert res is not None
    for note in o.notes:  # left byte for byte in the tuned file: the user sets them
        Console(stderr=True).print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    run_dir, files, split, split_dir, split_files = o.run_dir, o.files, o.split, o.split_dir, o.split_files
    cur, best = _summary(res.current), _summary(res.best)
    if json_out:
        extra = None
        if place.allows_split:
            extra = {
                "split": None
                if split is None
                else {
                    **split.to_dict(),
                    "speedup_over_tuned": _ratio(res.best.step_s, split.step_s),
                    "speedup_over_launch": _ratio(res.current.step_s, split.step_s),
                    "run_dir": None if split_dir is None else str(split_dir),
                    "overrides": {k: {"old": a, "new": b} for k, (a, b) in o.split_changes.items()},
                    "notes": o.split_notes,
                }
            }
        extra = {**(extra or {}), "left_on_table": None if o.left is None else o.left.to_dict()}
        _print_json(launch, plan, res, cur, best, run_dir, files, extra)
        return
    c = Console()
    wl = plan.workload
    from grpo_tune.costmodel.lengths import lengths_note, workload_line

    c.print(
        f"{launch}{fw.tune_label}: {plan.model.name} ({plan.model_note}) on {plan.cluster.gpus} x "
        f"{plan.hardware.name}, {workload_line(wl)}",
        highlight=False,
    )
    c.print(f"lengths: {lengths_note(wl)}", highlight=False)
    c.print(_compare_table(cur, best))
    _print_verdict(c, res, cur, best, o.request.keep, o.change_lines)
    if run_dir is not None:
        c.print(f"wrote [bold]{run_dir}/[/] ({', '.join(sorted(p.name for p in files.values()))})", highlight=False)
    if place.allows_split:
        _print_split(
            c, res, split, place, split_dir, split_files, o.framework.change_lines(o.split_changes), o.split_notes
        )
    if o.left is not None:
        _print_left(c, o.left)


def _print_left(c: Console, left) -> None:
    """The faster plan search finds with the knobs tune keeps as the launch sets them, and the command for it."""
    s = left.best.strategy
    c.print(
        f"[yellow]left on the table:[/] `grpo-tune search` on the same workload and GPUs finds "
        f"{left.step_s:,.1f} s per step vs {left.tuned_s:,.1f} s tuned ({left.tuned_s / left.step_s:.2f}x, beyond "
        f"the model's +/-{left.error_pct:g}%) with {'; '.join(left.knobs) or 'another plan'}: knobs tune keeps as "
        f"your launch sets them (plan {s.layout_text()}, vLLM tp{s.rollout.rollout_tp}). To get it, plan it anew:",
        highlight=False,
    )  # the prose wraps to the terminal; the command below stays one line, to copy
    c.print(f"  {escape(left.command)}", highlight=False, soft_wrap=True, markup=False)


def _print_separate(o: TuneOutcome, *, json_out: bool) -> None:
    """A separate-pool launch: its price as read back and the best separate plan, the run folder written."""
    plan, sep, run_dir, files, fw = o.plan, o.separate, o.run_dir, o.files, o.framework
    assert sep is not None and plan.launch is not None
    cur, best, gain = sep.current, sep.best, sep.gain
    if json_out:
        print(
            json.dumps(
                {
                    "launch": str(plan.launch.path),
                    "current": cur.to_dict(),
                    "best": best.to_dict(),
                    "gain": gain,
                    "overrides": {k: {"old": a, "new": b} for k, (a, b) in sep.changes.items()},
                    "notes": o.notes,
                    "run_dir": None if run_dir is None else str(run_dir),
                    "files": {n: str(v) for n, v in files.items()},
                },
                indent=2,
                default=str,
            )
        )
        return
    c = Console()

    def line(e) -> str:
        f = e.placement
        ahead = f.get("rollout_ahead", f["staleness"])  # a fractional staleness_threshold: the batches it runs ahead
        stale = f"{f['staleness']}" + (f" ({ahead:g} of a batch ahead)" if ahead != f["staleness"] else "")
        return (
            f"{f['rollout_gpus']} rollout + {f['train_gpus']} training GPUs, staleness {stale}: "
            f"{e.step_s:,.1f} s per step (generation {f['gen_s']:,.1f}, training {f['train_s']:,.1f}, sync "
            f"{f['sync_s']:,.1f}; busy {100 * f['rollout_busy']:.0f}% / {100 * f['train_busy']:.0f}%); training "
            f"{e.strategy.layout_text()}, vLLM tp{e.strategy.rollout.rollout_tp} "
            f"mem{e.strategy.rollout.gpu_memory_utilization:g}"
        )

    c.print(
        f"{plan.launch.path}: {fw.separate_label_of(plan)} of {plan.model.name} on {plan.cluster.gpus} x "
        f"{plan.hardware.name}",
        highlight=False,
    )
    c.print("as launched: " + line(cur), highlight=False)
    if best is cur:
        c.print("no faster separate plan found: keep the launch", highlight=False)
    else:
        c.print(f"[bold]best:[/] {line(best)} ({gain:.2f}x)", highlight=False)
        for note in o.notes:
            c.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
        c.print("keys that change or are added:")
        for ln in fw.change_lines(sep.changes):
            c.print(f"[{'red' if ln.startswith('-') else 'green'}]{escape(ln)}[/]", highlight=False, soft_wrap=True)
    if run_dir is not None:
        c.print(
            f"wrote [bold]{run_dir}/[/] ({', '.join(sorted(p.name for p in files.values()))}): "
            f"{fw.separate_written_of(plan)}",
            highlight=False,
        )


def _print_split(
    c: Console,
    res,
    split,
    place: PlacementAsk,
    run_dir: Path | None,
    files: dict[str, Path],
    changes: list[str] | None = None,
    notes: list[str] | None = None,
) -> None:
    """``changes``: the keys of the user's launch that change, as the framework's diff lines."""
    from grpo_tune.validate.grpo import STATED_ERROR_PCT

    k = place.staleness
    if split is None:
        c.print(
            f"separate pools (staleness up to {k}): no split beats the tuned colocated launch "
            f"({res.best.step_s:,.1f} s per step); keep it colocated",
            highlight=False,
        )
        return
    f, s = split.placement, split.strategy
    sp = res.best.step_s / split.step_s
    c.print(
        f"[bold]proposal: separate pools[/] {f['rollout_gpus']} rollout + {f['train_gpus']} training GPUs, "
        f"staleness {f['staleness']}, partial rollout {'on' if f['partial_rollout'] else 'off'}: "
        f"{split.step_s:,.1f} s per step vs {res.best.step_s:,.1f} s tuned colocated "
        f"({res.current.step_s:,.1f} s as launched): {sp:.2f}x over the tuned launch "
        f"({'within' if abs(sp - 1) * 100 < STATED_ERROR_PCT else 'beyond'} the model's +/-{STATED_ERROR_PCT:g}%); "
        f"busy rollout {100 * f['rollout_busy']:.0f}%, training {100 * f['train_busy']:.0f}%; training "
        f"{s.layout_text()}, vLLM tp{s.rollout.rollout_tp} mem{s.rollout.gpu_memory_utilization:g}",
        highlight=False,
    )
    for note in notes or []:
        c.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    if changes:
        c.print("keys of your launch that change or are added for it:")
        for ln in changes:
            c.print(f"[{'red' if ln.startswith('-') else 'green'}]{escape(ln)}[/]", highlight=False, soft_wrap=True)
    if run_dir is not None:
        c.print(
            f"wrote [bold]{run_dir}/[/] ({', '.join(sorted(p.name for p in files.values()))}): its tuned.sh is your "
            "launch, switched to verl's fully-async trainer",
            highlight=False,
        )


def _print_json(
    launch: Path,
    plan,
    res,
    cur: dict,
    best: dict,
    run_dir: Path | None,
    files: dict[str, Path],
    extra: dict[str, Any] | None = None,
) -> None:
    gain = res.gain()
    print(
        json.dumps(
            {
                "launch": str(launch),
                "model": plan.model.name,
                "model_note": plan.model_note,
                "hardware": plan.hardware.name,
                "gpus": plan.cluster.gpus,
                "workload": plan.workload.to_dict(),
                "current": cur,
                "best": best,
                "gain": None if gain is None else round(gain, 4),
                "overrides": {k: {"old": o, "new": n} for k, (o, n) in res.changes.items()},
                "nearest_fit": [_summary(e) for e in res.nearest_fit],
                "pins": res.pins,
                "run_dir": None if run_dir is None else str(run_dir),
                "files": {k: str(v) for k, v in files.items()},
                **(extra or {}),
            },
            indent=2,
            default=str,
        )
    )


def _report_keys(launch: Any, release: str, *, refuse: bool, json_out: bool) -> None:
    """diagnose's key findings for the launch, as diagnose words them; exit 1 (nothing priced, no tuned.sh) when
    verl would refuse a key, unless --ignore-unknown."""
    findings = launch.key_findings
    refused = launch.refused()
    if json_out and refused and refuse:
        print(json.dumps({"launch": str(launch.path), "tuned": False, "findings": [f.to_dict() for f in findings]}))
        raise typer.Exit(1)
    err = Console(stderr=True)
    for f in findings:
        sev = "warning" if f.severity == "error" and not refuse else str(f.severity)
        where = f"{launch.path}:{f.line}" if f.line else str(launch.path)
        read = f" (read as {launch.renames[f.key]})" if f.key in launch.renames and not refuse else ""
        err.print(f"{sev} {f.code} {where}: {f.message}{read}; {f.hint}", highlight=False, markup=False)
    if refused and refuse:
        err.print(
            f"{len(refused)} key(s) verl {release} refuses: fix them (`grpo-tune diagnose` lists every "
            "problem), or pass --ignore-unknown to tune anyway (blog-only keys read as their real twins, the "
            "others dropped from tuned.sh); no tuned.sh written",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(1)


def _compare_table(cur: dict, best: dict) -> Table:
    """The current plan next to the best one: degrees, phase seconds, step time, memory."""
    t = Table(title="Current plan vs best plan (predicted)", title_justify="left")
    t.add_column("")
    t.add_column("current")
    t.add_column("best")
    for key in ("degrees", "mbs", "recompute", "offload", "rollout"):
        t.add_row("batch" if key == "mbs" else key, cur["plan"][key], best["plan"][key])
    for ph in cur["phases_s"]:
        t.add_row(f"{ph} s", f"{cur['phases_s'][ph]:.1f}", f"{best['phases_s'].get(ph, 0.0):.1f}")
    t.add_row(
        "step s", f"{cur['step_s']:.1f}" if cur["step_s"] else "-", f"{best['step_s']:.1f}" if best["step_s"] else "-"
    )
    t.add_row("tok/s/GPU", f"{cur['tokens_per_s_per_gpu']:,.0f}", f"{best['tokens_per_s_per_gpu']:,.0f}")
    t.add_row(
        "peak GiB (phase)",
        f"{cur['peak_gib']:.1f} ({cur['peak_phase']})",
        f"{best['peak_gib']:.1f} ({best['peak_phase']})",
    )
    t.add_row("headroom GiB", f"{cur['headroom_gib']:.1f}", f"{best['headroom_gib']:.1f}")
    t.add_row("fits", "yes" if cur["fits"] else "[red]no[/]", "yes" if best["fits"] else "[red]no[/]")
    return t


def _print_verdict(c: Console, res, cur: dict, best: dict, keep_list: list[str], lines: list[str]) -> None:
    """Why the current plan does not fit (and the nearest that do), then the gain and the overrides that change."""
    from grpo_tune.autotune import tune as T

    gain = res.gain()
    if not cur["fits"]:
        for o in cur["oom"]:
            over = o["bytes_over"] or 0
            c.print(
                f"[red]the current plan does not fit:[/] {o['phase']} needs {over / GiB:.1f} GiB more than the GPU has",
                highlight=False,
            )
        if res.nearest_fit:
            c.print("nearest plans that fit:")
            for e in res.nearest_fit:
                s = _summary(e)
                row = s["plan"]  # labelled, as the table's rows are
                c.print(
                    f"  {row['degrees']} {row['mbs']} recompute {row['recompute']} offload {row['offload']} "
                    f"rollout {row['rollout']}: {s['step_s']:.1f} s, peak {s['peak_gib']:.1f} GiB",
                    highlight=False,
                )
        elif not res.changes:
            c.print(
                "[red]no plan fits this workload on these GPUs[/] (more GPUs, shorter responses or a smaller batch)"
            )
    if res.changes:
        c.print(
            f"predicted gain: {gain:.2f}x ({cur['step_s']:.1f} s -> {best['step_s']:.1f} s per step)"
            if gain and cur["fits"]
            else "tuned plan fits",
            highlight=False,
        )
        c.print("overrides that change:")
        for line in lines:
            c.print(f"[{'red' if line.startswith('-') else 'green'}]{line}[/]", highlight=False, soft_wrap=True)
    else:
        c.print(
            "no change: no plan is predicted to be more than "
            f"{T.MIN_GAIN:.0%} faster with the same workload"
            + (f" (keeping {', '.join(keep_list)})" if keep_list else "")
        )


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
