"""``grpo-tune diagnose`` on a NeMo-RL recipe: coded findings and the Parallel Config Summary.

The recipe is resolved as NeMo-RL resolves it (:mod:`.recipe`), checked against NeMo-RL 0.7.0's own rules
(each cites the source line that asserts it), its key tree (the shipped snapshot), Megatron's and vLLM's
divisibility rules (:func:`grpo_tune.core.rules.check_degrees`) and the cost model's memory per phase.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Sequence

from grpo_tune.frameworks.base.findings import Finding, MemorySummary, Report, Severity, Summary
from grpo_tune.frameworks.base.terms import Terms
from grpo_tune.core.errors import CODES, GrpoTuneError, InvalidDegreesError
from grpo_tune.core.specs import load_hardware

from . import read
from . import recipe as R
from . import snapshot as snap
from . import table as T

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO


TERMS = Terms(
    train_role="policy",
    rollout_role="generation",
    keys={
        "tp": f"{T.MEG}.tensor_model_parallel_size",
        "pp": f"{T.MEG}.pipeline_model_parallel_size",
        "cp": f"{T.MEG}.context_parallel_size",
        "ep": f"{T.MEG}.expert_model_parallel_size",
        "etp": f"{T.MEG}.expert_tensor_parallel_size",
        "rollout_tp": f"{T.VLLM}.tensor_parallel_size",
        "first_stage_layers": f"{T.MEG}.num_layers_in_first_pipeline_stage",
        "last_stage_layers": f"{T.MEG}.num_layers_in_last_pipeline_stage",
    },
)
"""Core's degree findings in NeMo-RL's words: the role and the recipe's keys."""


def _unknown_keys(r: R.Recipe) -> list[Finding]:
    out = []
    leaves = snap.leaf_names()
    known = sorted(set(snap.keys()) | {k for v in leaves.values() for k in v})
    for key in r.own:
        if snap.key_status(key) != "unknown":
            continue
        near = leaves.get(key.rsplit(".", 1)[-1]) or difflib.get_close_matches(key, known, n=2, cutoff=0.8)
        maybe = f"did you mean {', '.join(near[:2])}? " if near else ""
        out.append(
            Finding(
                W,
                "UNKNOWN_KEY",
                f"{key} is not a key of NeMo-RL {snap.RELEASE}'s GRPO config: NeMo-RL ignores it silently",
                f"{maybe}keys: {snap.BASE_CONFIG} and the TypedDicts of nemo_rl/models/policy/__init__.py",
                key=key,
            )
        )
    return out


def _nemo_rules(r: R.Recipe) -> list[Finding]:
    """NeMo-RL 0.7.0's own assertions, each with the file that makes it."""
    g = r.get
    out: list[Finding] = []
    pp = g(f"{T.MEG}.pipeline_model_parallel_size")
    if g(f"{T.DYN}.enabled") is True and isinstance(pp, int) and pp > 1:
        out.append(
            Finding(
                E,
                "BAD_CONFIG",
                f"dynamic batching with pipeline_model_parallel_size={pp}: NeMo-RL asserts 'Dynamic batching is "
                "only supported for single pipeline parallel stage' (nemo_rl/models/policy/lm_policy.py)",
                f"use sequence packing instead: {T.DYN}.enabled=false {T.PACK}.enabled=true",
                key=f"{T.DYN}.enabled",
            )
        )
    if g(f"{T.DYN}.enabled") is True and g(f"{T.PACK}.enabled") is True:
        out.append(
            Finding(
                E,
                "BAD_CONFIG",
                "dynamic batching and sequence packing are both on: NeMo-RL asserts they are exclusive "
                "(nemo_rl/models/policy/lm_policy.py)",
                f"turn one off ({T.PACK}.enabled is the base config's default on Megatron)",
                key=f"{T.PACK}.enabled",
            )
        )
    if g(f"{T.OPT}.optimizer_cpu_offload") is True and g(f"{T.OPT}.optimizer_offload_fraction") != 1.0:
        out.append(
            Finding(
                E,
                "BAD_CONFIG",
                f"optimizer_cpu_offload with optimizer_offload_fraction={g(f'{T.OPT}.optimizer_offload_fraction')}: "
                "NeMo-RL asserts the fraction is 1.0 (nemo_rl/models/megatron/setup.py _validate_optimizer_config)",
                f"set {T.OPT}.optimizer_offload_fraction=1.0",
                key=f"{T.OPT}.optimizer_offload_fraction",
            )
        )
    tp, sp = g(f"{T.MEG}.tensor_model_parallel_size"), g(f"{T.MEG}.sequence_parallel")
    if sp is True and tp == 1:
        out.append(
            Finding(
                W,
                "TP_MISMATCH",
                "sequence_parallel with tensor_model_parallel_size=1: Megatron has nothing to split",
                f"set {T.MEG}.sequence_parallel=false",
                key=f"{T.MEG}.sequence_parallel",
            )
        )
    if g(f"{T.GRPO}.async_grpo.enabled") is True:
        if g(f"{T.GEN}.colocated.enabled") is not False:
            out.append(
                Finding(
                    E,
                    "BAD_CONFIG",
                    "grpo.async_grpo with colocated generation: NeMo-RL asserts 'Colocated inference is not "
                    "supported for async GRPO' (nemo_rl/algorithms/grpo.py async_grpo_train)",
                    f"set {T.GEN}.colocated.enabled=false with its resources, or turn async_grpo off",
                    key=f"{T.GRPO}.async_grpo.enabled",
                )
            )
        if g(f"{T.LOSS}.use_importance_sampling_correction") is not True:
            out.append(
                Finding(
                    E,
                    "BAD_CONFIG",
                    "grpo.async_grpo without loss_fn.use_importance_sampling_correction: NeMo-RL asserts it "
                    "(nemo_rl/algorithms/grpo.py async_grpo_train)",
                    f"set {T.LOSS}.use_importance_sampling_correction=true",
                    key=f"{T.LOSS}.use_importance_sampling_correction",
                )
            )
        if g(f"{T.GRPO}.async_grpo.in_flight_weight_updates") is True:
            out.append(
                Finding(
                    I,
                    "BAD_CONFIG",
                    "in_flight_weight_updates: NeMo-RL refits while generations are pending (they finish under the "
                    "new weights); priced as partial rollout: no drain at the refit",
                    "",
                    key=f"{T.GRPO}.async_grpo.in_flight_weight_updates",
                )
            )
    out += _not_priced(g)
    if g(f"{T.P}.refit_buffer_size_gb") is None:
        out.append(
            Finding(
                I,
                "BAD_CONFIG",
                "policy.refit_buffer_size_gb is unset: NeMo-RL sizes the refit buffer at 30% of free GPU memory "
                "(NRL_REFIT_BUFFER_MEMORY_RATIO, grpo.py); priced with the default bucket",
                "set policy.refit_buffer_size_gb to price and run one bucket size",
                key=f"{T.P}.refit_buffer_size_gb",
            )
        )
    if T.prompt_assumed(g):
        out.append(
            Finding(
                I,
                "BAD_CONFIG",
                f"data.max_input_seq_length is not below policy.max_total_sequence_length: prompts assumed up to "
                f"{T.PROMPT_LEN_ASSUMED} tokens, responses take the rest",
                "set data.max_input_seq_length to the dataset's longest prompt to price it exactly",
                key="data.max_input_seq_length",
            )
        )
    return out


def _not_priced(g) -> list[Finding]:
    """What NeMo-RL runs and the cost model does not price (the figures are bf16, full-parameter, vLLM's): LoRA
    (``policy.megatron_cfg.peft``), FP8 training (``fp8_cfg``) or rollout (``vllm_cfg.precision``), another
    generation backend."""
    out: list[Finding] = []
    said = [
        (
            f"{T.MEG}.peft.enabled",
            g(f"{T.MEG}.peft.enabled") is True,
            "LoRA (peft) training is priced as full-parameter",
        ),
        (
            f"{T.MEG}.fp8_cfg.fp8",
            g(f"{T.MEG}.fp8_cfg.enabled") is True and g(f"{T.MEG}.fp8_cfg.fp8") not in (None, "e4m3", "hybrid"),
            f"FP8 format {g(f'{T.MEG}.fp8_cfg.fp8')} is priced as bf16 (grpo-tune prices e4m3 and hybrid)",
        ),
        (
            f"{T.GEN}.vllm_cfg.precision",
            g(f"{T.GEN}.backend") in (None, "vllm")
            and str(g(f"{T.GEN}.vllm_cfg.precision") or "bfloat16").lower()
            not in ("bfloat16", "bf16", "auto", "fp8", "${policy.precision}"),
            f"a {g(f'{T.GEN}.vllm_cfg.precision')} vLLM rollout is priced as bf16 (grpo-tune prices bf16 and fp8)",
        ),
        (
            f"{T.GEN}.backend",
            g(f"{T.GEN}.backend") not in (None, "vllm"),
            f"the {g(f'{T.GEN}.backend')} generation backend is priced as vLLM",
        ),
    ]
    rollout_fp8 = str(g(f"{T.GEN}.vllm_cfg.precision") or "").lower() == "fp8"
    if (
        rollout_fp8
        and g(f"{T.MEG}.fp8_cfg.enabled") is not True
        and g(f"{T.LOSS}.use_importance_sampling_correction") is not True
    ):
        out.append(
            Finding(
                W,
                "DTYPE_CONFLICT",
                f"{T.GEN}.vllm_cfg.precision=fp8 with bf16 training: the samples come from an FP8 policy, off the "
                "trained one by the quantization error, and no importance-sampling correction is set",
                f"set {T.LOSS}.use_importance_sampling_correction: true, as grpo-tune emits it",
                key=f"{T.GEN}.vllm_cfg.precision",
            )
        )
    for key, on, what in said:
        if on:
            out.append(
                Finding(
                    W,
                    "NOT_PRICED",
                    f"{key}: {what}",
                    "read the figures as the bf16, full-parameter, vLLM plan; grpo-tune emits that plan",
                    key=key,
                )
            )
    return out


def _batches(plan, train) -> list[Finding]:
    s, w = plan.strategy, plan.workload
    dp = s.layout.dp or train.gpus // s.layout.model_parallel
    gbs = w.mini_batch * w.n
    out = []
    if gbs % dp:
        out.append(
            Finding(
                E,
                "BATCH_DIVISIBILITY",
                f"policy.train_global_batch_size={gbs} does not split over data parallel {dp}",
                "make train_global_batch_size a multiple of world / (TP x PP x CP)",
                key=f"{T.P}.train_global_batch_size",
            )
        )
    if (w.prompts * w.n) % gbs:
        out.append(
            Finding(
                W,
                "BATCH_DIVISIBILITY",
                f"{w.prompts * w.n} responses per step are not a whole number of optimizer steps of {gbs}",
                "make num_prompts_per_step x num_generations_per_prompt a multiple of train_global_batch_size",
                key=f"{T.P}.train_global_batch_size",
            )
        )
    return out


def _tp_nodes(s, train, cluster, placement) -> list[Finding]:
    """A TP group (policy or vLLM) on two nodes: NeMo-RL runs it, with TP's all-reduces on the network."""
    from grpo_tune.core.rules import within_node
    from grpo_tune.core.placement import pools

    out = []
    if not within_node(s.layout.tp, train.gpus, train.gpus_per_node):
        out.append(
            Finding(
                W,
                "TP_MISMATCH",
                f"policy tensor_model_parallel_size={s.layout.tp} spans nodes of {train.gpus_per_node} GPUs",
                "Megatron all-reduces every layer's activations across TP: keep TP a divisor of the GPUs per node",
            )
        )
    gen = pools(cluster, placement.rollout_gpus).rollout if placement.separate else cluster
    if not within_node(s.rollout.rollout_tp, gen.gpus, gen.gpus_per_node):
        out.append(
            Finding(
                W,
                "TP_MISMATCH",
                f"vLLM tensor_parallel_size={s.rollout.rollout_tp} spans nodes of {gen.gpus_per_node} GPUs",
                "vLLM all-reduces every decoded token across TP: keep it a divisor of the GPUs per node",
            )
        )
    return out


def _memory(plan, findings: list[Finding], placement=None) -> MemorySummary | None:
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.costmodel.pools import estimate_separate

    try:
        if placement is not None and placement.separate:
            est = estimate_separate(
                model=plan.model,
                hardware=plan.hardware,
                cluster=plan.cluster,
                strategy=plan.strategy,
                workload=plan.workload,
                placement=placement,
            )
        else:
            est = estimate(
                model=plan.model,
                hardware=plan.hardware,
                cluster=plan.cluster,
                strategy=plan.strategy,
                workload=plan.workload,
            )
    except GrpoTuneError as exc:
        findings.append(Finding(I, "OOM_RISK", f"memory not estimated: [{exc.code}] {exc.message}"))
        return None
    for v in est.violations:
        if v.code == "OOM_RISK":
            findings.append(
                Finding(
                    E,
                    "OOM_RISK",
                    v.message,
                    _oom_hint(v.phase),
                    phase=v.phase,
                    bytes=None if v.bytes_over is None else int(v.bytes_over),
                )
            )
        elif v.code in CODES:
            findings.append(Finding(W, v.code, v.message, phase=v.phase))
    return {
        "capacity_bytes": int(est.capacity_bytes),
        "peak_phase": est.peak_phase,
        "peak_bytes": int(est.peak_bytes),
        "phases": {k: int(p.total_bytes) for k, p in est.memory.items()},
        "step_s": float(est.step_time_s) if hasattr(est, "step_time_s") else None,
    }


def _oom_hint(phase: str | None) -> str:
    if phase == "rollout":
        return f"lower {T.VLLM}.gpu_memory_utilization or raise {T.VLLM}.tensor_parallel_size"
    if phase == "update":
        return (
            f"lower {T.PACK}.train_mb_tokens (or train_micro_batch_size), set {T.MEG}.activation_checkpointing=true, "
            "or raise TP/PP"
        )
    return f"lower {T.PACK}.logprob_mb_tokens (or logprob_batch_size), or raise TP/PP"


def _summary(plan, r: R.Recipe, memory, placement=None, train=None) -> Summary:
    s, c, w = plan.strategy, plan.cluster, plan.workload
    sep = placement is not None and placement.separate
    gen_gpus = placement.rollout_gpus if sep else c.gpus
    deg = {
        "tp": s.layout.tp,
        "pp": s.layout.pp,
        "vpp": s.layout.vpp,
        "cp": s.layout.cp,
        "ep": s.layout.ep,
        "etp": s.layout.etp_,
        "dp": s.layout.dp,
    }
    return {
        "model": plan.model.name,
        "model_note": plan.model_note,
        "hardware": plan.hardware.name,
        "world_size": c.gpus,
        "nnodes": c.nnodes,
        "gpus_per_node": c.gpus_per_node,
        "dp": s.layout.dp,
        "roles": {
            "actor": dict(deg),
            "ref": dict(deg),
            "rollout": {
                "tp": s.rollout.rollout_tp,
                "pp": 1,
                "replicas": gen_gpus // s.rollout.rollout_tp,
                "gpu_memory_utilization": s.rollout.gpu_memory_utilization,
                "name": f"vllm ({gen_gpus} GPUs of its own, staleness {placement.staleness})"
                if sep
                else "vllm (colocated)",
            },
        },
        "batch": {
            "num_prompts_per_step": w.prompts,
            "num_generations_per_prompt": w.n,
            "train_global_batch_size": w.mini_batch * w.n,
            "train_micro_batch_size": s.batching.mbs,
            "logprob_batch_size": s.batching.log_prob_mbs_,
            "train_mb_tokens": s.batching.max_tokens_per_gpu,
            "logprob_mb_tokens": s.batching.log_prob_max_tokens_per_gpu or s.batching.max_tokens_per_gpu,
            "max_total_sequence_length": w.prompt_len + w.response_len,
        },
        "memory": memory,
        "framework": f"NeMo-RL {snap.RELEASE}",
        "defaults": r.parents,
        **({"placement": _placement(placement, c, train), "train_gpus": train.gpus if train else None} if sep else {}),
    }


def _placement(placement, c, train) -> dict[str, object]:
    """The separate pools as the summary shows them: each pool's GPUs and GPUs per node, NeMo-RL's schedule."""
    one_node = c.nnodes == 1
    return {
        **placement.to_dict(),
        "rollout_gpus_per_node": placement.rollout_gpus if one_node else c.gpus_per_node,
        "train_gpus": train.gpus if train else c.gpus - placement.rollout_gpus,
        "train_gpus_per_node": train.gpus_per_node if train else c.gpus_per_node,
        "shared_nodes": one_node,
        "trainer": "NeMo-RL async GRPO" if placement.staleness > 0 else "NeMo-RL GRPO, non-colocated",
    }


def diagnose_recipe(
    path: str | Path, overrides: Sequence[str] = (), *, hardware: str | None = None, model: str | None = None
) -> Report:
    r = R.load(path, list(overrides))
    from grpo_tune.core import bounds

    bounds.check_keys(dict(r.resolved).items(), where=str(path))  # held to the bounds tune holds it to
    findings = [
        Finding(
            W,
            "BAD_CONFIG",
            f"line {line}: key {k!r} appears twice in its mapping; YAML keeps the last one",
            "remove one of them",
            line=line,
        )
        for k, line in r.duplicates
    ]
    findings += _unknown_keys(r)
    findings += _nemo_rules(r)
    from grpo_tune.frameworks.nemo_rl import async_checks

    for sev, msg, hint in async_checks.check(snap.unflatten(dict(r.resolved))):  # NeMo-RL's own async checks
        findings.append(Finding(E if sev == "error" else W, "BAD_CONFIG", msg, hint))
    report = Report(source=str(path), kind="nemo_rl_recipe", findings=findings)
    for msg, hint in read.unsupported(r):
        findings.append(Finding(E, "TRAINER_UNSUPPORTED", msg, hint))
    if any(f.code == "TRAINER_UNSUPPORTED" for f in findings):
        report.summary = {"framework": f"NeMo-RL {snap.RELEASE}", "defaults": r.parents}
        return report
    placement = T.read_placement(r.get)
    try:
        m, note = read.resolve_model(r, model)
        c = read.cluster_of(r)
        if placement.separate:
            why = T.placement_problem(placement, c)
            if why:
                findings.append(Finding(E, "BAD_CONFIG", f"NeMo-RL cannot run this placement: {why}"))
        tc = read.train_cluster(r, c)
        wl = read.workload_of(r)
        s = read.strategy_of(r, m, tc.gpus, tc.gpus_per_node)
    except InvalidDegreesError as exc:
        message, hint = TERMS.say(exc.message, exc.hint)  # the role, and hints in NeMo-RL's keys
        findings.append(Finding(E, "INVALID_DEGREES", message, hint))
        report.summary = {"framework": f"NeMo-RL {snap.RELEASE}", "defaults": r.parents}
        return report
    except GrpoTuneError as exc:
        findings.append(Finding(E, exc.code if exc.code in CODES else "BAD_CONFIG", exc.message, exc.hint))
        report.summary = {"framework": f"NeMo-RL {snap.RELEASE}", "defaults": r.parents}
        return report
    from grpo_tune.frameworks.base.plan import LaunchPlan

    hw = load_hardware(hardware or "h100", stack=read.STACK)
    plan = LaunchPlan(launch=None, model=m, model_note=note, hardware=hw, cluster=c, strategy=s, workload=wl)
    findings += _batches(plan, tc)
    findings += _tp_nodes(s, tc, c, placement)
    bad = any(f.severity == E and f.code in ("BAD_CONFIG", "BATCH_DIVISIBILITY") for f in findings)
    memory = None if bad else _memory(plan, findings, placement)
    report.summary = _summary(plan, r, memory, placement, tc)
    return report
