"""diagnose's plan rules: the degrees, the batch sizes and the memory estimate (split from :mod:`.rules`,
which registers them in its ordered registry between ``cluster`` and ``dtypes``, and after ``optimizer``).
The severity rules are stated in :mod:`.rules`.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl import table
from grpo_tune.frameworks.verl.table import ACTOR, REF, ROLLOUT
from grpo_tune.core.errors import CODES, ConfigError, GrpoTuneError
from grpo_tune.core.rules import Finding as RuleFinding
from grpo_tune.core.rules import check_batches as core_check_batches
from grpo_tune.core.rules import check_degrees as core_check_degrees
from grpo_tune.core.rules import check_log_prob_batches as core_check_log_prob_batches
from grpo_tune.core.rules import within_node
from grpo_tune.core.strategy import Cluster, Strategy, Workload

from grpo_tune.frameworks.verl.diagnose.context import Batches, Ctx
from grpo_tune.frameworks.base.findings import MemorySummary, Roles, Severity
from grpo_tune.frameworks.base.terms import Terms

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO

_M = f"{ACTOR}.megatron"
TERMS = Terms(
    train_role="actor (and ref)",
    rollout_role="rollout",
    keys={
        **{
            d: f"{_M}.{k}"
            for d, k in {
                "tp": "tensor_model_parallel_size",
                "pp": "pipeline_model_parallel_size",
                "vpp": "virtual_pipeline_model_parallel_size",
                "cp": "context_parallel_size",
                "ep": "expert_model_parallel_size",
                "etp": "expert_tensor_parallel_size",
            }.items()
        },
        "rollout_tp": f"{ROLLOUT}.tensor_model_parallel_size",
        "first_stage_layers": f"+{table.OTC}.num_layers_in_first_pipeline_stage",
        "last_stage_layers": f"+{table.OTC}.num_layers_in_last_pipeline_stage",
    },
    uneven=f" (or {table.OTC}.account_for_embedding_in_pipeline_split=True / account_for_loss_in_pipeline_split=True, "
    "which count the embedding and the loss as a layer each)",
)
"""Core's degree findings in verl's words: the role and the launch's keys."""


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


def check_degrees(c: Ctx) -> None:
    """Sets ``c.sound`` when the degrees are sound enough for a memory estimate, and ``c.dp``."""
    c.sound = _check_degrees(c)
    a = c.roles["actor"]
    tp, pp, cp = a["tp"], a["pp"], a["cp"]
    mp = None if tp is None or pp is None or cp is None else tp * pp * cp
    c.dp = c.world // mp if c.world and mp and c.world % mp == 0 else None


def _check_degrees(c: Ctx) -> bool:
    roles, world, gpn, model = c.roles, c.world, c.gpn, c.model
    actor, ref, rollout = roles["actor"], roles["ref"], roles["rollout"]  # rollout: see _check_rollout
    ok = all(actor[d] is not None for d in DEGREES) and world is not None
    ok = _check_ref_degrees(c, actor, ref) and ok
    tp, pp, cp, ep, etp, vpp = (actor[d] for d in ("tp", "pp", "cp", "ep", "etp", "vpp"))
    ok = _check_world(c, actor, world) and ok
    ok = _check_vpp_experts_sp(c, actor, model) and ok
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
            message, hint = TERMS.say(f.message, f.hint)  # the role, and hints in verl's keys
            c.add(Severity(str(f.severity)), f.code, message, hint)
            ok = ok and f.severity != "error"
    return ok


def _check_ref_degrees(c: Ctx, actor: dict[str, Any], ref: dict[str, Any]) -> bool:
    """The reference's degrees must equal the actor's."""
    ok = True
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
    return ok


def _check_world(c: Ctx, actor: dict[str, Any], world: int | None) -> bool:
    """TP x PP x CP divides the world; EP x ETP divides TP x CP x DP."""
    ok = True
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
    return ok


def _check_vpp_experts_sp(c: Ctx, actor: dict[str, Any], model: Any) -> bool:
    """VPP needs PP; EP divides the experts; sequence parallel at TP=1."""
    ok = True
    tp, pp, cp, ep, etp, vpp = (actor[d] for d in ("tp", "pp", "cp", "ep", "etp", "vpp"))
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
        if gpn is not None and not within_node(rtp, world, gpn):
            c.add(
                W,
                "TP_MISMATCH",
                f"rollout TP={rtp} spans nodes of {gpn} GPUs"
                + ("" if rtp > gpn else " (it does not divide them: a replica straddles two nodes)"),
                "vLLM all-reduces every decoded token across TP: keep rollout TP within a node",
                key=f"{ROLLOUT}.tensor_model_parallel_size",
            )
    if tp is not None and world is not None and gpn is not None and not within_node(tp, world, gpn):
        # verl runs it (Ray fills a node before the next), with TP's per-layer all-reduces on the network
        c.add(
            W,
            "TP_MISMATCH",
            f"actor TP={tp} spans nodes of {gpn} GPUs"
            + ("" if tp > gpn else " (it does not divide them: a TP group straddles two nodes)"),
            "Megatron all-reduces every layer's activations across TP: keep TP within a node (a divisor of "
            "n_gpus_per_node)",
            key=f"{ACTOR}.megatron.tensor_model_parallel_size",
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
    # verl shifts it << 20 into the weight-sync bucket's bytes (engine_workers.py l.681): a positive int of MiB
    c.int_(f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes")
    return ok


def _strategy(c: Ctx, roles: Roles) -> Strategy:
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
        {d: a[d] for d in DEGREES}, rollout_tp=r["tp"], gpu_memory_utilization=_float(r["gpu_memory_utilization"])
    )
    if fields.get("sequence_parallel") is not None:
        fields["sequence_parallel"] = bool(fields["sequence_parallel"])
    if c.model is not None and fields.get("first_stage_layers") is None and fields.get("last_stage_layers") is None:
        # the account_for_* keys, read as tune reads them (table.pipeline_split)
        fields.update(table.pipeline_split(c.raw, c.model.layers, a["pp"] or 1))
    return Strategy.from_dict(fields)


def check_batches(c: Ctx) -> None:
    c.batches = _check_batches(c, c.dp)


def _check_batches(c: Ctx, dp: int | None) -> Batches:
    """verl 0.9.1's batch rules (verl/utils/config.py validate_config, workers/config/actor.py
    ActorConfig.validate, workers/engine_workers.py train_mini_batch)."""
    n = c.int_(f"{ROLLOUT}.n")
    mini = c.int_(f"{ACTOR}.ppo_mini_batch_size")
    if c.separate and not c.one_step:  # fully async: a parameter version trains trigger x require_batches minis
        sync, req = c.int_("async_training.trigger_parameter_sync_step"), c.int_("async_training.require_batches")
        tb = mini * sync * req if mini and sync and req else None
    else:
        tb = c.int_("data.train_batch_size")
    micro = c.int_(f"{ACTOR}.ppo_micro_batch_size_per_gpu", allow_none=True)
    dyn = c.bool_(f"{ACTOR}.use_dynamic_bsz")
    out: Batches = {
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
    _check_micro_keys(c, micro)
    if tb is None or n is None or mini is None:
        return out
    _check_mini(c, tb, mini)
    if dp is None or micro is None:
        return out
    _check_dp_split(c, tb, n, mini, micro, dp)
    return out


def _check_micro_keys(c: Ctx, micro: int | None) -> None:
    """Without dynamic batching verl needs the micro-batch keys set."""
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


def _check_mini(c: Ctx, tb: int, mini: int) -> None:
    """The mini-batch against the train batch (both count prompts)."""
    if mini > tb:
        c.add(
            E,
            "BATCH_DIVISIBILITY",
            f"ppo_mini_batch_size={mini} exceeds data.train_batch_size={tb}",
            "verl requires mini <= train batch (both count prompts)",
            key=f"{ACTOR}.ppo_mini_batch_size",
        )
    elif tb % mini:
        # verl 0.9.1 cuts each rank's step batch into mini-batches with tensordict_utils.make_iterator, which
        # asserts an even cut (verl/utils/tensordict_utils.py l.588); core.strategy's Workload refuses it too
        c.add(
            E,
            "BATCH_DIVISIBILITY",
            f"data.train_batch_size={tb} is not a multiple of ppo_mini_batch_size={mini}",
            "verl's engine asserts an even cut into mini-batches at the first update: make the train batch a "
            "multiple of the mini-batch",
            key=f"{ACTOR}.ppo_mini_batch_size",
        )


def _check_dp_split(c: Ctx, tb: int, n: int, mini: int, micro: int, dp: int) -> None:
    """The step and each mini-batch split over DP ranks and micro-batches."""
    mkey = f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    # (no step-level train_batch * n % (DP * micro) rule: verl 0.9.1 asserts none; with the step an even number
    # of mini-batches (checked above) it follows from the per-mini-batch rules below)
    # core.rules.check_batches' update rules, errors as there: verl's engine asserts the DP split at the first
    # update, and a micro-batch remainder too (see the last check)
    split = core_check_batches(Workload(prompts=mini, n=n, mini_batch=mini), dp=dp)[:1]  # (the step split is the same)
    for f in split:
        c.add(
            E,
            f.code,
            f.message,
            "verl's engine asserts mini_batch_size * n % DP == 0 at the first update",
            key=f"{ACTOR}.ppo_mini_batch_size",
        )
    _check_log_prob_split(c, tb, n, dp)
    if not split and ((mini * n) // dp) % micro:
        # verl 0.9.1 hands each update a rank's mini_batch * n / dp sequences (engine_workers.py train_mini_batch)
        # and prepare_micro_batches (workers/engine/utils.py l.125) asserts them divisible by the micro-batch
        c.add(
            E,
            "BATCH_DIVISIBILITY",
            f"each rank's mini-batch ({mini * n // dp} sequences) is not a multiple of the micro-batch {micro}",
            "verl's engine asserts it at the first update: choose a micro-batch dividing mini_batch * n / DP",
            key=mkey,
        )


def _check_log_prob_split(c: Ctx, tb: int, n: int, dp: int) -> None:
    """Each log-prob pass takes a rank's whole step batch in its own micro-batches (core.rules
    check_log_prob_batches; the interleaving part is left to the estimate)."""
    kl = c.raw(f"{ACTOR}.use_kl_loss") is True or c.raw("algorithm.use_kl_in_reward") is True
    for role in (ROLLOUT, REF) if kl else (ROLLOUT,):
        key = f"{role}.log_prob_micro_batch_size_per_gpu"
        lp = c.int_(key, allow_none=True)
        if lp is None or lp < 1:
            continue
        for f in core_check_log_prob_batches(Workload(prompts=tb, n=n, mini_batch=tb), dp=dp, log_prob_mbs=lp):
            c.add(E, f.code, f.message, "verl's engine asserts it at the first log-prob pass", key=key)


def _separate_estimate(c: Ctx, model, hw, wl, strategy):
    """The fully-async launch priced as separate pools (costmodel/pools.py): the pools as read back."""
    from grpo_tune.core.placement import Placement
    from grpo_tune.costmodel.pools import estimate_separate

    p = c.placement or {}
    rollout_gpus = p["rollout_gpus"]
    assert rollout_gpus is not None  # _memory prices separate pools only when the launch states them
    r, t = int(rollout_gpus), int(c.world or 0)
    gpn = max(c.gpn or 1, p.get("rollout_gpus_per_node") or 1)
    if p.get("shared_nodes"):
        gpn = (c.gpn or 0) + (p.get("rollout_gpus_per_node") or 0)
    stale = p.get("staleness")
    ahead = float(stale) if isinstance(stale, (int, float)) and not isinstance(stale, bool) else None
    place = Placement(
        mode="separate",
        rollout_gpus=r,
        # a threshold that is not a whole number: its ceiling (the versions a sample may lag)
        staleness=math.ceil(ahead) if ahead is not None else 1,
        partial_rollout=bool(p.get("partial_rollout")) and bool(stale),
        recompute_logprobs=p.get("recompute_logprobs", True) is not False,
    )
    c.placement = {**p, "priced_staleness": place.staleness}
    knobs = None
    if ahead is not None and not ahead.is_integer():
        from grpo_tune.costmodel.pools import AsyncKnobs

        # verl's fractional staleness_threshold: the pool runs that fraction of a batch ahead (issue 36)
        knobs = AsyncKnobs(ahead=ahead, no_drain=place.partial_rollout)
    return estimate_separate(
        model=model,
        hardware=hw,
        cluster=Cluster(gpus=r + t, gpus_per_node=gpn),
        strategy=strategy,
        workload=wl,
        placement=place,
        rollout_hardware=c.rollout_hardware,
        knobs=knobs,
    )


def _memory(c: Ctx) -> MemorySummary | None:
    model, hw, roles, world, gpn, batches = c.model, c.hardware, c.roles, c.world, c.gpn, c.batches
    if model is None or hw is None or world is None or gpn is None:
        return None
    try:
        from grpo_tune.costmodel.estimate import estimate
    except ImportError:  # pragma: no cover
        return None
    tb, n, mini = batches["train_batch_size"], batches["n"], batches["ppo_mini_batch_size"]
    plen, rlen = c.raw("data.max_prompt_length"), c.raw("data.max_response_length")
    if not (_positive(tb) and _positive(n) and _positive(mini) and _positive(plen) and _positive(rlen)):
        c.add(I, "OOM_RISK", "batch sizes or lengths are not all known: memory not estimated")
        return None
    kl = c.raw(f"{ACTOR}.use_kl_loss") is True or c.raw("algorithm.use_kl_in_reward") is True
    epochs = c.raw(f"{ACTOR}.ppo_epochs")
    epochs = epochs if isinstance(epochs, int) and epochs > 0 else 1
    mini_batch = mini if tb % mini == 0 else tb
    # the lengths (checked above) and the dtype as the verl table reads them; the batch sizes as checked above
    read = table.read_fields(c.raw, "workload")
    try:
        wl = Workload.from_dict(
            {**read, "prompts": tb, "n": n, "mini_batch": mini_batch, "ppo_epochs": epochs, "kl": kl}
        )
        if c.separate and c.placement and c.placement.get("rollout_gpus"):
            est = _separate_estimate(c, model, hw, wl, _strategy(c, roles))
        else:
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


def _positive(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _float(v: object) -> float:
    """``float(v)`` for a value read from the launch (a number, or a numeric string as float() reads it)."""
    if isinstance(v, (int, float, str)):
        return float(v)
    raise TypeError(f"float() argument must be a string or a real number, not {type(v).__name__!r}")


def _oom_hint(phase: str | None) -> str:
    if phase == "rollout":
        return f"lower {ROLLOUT}.gpu_memory_utilization or raise rollout TP, or offload params during rollout"
    if phase == "update":
        return "lower ppo_micro_batch_size_per_gpu, turn on recompute, offload the optimizer, or raise TP/PP"
    return "lower the micro-batch, raise TP/PP, or offload (param_offload, optimizer_offload)"


def check_memory(c: Ctx) -> None:
    bad_config = any(f.severity == E and f.code == "BAD_CONFIG" for f in c.findings)
    if c.model is not None and c.hardware is not None and c.sound and not bad_config:
        c.memory = _memory(c)
