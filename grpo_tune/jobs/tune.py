"""``grpo-tune tune``'s work: read the user's launch back, price it, search the same workload, write the run
folder with the tuned file, and (when separate pools are allowed) propose a split.

:func:`run_tune` takes a :class:`TuneRequest` and returns a :class:`TuneOutcome`; ``cli/tune.py`` prints it.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.placement import PlacementAsk
from grpo_tune.jobs.setup import Setup

if TYPE_CHECKING:
    from grpo_tune.autotune.tune import TuneResult
    from grpo_tune.core.strategy import Strategy
    from grpo_tune.costmodel.estimate import Estimate
    from grpo_tune.frameworks.base import Framework
    from grpo_tune.frameworks.base.plan import LaunchPlan


LOOK_FURTHER = True
"""tune searches the same workload with the knobs it keeps left free, to say what it left on the table
(:func:`left_on_table`, a few seconds more). The test suite turns it off outside the tests of it (tests/conftest.py),
to keep the suite's time."""


@dataclass(frozen=True)
class TuneRequest:
    """What ``tune`` was asked: the launch (and a recipe's overrides), how to read it, what to keep and pin."""

    launch: Path
    overrides: list[str] = field(default_factory=list)
    hardware: str = "h100"
    model: str | None = None
    prompt_len_mean: int | None = None
    response_len_mean: int | None = None
    keep: list[str] = field(default_factory=list)
    pins: dict[str, object] = field(default_factory=dict)
    place: PlacementAsk = PlacementAsk()
    setup: Setup = Setup(frameworks=())
    min_headroom: float = 0.05
    out: Path = Path("runs")
    emit: bool = True

    def meta(self) -> dict[str, str]:
        """The run folder's meta block: the launch tuned, the calibration."""
        return {"tuned_from": str(self.launch), **(self.setup.meta() or {})}


@dataclass(frozen=True)
class SeparateTune:
    """A separate-pool launch re-searched as separate pools: its price as read back and the best plan found."""

    current: Estimate
    best: Estimate
    """``current`` when no faster separate plan was found; else the edited file read back and priced."""
    gain: float
    changes: dict[str, tuple[object, object]] = field(default_factory=dict)
    """Key -> (old, new) for every key the tuned file changes or adds."""
    found: Estimate | None = None
    """The search's best separate plan (``best`` is what the edited file runs, read back)."""


@dataclass
class TuneOutcome:
    """What ``tune`` found and wrote."""

    request: TuneRequest
    framework: Framework
    plan: LaunchPlan
    result: TuneResult | None = None
    """The colocated tuning (None for a separate-pool launch: see ``separate``)."""
    separate: SeparateTune | None = None
    notes: list[str] = field(default_factory=list)
    """What the tuned file leaves as written (values computed at run time): the user sets them."""
    run_dir: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)
    split: Estimate | None = None
    """The separate-pool proposal that beats the tuned colocated launch (when pools are allowed), else None."""
    split_dir: Path | None = None
    split_files: dict[str, Path] = field(default_factory=dict)
    change_lines: list[str] = field(default_factory=list)
    """The keys that change as a diff (``- key=old``, ``+ key=new``), as the framework spells them."""

    split_changes: dict[str, tuple[object, object]] = field(default_factory=dict)
    """Every key the proposal's tuned file changes or adds in the user's launch."""
    split_notes: list[str] = field(default_factory=list)
    left: LeftOnTable | None = None
    """A faster plan search finds with knobs tune keeps as the launch sets them (None: none beyond the model's
    stated error)."""


def key_report(plan: LaunchPlan) -> tuple[object, str] | None:
    """The launch's key findings and the release that judges them (``verl 0.9.1``'s refused or renamed keys),
    None without any: what the CLI reports before any search (through the framework contract)."""
    from grpo_tune.frameworks import REGISTRY

    fw = next((f for f in REGISTRY if f.name == plan.framework), None)
    if fw is None:  # a grpo-tune run config (best.yaml): no framework's keys to judge
        return None
    launch = fw.key_findings(plan)
    return None if launch is None else (launch, fw.release)


@dataclass
class LeftOnTable:
    """What tune leaves on the table: the plan ``search`` finds on the same workload and GPUs when it is faster than
    the tuned launch by more than the model's stated error, using knobs tune does not change (dynamic batching,
    the engine's knobs, the placement)."""

    best: Estimate
    tuned_s: float
    knobs: list[str]
    """What the faster plan sets that tune kept (``dynamic batching (max_tokens_per_gpu 12288)``)."""
    command: str
    """The search that gets it."""
    error_pct: float

    @property
    def step_s(self) -> float:
        return float(self.best.step_s or float("inf"))

    def to_dict(self) -> dict[str, object]:
        return {
            "step_s": round(self.step_s, 3),
            "tuned_step_s": round(self.tuned_s, 3),
            "speedup": round(self.tuned_s / self.step_s, 4),
            "stated_error_pct": self.error_pct,
            "knobs": self.knobs,
            "command": self.command,
            "strategy": self.best.strategy.to_dict(),
            "placement": self.best.placement or None,
        }


def run_tune(req: TuneRequest, *, read: Callable[[LaunchPlan], None] | None = None) -> TuneOutcome:
    """Tune ``req.launch``; ``read`` is told the plan as soon as the launch is read back (before any search: the
    CLI reports the launch's key findings there, and may stop)."""
    from grpo_tune.autotune import tune as T
    from grpo_tune.frameworks import REGISTRY, read_plan, reader_for
    from grpo_tune.frameworks.base.plan import ReadRequest
    from grpo_tune.rundir.emit import Tables, emit_run, run_config

    place = req.place
    fw = reader_for(req.launch)
    if place.allows_split and not fw.tunes_separate:
        raise ConfigError(
            f"tune proposes separate pools for {', '.join(f.name for f in REGISTRY if f.tunes_separate)} launches only",
            hint="drop --placement/--staleness, or `grpo-tune search --placement auto` for the same model",
        )
    plan = read_plan(
        ReadRequest(
            req.launch,
            req.overrides,
            model=req.model,
            hardware=req.hardware,
            prompt_len_mean=req.prompt_len_mean,
            response_len_mean=req.response_len_mean,
            stack=req.setup.stack,
        )
    )
    if read is not None:
        read(plan)
    if plan.launch is None:  # read_plan reads a best.yaml too; tune edits launches only
        raise ConfigError(
            f"{req.launch}: a run config, not a verl launch",
            hint="pass the verl script or override list (the run folder's verl.sh), or `grpo-tune search` again",
        )
    cal = req.setup.load_calibration(plan.hardware.name)
    out = TuneOutcome(request=req, framework=fw, plan=plan)
    if plan.placement is not None:  # separate pools (verl's fully-async launch, NeMo-RL's generation pool)
        _tune_separate(out, cal)
        return out
    res = T.tune(plan, keep=req.keep, calibration=cal, min_headroom=req.min_headroom, pins=req.pins)
    out.result = res
    tuned_name, tuned, mode = fw.tuned_file(plan, res.changes, Path(req.out))
    out.notes = list(fw.tune_notes(plan, res.changes))
    out.change_lines = fw.change_lines(res.changes)
    if req.emit:
        out.run_dir, out.files = emit_run(
            res.best,
            out=req.out,
            search=Tables(ranked=res.ranked, counters=res.search_stats),
            meta=req.meta(),
            frameworks=(fw.name,),
            extra={tuned_name: (tuned, mode)},
        )
    if place.stream is not False and not fw.streams_within_step:  # issue 40: a stream the launch's framework cannot run
        place = dataclasses.replace(place, stream=False)
    out.split = _propose_split(plan, res, place, req.pins, cal, req.min_headroom) if place.allows_split else None
    out.left = left_on_table(out, cal) if LOOK_FURTHER else None
    if out.split is not None:
        # the proposal as the user's own launch, switched to the separate-pool trainer (only priced keys change)
        name, text, mode, out.split_changes, out.split_notes = fw.separate_tuned_file(
            plan, run_config(out.split), Path(req.out)
        )
        if req.emit:
            out.split_dir, out.split_files = emit_run(
                out.split,
                out=req.out,
                meta={"tuned_from": str(req.launch), "proposal": "separate pools", **(req.setup.meta() or {})},
                extra={name: (text, mode)},
            )
    return out


def _tune_separate(out: TuneOutcome, cal: dict[str, float] | None) -> None:
    """A separate-pool launch: its price as read back, and the best separate plan (the split, staleness, both
    pools' plans) for the same model, cluster and workload; the winner's run folder (the framework's whole file:
    verl's fully-async launch, NeMo-RL's recipe). A framework that tune proposes no splits for
    (``tunes_separate`` false: NeMo-RL) keeps the file's split and re-searches the pools' plans and the staleness
    within what it runs."""
    import dataclasses

    from grpo_tune.autotune import tune as T
    from grpo_tune.rundir.emit import emit_run, run_config
    from grpo_tune.autotune.search.placement import rollout_memory_default, search_placement

    req, plan, place, fw = out.request, out.plan, out.request.place, out.framework
    p0 = plan.placement
    assert p0 is not None  # only a separate-pool launch comes here
    hw_r = place.rollout_profile()
    if hw_r is not None:
        p0 = dataclasses.replace(p0, rollout_hardware=hw_r.name)
    cur = _price_separate(plan, p0, hw_r, cal)
    k = place.staleness or p0.staleness
    # a fractional staleness_threshold is the user's run-ahead: the re-search prices the launch's staleness at it
    # (tuned.sh keeps it as written, and reads back at it), and searches no other staleness unless --staleness asks
    keep_ahead = plan.ahead is not None and not place.staleness
    rollout_gpus, partial = place.rollout_gpus, place.partial_rollout or p0.partial_rollout
    # the knobs tune keeps as the launch sets them (the engine's, the batching mode) are pinned here as in the
    # colocated tuning: tuned.sh keeps them, so a plan that needs others is not what the tuned file runs
    pins = T._tune_pins(plan, req.keep, req.pins)[0]
    if not fw.tunes_separate:
        rollout_gpus, partial = p0.rollout_gpus, p0.partial_rollout
        pins = fw.separate_pins({**pins, **fw.constraints()})
    res = search_placement(
        plan.model,
        plan.hardware,
        plan.cluster,
        plan.workload,
        placement="separate",
        staleness=k,
        rollout_gpus=rollout_gpus,
        rollout_hardware=hw_r,
        partial_rollout=partial,
        recompute_logprobs=p0.recompute_logprobs,
        pins=pins,
        calibration=cal,
        min_headroom=req.min_headroom,
        rollout_memory=rollout_memory_default((fw.name,)),
        ahead=plan.ahead,
        min_staleness=k if keep_ahead else 0,
    )
    found = res.best_separate
    cur_s = float(cur.step_s or float("inf"))
    best = cur
    changes: dict[str, tuple[object, object]] = {}
    notes: list[str] = []
    tuned: tuple[str, str, int] | None = None
    if found is not None and float(found.step_s or float("inf")) < cur_s:
        name, text, mode, changes, notes = fw.separate_tuned_file(plan, run_config(found), Path(req.out))
        back = _reread_separate(out, found, cal, hw_r) if changes else None
        if back is not None and float(back.step_s or float("inf")) < cur_s * (1 - T.MIN_GAIN):
            best, tuned = back, (name, text, mode)
        else:
            changes, notes = {}, []
    if tuned is None:  # nothing worth changing: the file as the user wrote it (verl: with refused keys fixed)
        name, text, mode = fw.tuned_file(plan, {}, Path(req.out))
        tuned = (name, text, mode)
    gain = cur_s / float(best.step_s or float("inf"))
    out.separate = SeparateTune(current=cur, best=best, gain=gain, changes=changes, found=found)
    out.notes = list(notes)
    if req.emit:
        out.run_dir, out.files = emit_run(
            best, out=req.out, meta=req.meta(), frameworks=(fw.name,), extra={tuned[0]: (tuned[1], tuned[2])}
        )


def _reread_separate(out: TuneOutcome, found: Estimate, cal: dict[str, float] | None, hw_r) -> Estimate | None:
    """The edited file for ``found`` written to a scratch folder, read back as tune reads a launch, and priced: the
    plan the tuned file runs (values computed at run time stay the user's). None when it does not read back."""
    import dataclasses
    import tempfile

    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.frameworks import read_plan
    from grpo_tune.rundir.emit import run_config

    req, plan, fw = out.request, out.plan, out.framework
    with tempfile.TemporaryDirectory(prefix="grpo-tune-tuned-") as d:
        name, text, _mode, _ch, _notes = fw.separate_tuned_file(plan, run_config(found), Path(d))
        (Path(d) / "run").mkdir()
        f = Path(d) / "run" / name
        f.write_text(text)
        try:
            p2 = read_plan(
                f,
                model=req.model,
                hardware=req.hardware,
                prompt_len_mean=req.prompt_len_mean,
                response_len_mean=req.response_len_mean,
                stack=req.setup.stack,
            )
        except GrpoTuneError:
            return None
    if p2 is None or p2.placement is None:
        return None
    p = p2.placement if hw_r is None else dataclasses.replace(p2.placement, rollout_hardware=hw_r.name)
    return _price_separate(p2, p, hw_r, cal)


def _price_separate(plan: LaunchPlan, placement, hw_r, cal: dict[str, float] | None) -> Estimate:
    """A launch's plan priced on its separate pools (the rollout pool on ``hw_r`` when given): the launch as read
    and the tuned file read back are priced alike."""
    from grpo_tune.costmodel.pools import estimate_separate

    return estimate_separate(
        model=plan.model,
        hardware=plan.hardware,
        cluster=plan.cluster,
        strategy=plan.strategy,
        workload=plan.workload,
        placement=placement,
        rollout_hardware=hw_r,
        calibration=cal,
        knobs=plan.async_knobs(),  # verl's fractional staleness_threshold, as the fraction it is
    )


def _propose_split(
    plan: LaunchPlan,
    res: TuneResult,
    place: PlacementAsk,
    pins: dict[str, Any],
    cal: dict[str, float] | None,
    min_headroom: float,
) -> Estimate | None:
    """The best separate-pool plan for the launch's model, cluster and workload (staleness up to --staleness),
    when it beats the tuned colocated launch; None otherwise."""
    from grpo_tune.autotune.search.placement import rollout_memory_default, search_placement

    if place.placement == "colocated" and (place.partial_rollout and not place.staleness):
        raise ConfigError("--partial-rollout needs --staleness >= 1", hint="give --staleness 1")
    pres = search_placement(
        plan.model,
        plan.hardware,
        plan.cluster,
        plan.workload,
        placement="separate",
        staleness=place.staleness,
        rollout_gpus=place.rollout_gpus,
        rollout_hardware=place.rollout_profile(),
        partial_rollout=place.partial_rollout,
        stream=place.stream,
        pins=pins,
        calibration=cal,
        min_headroom=min_headroom,
        rollout_memory=rollout_memory_default((plan.framework,)),
    )
    sep = pres.best_separate
    if sep is None or not sep.step_s:
        return None
    best_s = res.best.step_s
    assert best_s is not None  # the cost model times every plan it prices
    return None if sep.step_s >= best_s else sep


# ---------------------------------------------------------------------------------------------
# What tune left on the table
# ---------------------------------------------------------------------------------------------

_KNOB_WORDS = {
    "max_tokens_per_gpu": "dynamic batching: max_tokens_per_gpu",
    "log_prob_max_tokens_per_gpu": "dynamic batching of the log-prob passes: max_tokens_per_gpu",
    "cpu_optimizer": "Megatron's CPU optimizer",
    "overlap_cpu_optimizer": "overlapped CPU optimizer copies",
    "precision_aware_optimizer": "precision-aware optimizer",
    "max_num_seqs": "vLLM max_num_seqs",
    "max_num_batched_tokens": "vLLM max_num_batched_tokens",
    "enforce_eager": "vLLM enforce_eager",
    "chunked_prefill": "vLLM chunked prefill",
    "free_cache_engine": "vLLM free_cache_engine",
    "log_prob_mbs": "log-prob micro-batch",
    "sync_bucket_mb": "weight-sync bucket MiB",
}


def _kept_knobs(tuned: Strategy, free: Strategy) -> list[str]:
    """The knobs tune keeps as the launch sets them on which ``free`` differs, in words."""
    from grpo_tune.frameworks.base.plan import PINNED

    out = []
    for k in PINNED:
        a, b = tuned.knob(k), free.knob(k)
        if a != b:
            out.append(f"{_KNOB_WORDS.get(k, k)} {a if a is not None else 'off'} -> {b if b is not None else 'off'}")
    return out


def left_on_table(out: TuneOutcome, cal: dict[str, float] | None) -> LeftOnTable | None:
    """Search the tuned launch's workload on its GPUs with the knobs tune keeps left free (dynamic batching, the
    engine's knobs), and as separate pools at staleness 0 (the same on-policy algorithm); the fastest plan, when it
    beats the tuned launch by more than the model's stated error (validate/grpo.py), else None."""
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.autotune.search.placement import rollout_memory_default, search_placement
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.validate.grpo import STATED_ERROR_PCT

    req, plan, res, fw = out.request, out.plan, out.result, out.framework
    if res is None or res.best.step_s is None:
        return None
    tuned_s = float(res.best.step_s)
    s0 = plan.strategy
    pins: dict[str, Any] = {k: s0.knob(k) for k in req.keep} | dict(req.pins) | dict(fw.tune_constraints())
    if "offload" in pins:
        pins["offload"] = tuple(pins["offload"])
    best = None
    try:
        free = search(
            plan.model,
            plan.hardware,
            plan.cluster,
            plan.workload,
            pins=pins,
            top=1,
            calibration=cal,
            allow_cross_node_tp=True,
            min_headroom=req.min_headroom,
        )
        best = free.best
    except GrpoTuneError:
        best = None
    placement = False
    if fw.tunes_separate and plan.workload.kind == "grpo":
        try:
            sep = search_placement(
                plan.model,
                plan.hardware,
                plan.cluster,
                plan.workload,
                placement="separate",
                staleness=0,
                pins=pins,
                calibration=cal,
                min_headroom=req.min_headroom,
                rollout_memory=rollout_memory_default((fw.name,)),
            ).best_separate
        except GrpoTuneError:
            sep = None
        if sep is not None and sep.step_s and (best is None or sep.step_s < float(best.step_s or float("inf"))):
            best, placement = sep, True
    if best is None or not best.step_s or best.step_s >= tuned_s * (1 - STATED_ERROR_PCT / 100):
        return None
    knobs = _kept_knobs(res.best.strategy, best.strategy)
    if placement:
        f = best.placement
        assert f is not None  # a separate plan carries its pools' figures
        knobs.append(f"separate pools {f['rollout_gpus']} rollout + {f['train_gpus']} training GPUs (staleness 0)")
    w = plan.workload
    from grpo_tune.core.specs import load_model

    try:
        model = plan.model.name if load_model(plan.model.name).name == plan.model.name else plan.model.hf_id
    except GrpoTuneError:
        model = plan.model.hf_id or plan.model.name
    cmd = [
        "grpo-tune search",
        f"--model {model}",
        f"--gpus {plan.cluster.gpus}",
        f"--gpus-per-node {plan.cluster.gpus_per_node}",
        f"--hardware {plan.hardware.name}",
        f"--framework {fw.name}",
        f"--prompts {w.prompts} --n {w.n} --mini-batch {w.mini_batch} --ppo-epochs {w.ppo_epochs}",
        f"--prompt-len {w.prompt_len} --response-len {w.response_len}",
        f"--prompt-len-mean {w.prompt_len_mean} --response-len-mean {w.response_len_mean}",
        "--kl" if w.kl else "--no-kl",
    ]
    if placement and best.placement is not None:
        cmd.append(f"--placement separate --rollout-gpus {best.placement['rollout_gpus']}")
    return LeftOnTable(best=best, tuned_s=tuned_s, knobs=knobs, command=" ".join(cmd), error_pct=STATED_ERROR_PCT)
