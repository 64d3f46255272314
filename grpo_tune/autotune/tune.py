"""Start from the user's verl launch: read its plan, price it, search with the same workload, and hand back
only the overrides that change (``grpo-tune tune``); also the launch -> plan reader that ``calibrate`` uses.

The launch is read with diagnose's parsers (a bash script or a Hydra override list). Every value not set in
the launch is verl 0.9.1's default (frameworks/verl/data/verl-0.9.1-keys.json). The verl table
(frameworks/verl/table.py) says which verl keys carry which strategy field, in both directions:
:func:`strategy_from` reads a plan from overrides and :func:`overrides_for` writes a plan back. The tuned plan
is re-read from the edited overrides and priced again, so the plan we print is the plan the edited script runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, cast

from grpo_tune.frameworks.verl import diagnose as D
from grpo_tune.frameworks.verl import table
from grpo_tune.frameworks.verl.launch import ACTOR as ACTOR
from grpo_tune.frameworks.verl.launch import ARO as ARO
from grpo_tune.frameworks.verl.launch import DEGREE_KEYS as DEGREE_KEYS
from grpo_tune.frameworks.verl.launch import OOC as OOC
from grpo_tune.frameworks.verl.launch import OTC as OTC
from grpo_tune.frameworks.verl.launch import REF as REF
from grpo_tune.frameworks.verl.launch import ROLLOUT as ROLLOUT
from grpo_tune.frameworks.verl.launch import Launch as Launch
from grpo_tune.frameworks.verl.launch import read_launch as read_launch
from grpo_tune.frameworks.verl.launch import inherited_from
from grpo_tune.frameworks.verl.script import diff_lines as diff_lines
from grpo_tune.frameworks.verl.script import parse_value_str as parse_value_str
from grpo_tune.frameworks.verl.script import tuned_text as tuned_text
from grpo_tune.core.errors import ConfigError, GrpoTuneError, UnknownModelError
from grpo_tune.core.knobs import names
from grpo_tune.core.specs import ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.frameworks.base.plan import LaunchPlan

# What tune does with each plan knob is its row's ``tune`` role (core/knobs.py): the fields the search may change
# and tune writes back (``search``, and ``keep``: pinned to the launch's, written back so that unset follows a new
# plan); the rest (dynamic-batching caps, the CPU optimizer, vLLM engine knobs) is the user's and stays as launched.
SEARCHED = names(tune=("search", "keep"))
PINNED = names(tune=("keep", "user"))
"""The knobs the search prices at the launch's values."""
USER_FIELDS = names(tune=("keep", "user", "reapply"))
"""The knobs that stay the user's (PINNED, and sequence parallel: searched by its default rule, then put back)."""
_READ_APART = (
    "dp",
    "etp",
    "mbs",
    "recompute",
    "recompute_layers",
    "offload",
    "gpu_memory_utilization",
    "cpu_optimizer",
)
"""The knobs strategy_from reads by their own rule (the rest: an int when positive, a bool when a bool)."""
MIN_GAIN = 0.01
"""A plan must be this much faster (fraction of step time) to be proposed: below it the cost model cannot
tell the plans apart (`grpo-tune validate`: a few %), and proposing it would break the fixed point."""


Get = Callable[[str], Any]


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


# ---------------------------------------------------------------------------------------------
# The two-way table: verl keys <-> Strategy
# ---------------------------------------------------------------------------------------------


def strategy_from(get: Get, model: ModelSpec) -> Strategy:
    """The plan a launch runs (``get(key)`` returns the launch's value or verl's default), read through diag's
    two-way table (frameworks/verl/table.py); values verl leaves unset get the plan's defaults."""
    f = table.read_fields(get, "strategy")
    d: dict[str, Any] = {}
    for k in Strategy.knob_names():  # every int knob a positive value sets, every bool knob a bool; the rest below
        v, kind = f.get(k), Strategy.knob_type(k)
        if k in _READ_APART:
            continue
        if kind is int and _is_int(v) and v > 0 or kind is bool and isinstance(v, bool):
            d[k] = v
    d["etp"] = f.get("etp") if model.is_moe and _is_int(f.get("etp")) else None
    mbs = f.get("mbs")
    d["mbs"] = mbs if _is_int(mbs) and mbs > 0 else 1  # null with dynamic batching: the caps rule instead
    _pipeline_split_accounting(get, model, d)
    d["recompute"] = f.get("recompute") or "none"
    rl = f.get("recompute_layers")
    d["recompute_layers"] = rl if _is_int(rl) and rl > 0 else None
    d["offload"] = tuple(f.get("offload") or ())
    gmu = f.get("gpu_memory_utilization")
    if isinstance(gmu, (int, float)) and not isinstance(gmu, bool):
        d["gpu_memory_utilization"] = float(gmu)
    cpu = f.get("cpu_optimizer")
    d["cpu_optimizer"] = float(cpu) if isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and cpu > 0 else None
    return Strategy.from_dict(d, where="launch plan")


def _pipeline_split_accounting(get: Get, model: ModelSpec, d: dict[str, Any]) -> None:
    """Megatron's ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``
    (megatron-core TransformerConfig; verl's 235B example sets both): the embedding and the loss count as
    one layer each in the even split, so the first / last stage hold one decoder layer fewer. Written
    here as the explicit first / last stage sizes the plan carries (unless the launch pins those)."""
    pp = d.get("pp", 1)
    emb = get(f"{OTC}.account_for_embedding_in_pipeline_split") is True
    loss = get(f"{OTC}.account_for_loss_in_pipeline_split") is True
    if pp <= 1 or not (emb or loss) or "first_stage_layers" in d or "last_stage_layers" in d:
        return
    total = model.layers + int(emb) + int(loss)
    if total % pp:
        return  # megatron-core refuses it too; validate() reports the split
    per = total // pp
    if emb:
        d["first_stage_layers"] = per - 1
    if loss:
        d["last_stage_layers"] = per - 1


def overrides_for(s: Strategy, model: ModelSpec, get: Get, present: set[str]) -> dict[str, Any]:
    """verl key -> value that makes a launch run ``s``, for the fields the search changes (:data:`SEARCHED`),
    written by diag's two-way table. ``present`` (the keys the launch sets) is unused by the table, which
    writes the reference's degrees out as verl's examples do; kept for callers."""
    del present
    out: dict[str, Any] = {}
    plan = {"strategy": s}
    for row in table.rows("strategy"):
        if row.write is None or row.field not in (*SEARCHED, "recompute_layers"):
            continue
        if row.field == "etp" and not model.is_moe:
            continue  # a dense model's expert TP is its TP: nothing to write
        for key, value in row.write(plan).items():
            out[key.lstrip("+")] = value
    # a pipeline split the launch pins but the new plan does not use goes back to Megatron's even split
    for fld in ("first", "last"):
        key = f"{OTC}.num_layers_in_{fld}_pipeline_stage"
        if key not in out and get(key) is not None:
            out[key] = None
    return out


def workload_from(get: Get, *, prompt_len_mean: int | None = None, response_len_mean: int | None = None) -> Workload:
    def pos(key: str) -> int:
        v = get(key)
        if not _is_int(v) or v < 1:
            raise ConfigError(
                f"{key}={v!r}: tune needs a positive integer here",
                hint=f"set {key} in the launch (a literal or a variable with a default, ${{VAR:-8}})",
            )
        return v

    prompts, n = pos("data.train_batch_size"), pos(f"{ROLLOUT}.n")
    mini = pos(f"{ACTOR}.ppo_mini_batch_size")
    epochs = get(f"{ACTOR}.ppo_epochs")
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(get(f"{ACTOR}.megatron.dtype"), "bf16")
    kl = get(f"{ACTOR}.use_kl_loss") is True or get("algorithm.use_kl_in_reward") is True
    from grpo_tune.costmodel.lengths import assumed_means

    plen, rlen = pos("data.max_prompt_length"), pos("data.max_response_length")
    # a launch states only the maxima: the means are assumed as search assumes them (costmodel/lengths.py)
    means = assumed_means(
        {"prompt_len_mean": prompt_len_mean, "response_len_mean": response_len_mean},
        prompt_len=plen,
        response_len=rlen,
    )
    ent = get(f"{ACTOR}.entropy_coeff")
    entropy = (isinstance(ent, (int, float)) and not isinstance(ent, bool) and ent != 0) or (
        get(f"{ACTOR}.calculate_entropy") is True
    )
    return Workload.from_dict(
        {
            "prompts": prompts,
            "n": n,
            "prompt_len": plen,
            "response_len": rlen,
            **means,
            "mini_batch": min(mini, prompts),
            "ppo_epochs": epochs if _is_int(epochs) and epochs > 0 else 1,
            "kl": kl,
            "entropy": entropy,
            "dtype": dtype,
        },
        where="launch workload",
    )


# ---------------------------------------------------------------------------------------------
# Reading a launch
# ---------------------------------------------------------------------------------------------


def resolve_launch_model(launch: Launch, model: str | None) -> tuple[ModelSpec, str]:
    if model:
        return load_model(model), f"--model {model}"
    mp = launch.get(f"{ARO}.model.path")
    spec, note = D.resolve_model(mp)
    if spec is None and isinstance(mp, str):
        try:  # HF ids and local folders as load_model reads them
            spec, note = load_model(mp), f"{mp} -> preset"
        except GrpoTuneError:
            spec = None
    if spec is None:
        raise UnknownModelError(
            f"{launch.path}: {note}",
            hint="pass --model PRESET (see `grpo-tune models`), a HF id, or a folder with config.json",
        )
    return spec, note


def separate_of(launch: Launch) -> tuple[Any, int, int]:
    """A fully-async launch's placement and its two pools' GPUs: (Placement, rollout GPUs, rollout GPUs per node)."""
    from grpo_tune.core.placement import Placement

    rg, rn = launch.get("rollout.n_gpus_per_node"), launch.get("rollout.nnodes")
    if not (_is_int(rg) and rg > 0 and _is_int(rn) and rn > 0):
        raise ConfigError(
            f"{launch.path}: rollout.n_gpus_per_node={rg!r} x rollout.nnodes={rn!r} is not a rollout pool",
            hint="set both to positive integers",
        )
    k = launch.get("async_training.staleness_threshold")
    if not isinstance(k, (int, float)) or isinstance(k, bool) or k < 0:
        raise ConfigError(f"{launch.path}: async_training.staleness_threshold={k!r} is not a number >= 0")
    partial = launch.get("async_training.partial_rollout") is True
    stale = int(-(-float(k) // 1))  # at most ceil(threshold) versions ahead
    from grpo_tune.frameworks.verl.fully_async import recomputes_logprobs

    return (
        Placement(
            mode="separate",
            rollout_gpus=rg * rn,
            staleness=stale,
            partial_rollout=partial and stale > 0,
            recompute_logprobs=recomputes_logprobs(launch.get),
        ),
        rg * rn,
        rg,
    )


def plan_of(
    path: str | Path,
    *,
    model: str | None = None,
    hardware: str | None = None,
    prompt_len_mean: int | None = None,
    response_len_mean: int | None = None,
    stack: str | None = None,
) -> LaunchPlan:
    """Model, hardware, GPUs, workload and plan of a launch (or of a grpo-tune run config, best.yaml, or of another
    framework's file: the registry's reader for it), the hardware priced under ``stack`` (None: the framework's)."""
    import dataclasses

    from grpo_tune.core.hardware import with_stack
    from grpo_tune.frameworks import reader_for

    read = reader_for(path).read_plan(
        Path(path), model=model, hardware=hardware, prompt_len_mean=prompt_len_mean, response_len_mean=response_len_mean
    )
    if read is not None:  # a framework's own reader (a NeMo-RL recipe)
        return dataclasses.replace(read, hardware=with_stack(read.hardware, stack)) if stack else read
    if Path(path).suffix in (".yaml", ".yml") and Path(path).is_file():
        plan = _plan_of_run_config(
            Path(path), hardware=hardware, prompt_len_mean=prompt_len_mean, response_len_mean=response_len_mean
        )
        return dataclasses.replace(plan, hardware=with_stack(plan.hardware, stack)) if stack else plan
    launch = read_launch(path)
    m, note = resolve_launch_model(launch, model)
    hw = load_hardware(hardware or "h100", stack=stack)
    gpn, nn = launch.get("trainer.n_gpus_per_node"), launch.get("trainer.nnodes")
    if not (_is_int(gpn) and gpn > 0 and _is_int(nn) and nn > 0):
        raise ConfigError(
            f"{launch.path}: trainer.n_gpus_per_node={gpn!r} x trainer.nnodes={nn!r} is not a GPU count",
            hint="set both to positive integers",
        )
    cluster = Cluster(gpus=gpn * nn, gpus_per_node=gpn)
    get = launch.get
    placement = None
    if launch.separate:  # the pools; one step = one parameter version of trigger x require_batches mini-batches
        placement, rgpus, rgpn = separate_of(launch)
        shared = launch.get("rollout.nnodes") == nn and rgpn + gpn <= hw.gpus_per_node
        cluster = Cluster(gpus=gpn * nn + rgpus, gpus_per_node=(gpn + rgpn) if shared else gpn)
        steps = (get("async_training.trigger_parameter_sync_step") or 1) * (get("async_training.require_batches") or 1)

        def get(key: str, _g=launch.get, _k=steps) -> Any:
            if key == "data.train_batch_size":
                mini = _g(f"{ACTOR}.ppo_mini_batch_size")
                return mini * _k if _is_int(mini) else mini
            return _g(key)

    wl = workload_from(get, prompt_len_mean=prompt_len_mean, response_len_mean=response_len_mean)
    s = strategy_from(launch.get, m)
    from grpo_tune.core.strategy import validate

    s = validate(m, s, gpn * nn, gpus_per_node=gpn, allow_cross_node_tp=True)
    return LaunchPlan(
        launch=launch,
        model=m,
        model_note=note,
        hardware=hw,
        cluster=cluster,
        strategy=s,
        workload=wl,
        placement=placement,
    )


def _plan_of_run_config(
    p: Path, *, hardware: str | None, prompt_len_mean: int | None, response_len_mean: int | None
) -> LaunchPlan:
    from grpo_tune.core.config import load as load_run_config

    cfg = load_run_config(p)
    wl = cfg.workload
    lens = {k: v for k, v in (("prompt_len_mean", prompt_len_mean), ("response_len_mean", response_len_mean)) if v}
    hw = load_hardware(hardware) if hardware else cfg.hardware
    return LaunchPlan(
        launch=None,
        model=cfg.model,
        model_note=f"run config {p}",
        hardware=hw,
        cluster=cfg.cluster,
        strategy=cfg.strategy,
        workload=wl.replace(**lens) if lens else wl,
    )


# ---------------------------------------------------------------------------------------------
# Tuning
# ---------------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


@dataclass
class TuneResult:
    plan: LaunchPlan
    current: Any
    """Estimate of the launch as it is."""
    best: Any
    """Estimate of the tuned launch (re-read from the edited overrides): ``current`` when nothing changes."""
    changes: dict[str, tuple[Any, Any]]
    """verl key -> (old value, new value) for the overrides that change."""
    ranked: list[Any]
    nearest_fit: list[Any]
    search_stats: dict[str, Any]
    pins: dict[str, Any]

    def gain(self) -> float | None:
        from grpo_tune.autotune.search.rank import step_s

        a, b = step_s(self.current), step_s(self.best)
        return a / b if math.isfinite(a) and b > 0 and math.isfinite(b) else None


def _fits(est) -> bool:
    return not any(v.code == "OOM_RISK" for v in est.violations)


def _tune_pins(
    plan: LaunchPlan, keep: Sequence[str], pins: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check ``keep`` and ``pins``; return (all pins for the search, the user's own pins)."""
    bad = [k for k in keep if k not in SEARCHED]
    if bad:
        raise ConfigError(
            f"--keep {bad[0]}: not a strategy field tune changes", hint=f"choose from {', '.join(SEARCHED)}"
        )
    s0 = plan.strategy
    extra = dict(pins or {})
    bad = [k for k in extra if k not in SEARCHED]
    if bad:
        raise ConfigError(
            f"--{bad[0].replace('_', '-')}: tune keeps that setting as the launch has it",
            hint=f"pin one of {', '.join(SEARCHED)}",
        )
    pins = {k: s0.knob(k) for k in keep} | extra
    # The engine knobs are the user's and tuned.sh keeps them, so the search prices its plans with them too:
    # left free, it would rank plans that only fit with, say, Megatron's CPU optimizer, which tune then drops.
    pins |= {k: s0.knob(k) for k in PINNED if k not in extra}  # log_prob_mbs may be pinned
    if "offload" in pins:
        pins["offload"] = tuple(cast(Sequence[str], pins["offload"]))
    if "etp" in pins and not plan.model.is_moe:
        pins.pop("etp")
    if s0.batching.max_tokens_per_gpu is not None:
        pins["mbs"] = s0.batching.mbs  # with verl's dynamic batching the token caps make the micro-batches, not mbs
    return pins, extra


def _overflowing_log_prob_mbs(plan: LaunchPlan, cur: Any, keep: Sequence[str], extra: dict[str, Any]) -> int | None:
    """The launch's log-prob micro-batch when it is what does not fit (an old/ref log-prob phase over capacity)
    and the user did not pin it (--keep, --log-prob-mbs): the search then chooses one up to it, instead of
    keeping it (autotune/search/log_prob.py). None: tune keeps the launch's, pinned."""
    s0 = plan.strategy
    if (
        s0.batching.log_prob_mbs is None
        or s0.batching.max_tokens_per_gpu is not None
        or "log_prob_mbs" in (*keep, *extra)
    ):
        return None
    over = any(v.code == "OOM_RISK" and v.phase in ("old_logprob", "ref_logprob") for v in cur.violations)
    return s0.batching.log_prob_mbs if over else None


def _tune_search(
    plan: LaunchPlan,
    pins: dict[str, Any],
    top: int,
    calibration: dict[str, float] | None,
    min_headroom: float,
    log_prob_mbs_max: int | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """The search's ranked plans and statistics (none when no plan fits)."""
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.core.errors import NoFeasiblePlanError

    try:
        res = search(
            plan.model,
            plan.hardware,
            plan.cluster,
            plan.workload,
            pins=pins,
            top=max(top, 40),
            calibration=calibration,
            allow_cross_node_tp=True,
            min_headroom=min_headroom,
            log_prob_mbs_max=log_prob_mbs_max,
        )
        ranked = res.ranked
        stats = res.stats()
    except NoFeasiblePlanError:
        ranked, stats = [], {}
    return ranked, stats


def _repriced(
    plan: LaunchPlan,
    launch: Launch,
    ranked: list[Any],
    price: Callable[[Strategy], Any],
    min_headroom: float,
) -> list[tuple[Any, dict[str, Any]]]:
    """The search's plans re-priced with the launch's own engine knobs, those that fit, fastest first."""
    from grpo_tune.autotune.search.rank import rank_key

    s0 = plan.strategy
    # log_prob_mbs and sync_bucket_mb are in the search's plans already: the launch's (pinned) or the user's pin
    user = {k: s0.knob(k) for k in names(tune=("user", "reapply"))}
    present = set(launch.values)
    candidates = []
    for est in ranked:
        new = overrides_for(est.strategy.replace(**user), plan.model, launch.get, present)
        edited = _Edited(launch, new)
        try:
            s_new = strategy_from(edited.get, plan.model)
            e = price(s_new)
        except GrpoTuneError:
            continue
        if _fits(e) and _headroom_ok(e, min_headroom):
            candidates.append((e, new))
    candidates.sort(key=lambda t: rank_key(t[0]))
    return candidates


def _choose(
    plan: LaunchPlan,
    launch: Launch,
    cur: Any,
    candidates: list[tuple[Any, dict[str, Any]]],
    extra: dict[str, Any],
) -> tuple[Any, dict[str, tuple[Any, Any]]]:
    """The best plan and its changed overrides (the current plan and none when nothing is worth changing)."""
    from grpo_tune.autotune.search.rank import step_s

    s0 = plan.strategy
    best, changes = cur, {}
    if candidates:
        e, new = candidates[0]
        better = step_s(e) < step_s(cur) * (1 - MIN_GAIN)
        # a value the user pinned that the launch does not have is a change asked for, faster or not
        asked = any(_pinned_differs(s0, k, v) for k, v in extra.items())
        if better or not _fits(cur) or asked:
            changes = {k: (launch.get(k), v) for k, v in new.items() if not _same(launch.get(k), v)}
            best = e if changes else cur
    return best, changes


def _nearest_fit(plan: LaunchPlan, launch: Launch, candidates: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
    """Plans that fit, nearest to the current one: fewest changed overrides, then fastest (at most 3)."""
    from grpo_tune.autotune.search.rank import step_s

    present = set(launch.values)
    nearest: list[Any] = []
    cur_ov = overrides_for(plan.strategy, plan.model, launch.get, present)
    scored = [(sum(1 for k, v in new.items() if not _same(cur_ov.get(k), v)), step_s(e), e) for e, new in candidates]
    seen: set[str] = set()
    for _, _, e in sorted(scored, key=lambda t: (t[0], t[1])):
        key = repr(sorted(e.strategy.to_dict().items()))
        if key not in seen and len(nearest) < 3:
            seen.add(key)
            nearest.append(e)
    return nearest


def tune(
    plan: LaunchPlan,
    *,
    keep: Sequence[str] = (),
    calibration: dict[str, float] | None = None,
    min_headroom: float = 0.05,
    top: int = 10,
    pins: dict[str, Any] | None = None,
) -> TuneResult:
    """``keep``: fields held at the launch's values; ``pins``: fields set to given values (estimate's flags)."""
    from grpo_tune.costmodel.estimate import estimate

    def price(s: Strategy):
        return estimate(
            model=plan.model,
            hardware=plan.hardware,
            cluster=plan.cluster,
            strategy=s,
            workload=plan.workload,
            calibration=calibration,
        )

    cur = price(plan.strategy)
    pins, extra = _tune_pins(plan, keep, pins)
    lp_max = _overflowing_log_prob_mbs(plan, cur, keep, extra)
    if lp_max is not None:
        pins.pop("log_prob_mbs", None)  # the search chooses it, up to the launch's
    ranked, stats = _tune_search(plan, pins, top, calibration, min_headroom, lp_max)
    # The search prices the engine knobs at their defaults; re-price its plans with the user's own
    # (dynamic-batching caps, CPU optimizer, vLLM engine) so that current and best compare like for like.
    launch = cast(Launch | None, plan.launch)  # a verl launch: plan_of reads NeMo-RL recipes for tune_recipe
    if launch is None:
        raise ConfigError(
            "tune needs a verl launch (script or override list), not a run config",
            hint="for a best.yaml, `grpo-tune search` with its model and workload is the same search",
        )
    candidates = _repriced(plan, launch, ranked, price, min_headroom)
    best, changes = _choose(plan, launch, cur, candidates, extra)
    nearest: list[Any] = []
    if not _fits(cur):
        nearest = _nearest_fit(plan, launch, candidates)
    return TuneResult(
        plan=plan,
        current=cur,
        best=best,
        changes=changes,
        ranked=[e for e, _ in candidates[:top]],
        nearest_fit=nearest,
        search_stats=stats,
        pins=pins,
    )


def _pinned_differs(s: Strategy, key: str, value: Any) -> bool:
    have = s.knob(key)
    if key == "offload":
        return tuple(cast(Sequence[str], have)) != tuple(value)
    return not _same(have, value)


def _headroom_ok(est, min_headroom: float) -> bool:
    cap = est.capacity_bytes
    return est.peak_bytes <= cap - min_headroom * est.hardware.hbm_bytes


class _Edited:
    """The launch's values with ``new`` applied (what the edited script passes to verl)."""

    def __init__(self, launch: Launch, new: dict[str, Any]):
        self.launch, self.new = launch, new

    def get(self, key: str) -> Any:
        if key in self.new:
            return self.new[key]
        src = inherited_from(key)
        if src is not None and key not in self.launch.values:
            return self.get(src)
        return self.launch.get(key)
