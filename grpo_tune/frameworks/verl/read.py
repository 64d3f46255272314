"""A verl launch read back into the plan grpo-tune prices, and edited for ``tune``.

The launch is read with diagnose's parsers (a bash script or a Hydra override list, :mod:`.launch`). Every value
not set in the launch is verl 0.9.1's default (``data/verl-0.9.1-keys.json``). The verl table (:mod:`.table`) says
which verl keys carry which strategy field, in both directions: :func:`strategy_from` reads a plan from overrides
and :func:`overrides_for` writes a plan back. ``tune`` re-reads the tuned plan from the edited overrides
(:class:`Edited`) and prices it again, so the plan it prints is the plan the edited script runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

from grpo_tune.core.errors import ConfigError, GrpoTuneError, UnknownModelError
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel.lengths import assumed_means
from grpo_tune.frameworks.base.inputs import as_names
from grpo_tune.frameworks.base.models import with_positions
from grpo_tune.frameworks.base.plan import SEARCHED, LaunchPlan
from grpo_tune.frameworks.base.sections import Sections
from grpo_tune.frameworks.verl import diagnose as D
from grpo_tune.frameworks.verl import table
from grpo_tune.frameworks.verl.launch import Launch, inherited_from, read_launch
from grpo_tune.frameworks.verl.table import ACTOR, ARO, OTC, ROLLOUT

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
Get = Callable[[str], object]


def _is_int(v: object) -> TypeGuard[int]:
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
    d["offload"] = as_names(f.get("offload") or (), "offload")
    gmu = f.get("gpu_memory_utilization")
    if isinstance(gmu, (int, float)) and not isinstance(gmu, bool):
        d["gpu_memory_utilization"] = float(gmu)
    cpu = f.get("cpu_optimizer")
    d["cpu_optimizer"] = float(cpu) if isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and cpu > 0 else None
    return Strategy.from_dict(d, where="launch plan")


def _pipeline_split_accounting(get: Get, model: ModelSpec, d: dict[str, Any]) -> None:
    """Megatron's account_for_* pipeline-split keys as explicit first / last stage sizes (:func:`table.
    pipeline_split`, the reading diagnose shares), unless the launch pins those."""
    if "first_stage_layers" in d or "last_stage_layers" in d:
        return
    d.update(table.pipeline_split(get, model.layers, d.get("pp", 1)))


def overrides_for(s: Strategy, model: ModelSpec, get: Get, present: set[str]) -> dict[str, object]:
    """verl key -> value that makes a launch run ``s``, for the fields the search changes (:data:`SEARCHED`),
    written by diag's two-way table. ``present`` (the keys the launch sets) is unused by the table, which
    writes the reference's degrees out as verl's examples do; kept for callers."""
    del present
    out: dict[str, object] = {}
    sections: Sections = {"strategy": s}
    for row in table.rows("strategy"):
        if row.write is None or row.field not in (*SEARCHED, "recompute_layers"):
            continue
        if row.field == "etp" and not model.is_moe:
            continue  # a dense model's expert TP is its TP: nothing to write
        for key, value in row.write(sections).items():
            out[key.lstrip("+")] = value
    # a pipeline split the launch pins but the new plan does not use goes back to Megatron's even split
    for fld in ("first", "last"):
        key = f"{OTC}.num_layers_in_{fld}_pipeline_stage"
        if key not in out and get(key) is not None:
            out[key] = None
    return out


def workload_from(get: Get, *, prompt_len_mean: int | None = None, response_len_mean: int | None = None) -> Workload:
    from grpo_tune.core import bounds

    def pos(key: str) -> int:
        v = get(key)
        bounds.check(key, v, bounds.MAX_TOKENS if key.endswith("_length") else bounds.MAX_BATCH)
        if not _is_int(v) or v < 1:
            raise ConfigError(
                f"{key}={v!r}: tune needs a positive integer here",
                hint=f"set {key} in the launch (a literal or a variable with a default, ${{VAR:-8}})",
            )
        return v

    prompts, n = pos("data.train_batch_size"), pos(f"{ROLLOUT}.n")
    mini = pos(f"{ACTOR}.ppo_mini_batch_size")
    epochs = get(f"{ACTOR}.ppo_epochs")
    verl_dtype = get(f"{ACTOR}.megatron.dtype")
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(verl_dtype, "bf16") if isinstance(verl_dtype, str) else "bf16"
    kl = get(f"{ACTOR}.use_kl_loss") is True or get("algorithm.use_kl_in_reward") is True

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
        return with_positions(load_model(model), launch.get(POSITIONS_KEY), f"--model {model}")
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
    return with_positions(spec, launch.get(POSITIONS_KEY), note)


POSITIONS_KEY = f"{ARO}.model.override_config.max_position_embeddings"
"""verl's override of the HF config's positions (verl's DAPO recipes raise Qwen2.5-Math-7B's 4,096 to 32,768)."""


def _streams(trigger: object) -> bool:
    """A staleness-0 fully-async launch with more than one fetch per parameter version streams (issue 40)."""
    return _is_int(trigger) and trigger > 1


def separate_of(launch: Launch) -> tuple[Placement, int, int]:
    """A separate-pool launch's placement and its rollout pool: (Placement, rollout GPUs, rollout GPUs per node).
    Fully-async: staleness ``ceil(staleness_threshold)`` (the versions a sample may lag), its partial rollout (the
    run-ahead itself is the fraction: :attr:`LaunchPlan.ahead`); one-step-off: staleness 1."""
    if launch.one_step:
        from grpo_tune.frameworks.verl import one_step_off

        p = one_step_off.placement_of(launch.get, str(launch.path))
        rg = launch.get("rollout.n_gpus_per_node")
        assert isinstance(rg, int)
        return p, p.rollout_gpus, rg

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
            # issue 40: at staleness 0, more than one fetch per parameter version is the on-policy stream
            stream=stale == 0 and _streams(launch.get("async_training.trigger_parameter_sync_step")),
        ),
        rg * rn,
        rg,
    )


def read_plan(
    path: str | Path,
    *,
    model: str | None = None,
    hardware: str | None = None,
    prompt_len_mean: int | None = None,
    response_len_mean: int | None = None,
    stack: str | None = None,
) -> LaunchPlan:
    """Model, hardware, GPUs, workload and plan of a verl launch (a bash script or an override list), the hardware
    priced under ``stack`` (None: the hardware's default)."""
    launch = read_launch(path)
    m, note = resolve_launch_model(launch, model)
    hw = load_hardware(hardware or "h100", stack=stack)
    gpn, nn = launch.get("trainer.n_gpus_per_node"), launch.get("trainer.nnodes")
    from grpo_tune.core import bounds

    bounds.check("trainer.nnodes", nn, bounds.MAX_GPUS, where=str(launch.path))
    bounds.check("trainer.n_gpus_per_node", gpn, bounds.MAX_GPUS_PER_NODE, where=str(launch.path))
    if not (_is_int(gpn) and gpn > 0 and _is_int(nn) and nn > 0):
        raise ConfigError(
            f"{launch.path}: trainer.n_gpus_per_node={gpn!r} x trainer.nnodes={nn!r} is not a GPU count",
            hint="set both to positive integers",
        )
    cluster = Cluster(gpus=gpn * nn, gpus_per_node=gpn)
    get = launch.get
    placement, ahead = None, None
    if launch.separate:  # the pools; one step = one parameter version (fully async: trigger x require_batches minis)
        placement, rgpus, rgpn = separate_of(launch)
        if not launch.one_step:  # the fraction as written (the staleness rounds it up): priced as the fraction it is
            k = float(launch.get("async_training.staleness_threshold"))  # type: ignore[arg-type]  # checked above
            ahead = k if k != placement.staleness else None
        shared = launch.get("rollout.nnodes") == nn and rgpn + gpn <= hw.gpus_per_node
        cluster = Cluster(gpus=gpn * nn + rgpus, gpus_per_node=(gpn + rgpn) if shared else gpn)
    if launch.separate and not launch.one_step:  # one-step-off: a step is data.train_batch_size prompts, as colocated
        trigger = get("async_training.trigger_parameter_sync_step") or 1
        batches = get("async_training.require_batches") or 1
        if not (isinstance(trigger, (int, float)) and isinstance(batches, (int, float))):
            raise TypeError(
                f"unsupported operand type(s) for *: {type(trigger).__name__!r} and {type(batches).__name__!r}"
            )
        steps = trigger * batches

        def get(key: str, _g=launch.get, _k=steps) -> object:
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
        framework="verl",
        ahead=ahead,
    )


class Edited:
    """The launch's values with ``new`` applied (what the edited script passes to verl)."""

    def __init__(self, launch: Launch, new: dict[str, object]):
        self.launch, self.new = launch, new

    def get(self, key: str) -> object:
        if key in self.new:
            return self.new[key]
        src = inherited_from(key)
        if src is not None and key not in self.launch.values:
            return self.get(src)
        return self.launch.get(key)
