"""The one two-way table between a grpo-tune plan and verl 0.9.1's Hydra overrides.

A plan is ``Strategy`` + ``Workload`` + ``TrainerOptions`` + the cluster. Each field is one :class:`Row`:
the verl keys it writes (export: plan -> overrides) and how it is read back from a key lookup
(diagnose: overrides -> plan). The key prefixes are spelled once, here. The rows come from three
tables: :data:`AS_IS` (fields verl takes as they are), :data:`NO_SETTING` (fields verl has no setting
for, and why: a statistic of the data, a pretraining-only field, ...) and :data:`CODED` (fields with
their own rule); :data:`ROWS` holds them in the dataclasses' field order, the order export writes.

Keys and defaults: verl 0.9.1's composed ``ppo_megatron_trainer`` (frameworks/verl/data/verl-0.9.1-keys.json);
the hybrid CPU optimizer keys are spelled as verl's examples spell them
(examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh in volcengine/verl).

Round trip: ``read_sections(write_sections(s)) == canonical(s)``, and ``canonical`` only folds what
verl cannot tell apart (verl's param_offload releases parameters and gradients together; a dense
model's expert TP is its TP; a log-prob token cap or micro-batch equal to the update's is the default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Callable

from grpo_tune import engines
from grpo_tune.core.config import TrainerOptions, cluster_of, trainer_options
from grpo_tune.frameworks.base.inputs import as_int, as_names
from grpo_tune.frameworks.base.sections import SECTIONS, C, Get, Row, S, Sections, T, W
from grpo_tune.frameworks.base.sections import none, read_rows, section_value, write_rows
from grpo_tune.core.strategy import Cluster, Strategy, Workload

ARO = "actor_rollout_ref"
DATA, TRAINER, ALGORITHM = "data", "trainer", "algorithm"
ACTOR = f"{ARO}.actor"
REF = f"{ARO}.ref"
ROLLOUT = f"{ARO}.rollout"
MEG = "megatron"
OTC = f"{ACTOR}.{MEG}.override_transformer_config"
REF_OTC = f"{REF}.{MEG}.override_transformer_config"
OPTIM = f"{ACTOR}.optim"
OOC = f"{OPTIM}.override_optimizer_config"
TRAINING_ROLES = (ACTOR, REF)
LOG_PROB_ROLES = (REF, ROLLOUT)

# verl's engine dtype names (engine/megatron.yaml: dtype ["bfloat16", "float16"]); fp32 has none.
VERL_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
DTYPE_FROM_VERL = {v: k for k, v in VERL_DTYPE.items()}


def same(section: str, name: str, *keys: str, attr: str = "", read: Callable[[Get], object] | None = None) -> Row:
    """The field's value (or the resolved property ``attr``: ``etp_``, ``sp``), written to every key (actor and
    reference degrees, ...); read from the first key, or by ``read``."""
    return Row(
        section,
        name,
        keys,
        lambda p: {k: section_value(p, section, attr or name) for k in keys},
        read or (lambda get: get(keys[0].lstrip("+"))),
    )


def flag(section: str, name: str, key: str) -> Row:
    """A boolean field on one key; anything but verl's ``True`` (unset, null) reads as off."""
    return same(section, name, key, read=lambda get: get(key.lstrip("+")) is True)


def optional(section: str, name: str, key: str) -> Row:
    """An undeclared (``+``) key written only when the field is set."""
    return Row(
        section,
        name,
        (key,),
        lambda p: {} if section_value(p, section, name) is None else {key: section_value(p, section, name)},
        lambda get: get(key.lstrip("+")),
    )


def _megs(name: str) -> tuple[str, ...]:
    return tuple(f"{r}.{MEG}.{name}" for r in TRAINING_ROLES)


# The keys of the coded rows (CODED below) that write more than one key.
_VPP_KEYS = _megs("virtual_pipeline_model_parallel_size")
_RECOMPUTE_KEYS = (f"{OTC}.recompute_granularity", f"{OTC}.recompute_modules")
_RECOMPUTE_LAYER_KEYS = (f"{OTC}.recompute_method", f"{OTC}.recompute_num_layers")
_DYN_KEYS = (
    f"{ACTOR}.use_dynamic_bsz",
    f"{ACTOR}.ppo_max_token_len_per_gpu",
    *(f"{r}.log_prob_use_dynamic_bsz" for r in LOG_PROB_ROLES),
)
_LP_TOKEN_KEYS = tuple(f"{r}.log_prob_max_token_len_per_gpu" for r in LOG_PROB_ROLES)
_LP_MBS_KEYS = tuple(f"{r}.log_prob_micro_batch_size_per_gpu" for r in LOG_PROB_ROLES)
_CPU_OPT_KEYS = (f"+{OOC}.optimizer_cpu_offload", f"+{OOC}.optimizer_offload_fraction")
_NODE_KEYS = (f"{TRAINER}.n_gpus_per_node", f"{TRAINER}.nnodes")
_GPUS_WHY = "n_gpus_per_node x nnodes (written by the gpus_per_node row)"


# --- strategy rows with more than one key ---------------------------------------------------


def _offload_write(p: Sections) -> dict[str, object]:
    off = set(p["strategy"].memory.offload)
    # verl 0.9.1 has no grad_offload: param_offload also releases the gradient buffers (engine/megatron.yaml)
    out: dict[str, object] = {k: bool({"param", "grad"} & off) for k in _megs("param_offload")}
    out[f"{ACTOR}.{MEG}.optimizer_offload"] = "optimizer" in off
    return out


def _offload_read(get: Get) -> tuple[str, ...]:
    off: tuple[str, ...] = ("param", "grad") if get(f"{ACTOR}.{MEG}.param_offload") is True else ()
    return off + (("optimizer",) if get(f"{ACTOR}.{MEG}.optimizer_offload") is True else ())


def _recompute_write(p: Sections) -> dict[str, object]:
    r = p["strategy"].memory.recompute
    if r == "selective":
        return {f"{OTC}.recompute_granularity": "selective", f"{OTC}.recompute_modules": ["core_attn"]}
    if r == "full":
        return {f"{OTC}.recompute_granularity": "full"}
    return {f"{OTC}.recompute_granularity": None}


def _recompute_read(get: Get) -> str:
    g = get(f"{OTC}.recompute_granularity")
    return g if g in ("selective", "full") else "none"


def _recompute_layers_write(p: Sections) -> dict[str, object]:
    s = p["strategy"]
    if s.memory.recompute != "full":
        return {}
    if s.memory.recompute_layers is None:  # uniform, 1 layer per chunk = every layer recomputed
        return {f"{OTC}.recompute_method": "uniform", f"{OTC}.recompute_num_layers": 1}
    return {f"{OTC}.recompute_method": "block", f"{OTC}.recompute_num_layers": s.memory.recompute_layers}


def _recompute_layers_read(get: Get) -> object:
    n = get(f"{OTC}.recompute_num_layers")
    if get(f"{OTC}.recompute_granularity") == "full" and get(f"{OTC}.recompute_method") == "block":
        return n
    return None


def _dyn_write(p: Sections) -> dict[str, object]:
    n = p["strategy"].batching.max_tokens_per_gpu
    out: dict[str, object] = {f"{ACTOR}.use_dynamic_bsz": n is not None}
    if n is not None:
        out[f"{ACTOR}.ppo_max_token_len_per_gpu"] = n
    # verl asserts the log-prob passes batch the same way as the update (workers/engine_workers.py l.616)
    out.update({f"{r}.log_prob_use_dynamic_bsz": n is not None for r in LOG_PROB_ROLES})
    return out


def _dyn_read(get: Get) -> object:
    return get(f"{ACTOR}.ppo_max_token_len_per_gpu") if get(f"{ACTOR}.use_dynamic_bsz") is True else None


def _lp_tokens_write(p: Sections) -> dict[str, object]:
    s = p["strategy"]
    if s.batching.max_tokens_per_gpu is None:
        return {}
    n = s.batching.log_prob_max_tokens_per_gpu or s.batching.max_tokens_per_gpu
    return {f"{r}.log_prob_max_token_len_per_gpu": n for r in LOG_PROB_ROLES}


def _lp_tokens_read(get: Get) -> object:
    if get(f"{ACTOR}.use_dynamic_bsz") is not True:
        return None
    n = get(f"{ROLLOUT}.log_prob_max_token_len_per_gpu")
    return None if n == get(f"{ACTOR}.ppo_max_token_len_per_gpu") else n


def _lp_mbs_write(p: Sections) -> dict[str, object]:
    # verl asserts both are set without dynamic batching (engine_workers.py l.636, utils/config.py)
    return {f"{r}.log_prob_micro_batch_size_per_gpu": p["strategy"].batching.log_prob_mbs_ for r in LOG_PROB_ROLES}


def _lp_mbs_read(get: Get) -> object:
    # the old log-prob pass (rollout key) is the one every step runs; the ref pass only with KL
    n = get(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu")
    return None if n == get(f"{ACTOR}.ppo_micro_batch_size_per_gpu") else n


def _cpu_opt_write(p: Sections) -> dict[str, object]:
    f = p["strategy"].memory.cpu_optimizer
    out: dict[str, object] = {f"+{OOC}.optimizer_cpu_offload": f is not None}
    if f is not None:
        out[f"+{OOC}.optimizer_offload_fraction"] = float(f)
    return out


def _cpu_opt_read(get: Get) -> object:
    if get(f"{OOC}.optimizer_cpu_offload") is not True:
        return None
    f = get(f"{OOC}.optimizer_offload_fraction")
    return 1.0 if f is None else f  # Megatron's OptimizerConfig default fraction


def _precision_aware_read(get: Get) -> bool:
    # verl also declares the first-class key actor.optim.use_precision_aware_optimizer
    return get(f"{OOC}.use_precision_aware_optimizer") is True or get(f"{OPTIM}.use_precision_aware_optimizer") is True


def _dtype_write(p: Sections) -> dict[str, object]:
    d = VERL_DTYPE.get(p["workload"].dtype)
    if d is None:  # fp32: verl's engine has no fp32; its default (bfloat16) stays (canonical() folds it)
        return {}
    return {**{k: d for k in _megs("dtype")}, f"{ROLLOUT}.dtype": d}


def _entropy_read(get: Get) -> bool:
    """verl computes the entropy in the update when actor.calculate_entropy is set or actor.entropy_coeff != 0
    (verl/trainer/ppo/ray_trainer.py _update_actor); the trainer option entropy_coef writes entropy_coeff."""
    coef = get(f"{ACTOR}.entropy_coeff")
    nonzero = isinstance(coef, (int, float)) and not isinstance(coef, bool) and coef != 0
    return get(f"{ACTOR}.calculate_entropy") is True or nonzero


_FP8_KEYS = (f"+{OTC}.fp8", f"+{OTC}.fp8_recipe")
FP8_FORMAT, FP8_RECIPE = "e4m3", "blockwise"
"""Megatron TransformerConfig ``fp8`` / ``fp8_recipe`` (megatron-core 0.16: fp8 in e4m3|hybrid, fp8_recipe in
delayed|tensorwise|mxfp8|blockwise), set through the actor's override_transformer_config (verl's reference reads
the actor's overrides: writing the reference's too is a Hydra error, "an item is already at ...")."""
_ROLLOUT_FP8_KEYS = (f"{ROLLOUT}.quantization", f"{ALGORITHM}.rollout_correction.rollout_is")
_KV_KEYS = tuple(engines.named(n).verl_kv_key() for n in ("vllm", "sglang"))


def _engine_write(p: Sections) -> dict[str, object]:
    return {f"{ROLLOUT}.name": engines.for_framework(p[S].rollout.engine).verl_name}


def _engine_read(get: Get) -> object:
    name = get(f"{ROLLOUT}.name")
    return name if name in ("vllm", "sglang") else "vllm"  # another engine is a diagnose finding (NOT_PRICED)


def _train_fp8_write(p: Sections) -> dict[str, object]:
    if p[S].precision.precision != "fp8":
        return {}
    return dict(zip(_FP8_KEYS, (FP8_FORMAT, FP8_RECIPE)))


def _train_fp8_read(get: Get) -> str:
    return "fp8" if get(_FP8_KEYS[0].lstrip("+")) in ("e4m3", "hybrid") else "bf16"


def _rollout_fp8_write(p: Sections) -> dict[str, object]:
    """FP8 rollout weights (verl 0.9.1 ``rollout.quantization=fp8``); with bf16 training the sampler's policy is
    off the trained one by the quantization error, so token-level importance sampling corrects it
    (``algorithm.rollout_correction.rollout_is=token``, verl's truncated IS at its default threshold 2.0)."""
    prec = p[S].precision
    if prec.rollout_precision != "fp8":
        return {}
    out: dict[str, object] = {_ROLLOUT_FP8_KEYS[0]: "fp8"}
    if prec.off_policy_fp8:
        out[_ROLLOUT_FP8_KEYS[1]] = "token"
    return out


def _rollout_fp8_read(get: Get) -> str:
    return "fp8" if get(_ROLLOUT_FP8_KEYS[0]) == "fp8" else "bf16"


def _kv_write(p: Sections) -> dict[str, object]:
    if p[S].precision.kv_cache_dtype == "auto":
        return {}
    eng = engines.for_framework(p[S].rollout.engine)
    return {eng.verl_kv_key(): eng.kv_value(p[S].precision.kv_cache_dtype)}


def _kv_read(get: Get) -> str:
    vals = {get(k.lstrip("+")) for k in _KV_KEYS}
    return "fp8" if vals & {"fp8", "fp8_e4m3", "fp8_e5m2"} else "auto"


def _gpn_write(p: Sections) -> dict[str, object]:
    c: Cluster = p["cluster"]
    return dict(zip(_NODE_KEYS, (c.ranks_per_node, c.nnodes)))


# Fields verl takes as they are: the value is written to every key and read back from the first (same()).
# The training degrees go to the actor and the reference alike, written out as verl's examples do.
AS_IS: dict[tuple[str, str], str | tuple[str, ...]] = {
    (S, "tp"): _megs("tensor_model_parallel_size"),
    (S, "pp"): _megs("pipeline_model_parallel_size"),
    (S, "cp"): _megs("context_parallel_size"),
    (S, "ep"): _megs("expert_model_parallel_size"),
    (S, "mbs"): f"{ACTOR}.ppo_micro_batch_size_per_gpu",
    (S, "distributed_optimizer"): f"{ACTOR}.{MEG}.use_distributed_optimizer",
    (S, "rollout_tp"): f"{ROLLOUT}.tensor_model_parallel_size",
    (S, "gpu_memory_utilization"): f"{ROLLOUT}.gpu_memory_utilization",
    (S, "max_num_seqs"): f"{ROLLOUT}.max_num_seqs",
    (S, "max_num_batched_tokens"): f"{ROLLOUT}.max_num_batched_tokens",
    (S, "enforce_eager"): f"{ROLLOUT}.enforce_eager",
    (S, "chunked_prefill"): f"{ROLLOUT}.enable_chunked_prefill",
    (S, "free_cache_engine"): f"{ROLLOUT}.free_cache_engine",
    (S, "sync_bucket_mb"): f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes",
    (S, "fused_kernels"): f"{ARO}.model.use_fused_kernels",
    (W, "prompts"): f"{DATA}.train_batch_size",
    (W, "n"): f"{ROLLOUT}.n",
    (W, "prompt_len"): f"{DATA}.max_prompt_length",
    (W, "response_len"): f"{DATA}.max_response_length",
    (W, "mini_batch"): f"{ACTOR}.ppo_mini_batch_size",
    (W, "ppo_epochs"): f"{ACTOR}.ppo_epochs",
    (W, "kl"): f"{ACTOR}.use_kl_loss",
    (T, "lr"): f"{OPTIM}.lr",
    (T, "weight_decay"): f"{OPTIM}.weight_decay",
    (T, "grad_clip"): f"{OPTIM}.clip_grad",
    (T, "seed"): f"{DATA}.seed",
    (T, "steps"): f"{TRAINER}.total_training_steps",
    (T, "temperature"): f"{ROLLOUT}.temperature",
    (T, "top_p"): f"{ROLLOUT}.top_p",
    (T, "clip_ratio"): f"{ACTOR}.clip_ratio",
    (T, "loss_agg_mode"): f"{ACTOR}.loss_agg_mode",
    (T, "kl_coef"): f"{ACTOR}.kl_loss_coef",
    (T, "kl_type"): f"{ACTOR}.kl_loss_type",
    (T, "entropy_coef"): f"{ACTOR}.entropy_coeff",
    (T, "norm_adv_by_std"): f"{ALGORITHM}.norm_adv_by_std_in_grpo",
    (T, "moe_aux_loss_coeff"): f"+{OTC}.moe_aux_loss_coeff",
    (T, "moe_router_load_balancing_type"): f"+{OTC}.moe_router_load_balancing_type",
}

# Fields verl has no setting for, and why.
NO_SETTING: dict[tuple[str, str], str] = {
    (S, "dp"): "derived: world size / (tp x pp x cp), as verl and Megatron derive it",
    (W, "kind"): "verl runs GRPO; the pretraining workload exists for the cost model only",
    (W, "prompt_len_mean"): "a statistic of the dataset, not a setting: verl reads the data",
    (W, "response_len_mean"): "a statistic of the policy's answers, not a setting",
    (W, "response_len_quantiles"): "a measured length histogram (--lengths), not a setting",
    (W, "lengths_source"): "where the length statistics came from: provenance, not a setting",
    (W, "seq_len"): "pretraining only",
    (W, "gbs"): "pretraining only",
    (T, "rollout_engine"): "grpo-tune's own trainer's sampler; verl's engine is the plan's engine (rollout.name)",
    (T, "dataset"): "verl.sh takes the data files from $TRAIN_FILES/$VAL_FILES",
    (T, "reward"): "verl picks the reward by data_source (verl/utils/reward_score)",
    (T, "hf_checkpoint"): "verl loads the model from actor_rollout_ref.model.path ($MODEL_PATH)",
    (T, "out_dir"): "verl writes under trainer.default_local_dir",
    (T, "checkpoint_every"): "verl's trainer.save_freq is left to the caller (verl.sh passes extra overrides on)",
    (T, "log_every"): "verl logs every step",
    (T, "tensorboard"): "verl's trainer.logger list is the caller's choice (verl.sh passes extra overrides on)",
    (T, "wandb_project"): "verl's trainer.project_name and trainer.logger are the caller's choice",
}


def _clip_high_write(p: Sections) -> dict[str, object]:
    t: TrainerOptions = p[T]
    return {f"{ACTOR}.clip_ratio_high": t.clip_ratio if t.clip_ratio_high is None else t.clip_ratio_high}


def _clip_high_read(get: Get) -> object:
    high = get(f"{ACTOR}.clip_ratio_high")
    return None if high == get(f"{ACTOR}.clip_ratio") else high


def _vpp_write(p: Sections) -> dict[str, object]:
    vpp = p[S].layout.vpp
    return {k: vpp if vpp > 1 else None for k in _VPP_KEYS}


_ETP_KEYS = _megs("expert_tensor_parallel_size")


def _etp_write(p: Sections) -> dict[str, object]:
    """Expert TP only where it means something: unset (a dense model's) is not written."""
    etp = p["strategy"].layout.etp
    return {} if etp is None else {k: etp for k in _ETP_KEYS}


def _dtype_read(get: Get) -> str:
    d = get(_megs("dtype")[0])
    return DTYPE_FROM_VERL.get(d, "bf16") if isinstance(d, str) else "bf16"


def _gpus_read(get: Get) -> int:
    """n_gpus_per_node x nnodes (integers; anything else is the TypeError ``*`` raises)."""
    gpn, nodes = get(_NODE_KEYS[0]), get(_NODE_KEYS[1])
    if isinstance(gpn, int) and isinstance(nodes, int):
        return gpn * nodes
    raise TypeError(f"unsupported operand type(s) for *: {type(gpn).__name__!r} and {type(nodes).__name__!r}")


# Fields with their own rule: a resolved property, a flag, a key written only when set, several fields' worth
# of keys (offload, recompute, dynamic batching, CPU optimizer), or a value verl spells differently.
CODED: tuple[Row, ...] = (
    Row(S, "vpp", _VPP_KEYS, _vpp_write, lambda get: get(_VPP_KEYS[0]) or 1),
    Row(S, "etp", _ETP_KEYS, _etp_write, lambda get: get(_ETP_KEYS[0])),
    Row(S, "log_prob_mbs", _LP_MBS_KEYS, _lp_mbs_write, _lp_mbs_read),
    same(S, "sequence_parallel", *_megs("sequence_parallel"), attr="sp"),
    Row(S, "recompute", _RECOMPUTE_KEYS, _recompute_write, _recompute_read),
    Row(S, "recompute_layers", _RECOMPUTE_LAYER_KEYS, _recompute_layers_write, _recompute_layers_read),
    Row(S, "offload", (*_megs("param_offload"), f"{ACTOR}.{MEG}.optimizer_offload"), _offload_write, _offload_read),
    optional(S, "first_stage_layers", f"+{OTC}.num_layers_in_first_pipeline_stage"),
    optional(S, "last_stage_layers", f"+{OTC}.num_layers_in_last_pipeline_stage"),
    Row(S, "max_tokens_per_gpu", _DYN_KEYS, _dyn_write, _dyn_read),
    Row(S, "log_prob_max_tokens_per_gpu", _LP_TOKEN_KEYS, _lp_tokens_write, _lp_tokens_read),
    Row(S, "cpu_optimizer", _CPU_OPT_KEYS, _cpu_opt_write, _cpu_opt_read),
    flag(S, "overlap_cpu_optimizer", f"+{OOC}.overlap_cpu_optimizer_d2h_h2d"),
    same(S, "precision_aware_optimizer", f"+{OOC}.use_precision_aware_optimizer", read=_precision_aware_read),
    Row(W, "dtype", (*_megs("dtype"), f"{ROLLOUT}.dtype"), _dtype_write, _dtype_read),
    Row(T, "clip_ratio_high", (f"{ACTOR}.clip_ratio_high",), _clip_high_write, _clip_high_read),
    # read only: verl computes the entropy in the update when entropy_coeff != 0 (the trainer option
    # entropy_coef writes the key); the cost model prices the logits' clone and saved softmax then
    same(W, "entropy", f"{ACTOR}.calculate_entropy", read=_entropy_read),
    Row(S, "engine", (f"{ROLLOUT}.name",), _engine_write, _engine_read),
    Row(S, "precision", _FP8_KEYS, _train_fp8_write, _train_fp8_read),
    Row(S, "rollout_precision", _ROLLOUT_FP8_KEYS, _rollout_fp8_write, _rollout_fp8_read),
    Row(S, "kv_cache_dtype", _KV_KEYS, _kv_write, _kv_read),
    Row(C, "gpus_per_node", _NODE_KEYS, _gpn_write, lambda get: get(_NODE_KEYS[0])),
    Row(C, "gpus", (), None, _gpus_read, _GPUS_WHY),
)


def _names(cls: type) -> list[str]:
    """A section's field names: a plan's knobs flat (core/knobs.py), any other section's dataclass fields."""
    return Strategy.knob_names() if cls is Strategy else [f.name for f in dataclasses.fields(cls)]


def _in_field_order(rows: list[Row]) -> tuple[Row, ...]:
    """The rows in the order of the sections' dataclass fields (the order write_sections writes the keys in)."""
    fields = [(sec, name) for sec, cls in SECTIONS.items() for name in _names(cls)]
    return tuple(sorted(rows, key=lambda r: fields.index((r.section, r.field))))


ROWS: tuple[Row, ...] = _in_field_order(
    [
        *(same(sec, name, *((keys,) if isinstance(keys, str) else keys)) for (sec, name), keys in AS_IS.items()),
        *(none(sec, name, why) for (sec, name), why in NO_SETTING.items()),
        *CODED,
    ]
)

# Settings grpo-tune always emits (not plan fields): GRPO itself, the data handling, the logger.
FIXED: dict[str, object] = {
    "algorithm.adv_estimator": "grpo",
    "algorithm.use_kl_in_reward": False,
    "data.filter_overlong_prompts": True,
    "data.truncation": "error",
    f"{ROLLOUT}.name": "vllm",  # the engine row writes the plan's engine here (same position in verl.sh)
    "trainer.critic_warmup": 0,
    "trainer.logger": ["console"],
    "trainer.project_name": "grpo_tune",
}


def rows(section: str | None = None) -> tuple[Row, ...]:
    return tuple(r for r in ROWS if section is None or r.section == section)


def write_sections(sections: Sections) -> dict[str, object]:
    """sections -> ordered {key (with ``+`` where verl's schema lacks it): Python value}."""
    return write_rows(ROWS, sections)


def read_fields(get: Get, section: str) -> dict[str, object]:
    """The section's fields that verl settings determine, read through ``get``."""
    return read_rows(ROWS, get, section)


def read_sections(get: Get) -> Sections:
    """overrides -> sections: every field with a verl setting from ``get``; the rest keep their defaults."""
    c = read_fields(get, C)
    s = read_fields(get, S)
    s["dp"] = as_int(c["gpus"], "gpus") // (as_int(s["tp"], "tp") * as_int(s["pp"], "pp") * as_int(s["cp"], "cp"))
    s["offload"] = list(as_names(s["offload"], "offload"))
    return {
        S: Strategy.from_dict(s),
        W: Workload.from_dict(read_fields(get, W)),
        T: trainer_options(read_fields(get, T)),
        C: cluster_of(c),
    }


def canonical(sections: Sections) -> Sections:
    """The sections as verl can express them (see the module docstring);
    ``read_sections(write_sections(p)) == canonical(p)``."""
    s: Strategy = sections[S]
    w: Workload = sections[W]
    t: TrainerOptions = sections[T]
    c: Cluster = sections[C]
    off = set(s.memory.offload)
    if off & {"param", "grad"}:
        off |= {"param", "grad"}
    lp = s.batching.log_prob_max_tokens_per_gpu
    if s.batching.max_tokens_per_gpu is None or lp == s.batching.max_tokens_per_gpu:
        lp = None
    s = s.replace(
        etp=s.layout.etp,  # unset (a dense model's) is not written, so it reads back unset
        sequence_parallel=s.layout.sp,
        dp=c.gpus // s.layout.model_parallel,
        offload=tuple(o for o in ("param", "grad", "optimizer") if o in off),
        recompute_layers=s.memory.recompute_layers if s.memory.recompute == "full" else None,
        log_prob_max_tokens_per_gpu=lp,
        log_prob_mbs=None if s.batching.log_prob_mbs == s.batching.mbs else s.batching.log_prob_mbs,
    )
    keep_w = {r.field for r in rows(W) if r.read is not None}
    w = Workload(**{k: v for k, v in dataclasses.asdict(w).items() if k in keep_w})
    if w.dtype not in VERL_DTYPE:
        w = dataclasses.replace(w, dtype="bf16")
    keep_t = {r.field for r in rows(T) if r.read is not None}
    t = TrainerOptions(**{k: v for k, v in dataclasses.asdict(t).items() if k in keep_t})
    if t.clip_ratio_high == t.clip_ratio:
        t = dataclasses.replace(t, clip_ratio_high=None)
    c = Cluster(gpus=c.gpus, gpus_per_node=c.ranks_per_node)
    return {S: s, W: w, T: t, C: c}


def format_value(v: object) -> str:
    """A Python value as a Hydra override value (``True``, ``null``, ``[a,b]``)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    return str(v)


def overrides(values: Mapping[str, object]) -> list[str]:
    return [f"{k}={format_value(v)}" for k, v in values.items()]


def pipeline_split(get: Get, layers: int, pp: int) -> dict[str, int]:
    """Megatron's ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``
    (megatron-core TransformerConfig; verl's Qwen3-235B example sets both): the embedding and the loss count as
    one layer each in the even split, so the first / last stage hold one decoder layer fewer. Returned as the
    explicit first / last stage sizes (``first_stage_layers`` / ``last_stage_layers``) the plan carries; empty
    when neither key is set, pp is 1, or the counted layers do not split evenly (megatron-core refuses that too,
    and the stage rule says so). The one reading: ``tune`` (read.py) and ``diagnose`` (rules_plan.py) use it."""
    emb = get(f"{OTC}.account_for_embedding_in_pipeline_split") is True
    loss = get(f"{OTC}.account_for_loss_in_pipeline_split") is True
    if pp <= 1 or not (emb or loss):
        return {}
    total = layers + int(emb) + int(loss)
    if total % pp:
        return {}
    per = total // pp
    out: dict[str, int] = {}
    if emb:
        out["first_stage_layers"] = per - 1
    if loss:
        out["last_stage_layers"] = per - 1
    return out
