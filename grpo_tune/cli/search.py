"""``grpo-tune search``: rank the valid plans, print the best, write ``runs/<id>/``.

Takes every flag ``estimate`` takes; a degree or option given on the command line is pinned and
search tunes the rest. ``--refine`` then measures the most promising plans with real profiling
runs (:func:`autotune.refine.refine`, imported only then).
"""

from __future__ import annotations

import math

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.hardware import NATIVE_ENGINE

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.autotune.search.grouping import caption as grouping_caption
from grpo_tune.autotune.search.grouping import group_by_layout
from grpo_tune.cli.options import (
    MIN_HEADROOM_DEFAULT,
    PLACEMENT_FLAGS,
    Framework,
    Hardware,
    Json,
    MinHeadroom,
    inputs_from_flags,
    placement_flags,
)
from grpo_tune.cli.plan_options import flags_after, plan_flags, plan_options
from grpo_tune.core.errors import ConfigError
from grpo_tune.costmodel.estimate import Estimate
from grpo_tune.core.units import GiB
from grpo_tune.jobs.search import RefineAsk, SearchOutcome, SearchRequest, run_search
from grpo_tune.jobs.setup import prepare

P_OUT = "Output"
P_REF = "Refinement (real profiling runs)"

# --top also sizes the exact re-evaluation (4 x top plans): 1,000 answers in ~1.5 s for 7B on 8 GPUs, 10**5 took
# 22 s (measured on this repo's 2-core dev box). Nobody reads more rows than that.
MAX_TOP = 1000
Top = Annotated[int, typer.Option("--top", help=f"Plans to show (1..{MAX_TOP}).", rich_help_panel=P_OUT)]
Out = Annotated[
    Path,
    typer.Option("--out", help="Parent folder of the run folder <model>-<gpus>g-<hw>-<time>.", rich_help_panel=P_OUT),
]
AllPlans = Annotated[
    bool, typer.Option("--all", help="List every top plan, not one row per layout.", rich_help_panel=P_OUT)
]
Emit = Annotated[
    bool,
    typer.Option("--emit/--no-emit", help="Write the run folder (best.yaml, verl.sh, ...).", rich_help_panel=P_OUT),
]
CrossNode = Annotated[
    bool,
    typer.Option(
        "--allow-cross-node-tp",
        help="Let TP groups span nodes.",
        rich_help_panel="Parallel degrees (unset: default in estimate, tuned in search)",
    ),
]
Calibration = Annotated[
    Optional[Path],
    typer.Option(
        "--calibration",
        help="Calibration JSON (grpo-tune calibrate, search --refine) applied to the time model.",
        rich_help_panel=P_REF,
    ),
]
Refine = Annotated[
    bool, typer.Option("--refine", help="Measure the best plans with short real runs (Optuna).", rich_help_panel=P_REF)
]
Trials = Annotated[int, typer.Option("--trials", help="Profiled trials the study should hold.", rich_help_panel=P_REF)]
Storage = Annotated[
    Optional[str],
    typer.Option(
        "--storage",
        help="SQLAlchemy URL of the Optuna study (default: SQLite in the run folder). A server must answer within "
        "10 s (?connect_timeout=N in the URL sets it); each statement within 300 s.",
        rich_help_panel=P_REF,
    ),
]
StudyName = Annotated[
    Optional[str],
    typer.Option(
        "--study-name",
        help="Optuna study name (default: derived from the inputs, so a re-run resumes).",
        rich_help_panel=P_REF,
    ),
]
TrialSteps = Annotated[
    int,
    typer.Option("--trial-steps", help="Training steps per profiling run (first is warm-up).", rich_help_panel=P_REF),
]
TrialTimeout = Annotated[
    float, typer.Option("--trial-timeout", help="Seconds before a profiling run is killed.", rich_help_panel=P_REF)
]
Launcher = Annotated[
    str,
    typer.Option(
        "--launcher",
        help="How each trial runs: local (here) or slurm (one sbatch job sized to the plan's nodes and GPUs).",
        rich_help_panel=P_REF,
    ),
]
# The --refine flags (name, Annotated type, default) in --help order, after --calibration; all but --refine
# itself are RefineOptions fields of the same name (trial_timeout: RefineOptions.trial_timeout_s).
REFINE_FLAGS: tuple[tuple[str, Any, Any], ...] = (
    ("refine", Refine, False),
    ("trials", Trials, 8),
    ("storage", Storage, None),
    ("study_name", StudyName, None),
    ("trial_steps", TrialSteps, 6),
    ("trial_timeout", TrialTimeout, 600.0),
    ("launcher", Launcher, "local"),
)


def _gib(x: float) -> str:
    return f"{x / GiB:.1f}"


def print_plans(ranked: list[Estimate], console: Console, *, top: int, title: str = "Top plans") -> None:
    """Two tables: the plans (degrees, rollout, step time, throughput), then seconds and GiB per
    GPU for each phase against the capacity."""
    from grpo_tune.rundir.report import batch_cell, phase_seconds
    from grpo_tune.costmodel.results import step_s, tokens_per_s_per_gpu

    plans = ranked[:top]
    if not plans:
        return
    # Fits 80 columns with its headers whole: no outer edge, the wrapping columns (degrees, rollout) keep
    # room for one degree per line, the rest never wrap (tests/test_search_cli.py renders it at 80).
    t = Table(
        title=title,
        title_justify="left",
        caption="batch: mbs N = micro-batch of N sequences, N tok = dynamic batching's token cap per GPU; "
        "offload: p=param g=grad o=optimizer; tok/s per GPU",
        caption_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for c in ("#", "degrees", "batch", "recompute", "offload", "rollout", "step s", "tok/s", "MFU"):
        wraps = c in ("degrees", "rollout")
        t.add_column(
            c,
            justify="left" if c in ("degrees", "batch", "recompute", "offload", "rollout") else "right",
            style="bold" if c == "step s" else None,
            no_wrap=not wraps,
            min_width=7 if wraps else None,
        )
    for i, e in enumerate(plans):
        s = e.strategy
        mfu = None if e.throughput is None else e.throughput.mfu
        deg = f"tp{s.layout.tp} pp{s.layout.pp}"
        if s.layout.first_stage_layers or s.layout.last_stage_layers:
            deg += f"({s.layout.first_stage_layers or '-'}/{s.layout.last_stage_layers or '-'})"
        deg += (f" vpp{s.layout.vpp}" if s.layout.vpp > 1 else "") + (f" cp{s.layout.cp}" if s.layout.cp > 1 else "")
        deg += (f" ep{s.layout.ep} etp{s.layout.etp_}" if e.model.is_moe else "") + f" dp{s.layout.dp}"
        t.add_row(
            str(i + 1),
            deg,
            batch_cell(s),
            s.memory.recompute,
            ",".join(o[0] for o in s.memory.offload) or "-",
            f"tp{s.rollout.rollout_tp} mem{s.rollout.gpu_memory_utilization:g}" if e.workload.kind == "grpo" else "-",
            f"{step_s(e):.2f}",
            f"{tokens_per_s_per_gpu(e):,.0f}",
            "-" if mfu is None else f"{100 * mfu:.1f}%",
        )
    console.print(t)
    phases = list(plans[0].memory)
    for e in plans:
        for k in phase_seconds(e):
            if k not in phases:
                phases.append(k)
    short = {
        "rollout": "rollout",
        "weight_sync": "w-sync",
        "old_logprob": "old-lp",
        "ref_logprob": "ref-lp",
        "update": "update",
        "offload": "offload",
    }
    mt = Table(
        title=f"Per phase: seconds/GiB per GPU (capacity {_gib(plans[0].capacity_bytes)} GiB)", title_justify="left"
    )
    mt.add_column("#", justify="right")
    for p in phases:
        mt.add_column(short.get(p, p), justify="right")
    mt.add_column("free GiB", justify="right")
    for i, e in enumerate(plans):
        ph = phase_seconds(e)
        cells = []
        for p in phases:
            sec = f"{ph[p]:.1f}" if p in ph else "-"
            pm = e.memory.get(p)
            gib = "" if pm is None else f"/{pm.total_bytes / GiB:.0f}"
            cells.append(f"[bold]{sec}{gib}[/]" if p == e.peak_phase else f"{sec}{gib}")
        mt.add_row(str(i + 1), *cells, _gib(e.headroom_bytes))
    console.print(mt)


@flags_after("calibration", REFINE_FLAGS + PLACEMENT_FLAGS)
@plan_options(degrees_after="hardware", workload_before="top", target=True)
def search(
    hardware: Hardware = "h100",
    allow_cross_node_tp: CrossNode = False,
    min_headroom: MinHeadroom = MIN_HEADROOM_DEFAULT,
    top: Top = 10,
    all_plans: AllPlans = False,
    json_out: Json = False,
    out: Out = Path("runs"),
    emit: Emit = True,
    calibration: Calibration = None,
    framework: Framework = "verl",
    **plan: Any,
) -> None:
    """Rank every valid plan by predicted step time; print the best and write runs/<id>/."""
    ref = {name: plan.pop(name, default) for name, _, default in REFINE_FLAGS}
    place = placement_flags(plan)
    if not 1 <= top <= MAX_TOP:
        raise ConfigError(
            f"--top must be between 1 and {MAX_TOP}, got {top}", hint=f"give --top {MAX_TOP} or fewer plans to show"
        )
    # before the search, not after it
    setup = prepare(framework, stack=plan.get("stack"), out=out if emit else None, calibration=calibration)
    plan["stack"] = setup.stack
    target, pins = inputs_from_flags(plan_flags(plan, hardware=hardware))
    req = SearchRequest(
        target=target,
        pins=pins,
        setup=setup,
        place=place,
        top=top,
        allow_cross_node_tp=allow_cross_node_tp,
        min_headroom=min_headroom,
        out=out,
        emit=emit,
        refine=_refine_ask(ref),
    )
    err = Console(stderr=True)
    console = Console()
    if not json_out:  # what is searched, before the search (every placement's output starts with it)
        _print_target(target, console, place.rollout_profile())
        if line := setup.stack_line(target.hardware.stack):
            console.print(line, highlight=False)
    stack_info = setup.stack_info(target.hardware.stack)

    def ranked(o: SearchOutcome) -> None:  # printed before a refinement starts (it takes minutes)
        if not json_out:
            _print_result(
                o.result, target.workload, console, top=top, all_plans=all_plans, run_dir=o.run_dir, files=o.files
            )

    o = run_search(req, progress=lambda: _progress_bar(err), ranked=ranked, console=err)
    if o.placement is not None:
        _print_placement(o, console, json_out=json_out, all_plans=all_plans, stack=stack_info)
    elif json_out and o.refine is None:
        _print_json(o.result, o.run_dir, o.files, top, stack=stack_info)
    elif json_out:
        assert o.refine is not None
        print(
            json.dumps(
                {"run_dir": str(o.run_dir), "stats": o.result.stats(), "refine": o.refine.to_dict()},
                indent=2,
                default=str,
            )
        )
    if o.refine is not None and o.refine.winner is None:
        raise _no_trial_completed(o.refine)


def _no_trial_completed(res: Any) -> GrpoTuneError:
    """``search --refine`` with no completed trial: exit 2 (TRIAL_FAILED) naming the first trial's reason (it exited
    0, as if the refinement had measured something)."""
    ran = sorted((r for r in res.records if r.ran or r.reason), key=lambda r: r.number)
    if not ran:
        return GrpoTuneError(
            "the refinement ran no profiling trial: no plan of the search was measured",
            hint="raise --trials, or check that the plans are ones `grpo-tune train` runs",
            code="TRIAL_FAILED",
        )
    first = ran[0]
    return GrpoTuneError(
        f"no profiling trial completed ({len(ran)} tried); the first, trial {first.number}: "
        f"{first.reason or first.state.lower()}",
        hint=f"read {res.out_dir}/trials/{first.number:04d}/profile.log; rerun the command to resume the study",
        code="TRIAL_FAILED",
    )


def _refine_ask(flags: dict[str, Any]) -> RefineAsk | None:
    """The --refine options (None without --refine)."""
    if not flags["refine"]:
        return None
    return RefineAsk(
        **{("trial_timeout_s" if k == "trial_timeout" else k): v for k, v in flags.items() if k != "refine"}
    )


@contextmanager
def _progress_bar(err: Console) -> Iterator[Callable[[int, int], None]]:
    """The search's progress bar on stderr (only on a terminal; gone when the search ends)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]search[/] layouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("search", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield progress


def _print_json(result, run_dir: Path | None, files: dict[str, Path], top: int, stack: Any = None) -> None:
    print(
        json.dumps(
            {
                "run_dir": None if run_dir is None else str(run_dir),
                "stack": stack,
                "files": {k: str(v) for k, v in files.items()},
                "stats": result.stats(),
                "best": result.best.to_dict(),
                "top": [e.to_dict() for e in result.ranked[:top]],
                "layouts": [r.to_dict() for r in group_by_layout(result.ranked)[:top]],
                "pareto": [e.to_dict() for e in result.pareto],
            },
            indent=2,
            default=str,
        )
    )


def _print_target(target, console: Console, rollout_hw=None) -> None:
    """The model, the GPUs (profile and stack named: the defaults are stated; a rollout pool's other profile), the
    workload and its lengths."""
    from grpo_tune.cli.options import target_line

    console.print(target_line(target.model, target.hardware, target.cluster, rollout_hw), highlight=False)
    wl = target.workload
    if wl.kind == "grpo":
        from grpo_tune.costmodel.lengths import lengths_note, workload_line

        console.print(f"Workload: {workload_line(wl)}", highlight=False)
        console.print(f"Lengths: {lengths_note(wl)}", highlight=False)


def _print_result(
    result, wl, console: Console, *, top: int, all_plans: bool, run_dir: Path | None, files: dict[str, Path]
) -> None:
    """The plan tables, why #1 wins, the search's statistics and the run folder written."""
    if all_plans:
        print_plans(result.ranked, console, top=top)
    else:  # one row per layout (autotune/search/grouping.py)
        rows = group_by_layout(result.ranked)[:top]
        print_plans([r.best for r in rows], console, top=top, title="Top plans, one row per layout (its best variant)")
        console.print(grouping_caption(rows), highlight=False)
    from grpo_tune.rundir.report import runner_ups, why_winner
    from grpo_tune.validate.grpo import STATED_ERROR_PCT

    for note in result.defaults_kept:
        console.print(f"verl's default kept: {note}", highlight=False)
    others = runner_ups(result.ranked)
    if others and wl.kind == "grpo":
        console.print("Why #1 wins (runner-up minus winner, by phase):", highlight=False)
        for line in why_winner(result.best, others, STATED_ERROR_PCT):
            console.print("  " + line.lstrip("- ").replace("`", ""), highlight=False)
    st = result.stats()
    console.print(
        f"{st['candidates']:,} valid plans; {st['evaluated']:,} cost-model calls, "
        f"{st['combined']:,} combined; {st['pruned_layouts']:,}/{st['layouts']:,} layouts pruned; "
        f"{st['seconds']:.2f} s; Pareto front: {len(result.pareto)} plan(s)",
        highlight=False,
    )
    if run_dir is not None and files:
        console.print(
            f"wrote [bold]{run_dir}/[/] ({', '.join(sorted(p.name for p in files.values()))})", highlight=False
        )
    elif run_dir is not None:  # --refine resuming: the folder's files stay until the refinement rewrites them
        console.print(
            f"resuming in [bold]{run_dir}/[/]: its files are rewritten when the refinement finishes", highlight=False
        )


def _print_placement(o: SearchOutcome, console: Console, *, json_out: bool, all_plans: bool, stack: Any = None) -> None:
    """search --placement separate|auto: the best plan of each placement side by side, the run folder written."""
    res, colocated = o.placement, o.result
    assert res is not None
    if json_out:
        print(json.dumps({**placement_json(res, o.run_dir, o.files), "stack": stack}, indent=2, default=str))
        return
    if res.best_colocated is not None and not res.best.placement:
        _print_result(
            colocated,
            o.request.target.workload,
            console,
            top=o.request.top,
            all_plans=all_plans,
            run_dir=None,
            files={},
        )
    print_placements(res, console)
    if o.run_dir is not None:
        console.print(
            f"wrote [bold]{o.run_dir}/[/] ({', '.join(sorted(p.name for p in o.files.values()))})", highlight=False
        )


def placement_json(res, run_dir, files) -> dict[str, Any]:
    return {
        "run_dir": None if run_dir is None else str(run_dir),
        "files": {k: str(v) for k, v in files.items()},
        "best": res.best.to_dict(),
        "colocated": None if res.best_colocated is None else res.best_colocated.to_dict(),
        "separate": None if res.best_separate is None else res.best_separate.to_dict(),
        "speedup": res.speedup(),
        "splits": res.splits,
        "seconds": round(res.seconds, 3),
    }


def _sec(x: float) -> str:
    """Seconds in at most 5 characters: one decimal below 100 s, none above."""
    return f"{x:.1f}" if x < 99.95 else f"{x:,.0f}"


def _split_steps(splits: list[dict[str, float]], exact: list | None) -> dict[tuple[int, int], tuple[float, bool]]:
    """Each (rollout GPUs, staleness) the search priced: the step of its exact composition where the search composed
    one (``exact``: PlacementResult.separate), else the split-ranking estimate; the flag says which (True: exact)."""
    out: dict[tuple[int, int], tuple[float, bool]] = {}
    for d in splits:
        out.setdefault((int(d["rollout_gpus"]), int(d["staleness"])), (float(d["step_s"]), False))
    best: dict[tuple[int, int], float] = {}
    for e in exact or []:
        f = e.placement or {}
        if "rollout_gpus" in f and e.step_s:
            key = (int(f["rollout_gpus"]), int(f["staleness"]))
            best[key] = min(best.get(key, math.inf), float(e.step_s))
    out.update({k: (v, True) for k, v in best.items()})
    return out


def pool_lines(s, splits: list[dict[str, float]], exact: list | None = None) -> list[str]:
    """What the separate plan's pools do in steady state (each replica's resident sequences and what bounds them, the
    rollout pool's sustained throughput and drain, the trainer's wait for its first fetch) and why its split won: the
    pool that sets the step and the next-best split of the search at the same staleness. Another split or staleness
    is quoted at its exact composition where the search made one (``exact``), else at the estimate the search ranked
    splits by, marked ``~``."""
    f = s.placement
    steps = _split_steps(splits, exact)
    out = []
    if "concurrency_bound" in f:
        bound = {"max_num_seqs": "max_num_seqs", "kv_cache": "the KV cache", "feed": "the batches fed ahead"}.get(
            f["concurrency_bound"], f["concurrency_bound"]
        )
        out.append(
            f"pools: rollout {f['decode_concurrency']:,.0f} resident sequences per replica (bound by {bound}; fed "
            f"{f['rollout_ahead']:g} batch(es) ahead), {f['rollout_tokens_per_s']:,.0f} tokens/s sustained, drain "
            f"{f['drain_s']:.1f} s per step, busy {100 * f['rollout_busy']:.0f}%; training busy "
            f"{100 * f['train_busy']:.0f}%, waits {f['first_wait_s']:.1f} s per sync for its first fetch",
        )
    k = f["staleness"]
    if k >= 1:
        slower = "rollout" if f["gen_s"] >= f["train_s"] + f.get("first_wait_s", 0.0) else "training"
        slow_s = max(f["gen_s"], f["train_s"])
        setter = f"the {slower} pool ({slow_s:.1f} s) + the exposed sync ({f['exposed_sync_s']:.1f} s)"
    elif f.get("stream_units"):
        setter = (
            f"generation ({f['gen_s']:.1f} s) streamed into training ({f['train_s']:.1f} s) over "
            f"{f['stream_units']} mini-batches, then the sync ({f['sync_s']:.1f} s)"
        )
    else:
        setter = f"generation + sync + training in turn ({f['gen_s']:.1f} + {f['sync_s']:.1f} + {f['train_s']:.1f} s)"
    here = int(f["rollout_gpus"])

    def at(st: float, exact_: bool) -> str:
        return f"{'' if exact_ else '~'}{st:.1f} s"

    rivals = sorted((st, r, ex) for (r, kk), (st, ex) in steps.items() if kk == k and r != here)
    nxt = (
        f"; next split searched at K {k}: {rivals[0][1]} rollout GPUs at {at(rivals[0][0], rivals[0][2])}"
        if rivals
        else ""
    )
    out.append(f"why {here}+{f['train_gpus']}: its step is {setter}{nxt}")
    other_k = sorted((kk, st, ex) for (r, kk), (st, ex) in steps.items() if r == here and kk != k)
    if other_k:  # why this staleness: the same split at every other staleness searched
        each = ", ".join(f"K {kk} {at(st, ex)}" for kk, st, ex in other_k)
        own = getattr(s, "step_s", None)
        mine = float(own) if own else steps.get((here, k), (None, False))[0]
        tie = [kk for kk, st, _ in other_k if mine is not None and kk > k and abs(st - mine) <= 5e-3 * mine]
        why = f" (K {', '.join(map(str, tie))} within 0.5%: the smaller staleness is kept)" if tie else ""
        out.append(f"why K {k}: at {here}+{f['train_gpus']}, {each}{why}")
    return out


def print_placements(res, console: Console) -> None:
    """The best plan of each placement side by side (80 columns): split, staleness, seconds per pool, busy
    fractions, the speed-up over colocated, tokens per dollar; then the model's stated error."""
    from grpo_tune.validate.grpo import STATED_ERROR_PCT
    from grpo_tune.costmodel.pools import colocated_figures

    from rich import box

    t = Table(
        title="Best plan of each placement (s per step; R+T: rollout+training GPUs; K: staleness)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1),
    )
    for c in ("placement", "R+T", "K", "step", "gen", "train", "sync", "busy R/T", "speed", "tok/$"):
        t.add_column(c, justify="left" if c in ("placement", "R+T") else "right", no_wrap=True)
    base = res.best_colocated
    rows = [e for e in (base, res.best_separate) if e is not None]
    for e in rows:
        pools = e.placement
        f = pools if pools is not None else colocated_figures(e)
        sep = pools is not None
        ph = e.time.phases if e.time is not None else {}
        train = (
            pools["train_s"]
            if pools is not None
            else sum(ph.get(k, 0.0) for k in ("old_logprob", "ref_logprob", "update", "offload"))
        )
        gen = pools["gen_s"] if pools is not None else ph.get("rollout", 0.0)
        sync = pools["sync_s"] if pools is not None else ph.get("weight_sync", 0.0)
        split = f"{f['rollout_gpus']}+{f['train_gpus']}" if sep else f"{e.cluster.gpus} all"
        speed = "-" if base is None or not e.step_s else f"{base.step_s / e.step_s:.2f}x"
        tpd = f.get("tokens_per_usd")
        t.add_row(
            "separate" if sep else "colocated",
            split,
            str(f["staleness"]),
            _sec(e.step_s or 0.0),
            _sec(gen),
            _sec(train),
            _sec(sync),
            f"{100 * f['rollout_busy']:.0f}/{100 * f['train_busy']:.0f}%",
            speed,
            "-" if not tpd else (f"{tpd / 1e6:,.2f}M" if tpd >= 1e6 else f"{tpd / 1e3:,.0f}k"),
        )
    console.print(t)
    s = res.best_separate
    if s is None and res.best.cluster.gpus < 2:
        console.print("separate: none (separate pools need 2 GPUs or more)", highlight=False)
    elif s is None:
        console.print("separate: no separate-pool plan fits (none of the splits has a plan)", highlight=False)
    if s is not None:
        st, f = s.strategy, s.placement
        roll = st.rollout
        from grpo_tune.core.specs import load_hardware

        # the pool's own profile (a cpu plan priced with vLLM keeps its engine; another profile is read by name)
        hw_r = s.hardware if f["rollout_hardware"] == s.hardware.name else load_hardware(f["rollout_hardware"])
        if roll.native or (hw_r is not s.hardware and hw_r.default_engine == NATIVE_ENGINE):  # the trainer's sampler
            engine = f"native sampler tp{roll.rollout_tp}"
        else:
            engine = (
                f"vLLM tp{roll.rollout_tp} mem{roll.gpu_memory_utilization:g} max_num_seqs {roll.max_num_seqs}"
                f"{' eager' if roll.enforce_eager else ''}"
            )
        console.print(
            f"separate: training {f['train_gpus']} x {s.hardware.name}: {st.layout_text()} {st.memory.recompute}"
            f" offload={','.join(st.memory.offload) or 'none'}; rollout {f['rollout_gpus']} x {f['rollout_hardware']}: "
            f"{engine}; partial rollout {'on' if f['partial_rollout'] else 'off'}",
            highlight=False,
        )
        for line in pool_lines(s, res.splits, res.separate):
            console.print(line, highlight=False)
    sp = res.speedup()
    if sp is not None:
        verdict = (
            "within the model's error: treat the two as equal"
            if abs(sp - 1) * 100 < STATED_ERROR_PCT
            else "beyond the model's error"
        )
        console.print(
            f"speed-up of separate pools {sp:.2f}x; stated error of a step time +/-{STATED_ERROR_PCT:g}% "
            f"({verdict}). Busy = the share of the step each pool works; tok/$ from the profiles' illustrative prices.",
            highlight=False,
        )
    best_sep = res.best_separate
    if best_sep is not None and (best_sep.placement.get("stream_units") or best_sep.placement.get("streamed_step_s")):
        console.print(streaming_why(best_sep, res.best_colocated, res.stream), highlight=False)
    elif res.separate and all(e.placement["staleness"] == 0 for e in res.separate):
        console.print(
            "staleness 0 (the default): the pools take turns, generation waiting for each update; --staleness 1 "
            "lets them overlap (samples at most one policy version old, importance-weighted)",
            highlight=False,
        )
    winner = "separate" if res.best.placement else "colocated"
    console.print(f"winner: {winner} (separate-pool search {res.seconds:.2f} s)", highlight=False)


def streaming_why(sep, colocated, ask: bool | None = True) -> str:
    """Why a streamed separate plan wins or loses: its step against the same plan in sequence and the colocated.
    ``ask``: the stream asked for (None: the search chose it; a plan that declined carries ``streamed_step_s``)."""
    f = sep.placement
    seq, step = float(f["unstreamed_step_s"]), sep.step_s
    if not f.get("stream_units"):  # auto, and streaming this split costs more than running it in sequence
        from grpo_tune.core.specs import load_hardware

        more = float(f["streamed_step_s"]) - seq
        cause = (
            "the native sampler would decode the stream in waves of max_num_seqs per replica, slower than the batch "
            "in one call,"
            if sep.strategy.rollout.native
            or (
                f["rollout_hardware"] != sep.hardware.name
                and load_hardware(f["rollout_hardware"]).default_engine == NATIVE_ENGINE
            )
            else "each mini-batch's log-prob passes would fill and drain the PP pipeline again (PP bubbles),"
        )
        return (
            f"not streamed: streaming this split would cost {more:.2f} s more per step ({f['streamed_step_s']:.1f} "
            f"against {seq:.1f} s in sequence): {cause} and the overlap does not pay for it. --stream forces it."
        )
    why = ""
    if ask is None:
        why = f"streamed: saves {seq - step:.2f} s per step against the same plan in sequence ({seq:.1f} s). "
    elif ask and step > seq:
        why = f"streamed (--stream): costs {step - seq:.2f} s more than in sequence (PP bubbles). "
    text = why + (
        f"staleness 0 (the default), streamed on-policy: the training pool takes each of {f['stream_units']} "
        f"mini-batches as its groups finish while the rollout pool generates the rest: {step:.1f} s per step "
        f"against {seq:.1f} s in sequence (gen {f['gen_s']:.1f} + train {f['train_s']:.1f} + "
        f"sync {f['exposed_sync_s']:.1f} s); "
    )
    if colocated is not None:
        c = colocated.step_s
        text += (
            f"the split {'beats' if step < c else 'does not beat'} colocated ({c:.1f} s)"
            + (" only because it streams" if seq >= c > step else "")
            + "."
        )
    return text + " --no-stream prices the pools in turn; --staleness 1 lets them overlap across steps."


def register(app: typer.Typer) -> None:
    app.command("search")(search)
