"""The two-way table between a grpo-tune plan and NeMo-RL's GRPO config keys (its Megatron-Core path).

As for verl (frameworks/verl/table.py), each plan field is one :class:`Row`: the dotted NeMo-RL keys it writes
(export: plan -> recipe) and how it is read back (diagnose/tune: recipe -> plan). The key names are NeMo-RL
v0.7.0's (``data/nemo-rl-0.7.0-keys.json``, from ``examples/configs/grpo_math_1B.yaml`` and the TypedDicts
of ``nemo_rl/models/policy/__init__.py``); how NeMo-RL uses them is cited per row from v0.7.0's source.

What NeMo-RL cannot express (:data:`CONSTRAINTS`), and so what the search is pinned to when it plans for
NeMo-RL:

- no virtual pipeline: ``megatron_cfg`` has no ``virtual_pipeline_model_parallel_size`` (vpp = 1);
- full recompute is every layer: ``nemo_rl/models/megatron/setup.py`` sets ``recompute_method="uniform"``,
  ``recompute_num_layers=1`` (no partial recompute);
- the CPU optimizer is all or nothing: ``_validate_optimizer_config`` asserts ``optimizer_offload_fraction
  == 1.0`` when ``optimizer_cpu_offload`` is on; Megatron's overlapped D2H/H2D has no key;
- colocated generation moves the policy off the GPU around generation (``offload_before_refit`` /
  ``offload_after_refit`` in ``grpo.py``): weights, gradients and optimizer, so the plan's offload is all
  three when colocated; vLLM always runs with ``enable_sleep_mode=True`` (``vllm_worker.py``);
- one update epoch per step (GRPO in NeMo-RL has no PPO epochs).

Round trip: ``read_sections(write_sections(s)) == canonical(s)``; ``canonical`` folds the constraints above
and what NeMo-RL cannot tell apart (a log-prob micro-batch or token cap equal to the update's is the
default; a dense model's expert TP is its TP).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from grpo_tune.core.config import TrainerOptions, cluster_of, trainer_options
from grpo_tune.frameworks.base.inputs import as_int, as_names
from grpo_tune.frameworks.base.sections import C, Get, Row, S, Sections, T, W
from grpo_tune.frameworks.base.sections import none, read_rows, section_value, write_rows
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.core.placement import Placement

P = "policy"
MEG = f"{P}.megatron_cfg"
OPT = f"{MEG}.optimizer"
DDP = f"{MEG}.distributed_data_parallel_config"
GEN = f"{P}.generation"
VLLM = f"{GEN}.vllm_cfg"
VKW = f"{GEN}.vllm_kwargs"
PACK = f"{P}.sequence_packing"
DYN = f"{P}.dynamic_batching"
GRPO = "grpo"
LOSS = "loss_fn"

PRECISION = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DTYPE_FROM = {v: k for k, v in PRECISION.items()}
ALL_OFFLOAD = ("param", "grad", "optimizer")


def same(section: str, name: str, key: str, *, attr: str = "") -> Row:
    return Row(section, name, (key,), lambda p: {key: section_value(p, section, attr or name)}, lambda get: get(key))


def _recompute_write(p: Sections) -> dict[str, object]:
    r = p[S].memory.recompute
    if r == "none":
        return {f"{MEG}.activation_checkpointing": False}
    out: dict[str, object] = {f"{MEG}.activation_checkpointing": True, f"{MEG}.recompute_granularity": r}
    if r == "selective":
        out[f"{MEG}.recompute_modules"] = ["core_attn"]
    return out


def _recompute_read(get: Get) -> str:
    if get(f"{MEG}.activation_checkpointing") is not True:
        return "none"
    g = get(f"{MEG}.recompute_granularity") or "full"  # setup.py: .get("recompute_granularity", "full")
    return g if g in ("full", "selective") else "full"


def _stage_write(which: str) -> Callable[[Sections], dict[str, object]]:
    return lambda p: {f"{MEG}.num_layers_in_{which}_pipeline_stage": p[S].knob(f"{which}_stage_layers")}


def _pack_write(p: Sections) -> dict[str, object]:
    s = p[S]
    n = s.batching.max_tokens_per_gpu
    # Megatron in NeMo-RL packs sequences (dynamic batching is off: grpo_math_1B_megatron.yaml, "incompatible
    # with Pipeline parallelism"); the token caps are the packed micro-batches' sizes per GPU.
    out: dict[str, object] = {f"{DYN}.enabled": False, f"{PACK}.enabled": n is not None}
    if n is not None:
        out[f"{PACK}.train_mb_tokens"] = n
        out[f"{PACK}.logprob_mb_tokens"] = s.batching.log_prob_max_tokens_per_gpu or n
    return out


def _caps(get: Get) -> tuple[object, object]:
    for sec in (PACK, DYN):
        if get(f"{sec}.enabled") is True:
            t = get(f"{sec}.train_mb_tokens")
            lp = get(f"{sec}.logprob_mb_tokens")
            return t, (None if lp == t else lp)
    return None, None


def _cpu_write(p: Sections) -> dict[str, object]:
    f = p[S].memory.cpu_optimizer
    return {f"{OPT}.optimizer_cpu_offload": f is not None, f"{OPT}.optimizer_offload_fraction": float(f or 0.0)}


def _cpu_read(get: Get) -> float | None:
    if get(f"{OPT}.optimizer_cpu_offload") is not True:
        return None
    f = get(f"{OPT}.optimizer_offload_fraction")
    return float(f) if isinstance(f, (int, float)) and not isinstance(f, bool) else 1.0


def _offload_read(get: Get) -> tuple[str, ...]:
    # separate generation: the training pool keeps its state (nothing to make room for)
    return ALL_OFFLOAD if get(f"{GEN}.colocated.enabled") is not False else ()


def _lp_mbs_read(get: Get) -> object:
    n = get(f"{P}.logprob_batch_size")
    return None if n is None or n == get(f"{P}.train_micro_batch_size") else n


def _bucket_write(p: Sections) -> dict[str, object]:
    return {f"{P}.refit_buffer_size_gb": p[S].rollout.sync_bucket_mb / 1024}


def _number(v: object) -> float:
    """``float(v)`` of a recipe value: a number or a numeric string; else the TypeError ``float`` raises."""
    if isinstance(v, (int, float, str)):
        return float(v)
    raise TypeError(f"float() argument must be a string or a real number, not {type(v).__name__!r}")


def _bucket_read(get: Get) -> int | None:
    gb = get(f"{P}.refit_buffer_size_gb")
    return None if gb is None else int(round(_number(gb) * 1024))


def _lens_write(p: Sections) -> dict[str, object]:
    w = p[W]
    total = w.prompt_len + w.response_len
    return {
        f"{P}.max_total_sequence_length": total,
        "data.max_input_seq_length": w.prompt_len,
        f"{GEN}.max_new_tokens": w.response_len,
        f"{VLLM}.max_model_len": total,
    }


PROMPT_LEN_ASSUMED = 256
"""Prompt cap assumed when a recipe leaves ``data.max_input_seq_length`` at the total sequence length (its
default, ``${policy.max_total_sequence_length}``): NeMo-RL then bounds only prompt + response. 256 is what
profiles/data/published_grpo.csv assumes for the base config's data (OpenMathInstruct-2 with its cot prompt)."""


def _total(get: Get) -> int | None:
    t, m = get(f"{P}.max_total_sequence_length"), get(f"{VLLM}.max_model_len")
    vals = [v for v in (t, m) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return min(vals) if vals else None  # vLLM stops a sequence at max_model_len


def prompt_assumed(get: Get) -> bool:
    """Whether the recipe leaves the prompt cap open (then :data:`PROMPT_LEN_ASSUMED` applies)."""
    p, total = get("data.max_input_seq_length"), _total(get)
    return not isinstance(p, int) or total is None or p >= total


def _prompt_read(get: Get) -> int | None:
    total = _total(get)
    if total is None:
        return None
    if prompt_assumed(get):
        return min(PROMPT_LEN_ASSUMED, max(1, total // 2))
    cap = get("data.max_input_seq_length")
    return cap if isinstance(cap, int) else None  # an int below the total (prompt_assumed checked it)


def _response_read(get: Get) -> int | None:
    total, p, new = _total(get), _prompt_read(get), get(f"{GEN}.max_new_tokens")
    if total is None or p is None:
        return None
    room = total - p
    return min(new, room) if isinstance(new, int) and new > 0 else room


_FP8_KEYS = (f"{MEG}.fp8_cfg.enabled", f"{MEG}.fp8_cfg.fp8", f"{MEG}.fp8_cfg.fp8_recipe")
_IS_KEY = f"{LOSS}.use_importance_sampling_correction"


def _train_fp8_write(p: Sections) -> dict[str, object]:
    """NeMo-RL's Megatron FP8 (policy.megatron_cfg.fp8_cfg: e4m3, blockwise, as its FP8 recipes run it)."""
    if p[S].precision.precision != "fp8":
        return {}
    return dict(zip(_FP8_KEYS, (True, "e4m3", "blockwise")))


def _train_fp8_read(get: Get) -> str:
    return "fp8" if get(_FP8_KEYS[0]) is True else "bf16"


def _rollout_fp8_write(p: Sections) -> dict[str, object]:
    """FP8 generation (``vllm_cfg.precision: fp8``); with bf16 training, NeMo-RL's importance-sampling correction of
    the sampler's policy (``loss_fn.use_importance_sampling_correction``)."""
    prec = p[S].precision
    if prec.rollout_precision != "fp8":
        return {}
    return {f"{VLLM}.precision": "fp8", **({_IS_KEY: True} if prec.off_policy_fp8 else {})}


def _rollout_fp8_read(get: Get) -> str:
    return "fp8" if str(get(f"{VLLM}.precision") or "").lower() == "fp8" else "bf16"


def _gbs_write(p: Sections) -> dict[str, object]:
    w = p[W]
    return {f"{P}.train_global_batch_size": w.mini_batch * w.n}


def _mini_read(get: Get) -> int | None:
    g, n = get(f"{P}.train_global_batch_size"), get(f"{GRPO}.num_generations_per_prompt")
    if isinstance(g, int) and isinstance(n, int) and n > 0:
        return max(1, g // n)
    return None


def _kl_write(p: Sections) -> dict[str, object]:
    return {f"{LOSS}.reference_policy_kl_penalty": p[T].kl_coef if p[W].kl else 0.0}


def _kl_read(get: Get) -> bool:
    v = get(f"{LOSS}.reference_policy_kl_penalty")
    return isinstance(v, (int, float)) and v > 0  # grpo.py: init_reference_model = penalty > 0


def _kl_coef_read(get: Get) -> float:
    v = get(f"{LOSS}.reference_policy_kl_penalty")
    return float(v) if isinstance(v, (int, float)) and v > 0 else TrainerOptions().kl_coef


def _clip_high_write(p: Sections) -> dict[str, object]:
    t: TrainerOptions = p[T]
    return {f"{LOSS}.ratio_clip_max": t.clip_ratio if t.clip_ratio_high is None else t.clip_ratio_high}


def _clip_high_read(get: Get) -> object:
    hi = get(f"{LOSS}.ratio_clip_max")
    return None if hi == get(f"{LOSS}.ratio_clip_min") else hi


def _dtype_read(get: Get) -> str:
    d = get(f"{P}.precision")
    return DTYPE_FROM.get(d, "bf16") if isinstance(d, str) else "bf16"


def _gpus_read(get: Get) -> int:
    """gpus_per_node x num_nodes (integers; anything else is the TypeError ``*`` raises)."""
    gpn, nodes = get("cluster.gpus_per_node"), get("cluster.num_nodes")
    if isinstance(gpn, int) and isinstance(nodes, int):
        return gpn * nodes
    raise TypeError(f"unsupported operand type(s) for *: {type(gpn).__name__!r} and {type(nodes).__name__!r}")


def _nodes_write(p: Sections) -> dict[str, object]:
    c: Cluster = p[C]
    return {"cluster.gpus_per_node": c.ranks_per_node, "cluster.num_nodes": c.nnodes}


ROWS: tuple[Row, ...] = (
    same(S, "tp", f"{MEG}.tensor_model_parallel_size"),
    same(S, "pp", f"{MEG}.pipeline_model_parallel_size"),
    none(S, "vpp", "NeMo-RL 0.7.0's megatron_cfg has no virtual pipeline size (always 1)"),
    same(S, "cp", f"{MEG}.context_parallel_size"),
    same(S, "ep", f"{MEG}.expert_model_parallel_size"),
    same(S, "etp", f"{MEG}.expert_tensor_parallel_size", attr="etp_"),
    none(S, "dp", "derived: world size / (tp x pp x cp)"),
    same(S, "mbs", f"{P}.train_micro_batch_size"),
    Row(
        S,
        "log_prob_mbs",
        (f"{P}.logprob_batch_size",),
        lambda p: {f"{P}.logprob_batch_size": p[S].batching.log_prob_mbs_},
        _lp_mbs_read,
    ),
    same(S, "sequence_parallel", f"{MEG}.sequence_parallel", attr="sp"),
    Row(
        S,
        "recompute",
        (f"{MEG}.activation_checkpointing", f"{MEG}.recompute_granularity", f"{MEG}.recompute_modules"),
        _recompute_write,
        _recompute_read,
    ),
    none(S, "recompute_layers", "NeMo-RL's full recompute is uniform over every layer (megatron/setup.py)"),
    none(S, "fused_kernels", "verl's fused linear cross-entropy; NeMo-RL materialises the logits (the plan's false)"),
    same(S, "distributed_optimizer", f"{OPT}.use_distributed_optimizer"),
    Row(S, "offload", (), None, _offload_read, "colocated generation offloads the policy around generation"),
    Row(
        S,
        "first_stage_layers",
        (f"{MEG}.num_layers_in_first_pipeline_stage",),
        _stage_write("first"),
        lambda get: get(f"{MEG}.num_layers_in_first_pipeline_stage"),
    ),
    Row(
        S,
        "last_stage_layers",
        (f"{MEG}.num_layers_in_last_pipeline_stage",),
        _stage_write("last"),
        lambda get: get(f"{MEG}.num_layers_in_last_pipeline_stage"),
    ),
    same(S, "rollout_tp", f"{VLLM}.tensor_parallel_size"),
    same(S, "gpu_memory_utilization", f"{VLLM}.gpu_memory_utilization"),
    Row(
        S,
        "max_tokens_per_gpu",
        (f"{DYN}.enabled", f"{PACK}.enabled", f"{PACK}.train_mb_tokens", f"{PACK}.logprob_mb_tokens"),
        _pack_write,
        lambda get: _caps(get)[0],
    ),
    Row(S, "log_prob_max_tokens_per_gpu", (), None, lambda get: _caps(get)[1], "written by max_tokens_per_gpu"),
    Row(
        S, "cpu_optimizer", (f"{OPT}.optimizer_cpu_offload", f"{OPT}.optimizer_offload_fraction"), _cpu_write, _cpu_read
    ),
    none(S, "overlap_cpu_optimizer", "NeMo-RL has no key for Megatron's overlapped CPU-optimizer copies"),
    same(S, "precision_aware_optimizer", f"{OPT}.use_precision_aware_optimizer"),
    same(S, "max_num_seqs", f"{VKW}.max_num_seqs"),
    same(S, "max_num_batched_tokens", f"{VKW}.max_num_batched_tokens"),
    same(S, "enforce_eager", f"{VLLM}.enforce_eager"),
    same(S, "chunked_prefill", f"{VKW}.enable_chunked_prefill"),
    none(S, "free_cache_engine", "NeMo-RL's vLLM always sleeps between generations (enable_sleep_mode=True)"),
    Row(S, "sync_bucket_mb", (f"{P}.refit_buffer_size_gb",), _bucket_write, _bucket_read),
    none(S, "engine", "NeMo-RL 0.7.0 generates with vLLM here (its base config has no SGLang section)"),
    Row(S, "precision", _FP8_KEYS, _train_fp8_write, _train_fp8_read),
    Row(S, "rollout_precision", (f"{VLLM}.precision", _IS_KEY), _rollout_fp8_write, _rollout_fp8_read),
    Row(
        S,
        "kv_cache_dtype",
        (f"{VLLM}.kv_cache_dtype",),
        lambda p: {} if p[S].precision.kv_cache_dtype == "auto" else {f"{VLLM}.kv_cache_dtype": "fp8"},
        lambda get: "fp8" if str(get(f"{VLLM}.kv_cache_dtype") or "auto").startswith("fp8") else "auto",
    ),
    none(W, "kind", "NeMo-RL's GRPO"),
    same(W, "prompts", f"{GRPO}.num_prompts_per_step"),
    same(W, "n", f"{GRPO}.num_generations_per_prompt"),
    Row(
        W,
        "prompt_len",
        (
            f"{P}.max_total_sequence_length",
            "data.max_input_seq_length",
            f"{GEN}.max_new_tokens",
            f"{VLLM}.max_model_len",
        ),
        _lens_write,
        _prompt_read,
    ),
    Row(W, "response_len", (), None, _response_read, "written by prompt_len"),
    Row(W, "mini_batch", (f"{P}.train_global_batch_size",), _gbs_write, _mini_read),
    none(W, "ppo_epochs", "one update epoch per GRPO step in NeMo-RL"),
    Row(W, "kl", (f"{LOSS}.reference_policy_kl_penalty",), _kl_write, _kl_read),
    Row(
        W,
        "dtype",
        (f"{P}.precision",),
        lambda p: {f"{P}.precision": PRECISION[p[W].dtype]},
        _dtype_read,
    ),
    same(T, "steps", f"{GRPO}.max_num_steps"),
    same(T, "seed", f"{GRPO}.seed"),
    same(T, "lr", f"{OPT}.lr"),
    same(T, "weight_decay", f"{OPT}.weight_decay"),
    same(T, "grad_clip", f"{OPT}.clip_grad"),
    same(T, "temperature", f"{GEN}.temperature"),
    same(T, "top_p", f"{GEN}.top_p"),
    same(T, "clip_ratio", f"{LOSS}.ratio_clip_min"),
    Row(T, "clip_ratio_high", (f"{LOSS}.ratio_clip_max",), _clip_high_write, _clip_high_read),
    Row(T, "kl_coef", (), None, _kl_coef_read, "written by the workload's kl row"),
    *(
        none(W, f, why)
        for f, why in (
            ("prompt_len_mean", "a statistic of the dataset, not a setting"),
            ("entropy", "NeMo-RL's GRPO loss has no entropy term: the plan prices none (workload.entropy false)"),
            ("response_len_mean", "a statistic of the policy's answers, not a setting"),
            ("response_len_quantiles", "a measured length histogram, not a setting"),
            ("lengths_source", "provenance of the length statistics"),
            ("seq_len", "pretraining only"),
            ("gbs", "pretraining only"),
        )
    ),
    *(
        none(T, f, why)
        for f, why in (
            ("dataset", "NeMo-RL's data section is the user's (the base config's OpenMathInstruct-2 stays)"),
            ("reward", "NeMo-RL's env section is the user's (the base config's math environment stays)"),
            ("hf_checkpoint", "NeMo-RL loads policy.model_name"),
            ("out_dir", "NeMo-RL writes under logger.log_dir and checkpointing.checkpoint_dir"),
            ("checkpoint_every", "checkpointing.save_period is left to the user"),
            ("log_every", "NeMo-RL logs every step"),
            ("tensorboard", "NeMo-RL's logger section is the user's (logger.tensorboard_enabled)"),
            ("wandb_project", "NeMo-RL's logger section is the user's (logger.wandb)"),
            ("rollout_engine", "the recipe's generation backend is vLLM (fixed)"),
            ("loss_agg_mode", "not priced; NeMo-RL's loss_fn.token_level_loss is left as the base config has it"),
            ("kl_type", "not priced; NeMo-RL names its estimators k1/k2/k3 (loss_fn.reference_policy_kl_type)"),
            ("entropy_coef", "NeMo-RL's GRPO loss has no entropy bonus"),
            ("norm_adv_by_std", "not priced; grpo.normalize_rewards is left as the base config has it"),
            ("moe_aux_loss_coeff", "not priced; NeMo-RL disables router load balancing for GRPO by default"),
            ("moe_router_load_balancing_type", "not priced; megatron_cfg.moe_router_load_balancing_type stays 'none'"),
        )
    ),
    Row(
        C,
        "gpus_per_node",
        ("cluster.gpus_per_node", "cluster.num_nodes"),
        _nodes_write,
        lambda get: get("cluster.gpus_per_node"),
    ),
    Row(
        C,
        "gpus",
        (),
        None,
        _gpus_read,
        "gpus_per_node x num_nodes",
    ),
)

# Settings grpo-tune always writes (not plan fields): the Megatron path, the vLLM engine, bf16 gradient
# reduction as priced through the stack. The placement's keys come from write_placement below.
FIXED: dict[str, Any] = {
    f"{P}.dtensor_cfg.enabled": False,
    f"{MEG}.enabled": True,
    f"{P}.optimizer": None,  # the performance recipes drop the DTensor optimizer and scheduler
    f"{P}.scheduler": None,
    f"{P}.make_sequence_length_divisible_by": "${policy.megatron_cfg.tensor_model_parallel_size}",
    f"{DDP}.grad_reduce_in_fp32": False,
    f"{GEN}.backend": "vllm",
}

CONSTRAINTS: dict[str, Any] = {
    "vpp": 1,
    "recompute_layers": None,
    "overlap_cpu_optimizer": False,
    "free_cache_engine": True,
    "offload": ALL_OFFLOAD,
}
"""Strategy fields NeMo-RL fixes (colocated)."""

SEARCH_PINS: dict[str, Any] = {**CONSTRAINTS, "cpu_optimizer": None}
"""What the search is pinned to when it plans for NeMo-RL: :data:`CONSTRAINTS`, and no CPU optimizer (the
search prices Megatron's CPU optimizer with overlapped copies, as verl runs it; NeMo-RL has no key for the
overlap). A NeMo-RL recipe that sets ``optimizer_cpu_offload`` is still read and priced as it runs."""


def rows(section: str | None = None) -> tuple[Row, ...]:
    return tuple(r for r in ROWS if section is None or r.section == section)


def write_sections(sections: Sections) -> dict[str, object]:
    return write_rows(ROWS, sections)


def read_fields(get: Get, section: str) -> dict[str, object]:
    return read_rows(ROWS, get, section)


def read_sections(get: Get) -> Sections:
    c = read_fields(get, C)
    s = read_fields(get, S)
    s = {k: v for k, v in s.items() if v is not None or k in ("first_stage_layers", "last_stage_layers")}
    s["dp"] = as_int(c["gpus"], "gpus") // (as_int(s["tp"], "tp") * as_int(s["pp"], "pp") * as_int(s["cp"], "cp"))
    s["offload"] = list(as_names(s["offload"], "offload"))
    s["free_cache_engine"] = True
    w = read_fields(get, W)
    t = read_fields(get, T)
    return {
        S: Strategy.from_dict(s),
        W: Workload.from_dict({k: v for k, v in w.items() if v is not None}),
        T: trainer_options(t),
        C: cluster_of(c),
    }


def canonical(sections: Sections, *, model_is_moe: bool = True) -> Sections:
    """The sections as NeMo-RL (colocated) can express them; ``read_sections(write_sections(p)) == canonical(p)``."""
    s: Strategy = sections[S]
    w: Workload = sections[W]
    t: TrainerOptions = sections[T]
    c: Cluster = sections[C]
    lp = s.batching.log_prob_max_tokens_per_gpu
    if s.batching.max_tokens_per_gpu is None or lp == s.batching.max_tokens_per_gpu:
        lp = None
    s = s.replace(
        etp=s.layout.etp_,
        sequence_parallel=s.layout.sp,
        dp=c.gpus // s.layout.model_parallel,
        log_prob_max_tokens_per_gpu=lp,
        log_prob_mbs=None if s.batching.log_prob_mbs == s.batching.mbs else s.batching.log_prob_mbs,
        cpu_optimizer=None if s.memory.cpu_optimizer is None else s.memory.cpu_optimizer,
        **CONSTRAINTS,
    )
    keep_w = {r.field for r in rows(W) if r.read is not None}
    w = Workload(**{k: v for k, v in dataclasses.asdict(w).items() if k in keep_w})
    keep_t = {r.field for r in rows(T) if r.read is not None}
    t = TrainerOptions(**{k: v for k, v in dataclasses.asdict(t).items() if k in keep_t})
    if t.clip_ratio_high == t.clip_ratio:
        t = dataclasses.replace(t, clip_ratio_high=None)
    if not w.kl:
        t = dataclasses.replace(t, kl_coef=TrainerOptions().kl_coef)
    c = Cluster(gpus=c.gpus, gpus_per_node=c.ranks_per_node)
    return {S: s, W: w, T: t, C: c}


# ---------------------------------------------------------------------------------------------
# Placement: colocated generation, or a separate generation pool (NeMo-RL's non-colocated mode)
# ---------------------------------------------------------------------------------------------

COLOC = f"{GEN}.colocated"
ASYNC = f"{GRPO}.async_grpo"
PLACEMENT_KEYS = (
    f"{COLOC}.enabled",
    f"{COLOC}.resources.gpus_per_node",
    f"{COLOC}.resources.num_nodes",
    f"{ASYNC}.enabled",
    f"{ASYNC}.max_trajectory_age_steps",
    f"{ASYNC}.in_flight_weight_updates",
    f"{LOSS}.use_importance_sampling_correction",
    f"{VLLM}.async_engine",
)


def placement_problem(placement: Placement, cluster: Cluster) -> str | None:
    """Why NeMo-RL 0.7.0 cannot run this placement (None: it can). ``grpo.py`` setup: on one node the
    generation pool is ``resources.gpus_per_node`` GPUs of it; on more nodes it is ``resources.num_nodes``
    whole nodes. Partial rollout is ``grpo.async_grpo.in_flight_weight_updates`` (:func:`write_placement`)."""
    if not placement.separate:
        return None
    if placement.rollout_hardware:
        return "a generation pool of another GPU type is not one NeMo-RL cluster"
    if not placement.recompute_logprobs:
        return "NeMo-RL recomputes the previous log-probs on the training pool (no key takes the rollout's)"
    if placement.sync_interval != 1:
        return "NeMo-RL refits the generation pool after every step (sync interval 1)"
    g, gpn = placement.rollout_gpus, cluster.gpus_per_node
    if cluster.nnodes > 1 and g % gpn:
        return f"on {cluster.nnodes} nodes NeMo-RL's generation pool is whole nodes ({gpn} GPUs each), not {g} GPUs"
    return None


def write_placement(placement: Placement, cluster: Cluster) -> dict[str, object]:
    """NeMo-RL keys for the plan's placement (colocated, or the generation pool and its staleness)."""
    if not placement.separate:
        return {f"{COLOC}.enabled": True, f"{ASYNC}.enabled": False}
    why = placement_problem(placement, cluster)
    if why:
        from grpo_tune.core.errors import ConfigError

        raise ConfigError(f"NeMo-RL cannot run this placement: {why}", hint="plan colocated, or another split")
    g, gpn = placement.rollout_gpus, cluster.ranks_per_node
    one_node = cluster.nnodes == 1
    out: dict[str, object] = {
        f"{COLOC}.enabled": False,
        f"{COLOC}.resources.gpus_per_node": g if one_node else gpn,
        f"{COLOC}.resources.num_nodes": 1 if one_node else g // gpn,
        f"{ASYNC}.enabled": placement.staleness > 0,
    }
    if placement.staleness > 0:
        out[f"{ASYNC}.max_trajectory_age_steps"] = placement.staleness
        # partial rollout: the refit does not wait for pending generations, which finish under the new weights with
        # their KV caches (nemo_rl/algorithms/async_utils/trajectory_collector.py prepare_for_refit, v0.7.0; it
        # takes effect with the async engine, set below); recompute_kv_cache_after_weight_updates stays false
        out[f"{ASYNC}.in_flight_weight_updates"] = placement.partial_rollout
        # grpo_math_1B.yaml: "Async GRPO requires importance sampling correction enabled"
        out[f"{LOSS}.use_importance_sampling_correction"] = True
        # async_grpo_train asserts an async engine (nemo_rl/algorithms/grpo.py, v0.7.0; async_checks.py)
        out[f"{VLLM}.async_engine"] = True
    return out


def read_placement(get: Get) -> Placement:
    """The Placement a recipe runs."""
    from grpo_tune.core.placement import Placement

    if get(f"{COLOC}.enabled") is not False:
        return Placement()
    gpn, nodes = get("cluster.gpus_per_node"), get("cluster.num_nodes")
    r_gpn, r_nodes = get(f"{COLOC}.resources.gpus_per_node"), get(f"{COLOC}.resources.num_nodes")
    if nodes == 1:
        g = r_gpn if isinstance(r_gpn, int) else 0
    else:
        g = (r_nodes if isinstance(r_nodes, int) else 0) * (gpn if isinstance(gpn, int) else 0)
    age = get(f"{ASYNC}.max_trajectory_age_steps") if get(f"{ASYNC}.enabled") is True else 0
    age = age or 0
    if not isinstance(age, (int, float, str)):
        raise TypeError(
            f"int() argument must be a string, a bytes-like object or a real number, not {type(age).__name__!r}"
        )
    # in-flight weight updates (with the async engine, which async GRPO asserts): a refit does not wait for pending
    # generations (trajectory_collector.py prepare_for_refit, v0.7.0), grpo-tune's partial rollout
    partial = int(age) >= 1 and get(f"{ASYNC}.in_flight_weight_updates") is True
    return Placement(mode="separate", rollout_gpus=g, staleness=int(age), partial_rollout=partial)
