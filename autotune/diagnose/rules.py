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

import os
from functools import lru_cache
from typing import Any, Callable

from autotune import verl
from autotune import verl_table as table
from autotune.verl_table import ACTOR, OTC, REF, REF_OTC, ROLLOUT
from core.errors import CODES, ConfigError, GrpoTuneError, close_matches
from core.rules import Finding as RuleFinding
from core.rules import check_batches as core_check_batches
from core.rules import check_degrees as core_check_degrees
from core.strategy import Cluster, Strategy, Workload

from .context import Ctx
from .findings import Severity

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


# verl engine key -> our degree name
DEGREES = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
}
MISMATCH_CODE = {
    "tp": "TP_MISMATCH",
    "pp": "PP_MISMATCH",
    "vpp": "PP_MISMATCH",
    "cp": "CP_MISMATCH",
    "ep": "EP_MISMATCH",
    "etp": "EP_MISMATCH",
}

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


MAX_SUGGESTIONS = 50
"""Unknown keys that get a 'did you mean' search; the rest get a plain hint."""


@lru_cache(maxsize=1)
def transformer_config_fields() -> frozenset[str]:
    path = verl.DATA_DIR / "megatron-core-0.16.1-transformer-config-fields.txt"
    return frozenset(ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#"))


def _needs_plus(c: Ctx, key: str, raw: str) -> None:
    """A key verl's config does not declare, given without Hydra's ``+``."""
    c.add(
        E,
        "BAD_CONFIG",
        f"{key} is not declared in verl's config: Hydra refuses it without `+`",
        f"write +{key}={raw}",
        key=key,
    )


@register("keys")
def check_keys(c: Ctx) -> None:
    suggested = 0
    fields = transformer_config_fields()
    for key, ov in c.items.items():
        status = verl.key_status(key)
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
                _needs_plus(c, key, ov.raw)
            continue
        if status == "open":
            if not ov.prefix:
                _needs_plus(c, key, ov.raw)
            continue
        # unknown
        real, why = RENAMES.get(key) or LEAF_RENAMES.get(leaf) or (None, "")
        sev = W if ov.prefix else E
        tail = " (Hydra adds it with `+`, but verl never reads it)" if ov.prefix else ""
        if real or why:
            hint = (f"use {real}" if real else "") + (f" ({why})" if real and why else why)
            c.add(sev, "UNKNOWN_KEY", f"{key} does not exist in verl {verl.VERL_VERSION}{tail}", hint, key=key)
            continue
        cands = verl.leaf_names().get(leaf, [])
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


@register("algorithm")
def check_algorithm(c: Ctx) -> None:
    if c.config_name not in (None, verl.CONFIG_NAME):
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


def _degrees(c: Ctx) -> dict[str, dict[str, Any]]:
    actor = {d: c.int_(f"{ACTOR}.megatron.{k}", allow_none=d in ("vpp", "etp")) for d, k in DEGREES.items()}
    ref = {
        d: c.int_(f"{REF}.megatron.{k}", allow_none=d in ("vpp", "etp"), inherit=actor[d]) for d, k in DEGREES.items()
    }
    for role in (actor, ref):
        role["vpp"] = role["vpp"] or 1
        if role["etp"] is None:
            role["etp"] = role["tp"]
    rollout = {
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
    c.world = c.gpn * c.nnodes if c.gpn and c.nnodes else None
    c.roles = _degrees(c)


@register("degrees")
def check_degrees(c: Ctx) -> None:
    """Sets ``c.sound`` when the degrees are sound enough for a memory estimate, and ``c.dp``."""
    c.sound = _check_degrees(c)
    a = c.roles["actor"]
    mp = None if None in (a["tp"], a["pp"], a["cp"]) else a["tp"] * a["pp"] * a["cp"]
    c.dp = c.world // mp if c.world and mp and c.world % mp == 0 else None


def _check_degrees(c: Ctx) -> bool:
    roles, world, gpn, model = c.roles, c.world, c.gpn, c.model
    actor, ref, rollout = roles["actor"], roles["ref"], roles["rollout"]  # rollout: see _check_rollout
    ok = all(actor[d] is not None for d in DEGREES) and world is not None
    for d, k in DEGREES.items():
        key = f"{REF}.megatron.{k}"
        if c.set(key) and ref[d] is not None and actor[d] is not None and ref[d] != actor[d]:
            c.add(
                E,
                MISMATCH_CODE[d],
                f"reference {k}={ref[d]} differs from the actor's {actor[d]}",
                f"verl builds Megatron's process groups once, from the actor's degrees: set {key}={actor[d]} "
                "or drop the line (it defaults to the actor's)",
                key=key,
            )
            ok = False
    tp, pp, cp, ep, etp, vpp = (actor[d] for d in ("tp", "pp", "cp", "ep", "etp", "vpp"))
    if world is not None and None not in (tp, pp, cp):
        mp = tp * pp * cp
        if world % mp:
            c.add(
                E,
                "INVALID_DEGREES",
                f"world size {world} is not divisible by TP x PP x CP = {tp} x {pp} x {cp} = {mp}",
                "choose degrees whose product divides trainer.n_gpus_per_node x trainer.nnodes",
                key=f"{ACTOR}.megatron.tensor_model_parallel_size",
            )
            ok = False
        elif None not in (ep, etp):
            dp = world // mp
            # Megatron's MoE parallel folding: world % (ETP x EP x PP) == 0
            # (megatron/core/parallel_state.py, initialize_model_parallel)
            if (tp * cp * dp) % (ep * etp):
                c.add(
                    E,
                    "EXPERT_DEGREES",
                    f"EP x ETP = {ep} x {etp} = {ep * etp} does not divide TP x CP x DP = "
                    f"{tp} x {cp} x {dp} = {tp * cp * dp}",
                    "lower expert_model_parallel_size or expert_tensor_parallel_size (ETP may differ from TP; "
                    "Moonlight runs TP4/EP4/ETP1)",
                    key=f"{ACTOR}.megatron.expert_model_parallel_size",
                )
                ok = False
    if vpp > 1 and pp is not None and pp == 1:
        c.add(
            E,
            "INVALID_DEGREES",
            "virtual_pipeline_model_parallel_size > 1 needs pipeline_model_parallel_size > 1",
            key=f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size",
        )
        ok = False
    if model is not None and ep is not None:
        if model.is_moe and model.experts % ep:
            c.add(
                E,
                "EXPERT_IMBALANCE",
                f"EP={ep} does not divide the {model.experts} experts of {model.name}",
                f"use an EP among {', '.join(str(d) for d in range(1, model.experts + 1) if model.experts % d == 0)}",
                key=f"{ACTOR}.megatron.expert_model_parallel_size",
            )
            ok = False
    elif model is None and ep and ep > 1:
        c.add(I, "EXPERT_IMBALANCE", f"EP={ep}: the model is unknown, so EP against the expert count is not checked")
    sp = c.raw(f"{ACTOR}.megatron.sequence_parallel")
    if sp is True and tp == 1 and c.set(f"{ACTOR}.megatron.sequence_parallel"):
        c.add(
            I,
            "BAD_CONFIG",
            "sequence_parallel=True has no effect at TP=1 (verl turns it off)",
            key=f"{ACTOR}.megatron.sequence_parallel",
        )
    ok = _check_rollout(c, tp) and ok
    # model-dependent degree rules (heads, layers, VPP, rollout TP vs heads): the one rule set, core.rules
    if ok and model is not None and rollout["tp"] is not None and world is not None:
        try:
            found = core_check_degrees(model, _strategy(c, roles), world, gpus_per_node=gpn, allow_cross_node_tp=True)
        except ConfigError as exc:
            found = [RuleFinding(exc.code, exc.message, exc.hint)]
        for f in found:
            if f.code == "EXPERT_IMBALANCE" and any(x.code == f.code for x in c.findings):
                continue  # already said from the verl keys
            c.add(Severity(str(f.severity)), f.code, f.message, f.hint)
            ok = ok and f.severity != "error"
    return ok


def _check_rollout(c: Ctx, tp: int | None) -> bool:
    """verl's rollout rules (vLLM: TP only, within a node, dividing the world); False when one is broken."""
    rollout, world, gpn, ok = c.roles["rollout"], c.world, c.gpn, True
    rtp, rpp = rollout["tp"], rollout["pp"]
    if rtp is not None and world is not None:
        if world % rtp:
            c.add(
                E,
                "INVALID_DEGREES",
                f"rollout TP={rtp} does not divide the world size {world}",
                "verl requires rollout world % rollout TP == 0",
                key=f"{ROLLOUT}.tensor_model_parallel_size",
            )
            ok = False
        if gpn is not None and rtp > gpn:
            c.add(
                W,
                "TP_MISMATCH",
                f"rollout TP={rtp} spans nodes of {gpn} GPUs",
                "vLLM all-reduces every decoded token across TP: keep rollout TP within a node",
                key=f"{ROLLOUT}.tensor_model_parallel_size",
            )
    if rtp is not None and tp is not None and rtp != tp:
        c.add(
            I,
            "TP_MISMATCH",
            f"rollout TP={rtp} differs from the actor's TP={tp}: legal in verl "
            "(weights are resharded at each weight sync)",
            "a smaller rollout TP gives more vLLM replicas (throughput) but more KV-cache memory per GPU",
            key=f"{ROLLOUT}.tensor_model_parallel_size",
        )
    if rpp is not None and rpp > 1 and rollout["name"] == "vllm":
        c.add(
            E,
            "PP_MISMATCH",
            f"rollout pipeline_model_parallel_size={rpp}: verl's vLLM rollout has no PP",
            f"set {ROLLOUT}.pipeline_model_parallel_size=1 and raise rollout TP",
            key=f"{ROLLOUT}.pipeline_model_parallel_size",
        )
        ok = False
    if rollout["name"] in ("???", None):
        c.add(
            E,
            "BAD_CONFIG",
            f"{ROLLOUT}.name is mandatory in verl {verl.VERL_VERSION}",
            f"add {ROLLOUT}.name=vllm (or sglang)",
        )
    gmu = rollout["gpu_memory_utilization"]
    if isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0 < gmu <= 1:
        c.add(
            E,
            "BAD_CONFIG",
            f"{ROLLOUT}.gpu_memory_utilization={gmu!r} must be a fraction in (0, 1]",
            key=f"{ROLLOUT}.gpu_memory_utilization",
        )
        ok = False
    return ok


def _strategy(c: Ctx, roles: dict) -> Strategy:
    """The plan's strategy as verl will run it, read through the one verl table; the degrees come from
    the checked roles. A field whose value verl would not take falls back to grpo-tune's default
    (the value itself is reported by the rule that owns it)."""
    a, r = roles["actor"], roles["rollout"]
    fields: dict[str, Any] = {}
    for row in table.rows("strategy"):
        if row.read is None or any(not c.known(k.lstrip("+")) for k in row.keys):
            continue
        try:
            v = row.read(c.raw)
            Strategy.from_dict({row.field: list(v) if isinstance(v, tuple) else v})
        except (GrpoTuneError, TypeError, ValueError):
            continue
        fields[row.field] = list(v) if isinstance(v, tuple) else v
    fields.update(
        tp=a["tp"],
        pp=a["pp"],
        vpp=a["vpp"],
        cp=a["cp"],
        ep=a["ep"],
        etp=a["etp"],
        rollout_tp=r["tp"],
        gpu_memory_utilization=float(r["gpu_memory_utilization"]),
    )
    if fields.get("sequence_parallel") is not None:
        fields["sequence_parallel"] = bool(fields["sequence_parallel"])
    return Strategy.from_dict(fields)


@register("batches")
def check_batches(c: Ctx) -> None:
    c.batches = _check_batches(c, c.dp)


def _check_batches(c: Ctx, dp: int | None) -> dict[str, Any]:
    """verl 0.9.1's batch rules (verl/utils/config.py validate_config, workers/config/actor.py
    ActorConfig.validate, workers/engine_workers.py train_mini_batch)."""
    tb = c.int_("data.train_batch_size")
    n = c.int_(f"{ROLLOUT}.n")
    mini = c.int_(f"{ACTOR}.ppo_mini_batch_size")
    micro = c.int_(f"{ACTOR}.ppo_micro_batch_size_per_gpu", allow_none=True)
    dyn = c.bool_(f"{ACTOR}.use_dynamic_bsz")
    out = {
        "train_batch_size": tb,
        "n": n,
        "ppo_mini_batch_size": mini,
        "ppo_micro_batch_size_per_gpu": micro,
        "use_dynamic_bsz": dyn,
    }
    if n == 1 and c.raw("algorithm.adv_estimator") == "grpo":
        c.add(
            W,
            "BAD_CONFIG",
            f"{ROLLOUT}.n=1: with one response per prompt every GRPO advantage is 0",
            f"set {ROLLOUT}.n to the group size (e.g. 5 or 8)",
            key=f"{ROLLOUT}.n",
        )
    if dyn:
        return out
    mkey = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    if micro is None and c.raw(mkey) is None:
        c.add(
            E,
            "BATCH_DIVISIBILITY",
            f"{mkey} is not set; verl requires it unless use_dynamic_bsz=True",
            f"add {mkey}=1 (or more if memory allows)",
        )
    for role in (ROLLOUT, REF):
        k = f"{role}.log_prob_micro_batch_size_per_gpu"
        kl = c.raw(f"{ACTOR}.use_kl_loss") is True or c.raw("algorithm.use_kl_in_reward") is True
        if role == REF and not kl:
            continue
        if c.raw(k) is None and c.raw(f"{role}.log_prob_micro_batch_size") is None:
            c.add(
                E,
                "BATCH_DIVISIBILITY",
                f"{k} is not set; verl requires it unless use_dynamic_bsz=True",
                f"add {k}={micro or 1}",
            )
    if tb is None or n is None or mini is None:
        return out
    if mini > tb:
        c.add(
            E,
            "BATCH_DIVISIBILITY",
            f"ppo_mini_batch_size={mini} exceeds data.train_batch_size={tb}",
            "verl requires mini <= train batch (both count prompts)",
            key=f"{ACTOR}.ppo_mini_batch_size",
        )
    elif tb % mini:
        c.add(
            W,
            "BATCH_DIVISIBILITY",
            f"data.train_batch_size={tb} is not a multiple of ppo_mini_batch_size={mini}",
            "the last mini-batch of each step is smaller",
            key=f"{ACTOR}.ppo_mini_batch_size",
        )
    if dp is None or micro is None:
        return out
    if (tb * n) % (dp * micro):
        c.add(
            E,
            "BATCH_DIVISIBILITY",
            f"train_batch_size x n = {tb} x {n} = {tb * n} is not divisible by DP x micro = "
            f"{dp} x {micro} = {dp * micro}",
            "verl asserts (train_batch_size * n) % (DP * ppo_micro_batch_size_per_gpu) == 0",
            key="data.train_batch_size",
        )
    # the DP split is the one batch rule of core.rules (verl's engine asserts it at the first update); a
    # micro-batch remainder only shortens verl's last micro-batch, so it stays a warning here
    split = core_check_batches(Workload(prompts=mini, n=n, mini_batch=mini), dp=dp)[:1]  # (the step split is the same)
    for f in split:
        c.add(
            E,
            f.code,
            f.message,
            "verl's engine asserts mini_batch_size * n % DP == 0 at the first update",
            key=f"{ACTOR}.ppo_mini_batch_size",
        )
    if not split and ((mini * n) // dp) % micro:
        c.add(
            W,
            "BATCH_DIVISIBILITY",
            f"each rank's mini-batch ({mini * n // dp} sequences) is not a multiple of the micro-batch {micro}",
            "the last micro-batch of each update is smaller",
            key=mkey,
        )
    return out


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


def _memory(c: Ctx) -> dict[str, Any] | None:
    model, hw, roles, world, gpn, batches = c.model, c.hardware, c.roles, c.world, c.gpn, c.batches
    if model is None or hw is None or world is None or gpn is None:
        return None
    try:
        from costmodel.estimate import estimate
    except ImportError:  # pragma: no cover
        return None
    tb, n, mini = batches["train_batch_size"], batches["n"], batches["ppo_mini_batch_size"]
    plen, rlen = c.raw("data.max_prompt_length"), c.raw("data.max_response_length")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (tb, n, mini, plen, rlen)):
        c.add(I, "OOM_RISK", "batch sizes or lengths are not all known: memory not estimated")
        return None
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(c.raw(f"{ACTOR}.megatron.dtype"), "bf16")
    kl = c.raw(f"{ACTOR}.use_kl_loss") is True or c.raw("algorithm.use_kl_in_reward") is True
    epochs = c.raw(f"{ACTOR}.ppo_epochs")
    try:
        wl = Workload.from_dict(
            dict(
                prompts=tb,
                n=n,
                prompt_len=plen,
                response_len=rlen,
                mini_batch=mini if tb % mini == 0 else tb,
                ppo_epochs=epochs if isinstance(epochs, int) and epochs > 0 else 1,
                kl=kl,
                dtype=dtype,
            )
        )
        est = estimate(
            model=model,
            hardware=hw,
            cluster=Cluster(gpus=world, gpus_per_node=gpn),
            strategy=_strategy(c, roles),
            workload=wl,
        )
    except ImportError as exc:
        c.add(I, "OOM_RISK", f"memory model not available ({exc}); memory not checked")
        return None
    except GrpoTuneError as exc:
        c.add(I, "OOM_RISK", f"memory not estimated: [{exc.code}] {exc.message}")
        return None
    for v in est.violations:
        if v.code == "OOM_RISK":
            c.add(
                E,
                "OOM_RISK",
                v.message,
                _oom_hint(v.phase),
                phase=v.phase,
                bytes=None if v.bytes_over is None else int(v.bytes_over),
            )
        elif v.code in CODES:
            c.add(W, v.code, v.message, phase=v.phase)
    return {
        "capacity_bytes": int(est.capacity_bytes),
        "peak_phase": est.peak_phase,
        "peak_bytes": int(est.peak_bytes),
        "phases": {k: int(p.total_bytes) for k, p in est.memory.items()},
    }


def _oom_hint(phase: str | None) -> str:
    if phase == "rollout":
        return f"lower {ROLLOUT}.gpu_memory_utilization or raise rollout TP, or offload params during rollout"
    if phase == "update":
        return "lower ppo_micro_batch_size_per_gpu, turn on recompute, offload the optimizer, or raise TP/PP"
    return "lower the micro-batch, raise TP/PP, or offload (param_offload, optimizer_offload)"


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


@register("memory")
def check_memory(c: Ctx) -> None:
    bad_config = any(f.severity == E and f.code == "BAD_CONFIG" for f in c.findings)
    if c.model is not None and c.hardware is not None and c.sound and not bad_config:
        c.memory = _memory(c)
