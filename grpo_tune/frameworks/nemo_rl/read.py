"""A NeMo-RL recipe (with Hydra-style overrides) -> the plan grpo-tune prices: model, hardware, GPUs,
workload and strategy, as :class:`grpo_tune.frameworks.base.plan.LaunchPlan` holds them for a verl launch."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from grpo_tune.core.errors import ConfigError, GrpoTuneError, UnknownModelError
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate
from grpo_tune.frameworks.base.inputs import as_int, as_names
from grpo_tune.frameworks.base.plan import LaunchPlan

from . import recipe as R
from . import table


STACK = "nemo-rl-0.7.0"
"""The stack profile NeMo-RL recipes are priced under (profiles/stacks/nemo-rl-0.7.0.toml, also the ``nemo-rl``
alias): the release the recipes target (:data:`.snapshot.RELEASE`), with NeMo-RL's host and engine costs and its bf16
gradient reduction. No 0.7.0 step time is scored: the file says, per parameter, which value is a prior and which is
carried from the v0.3 fit (v0.3's micro-batch overhead, fitted on its prior's 30 ms bound, is not)."""


def is_recipe(path: str | Path) -> bool:
    """Whether ``path`` is a NeMo-RL recipe (a YAML mapping shaped like one), read bounded; False otherwise."""
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    try:
        _, data, _ = R._read_mapping(p)
    except GrpoTuneError:
        return False
    return R.looks_like_recipe(data)


POSITIONS_KEY = f"{table.P}.hf_config_overrides.max_position_embeddings"
"""NeMo-RL's override of the HF config's positions (passed to vLLM as ``hf_overrides``; its DAPO recipe raises
Qwen2.5-Math-7B's 4,096 to 16,384)."""


def resolve_model(r: R.Recipe, model: str | None):
    from grpo_tune.frameworks.base.models import with_positions

    spec, note = _resolve_model(r, model)
    return with_positions(spec, r.get(POSITIONS_KEY), note, key="hf_config_overrides")


def _resolve_model(r: R.Recipe, model: str | None):
    from grpo_tune.frameworks.base.models import resolve_model as lookup

    if model:
        return load_model(model), f"--model {model}"
    name = r.get(f"{table.P}.model_name")
    spec, note = lookup(name, key=f"{table.P}.model_name")
    if spec is None and isinstance(name, str):
        try:
            spec, note = load_model(name), f"{name} -> preset"
        except GrpoTuneError:
            spec = None
    if spec is None:
        raise UnknownModelError(
            f"{r.path}: policy.model_name={name!r} maps to no preset",
            hint="pass --model PRESET (see `grpo-tune models`), a HF id, or a folder with config.json",
        )
    return spec, note


def train_cluster(r: R.Recipe, c: Cluster) -> Cluster:
    """The training pool: the whole cluster when colocated, else the cluster minus the generation pool."""
    p = table.read_placement(r.get)
    if not p.separate:
        return c
    from grpo_tune.core.placement import pools

    return pools(c, p.rollout_gpus).train


def unsupported(r: R.Recipe) -> list[tuple[str, str]]:
    """(message, hint) for what grpo-tune does not price in this recipe (it is then not a plan)."""
    out = []
    if r.get(f"{table.MEG}.enabled") is not True:
        out.append(
            (
                "policy.megatron_cfg.enabled is not true: the DTensor (FSDP2) path is not priced",
                "grpo-tune prices NeMo-RL's Megatron-Core path; set policy.megatron_cfg.enabled=true",
            )
        )
    if r.get(f"{table.GEN}.backend") not in (None, "vllm"):
        out.append((f"policy.generation.backend={r.get(f'{table.GEN}.backend')!r}: only vLLM generation is priced", ""))
    return out


def strategy_of(r: R.Recipe, model, gpus: int, gpn: int) -> Strategy:
    plan = table.read_fields(r.get, table.S)
    d: dict[str, Any] = {k: v for k, v in plan.items() if v is not None}
    for k in ("first_stage_layers", "last_stage_layers"):
        d[k] = plan.get(k)
    d["offload"] = as_names(plan["offload"], "offload")
    # vLLM sleeps between generations when it shares the GPUs (enable_sleep_mode); a pool of its own stays up
    d["free_cache_engine"] = not table.read_placement(r.get).separate
    if not model.is_moe:
        d.pop("etp", None)
    if isinstance(d.get("cpu_optimizer"), float) and d["cpu_optimizer"] <= 0:
        d["cpu_optimizer"] = None
    return validate(
        model, Strategy.from_dict(d, where="NeMo-RL recipe"), gpus, gpus_per_node=gpn, allow_cross_node_tp=True
    )


def workload_of(
    r: R.Recipe, *, prompt_len_mean: int | None = None, response_len_mean: int | None = None, assume: bool = True
) -> Workload:
    """The recipe's workload. A recipe states only the length caps: with ``assume`` the means are assumed as
    search and tune assume them for a verl launch (costmodel/lengths.py), unless given."""
    w = table.read_fields(r.get, table.W)
    for k in ("prompts", "n", "prompt_len", "response_len", "mini_batch"):
        v = w.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(
                f"{r.path}: cannot read the workload's {k} ({v!r}) from this recipe",
                hint="set grpo.num_prompts_per_step, grpo.num_generations_per_prompt, policy.train_global_batch_size "
                "and policy.max_total_sequence_length to positive integers",
            )
    from grpo_tune.core import bounds

    for k, key in (
        ("prompts", "grpo.num_prompts_per_step"),
        ("n", "grpo.num_generations_per_prompt"),
        ("mini_batch", "policy.train_global_batch_size / num_generations_per_prompt"),
    ):
        bounds.check(key, w[k], bounds.MAX_BATCH, where=str(r.path))  # before a clamp hides an absurd value
    for k in ("prompt_len", "response_len"):
        bounds.check(f"{k} (policy.max_total_sequence_length)", w[k], bounds.MAX_TOKENS, where=str(r.path))
    w["mini_batch"] = min(as_int(w["mini_batch"], "mini_batch"), as_int(w["prompts"], "prompts"))
    means: dict[str, Any] = {"prompt_len_mean": prompt_len_mean, "response_len_mean": response_len_mean}
    if assume:
        from grpo_tune.costmodel.lengths import assumed_means

        means = assumed_means(
            means,
            prompt_len=as_int(w["prompt_len"], "prompt_len"),
            response_len=as_int(w["response_len"], "response_len"),
        )
    w.update(means)
    return Workload.from_dict({k: v for k, v in w.items() if v is not None}, where="NeMo-RL workload")


def cluster_of(r: R.Recipe) -> Cluster:
    gpn, nn = r.get("cluster.gpus_per_node"), r.get("cluster.num_nodes")
    from grpo_tune.core import bounds

    bounds.check("cluster.num_nodes", nn, bounds.MAX_GPUS, where=str(r.path))
    bounds.check("cluster.gpus_per_node", gpn, bounds.MAX_GPUS_PER_NODE, where=str(r.path))
    if not (isinstance(gpn, int) and gpn > 0 and isinstance(nn, int) and nn > 0):
        raise ConfigError(
            f"{r.path}: cluster.gpus_per_node={gpn!r} x cluster.num_nodes={nn!r} is not a GPU count",
            hint="set both to positive integers",
        )
    return Cluster(gpus=gpn * nn, gpus_per_node=gpn)


def read_plan(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    model: str | None = None,
    hardware: str | None = None,
    prompt_len_mean: int | None = None,
    response_len_mean: int | None = None,
    stack: str | None = None,
) -> LaunchPlan:
    """The LaunchPlan of a NeMo-RL recipe (``launch`` is the :class:`~.recipe.Recipe`), priced under NeMo-RL's
    stack profile (:data:`STACK`) unless ``stack`` names another."""
    r = R.load(path, list(overrides))
    bad = unsupported(r)
    if bad:
        raise ConfigError(f"{r.path}: {bad[0][0]}", hint=bad[0][1])
    m, note = resolve_model(r, model)
    hw = load_hardware(hardware or "h100", stack=stack or STACK)
    c = cluster_of(r)
    placement = table.read_placement(r.get)
    if placement.separate:  # a generation pool of its own: the plan is the training pool's
        why = table.placement_problem(placement, c)
        if why:
            raise ConfigError(f"{r.path}: NeMo-RL cannot run this placement: {why}", hint="fix its resources")
    tc = train_cluster(r, c)
    wl = workload_of(r, prompt_len_mean=prompt_len_mean, response_len_mean=response_len_mean)
    s = strategy_of(r, m, tc.gpus, tc.gpus_per_node)
    return LaunchPlan(
        launch=r,
        model=m,
        model_note=note,
        hardware=hw,
        cluster=c,
        strategy=s,
        workload=wl,
        placement=placement if placement.separate else None,
        framework="nemo-rl",
    )


def replace_workload(plan, **kw):
    return dataclasses.replace(plan, workload=plan.workload.replace(**kw))
