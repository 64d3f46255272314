"""``grpo-tune search``'s work: rank the plans, search separate pools when asked, write the run folder, refine.

:func:`run_search` takes a :class:`SearchRequest` (the flags, parsed) and returns a :class:`SearchOutcome`
(what was found and written); ``cli/search.py`` prints it.
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.placement import PlacementAsk
from grpo_tune.core.target import Target
from grpo_tune.jobs.setup import Setup

if TYPE_CHECKING:
    from rich.console import Console
    from grpo_tune.autotune.refine.results import RefineResult
    from grpo_tune.autotune.search.driver import SearchResult
    from grpo_tune.autotune.search.placement import PlacementResult

Progress = Callable[[int, int], None]
"""Told (layouts done, layouts in all) as the search goes."""


@dataclass(frozen=True)
class RefineAsk:
    """The ``--refine`` options (the RefineOptions fields of the same names)."""

    trials: int = 8
    storage: str | None = None
    study_name: str | None = None
    trial_steps: int = 6
    trial_timeout_s: float = 600.0
    launcher: str = "local"


@dataclass(frozen=True)
class SearchRequest:
    """What ``search`` was asked: the target, the pins, the placement, and what to write."""

    target: Target
    pins: dict[str, object]
    setup: Setup = Setup()
    place: PlacementAsk = PlacementAsk()
    top: int = 10
    allow_cross_node_tp: bool = False
    min_headroom: float = 0.0
    out: Path = Path("runs")
    emit: bool = True
    refine: RefineAsk | None = None
    """None: no ``--refine``."""


@dataclass
class SearchOutcome:
    """What ``search`` found and wrote."""

    request: SearchRequest
    result: SearchResult
    """The colocated search (knobs within the model's noise of verl's defaults put back at the default)."""
    run_dir: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)
    """The run folder's files written by this run (empty when ``--refine`` resumes an existing folder)."""
    placement: PlacementResult | None = None
    """The placement search (``--placement separate|auto`` or a pool option), else None."""
    refine: RefineResult | None = None


def run_search(
    req: SearchRequest,
    *,
    progress: Callable[[], AbstractContextManager[Progress | None]] | None = None,
    ranked: Callable[[SearchOutcome], None] | None = None,
    console: Console | None = None,
) -> SearchOutcome:
    """Search ``req``'s target; with a placement asked, search separate pools too and write the winner's run
    folder; else write the best plan's run folder (under ``--refine`` a stable folder named like the study) and
    refine it.

    ``progress`` opens the search's progress display (entered around the colocated search only); ``ranked``
    is told the outcome once the colocated plans are ranked and written, before a refinement starts;
    ``console`` is where the refinement reports its trials."""
    from grpo_tune import frameworks as F

    m, hw, cluster, wl = req.target
    if wl.kind != "grpo" and (req.emit or req.refine is not None):
        # best.yaml and the framework launches are GRPO runs (the trainer and verl refuse a pretraining step):
        # a folder written for this plan would price one run and launch another
        raise ConfigError(
            "search writes a GRPO run folder (best.yaml, verl.sh); a pretraining workload is ranked, not emitted",
            hint="add --no-emit to rank pretraining plans (no --refine), or price one with grpo-tune estimate "
            "--workload pretrain",
        )
    if req.refine is not None and req.refine.storage is not None:
        from grpo_tune.autotune.refine.study import check_storage

        check_storage(req.refine.storage)  # before the search runs and before anything is written
    pins = F.check_pins(req.setup.frameworks, req.pins)
    cal = req.setup.load_calibration(hw.name)
    with progress() if progress is not None else nullcontext(None) as tick:
        from grpo_tune.autotune.search.defaults import with_defaults
        from grpo_tune.autotune.search.driver import search

        res = search(
            m,
            hw,
            cluster,
            wl,
            pins=pins,
            top=req.top,
            calibration=cal,
            allow_cross_node_tp=req.allow_cross_node_tp,
            min_headroom=req.min_headroom,
            progress=tick,
        )
        # a knob within the model's noise of the framework's default (verl's) is printed and emitted at the default
        owner, defaults = F.search_defaults(req.setup.frameworks)
        result = with_defaults(
            res, pins=pins, defaults=defaults, owner=owner, calibration=cal, min_headroom=req.min_headroom
        )
    out = SearchOutcome(request=req, result=result)
    place = req.place
    if place.placement != "colocated" or place.pool_options:
        if req.refine is not None:
            raise ConfigError(
                "--refine measures colocated plans only", hint="drop --refine, or search --placement colocated"
            )
        _search_placement(out, pins, cal)
        return out

    if (
        req.refine is not None
    ):  # every refine option is checked before the run folder (a finished refine's best.yaml) is written
        from grpo_tune.autotune.refine import RefineOptions

        opts = RefineOptions(
            **dataclasses.asdict(req.refine), calibration=cal, pins=pins, allow_cross_node_tp=req.allow_cross_node_tp
        )
        opts.check()
    if req.emit or req.refine is not None:
        out.run_dir, out.files = _write_run_folder(req, result)
    if ranked is not None:
        ranked(out)
    if req.refine is not None:
        from grpo_tune.autotune.refine import refine as run_refine

        assert out.run_dir is not None  # --refine always writes the run folder above
        out.refine = run_refine(result.ranked, m, hw, cluster, wl, out.run_dir, opts, console=console, search=result)
    return out


def _write_run_folder(req: SearchRequest, result: SearchResult) -> tuple[Path, dict[str, Path]]:
    """The run folder of the best plan: a new runs/<id>/, or under --refine a stable folder named like the
    study, so that re-running the command resumes it (written only once: refine's finish replaces it atomically)."""
    from grpo_tune.rundir.emit import emit_run, emit_staged

    kw: dict[str, Any] = dict(search=result, meta=req.setup.meta())
    if req.setup.frameworks != ("verl",):
        kw["frameworks"] = req.setup.frameworks
    if req.refine is None:
        return emit_run(result.best, out=req.out, **kw)
    from grpo_tune.autotune.refine import default_study_name

    run_dir = req.out / (req.refine.study_name or default_study_name(*req.target))
    files: dict[str, Path] = {}
    if not (run_dir / "best.yaml").exists():
        files = emit_staged(result.best, run_dir, **kw)  # appears whole, as search's folders do
    return run_dir, files


def _search_placement(out: SearchOutcome, pins: dict[str, Any], cal: dict[str, float] | None) -> None:
    """search --placement separate|auto: the best plan of each placement, the winner's run folder written."""
    from grpo_tune.autotune.search.placement import rollout_memory_default, search_placement

    req, place, colocated = out.request, out.request.place, out.result
    m, hw, cluster, wl = req.target
    frameworks = req.setup.frameworks
    mode = place.require_separate()
    hw_r = place.rollout_profile()
    from grpo_tune import frameworks as F
    from grpo_tune.frameworks import separate_pins

    res = search_placement(
        m,
        hw,
        cluster,
        wl,
        placement=mode,
        staleness=place.staleness,
        rollout_gpus=place.rollout_gpus,
        rollout_hardware=hw_r,
        partial_rollout=place.partial_rollout,
        stream=place.stream_for(F.can_stream(frameworks)),
        pins=separate_pins(frameworks, pins),
        top=req.top,
        calibration=cal,
        allow_cross_node_tp=req.allow_cross_node_tp,
        min_headroom=req.min_headroom,
        colocated=colocated if mode == "auto" else None,
        rollout_memory=rollout_memory_default(frameworks),
    )
    out.placement = res
    if req.emit:
        from grpo_tune.rundir.emit import emit_run

        out.run_dir, out.files = emit_run(
            res.best,
            out=req.out,
            search=colocated if not res.best.placement else None,
            meta=req.setup.meta(),
            frameworks=frameworks,
        )
    if out.run_dir is not None and res.splits:
        from grpo_tune.rundir.report import plot_splits

        out.files["placement_png"] = plot_splits(res, out.run_dir / "placement.png")
