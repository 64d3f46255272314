"""diagnose's rules, in the order they run: an ordered registry (as verl registers its advantage
estimators by name). Each rule reads the overrides through :class:`Ctx`, adds findings, and may
leave results for later rules (the roles' degrees, DP, the batch sizes).

Severity rules, decided here:
- the reference's degrees must equal the actor's (verl builds Megatron's process groups once, from
  the actor's degrees): any difference is an **error** (TP/PP/CP/EP_MISMATCH);
- the rollout only has TP in verl's vLLM path; a rollout TP that differs from the actor's TP is
  legal (weights are resharded at weight sync) and is reported as **info**; a rollout TP that does
  not divide the world size is an **error**, and one wider than a node is a **warning**;
- rollout PP > 1 with vLLM is an **error** (not implemented in verl).
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from typing import Callable

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl import table
from grpo_tune.frameworks.verl.table import ACTOR, ALGORITHM, ARO, OTC, REF, REF_OTC, ROLLOUT
from grpo_tune.core.errors import close_matches

from grpo_tune.frameworks.verl.diagnose.context import Ctx
from grpo_tune.frameworks.base.findings import RolloutRole, Roles, Severity
from grpo_tune.frameworks.base.inputs import Override
from grpo_tune.frameworks.verl.diagnose.rules_plan import DEGREES as DEGREES
from grpo_tune.frameworks.verl.diagnose.rules_plan import MISMATCH_CODE as MISMATCH_CODE
from grpo_tune.frameworks.verl.diagnose.rules_plan import check_batches, check_degrees, check_memory

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO

Rule = Callable[[Ctx], None]
RULES: dict[str, Rule] = {}


def register(name: str) -> Callable[[Rule], Rule]:
    """Add a rule under ``name``; rules run in the order they are registered."""

    def deco(fn: Rule) -> Rule:
        if name in RULES:
            raise ValueError(f"rule {name!r} registered twice")
        RULES[name] = fn
        return fn

    return deco


def run_rules(c: Ctx, names: tuple[str, ...] | None = None) -> None:
    for name, fn in RULES.items():
        if names is None or name in names:
            fn(c)


# Keys that circulate in blog posts but do not exist in verl 0.9.1: key -> (real key or None, why).
RENAMES: dict[str, tuple[str | None, str]] = {
    "algorithm.group_size": (f"{ROLLOUT}.n", "GRPO's group size is the number of rollouts per prompt"),
    "training.batch_size": ("data.train_batch_size", "prompts per step"),
    "training.epochs": ("trainer.total_epochs", "epochs over the dataset"),
    "training.gradient_accumulation_steps": (
        None,
        "verl derives it: each update runs ppo_mini_batch_size x n / (DP x ppo_micro_batch_size_per_gpu) "
        "micro-batches; set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu instead",
    ),
    f"{ACTOR}.megatron.grad_offload": (
        f"{ACTOR}.megatron.param_offload",
        "verl 0.9.1 has no grad_offload: param_offload also releases the gradient buffers while inactive",
    ),
    f"{REF}.megatron.grad_offload": (f"{REF}.megatron.param_offload", "verl 0.9.1 has no grad_offload"),
}
# Last key component -> (real key, why), wherever it appears.
LEAF_RENAMES: dict[str, tuple[str | None, str]] = {
    "kl_coeff": (
        f"{ACTOR}.kl_loss_coef",
        "or algorithm.kl_ctrl.kl_coef (with algorithm.use_kl_in_reward=True) for a KL penalty in the reward",
    ),
    "group_size": (f"{ROLLOUT}.n", "GRPO's group size is the number of rollouts per prompt"),
    "moe_router_load_balance": (
        f"{OTC}.moe_router_load_balancing_type",
        "Megatron's field takes aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none",
    ),
}


def rename_of(key: str) -> str | None:
    """The real verl key a blog-only key stands for, when its value carries over as it is (group_size -> rollout.n,
    training.batch_size -> data.train_batch_size, kl_coeff -> kl_loss_coef, grad_offload -> param_offload);
    None for a key verl has, or one without such a twin."""
    if verl.key_status(key) != "unknown":
        return None
    real, _ = RENAMES.get(key) or LEAF_RENAMES.get(key.rsplit(".", 1)[-1]) or (None, "")
    return real if real and verl.key_status(real) == "declared" else None


def apply_renames(overrides: list[Override]) -> tuple[list[Override], dict[str, str]]:
    """The overrides with each blog-only key's value also set on its real key (unless the launch sets that key
    itself), and blog key -> real key: what diagnose's summary and tune's plan read, so that
    ``algorithm.group_size=8`` is priced as ``rollout.n=8``, not as verl's default n=1. The blog key itself
    stays (the keys rule reports it: Hydra refuses it)."""
    present = {o.key for o in overrides}
    out: list[Override] = list(overrides)
    renames: dict[str, str] = {}
    for o in overrides:
        real = rename_of(o.key) if o.prefix != "~" else None
        if real and real not in present and real not in renames.values():
            out.append(dataclasses.replace(o, key=real, prefix=""))
            renames[o.key] = real
    return out, renames


MAX_SUGGESTIONS = 50
"""Unknown keys that get a 'did you mean' search; the rest get a plain hint."""


@lru_cache(maxsize=1)
def transformer_config_fields() -> frozenset[str]:
    path = verl.DATA_DIR / "megatron-core-0.16.1-transformer-config-fields.txt"
    return frozenset(ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#"))


@register("keys")
def check_keys(c: Ctx) -> None:
    suggested = 0
    fields = transformer_config_fields()
    for key, ov in c.items.items():
        status = verl.key_status(key)
        if c.separate and status != "declared" and _async_declared(key, c.config_name):
            status = "declared"
        if key == "hydra.searchpath":  # Hydra's own: where the fully-async config finds ppo_megatron_trainer
            continue
        leaf = key.rsplit(".", 1)[-1]
        if status == "declared":
            # Hydra's `+` merges a list/dict value into an existing key but refuses a scalar
            # (hydra/_internal/config_loader_impl.py, _apply_overrides_to_config)
            if ov.prefix == "+" and verl.default(key) is not None and not isinstance(ov.value, (list, dict)):
                c.add(
                    E,
                    "BAD_CONFIG",
                    f"+{key}: the key already exists in verl's config, and Hydra refuses to add it again",
                    f"drop the `+`: {key}={ov.raw}",
                    key=key,
                )
            continue
        if status == "parent":
            if not isinstance(ov.value, (list, dict)) and ov.value is not None:
                c.add(
                    E,
                    "BAD_CONFIG",
                    f"{key}={ov.raw} replaces a whole section of verl's config with a value",
                    f"set a key inside it, e.g. {next(k for k in verl.snapshot() if k.startswith(key + '.'))}=...",
                    key=key,
                )
            continue
        otc = next((p for p in (OTC, REF_OTC) if key.startswith(p + ".")), None)
        if otc is not None:
            _check_otc_key(c, key, ov, otc, fields)
            continue
        if status == "open":
            if not ov.prefix:
                c.add(
                    E,
                    "BAD_CONFIG",
                    f"{key} is not declared in verl's config: Hydra refuses it without `+`",
                    f"write +{key}={ov.raw}",
                    key=key,
                )
            continue
        # unknown
        suggested = _check_unknown_key(c, key, ov, leaf, suggested)


def _check_otc_key(c: Ctx, key: str, ov: Override, otc: str, fields: frozenset[str]) -> None:
    """A key under override_transformer_config: Megatron's TransformerConfig must have the field."""
    sub = key[len(otc) + 1 :]
    name = sub.split(".", 1)[0]
    if name in LEAF_RENAMES:
        real, why = LEAF_RENAMES[name]
        c.add(
            E,
            "UNKNOWN_KEY",
            f"{key}: Megatron's TransformerConfig has no field {name!r}",
            f"use +{real}=... ({why})",
            key=key,
        )
    elif name not in fields:
        near = close_matches(name, fields, n=1)
        c.add(
            E,
            "UNKNOWN_KEY",
            f"{key}: Megatron's TransformerConfig (megatron-core 0.16.1) has no field {name!r}; "
            "verl passes it on and the model build fails",
            f"did you mean {otc}.{near[0]}?" if near else "remove it",
            key=key,
        )
    elif not ov.prefix:
        c.add(
            E,
            "BAD_CONFIG",
            f"{key} is not declared in verl's config: Hydra refuses it without `+`",
            f"write +{key}={ov.raw}",
            key=key,
        )


def _check_unknown_key(c: Ctx, key: str, ov: Override, leaf: str, suggested: int) -> int:
    """A key verl does not have: a rename or a near key as the hint; returns the count of searched suggestions."""
    real, why = RENAMES.get(key) or LEAF_RENAMES.get(leaf) or (None, "")
    sev = W if ov.prefix else E
    tail = " (Hydra adds it with `+`, but verl never reads it)" if ov.prefix else ""
    if real or why:
        hint = (f"use {real}" if real else "") + (f" ({why})" if real and why else why)
        c.add(sev, "UNKNOWN_KEY", f"{key} does not exist in verl {verl.VERL_VERSION}{tail}", hint, key=key)
        return suggested
    cands = list(verl.leaf_names().get(leaf, []))
    from grpo_tune.frameworks.verl.pool_trainers import trainer_of

    t = trainer_of(c.config_name)  # a separate-pool config's own keys (where 0.9.1 moved use_rollout_log_probs)
    if t is not None:
        cands += [k for k in t.snapshot() if k.rsplit(".", 1)[-1] == leaf and k not in cands]
    suggested += 1
    if suggested > MAX_SUGGESTIONS:  # a close-match search per key would make a long list quadratic-ish
        hint = "see verl's ppo_megatron_trainer config"
    elif cands:
        best = max(cands, key=lambda k: len(os.path.commonprefix([k, key])))
        hint = f"did you mean {best}?"
    else:
        near = close_matches(key, verl.snapshot().keys(), n=1)
        hint = f"did you mean {near[0]}?" if near else "see verl's ppo_megatron_trainer config"
    c.add(sev, "UNKNOWN_KEY", f"{key} does not exist in verl {verl.VERL_VERSION}{tail}", hint, key=key)
    return suggested


def _async_declared(key: str, config_name: str | None) -> bool:
    """A key that the launch's separate-pool config (fully-async or one-step-off) declares on top of verl's."""
    from grpo_tune.frameworks.verl.pool_trainers import trainer_of

    t = trainer_of(config_name)
    return t is not None and key in t.snapshot()


@register("not_priced")
def check_not_priced(c: Ctx) -> None:
    """Settings verl runs and the cost model does not price: said, so that nobody reads a full-parameter, vLLM price
    as theirs. LoRA: no full gradients or optimizer states, and only the adapters go to the rollout. A value the
    script computes at run time is left to the checks that report it (this one runs in ``tune``'s key check too)."""

    def value(key: str) -> object:
        ov = c.items.get(key)
        return None if ov is not None and (ov.unresolved or ov.unevaluable) else c.raw(key)

    for key in (f"{ARO}.model.lora.rank", f"{ARO}.model.lora_rank"):
        v = value(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            c.add(
                W,
                "NOT_PRICED",
                f"{key}={v}: LoRA is not priced; the memory and times are full-parameter training's (LoRA keeps "
                "no full gradients or optimizer states, and syncs only the adapters to the rollout)",
                "read the update's memory as an upper bound; grpo-tune search and tune propose full-parameter plans",
                key=key,
            )
            break
    off = (None, "", False, "none", "None")
    # priced (docs/precision.md): FP8 rollout weights, Megatron FP8 GEMMs (e4m3 / hybrid), vLLM and SGLang
    for key, priced, what, hint in (
        (
            f"{ROLLOUT}.quantization",
            ("fp8",),
            "this quantized rollout is priced as bf16",
            "read the rollout as a bf16 engine's (grpo-tune prices rollout.quantization=fp8)",
        ),
        (
            f"{OTC}.fp8",
            ("e4m3", "hybrid"),
            "this FP8 format is priced as bf16",
            "read the update's time as a bf16 run's (grpo-tune prices fp8=e4m3 and hybrid)",
        ),
    ):
        v = value(key)
        if v not in off and v not in priced:
            c.add(W, "NOT_PRICED", f"{key}={v}: {what}", hint, key=key)
    name = value(f"{ROLLOUT}.name")
    if isinstance(name, str) and name not in ("vllm", "sglang", "???"):
        c.add(
            W,
            "NOT_PRICED",
            f"{ROLLOUT}.name={name}: the rollout is priced as vLLM's (grpo-tune prices and emits vllm and sglang)",
            f"compare against a vLLM run, or set {ROLLOUT}.name=vllm",
            key=f"{ROLLOUT}.name",
        )
    train_fp8 = value(f"{OTC}.fp8") not in off
    if (
        value(f"{ROLLOUT}.quantization") == "fp8"
        and not train_fp8
        and value(f"{ALGORITHM}.rollout_correction.rollout_is") in off
    ):
        c.add(
            W,
            "DTYPE_CONFLICT",
            f"{ROLLOUT}.quantization=fp8 with bf16 training: the samples come from an FP8 policy, off the trained "
            "bf16 one by the quantization error, and no importance-sampling correction is set",
            f"add {ALGORITHM}.rollout_correction.rollout_is=token (truncated IS, threshold 2.0), as grpo-tune emits it",
            key=f"{ROLLOUT}.quantization",
        )


@register("algorithm")
def check_algorithm(c: Ctx) -> None:
    if c.config_name not in (None, verl.CONFIG_NAME) and not c.separate:
        if not (c.config_name == "ppo_trainer" and c.raw("model_engine") == "megatron"):
            c.add(
                W,
                "BAD_CONFIG",
                f"--config-name={c.config_name}: diagnose checks verl's {verl.CONFIG_NAME}",
                f"use --config-name={verl.CONFIG_NAME} (or ppo_trainer with model_engine=megatron) for Megatron",
            )
    if c.raw("algorithm.adv_estimator") != "grpo":
        c.add(
            W,
            "BAD_CONFIG",
            f"algorithm.adv_estimator={c.raw('algorithm.adv_estimator')!r}: verl's default is gae (PPO with a critic)",
            "add algorithm.adv_estimator=grpo",
        )
    if c.model is None:
        c.add(
            I,
            "UNKNOWN_MODEL",
            f"{c.model_note}: memory checks skipped",
            "pass --model PRESET, or point actor_rollout_ref.model.path at a folder with config.json",
        )


def _degrees(c: Ctx) -> Roles:
    actor = {d: c.int_(f"{ACTOR}.megatron.{k}", allow_none=d in ("vpp", "etp")) for d, k in DEGREES.items()}
    ref = {
        d: c.int_(f"{REF}.megatron.{k}", allow_none=d in ("vpp", "etp"), inherit=actor[d]) for d, k in DEGREES.items()
    }
    for role in (actor, ref):
        role["vpp"] = role["vpp"] or 1
        if role["etp"] is None:
            role["etp"] = role["tp"]
    rollout: RolloutRole = {
        "tp": c.int_(f"{ROLLOUT}.tensor_model_parallel_size"),
        "pp": c.int_(f"{ROLLOUT}.pipeline_model_parallel_size"),
        "gpu_memory_utilization": c.raw(f"{ROLLOUT}.gpu_memory_utilization"),
        "name": c.raw(f"{ROLLOUT}.name"),
    }
    return {"actor": actor, "ref": ref, "rollout": rollout}


@register("cluster")
def read_cluster(c: Ctx) -> None:
    c.gpn = c.int_("trainer.n_gpus_per_node")
    c.nnodes = c.int_("trainer.nnodes")
    c.world = c.gpn * c.nnodes if c.gpn and c.nnodes else None  # separate pools: the training pool's
    c.roles = _degrees(c)
    if c.separate:
        _read_pools(c)


def _read_pools(c: Ctx) -> None:
    """A separate-pool launch's pools and schedule, as grpo-tune's placement (``c.placement``), checked as verl
    0.9.1's trainers assert them: the fully-async rollouter's batch keys, and ``hybrid_engine=False`` (both)."""
    from grpo_tune.frameworks.verl import fully_async as verl_async
    from grpo_tune.frameworks.verl import one_step_off

    rgpn, rnodes = c.int_("rollout.n_gpus_per_node"), c.int_("rollout.nnodes")
    rollout = rgpn * rnodes if rgpn and rnodes else None
    stale: object
    sync: int | None
    partial: object
    if c.one_step:  # one step ahead with the weights of the step before; a sync after every step
        stale, sync, partial = one_step_off.STALENESS, None, False
        recompute = c.raw("algorithm.rollout_correction.bypass_mode") is False
    else:
        stale = c.raw("async_training.staleness_threshold")
        sync = c.int_("async_training.trigger_parameter_sync_step")
        partial, recompute = c.raw("async_training.partial_rollout"), verl_async.recomputes_logprobs(c.raw)
        for key, want in (("data.train_batch_size", 0), ("data.gen_batch_size", 1)):
            if c.raw(key) != want:
                c.add(E, "BAD_CONFIG", f"{key}={c.raw(key)!r}: verl's fully-async rollouter asserts {want}", key=key)
    if c.raw(f"{ARO}.hybrid_engine") is not False:
        c.add(
            E,
            "BAD_CONFIG",
            f"the {'one-step-off' if c.one_step else 'fully-async'} trainer asserts "
            "actor_rollout_ref.hybrid_engine=False",
            key=f"{ARO}.hybrid_engine",
        )
    shared = bool(rgpn and c.gpn and rnodes == c.nnodes and rgpn + c.gpn <= 8 and rgpn < 8)
    c.placement = {
        "mode": "separate",
        "rollout_gpus": rollout,
        "train_gpus": c.world,
        "rollout_gpus_per_node": rgpn,
        "shared_nodes": shared,
        "staleness": int(stale) if isinstance(stale, (int, float)) and float(stale).is_integer() else stale,
        "partial_rollout": partial,
        "trigger_parameter_sync_step": sync,
        "recompute_logprobs": recompute,
        "trainer": "one-step-off" if c.one_step else "fully-async",
    }


register("degrees")(check_degrees)
register("batches")(check_batches)

_FP32 = ("fp32", "float32", "torch.float32")


@register("dtypes")
def check_dtypes(c: Ctx) -> None:
    dtype = c.raw(f"{ACTOR}.megatron.dtype")
    ref_dtype = c.raw(f"{REF}.megatron.dtype")  # not inherited from the actor (engine/megatron.yaml default)
    if dtype not in ("bfloat16", "float16"):
        c.add(
            E,
            "DTYPE_CONFLICT",
            f"{ACTOR}.megatron.dtype={dtype!r}: verl's Megatron engine trains in bfloat16 or float16",
            key=f"{ACTOR}.megatron.dtype",
        )
    if ref_dtype != dtype:
        c.add(
            W,
            "DTYPE_CONFLICT",
            f"reference dtype {ref_dtype} differs from the actor's {dtype}",
            "the KL term then compares log-probs computed in two precisions",
            key=f"{REF}.megatron.dtype",
        )
    rdtype = c.raw(f"{ROLLOUT}.dtype")
    if rdtype != dtype:
        c.add(
            W,
            "DTYPE_CONFLICT",
            f"rollout dtype {rdtype} differs from the actor's {dtype}",
            "rollout and training log-probs drift apart; keep them equal",
            key=f"{ROLLOUT}.dtype",
        )
    for otc, role_dtype in ((OTC, dtype), (REF_OTC, ref_dtype)):
        fp16 = c.raw(f"{otc}.fp16") is True
        bf16 = c.raw(f"{otc}.bf16") is True
        pd = c.raw(f"{otc}.params_dtype")
        if fp16 and bf16:
            c.add(
                E,
                "DTYPE_CONFLICT",
                f"{otc}: fp16 and bf16 are both on",
                "Megatron's TransformerConfig rejects both; choose one with megatron.dtype",
                key=f"{otc}.fp16",
            )
        elif fp16 and role_dtype == "bfloat16":
            c.add(
                E,
                "DTYPE_CONFLICT",
                f"{otc}.fp16=True while megatron.dtype=bfloat16: verl sets bf16 from dtype, so either both are on "
                "(Megatron's TransformerConfig refuses) or the override is silently overwritten",
                f"to train in fp16 set {ACTOR}.megatron.dtype=float16 (and the reference's) and drop the override; "
                "bf16 needs no loss scaling",
                key=f"{otc}.fp16",
            )
        if pd is not None and str(pd).lower() in _FP32 and (fp16 or role_dtype == "float16"):
            c.add(
                E,
                "DTYPE_CONFLICT",
                f"{otc}.params_dtype={pd} with fp16 on: the weights stay fp32 while "
                "the compute is fp16, the float16/float32 mismatch in attention that it was meant to fix",
                "drop params_dtype: verl derives it from megatron.dtype (attention_softmax_in_fp32 is fine)",
                key=f"{otc}.params_dtype",
            )


@register("optimizer")
def check_optimizer(c: Ctx) -> None:
    """Megatron's hybrid CPU optimizer (verl passes override_optimizer_config to Megatron-Core's OptimizerConfig)."""
    ooc = table.OOC
    if c.raw(f"{ooc}.optimizer_cpu_offload") is not True:
        return
    frac = c.raw(f"{ooc}.optimizer_offload_fraction")
    if frac is not None and (isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1):
        c.add(
            E,
            "BAD_CONFIG",
            f"{ooc}.optimizer_offload_fraction={frac!r} must be a fraction in [0, 1]",
            key=f"{ooc}.optimizer_offload_fraction",
        )
    if (
        c.raw(f"{ooc}.use_precision_aware_optimizer") is not True
        and c.raw(f"{table.OPTIM}.use_precision_aware_optimizer") is not True
    ):
        # Megatron-LM's validate_args asserts it (megatron/training/arguments.py, commit 000c4ac, line 1161)
        c.add(
            W,
            "BAD_CONFIG",
            "optimizer_cpu_offload without use_precision_aware_optimizer: Megatron's hybrid "
            "CPU optimizer reuses the precision-aware optimizer's code path",
            f"add +{ooc}.use_precision_aware_optimizer=True (verl's 96 GB examples do)",
            key=f"{ooc}.optimizer_cpu_offload",
        )


register("memory")(check_memory)
