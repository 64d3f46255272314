"""``grpo-tune validate --grpo``: the GRPO step against published runs (profiles/data/published_grpo.csv).

Each row is a run that verl or NeMo-RL published with its step time and, where given, the time of
each phase. The cost model prices the row's plan (its model, GPUs, degrees, lengths and engine
settings as the row states them, with the row's assumptions where the source is silent) and the
result is compared per step and per phase. Rows marked ``fit`` are the ones the Hopper RL
efficiency was fitted on (:func:`fit`); ``holdout`` rows never enter a fit; ``excluded`` rows
(FSDP2/DTensor backends, or runs that do not publish a setting the price needs) are printed and
not scored. The published step includes work the model does not price (reward, advantages,
data loading), which is part of the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import PROFILES_DIR, HardwareSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel.estimate import Estimate, estimate

from grpo_tune.validate.pretraining import read_records

GRPO_DATA_PATH = PROFILES_DIR / "data" / "published_grpo.csv"
PHASES = ("gen_s", "train_s", "old_lp_s", "ref_lp_s", "refit_s", "train_mfu")
"""Published figures besides the step: seconds per phase, and ``train_mfu``, the update's MFU as verl
reports it (perf/mfu/actor: verl's own FLOP count over the update time, world size and the GPU's
peak), which scores the update's speed where the step or the mean response length is not published."""
TOLERANCE_PCT = 12.0
"""Held-out step-time MAPE above which ``validate --grpo`` exits 1 (the target; the goal is 10%)."""

STATED_ERROR_PCT = 11.9
"""The model's stated error: the cross-validated step-time MAPE that ``validate --grpo`` prints for the shipped rows
(the fit redone without each configuration; a test keeps the two equal). The report calls plans closer than this
indistinguishable. (10.7 when it was one linearised Gauss-Newton step per left-out row.)"""

BAND_PCT = {"fitted": 12.1, "transferred": 12.1, "spec-only": 18.1}
"""Error band per class of hardware profile (``provenance``), as ``compare`` prints it: the cross-validated
step MAPE of the scored rows on profiles of that class (:func:`bands`; a test keeps the two equal).
``spec-only`` has no measured row: half again the transferred band, a stated assumption."""

_REQUIRED = ("id", "split", "framework", "backend", "source", "model", "hardware", "gpus", "step_s", "assumptions")
PLACEMENT_COLUMNS = ("placement", "rollout_gpus", "staleness")
"""Columns for separate-pool and asynchronous rows (``placement`` colocated|separate, the rollout
pool's GPUs, the staleness bound). This module prices colocated, on-policy rows only; a ``separate``
row is read and listed, and scored by the placement model where one prices it."""


@dataclass(frozen=True)
class GrpoRow:
    """One measurement row: the validated id and split, the published figures, and every column as read
    (``raw``: the plan, backend, source, lp_combined, ...)."""

    id: str
    split: str
    raw: dict[str, str]
    published: dict[str, float]
    """step_s and the published phases (seconds)."""


def load_grpo_rows(path: str | Path | None = None) -> list[GrpoRow]:
    path = Path(path) if path else GRPO_DATA_PATH
    records = read_records(path, _REQUIRED, "published GRPO runs")
    rows = []
    for raw in records:
        rid = (raw.get("id") or "").strip()
        if raw.get("split") not in ("scored", "excluded", "fit", "holdout"):
            raise ConfigError(f"{path}: row {rid}: split must be scored or excluded")
        if not (raw.get("source") or "").strip():
            raise ConfigError(f"{path}: row {rid} has no source")
        pub: dict[str, float] = {}
        for k in ("step_s", *PHASES):
            v = (raw.get(k) or "").strip()
            if v:
                try:
                    pub[k] = float(v)
                except ValueError:
                    raise ConfigError(f"{path}: row {rid}: {k} is not a number ({v!r})") from None
                if not (math.isfinite(pub[k]) and pub[k] > 0):  # inf passed `> 0`: an infinite error, MAPE inf
                    raise ConfigError(f"{path}: row {rid}: {k} must be a finite number > 0, got {v!r}")
        if not pub:
            raise ConfigError(f"{path}: row {rid} publishes no step_s and no phase time")
        for k in (c.strip() for c in (raw.get("calibrates") or "").split(",") if c.strip()):
            # a published figure that set one of the row's assumptions (the mean length a source does not
            # publish, solved from it): kept in the file, never scored, or the row would score itself
            if k not in pub:
                raise ConfigError(f"{path}: row {rid}: calibrates names {k!r}, which the row does not publish")
            del pub[k]
        if not pub:
            raise ConfigError(f"{path}: row {rid}: every published figure is in calibrates; nothing is left to score")
        rows.append(
            GrpoRow(
                id=rid,
                split=raw["split"],
                raw=dict(raw),
                published=pub,
            )
        )
    return rows


def _i(raw: dict[str, str], k: str) -> int | None:
    v = (raw.get(k) or "").strip()
    if not v:
        return None
    f = float(v)  # "8" and "8.0" are 8; inf, nan and 2.5 are the file's mistake (plan() codes the ValueError)
    if not (math.isfinite(f) and f == int(f)):
        raise ValueError(f"{k} = {v!r} is not an integer")
    return int(f)


def _ones(raw: dict[str, str], *keys: str) -> dict[str, Any]:
    """The columns ``keys`` as ints, an empty (or 0) cell read as 1."""
    return {k: _i(raw, k) or 1 for k in keys}


def plan(row: GrpoRow, hw: HardwareSpec | None = None) -> tuple[Any, HardwareSpec, Cluster, Strategy, Workload]:
    """The row's model, hardware, cluster, strategy and workload."""
    r = row.raw
    try:
        m = load_model(r["model"])
        hw = hw or _hw(row, None)
        gpus = _i(r, "gpus") or 0
        cluster = Cluster(gpus=gpus, gpus_per_node=_i(r, "gpus_per_node") or hw.gpus_per_node)
        off = tuple(o for o in (r.get("offload") or "").split(",") if o)
        cpu = (r.get("cpu_optimizer") or "").strip()
        s = Strategy.of(
            **_ones(r, "tp", "pp", "cp", "ep", "rollout_tp", "mbs"),
            etp=_i(r, "etp"),
            last_stage_layers=_i(r, "last_stage_layers"),
            gpu_memory_utilization=float(r.get("gpu_memory_utilization") or 0.6),
            recompute=r.get("recompute") or "selective",
            offload=off,
            max_tokens_per_gpu=_i(r, "max_tokens_per_gpu"),
            log_prob_max_tokens_per_gpu=_i(r, "log_prob_max_tokens_per_gpu"),
            cpu_optimizer=float(cpu) if cpu else None,
            overlap_cpu_optimizer=bool(cpu),
            precision_aware_optimizer=bool(cpu),
            enforce_eager=(r.get("enforce_eager") or "").lower() == "true",
            max_num_seqs=_i(r, "max_num_seqs") or 256,
            **({"sync_bucket_mb": _i(r, "sync_bucket_mb")} if _i(r, "sync_bucket_mb") else {}),
            **({"free_cache_engine": False} if _separate(row) else {}),
        )
        wl = Workload(
            **_ones(r, "prompts", "n", "mini_batch", "prompt_len", "response_len"),
            prompt_len_mean=_i(r, "prompt_len_mean"),
            response_len_mean=_i(r, "response_len_mean"),
            kl=(r.get("kl") or "").lower() == "true",
        )
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"published GRPO row {row.id}: bad value ({exc})") from None
    if r.get("backend") == "megatron":
        s, wl = _via_framework(row.id, r.get("framework") or "", m, cluster, s, wl, _placement(row))
    return m, hw, cluster, s, wl


_RECIPE_PLANS: dict[str, tuple[Strategy, Workload]] = {}


def _placement(row: GrpoRow) -> Placement:
    """The row's placement: colocated, or separate pools with its rollout GPUs and staleness."""
    if not _separate(row):
        return Placement()
    return Placement(
        mode="separate", rollout_gpus=_i(row.raw, "rollout_gpus") or 0, staleness=_i(row.raw, "staleness") or 0
    )


def _via_framework(
    row_id: str, framework: str, m: Any, cluster: Cluster, s: Strategy, wl: Workload, place: Placement | None = None
) -> tuple[Strategy, Workload]:
    """A row's plan as the file its framework's exporter writes for it reads back (NeMo-RL: nemo_rl.yaml, loaded
    as NeMo-RL loads it; :meth:`~grpo_tune.frameworks.base.Framework.round_trip`): the plan that is scored is
    the plan the file runs. Rows of a framework without a round trip keep their plan. Cached per row (the file
    does not depend on the fitted parameters)."""
    from grpo_tune.frameworks import REGISTRY

    fw = next((f for f in REGISTRY if f.name == framework), None)
    if fw is None or not fw.round_trips:
        return s, wl
    if row_id not in _RECIPE_PLANS:
        from grpo_tune.core.config import RunConfig, TrainerOptions
        from grpo_tune.core.strategy import validate

        hw0 = load_hardware("h100")
        place = place or Placement()
        train_gpus = cluster.gpus - (place.rollout_gpus if place.separate else 0)  # the training pool's layout
        s = validate(m, s, train_gpus, gpus_per_node=cluster.gpus_per_node, allow_cross_node_tp=True)
        cfg = RunConfig(
            model=m, hardware=hw0, cluster=cluster, strategy=s, workload=wl, trainer=TrainerOptions(), placement=place
        )
        _RECIPE_PLANS[row_id] = fw.round_trip(cfg, run_id=row_id)
    return _RECIPE_PLANS[row_id]


def _separate(row: GrpoRow) -> bool:
    return (row.raw.get("placement") or "").strip() == "separate"


def predict(row: GrpoRow, hw: HardwareSpec | None = None) -> tuple[dict[str, float], Estimate]:
    """Predicted seconds in the row's terms: step and each published phase (``hw``: the row's
    hardware under its stack, :func:`_hw`, unless given). A ``separate`` row is priced by
    :func:`costmodel.pools.estimate_separate` with its pools: its ``refit_s`` is the cross-pool
    weight sync by the row's ``refit_transport`` (empty: a broadcast; ``nccl_reshard``: NeMo-RL's shard-to-shard
    reshard), its ``gen_s`` the rollout pool's generation."""
    m, hw, cluster, s, wl = plan(row, hw or _hw(row, None))
    if _separate(row):
        from grpo_tune.costmodel.pools import estimate_separate

        place = _placement(row)
        transport = (row.raw.get("refit_transport") or "").strip() or "broadcast"
        try:
            est = estimate_separate(
                model=m,
                hardware=hw,
                cluster=cluster,
                strategy=s,
                workload=wl,
                placement=place,
                refit_transport=transport,
            )
        except ConfigError as exc:
            raise ConfigError(f"published GRPO row {row.id}: {exc.message}", hint=exc.hint) from None
    else:
        est = estimate(model=m, hardware=hw, cluster=cluster, strategy=s, workload=wl)
    t = est.time
    assert t is not None
    lp_combined = (row.raw.get("lp_combined") or "").lower() == "true"  # NeMo-RL publishes old + reference together
    lp = t["old_logprob"] + (t["ref_logprob"] if lp_combined else 0.0)
    # verl before its update_weights timer (2026-01) timed the rollout's wake-up, weight sync and sleep inside
    # timing_s/gen (the sharding manager's __enter__ / the agent loop's wake_up around generate_sequences)
    gen_refit = (row.raw.get("gen_includes_refit") or "").lower() == "true"
    return {
        "step_s": t.step_s,
        "gen_s": t["rollout"] + (t["weight_sync"] if gen_refit else 0.0),
        "train_s": t["update"] + t["offload"],
        "old_lp_s": lp,
        "ref_lp_s": t["ref_logprob"],
        "refit_s": t["weight_sync"],
        # verl times its MFU inside the worker (update_policy): the controller's batch move is not in it
        "train_mfu": verl_flops(m, wl)
        * wl.ppo_epochs
        / ((t["update"] - est.details.get("controller_update_s", 0.0)) * cluster.gpus * hw.peak_flops_per_s()),
    }, est


def verl_flops(m: Any, wl: Workload) -> float:
    """FLOPs of one update as verl 0.9.1 counts them for its MFU (verl/utils/flops_counter.py
    ``_estimate_qwen2_moe_flops`` / the dense twin): 6 x (per-layer attention and MLP weights, the router,
    embedding and LM head) x tokens + 6 x sum of squared sequence lengths x head_dim x heads x layers, over
    the step's sequences at their mean length; an MLA model (DeepSeek-V3) as ``_estimate_deepseek_v3_flops``
    counts it: the low-rank Q/KV projections, routed + shared experts on the MoE layers, the dense first layers,
    and 3 x seq^2 x (q + v head dims) x heads x layers for the causal core attention."""
    h = m.hidden
    seqs = wl.prompts * wl.n
    s = wl.mean_seq_len
    if m.kv_lora_rank:  # MLA (DeepSeek-V3): ``_estimate_deepseek_v3_flops``
        qd = m.qk_nope_head_dim + m.qk_rope_head_dim
        attn = (h * m.q_lora_rank + m.heads * qd * m.q_lora_rank) if m.q_lora_rank else h * m.heads * qd
        attn += h * (m.kv_lora_rank + m.qk_rope_head_dim)
        attn += m.heads * (qd - m.qk_rope_head_dim + m.v_head_dim) * m.kv_lora_rank
        attn += m.heads * m.v_head_dim * h
        moe = h * m.experts + h * m.expert_ffn_hidden * (m.top_k + m.shared_experts) * 3 + attn
        n = moe * (m.layers - m.dense_layers) + (h * m.ffn_hidden * 3 + attn) * m.dense_layers + 2 * m.vocab * h
        return 6.0 * n * seqs * s + 3.0 * seqs * s * s * m.layers * (qd + m.v_head_dim) * m.heads
    qkv = m.heads * m.head_dim + 2 * m.kv_heads * m.head_dim
    attn = h * (qkv + m.heads * m.head_dim)
    if m.is_moe:
        mlp = h * m.top_k * m.expert_ffn_hidden * 3 + h * m.experts
    else:
        mlp = h * m.ffn_hidden * 3
    n = (mlp + attn) * m.layers + 2 * m.vocab * h
    return 6.0 * n * seqs * s + 6.0 * seqs * s * s * m.head_dim * m.heads * m.layers


DEFAULT_STACK = "verl-0.9.1"
"""The stack of a row that names neither a stack nor a framework with its own (the release verl.sh targets)."""
"""A row's stack when its ``stack`` column is empty: the release its framework published with."""


@dataclass(frozen=True)
class Prior:
    """One fitted parameter: where it lives, its prior value and bounds, and why."""

    key: str
    on: str
    """``stack:<name>`` (a stack profile's parameter), ``hardware:<profile>`` (one GPU's) or ``hardware`` (every
    Hopper profile's that has no ``hardware:<profile>`` prior of the same key)."""
    value: float
    lo: float
    hi: float
    why: str


PRIORS: tuple[Prior, ...] = (
    Prior(
        "decode_efficiency",
        "hardware",
        0.6,
        0.35,
        0.9,
        "paged-attention / small-GEMM decode kernels reach 35-90% of a STREAM copy's HBM bandwidth",
    ),
    Prior(
        "rl_compute_scale",
        "stack:nemo-rl-v0.3",
        0.85,
        0.6,
        1.0,
        "RL passes (fp32 log-softmax, short packed micro-batches) at 60-100% of pretraining FLOP/s",
    ),
    Prior(
        "micro_batch_overhead_s",
        "stack:nemo-rl-v0.3",
        5e-3,
        1e-3,
        3e-2,
        "per micro-batch host work (split, unpad/pad, loss bookkeeping): 1-30 ms",
    ),
    Prior(
        "moe_layer_overhead_s",
        "stack:nemo-rl-v0.3",
        5e-4,
        2e-4,
        1e-3,
        "Megatron MoE docs: a few hundred us to ~1 ms per layer with moe_permute_fusion + grouped GEMM; NeMo-RL "
        "v0.3 builds Qwen3 MoE from NeMo's Qwen3MoEConfig (nemo/tron/converter/qwen.py HFQwen3Importer -> "
        "nemo/collections/llm/gpt/model/qwen3.py: moe_grouped_gemm, moe_permute_fusion, alltoall), which sets both",
    ),
    Prior(
        "engine_wake_s",
        "stack:nemo-rl-v0.3",
        4.0,
        1.0,
        15.0,
        "wake of weights + KV-cache re-allocation and the policy offload around it: 1-15 s",
    ),
    Prior(
        "sync_tensor_overhead_s",
        "stack:nemo-rl-v0.3",
        3.7e-4,
        5e-5,
        2e-3,
        "per exported HF tensor (name mapping, gather launch): 50 us-2 ms",
    ),
    Prior(
        "sync_tensor_overhead_s",
        "stack:nemo-rl-main-2026-08",
        2e-4,
        2e-5,
        2e-3,
        "per HF tensor of NeMo-RL's packed collective update (every tensor of the NCCL broadcast, the NCCL "
        "reshard's misc tensors): the bridge's conversion task with its PP broadcast and TP/EP gather calls, its "
        "copy into the packed bucket, and vLLM's weight_loader for it (name match, TP narrow, copy): 20 us-2 ms",
    ),
    Prior(
        "reshard_entry_overhead_s",
        "stack:nemo-rl-main-2026-08",
        1e-3,
        1e-4,
        1e-2,
        "per NCCL-reshard bulk entry: one xferdtensor call for a layer's FFN projection, its experts grouped "
        "(the Python shard plan over the source and destination layouts, the receive-buffer pre hook, the NCCL "
        "send/recv group and the fused-copy post hook): 0.1-10 ms",
    ),
    Prior(
        "rl_compute_scale",
        "stack:verl-0.9.1",
        0.85,
        0.6,
        1.0,
        "as NeMo-RL's: RL passes at 60-100% of pretraining FLOP/s",
    ),
    Prior(
        "moe_layer_overhead_s",
        "stack:verl-0.9.1",
        5e-4,
        2e-4,
        1e-3,
        "Megatron MoE docs: a few hundred us to ~1 ms per layer with moe_permute_fusion + grouped GEMM "
        "(verl's Megatron MoE examples set both)",
    ),
    Prior(
        "sync_tensor_overhead_s",
        "stack:verl-0.9.1",
        3.7e-4,
        5e-5,
        2e-3,
        "per exported HF tensor (bridge name mapping, gather launch, the tensor's copy into a bucket): 50 us-2 ms",
    ),
    Prior(
        "load_weights_scan_s",
        "stack:verl-0.9.1",
        1e-6,
        2e-7,
        5e-6,
        "per vLLM parameter per single-tensor load_weights call (verl's sync without the checkpoint engine): "
        "vLLM's model load_weights rebuilds dict(self.named_parameters()) on every call, a Python walk of the "
        "module tree at ~0.2-5 us per parameter",
    ),
    Prior(
        "pp_export_tensor_overhead_s",
        "stack:verl-0.9.1",
        3e-4,
        3e-5,
        3e-3,
        "per HF tensor exported with PP > 1 (verl's per_tensor_generator): all_gather_object and "
        "broadcast_object_list of its name and shape over the pipeline group, each pickling and synchronising "
        "the host with the device: 30 us-3 ms",
    ),
    Prior(
        "eager_layer_overhead_s",
        "stack:verl-0.9.1",
        3e-4,
        8e-5,
        1.5e-3,
        "eager vLLM launches each decoder layer's ~15-30 ops from Python (norms, GEMMs, rotary, attention and "
        "its cache write, the TP all-reduces; a MoE layer's router, top-k, block alignment and two Triton "
        "fused-MoE kernels) at ~5-50 us of dispatch each: 80 us-1.5 ms per layer per decode step",
    ),
    Prior(
        "engine_sleep_s",
        "stack:verl-0.9.1",
        1.0,
        0.2,
        5.0,
        "vLLM sleep level 2 after generation (inside timing_s/gen): 0.2-5 s",
    ),
)
HOPPER = ("h100-sxm-80gb", "h200-141gb", "h800-sxm-80gb", "h20-96gb")
MOVES_PCT = 2.0
"""A row moves a parameter when the parameter's prior range moves some scored figure of it by this much."""
PRIOR_WEIGHT = 0.1
"""Weight of each prior's log-distance (in units of its log-range) against one scored figure's log error."""


def row_stack(row: GrpoRow) -> str:
    """The row's stack profile: its own ``stack`` column, else its framework's (the registry's), else verl's."""
    from grpo_tune.frameworks import REGISTRY

    st = (row.raw.get("stack") or "").strip()
    fw = next((f for f in REGISTRY if f.name == row.raw.get("framework", "")), None)
    return st or (fw.stack_profile if fw is not None else None) or DEFAULT_STACK


def _hw(row: GrpoRow, x: dict[Prior, float] | None) -> HardwareSpec:
    """The row's hardware under its stack, with the parameters ``x`` (None: as shipped) applied."""
    from grpo_tune.core.hardware import with_stack

    hw = with_stack(load_hardware(row.raw["hardware"]), row_stack(row))
    if not x:
        return hw
    own = {p.key for p in x if p.on == f"hardware:{hw.name}"}
    vals = {
        p.key: v
        for p, v in x.items()
        if (p.on == "hardware" and hw.name in HOPPER and p.key not in own)
        or p.on in (f"hardware:{hw.name}", f"stack:{hw.stack}")
    }
    return hw.with_efficiency(**vals) if vals else hw


def shipped(p: Prior) -> float:
    """The parameter's value in the shipped profiles."""
    from grpo_tune.core.stacks import load_stack

    if p.on == "hardware":
        return getattr(load_hardware("h100").efficiency, p.key)
    if p.on.startswith("hardware:"):
        return getattr(load_hardware(p.on.split(":", 1)[1]).efficiency, p.key)
    return load_stack(p.on.split(":", 1)[1]).params.get(p.key, p.value)


def _scored(r: GrpoRow) -> bool:
    return r.split != "excluded"


_PRED_MEMO: dict[tuple[object, ...], dict[str, float]] = {}


def _applied(row: GrpoRow, x: dict[Prior, float]) -> tuple[tuple[str, str, float], ...]:
    """The parameters of ``x`` that reach the row's hardware and stack (what :func:`_hw` applies)."""
    from grpo_tune.core.hardware import with_stack

    name = row.raw["hardware"]
    stack = row_stack(row)
    hw_name = with_stack(load_hardware(name), stack).name
    own = {p.key for p in x if p.on == f"hardware:{hw_name}"}
    return tuple(
        sorted(
            (p.on, p.key, v)
            for p, v in x.items()
            if (p.on == "hardware" and hw_name in HOPPER and p.key not in own)
            or p.on in (f"hardware:{hw_name}", f"stack:{stack}")
        )
    )


def _predict_at(row: GrpoRow, x: dict[Prior, float]) -> dict[str, float]:
    """:func:`predict` of the row at the parameters ``x``, memoized on the row's plan and the parameters that reach
    it (a fit's finite differences move one parameter at a time: the rows of other stacks are not priced again)."""
    key = (row.id, tuple(sorted(row.raw.items())), _applied(row, x))
    hit = _PRED_MEMO.get(key)
    if hit is None:
        if len(_PRED_MEMO) > 20000:
            _PRED_MEMO.clear()
        hit, _ = predict(row, _hw(row, x))
        _PRED_MEMO[key] = hit
    return hit


def _resid(rows: list[GrpoRow], x: dict[Prior, float]) -> list[list[float]]:
    """Per row: the log errors of its published figures (step and phases), in PHASE order."""
    out = []
    for r in rows:
        pred = _predict_at(r, x)
        out.append([math.log(max(pred[k], 1e-6) / r.published[k]) for k in ("step_s", *PHASES) if k in r.published])
    return out


def _prior_resid(x: dict[Prior, float]) -> list[float]:
    return [PRIOR_WEIGHT * math.log(x[p] / p.value) / math.log(p.hi / p.lo) for p in x]


def movers(rows: list[GrpoRow], priors: tuple[Prior, ...] = PRIORS) -> dict[Prior, list[str]]:
    """The rows whose scored figures move by at least MOVES_PCT when the parameter goes from its lower
    to its upper bound, the others at their prior values (so which parameters are fitted does not
    depend on where a previous fit left them)."""
    base = {p: p.value for p in priors}
    out: dict[Prior, list[str]] = {}
    for p in priors:
        lo = _resid(rows, {**base, p: p.lo})
        hi = _resid(rows, {**base, p: p.hi})
        out[p] = [
            r.id
            for r, a, b in zip(rows, lo, hi)
            if max((abs(u - v) for u, v in zip(a, b)), default=0) >= MOVES_PCT / 100
        ]
    return out


def _fit_params(
    scored: list[GrpoRow], free: list[Prior], start: dict[Prior, float] | None = None
) -> dict[Prior, float]:
    """Bounded least squares (scipy) of the log errors of every published figure of ``scored``, plus a weak pull
    of each parameter towards its prior (PRIOR_WEIGHT); ``free`` are fitted (from ``start``, else the shipped
    values), the rest keep their prior values."""
    from scipy.optimize import least_squares

    fixed = {p: p.value for p in PRIORS if p not in free}

    def unpack(z) -> dict[Prior, float]:
        return {**fixed, **{p: p.lo * (p.hi / p.lo) ** zi for p, zi in zip(free, z)}}

    def f(z):
        x = unpack(z)
        return [e for row in _resid(scored, x) for e in row] + _prior_resid(x)

    def z_of(p: Prior) -> float:
        v = (start or {}).get(p, shipped(p))
        return math.log(min(max(v, p.lo), p.hi) / p.lo) / math.log(p.hi / p.lo)

    z0 = [z_of(p) for p in free]
    res = least_squares(f, z0, bounds=(0.0, 1.0), diff_step=0.02) if free else None
    return unpack(res.x if res is not None else [])


def fit(rows: list[GrpoRow], *, quiet: bool = True) -> dict[str, float]:
    """Bounded least squares (scipy) of the log errors of every published figure of the scored rows,
    plus a weak pull of each parameter towards its prior (PRIOR_WEIGHT). A parameter that fewer than two
    scored rows move (:func:`movers`) is not fitted: it keeps its prior value.
    Keys: ``stack:NAME:key`` / ``hardware:key``."""
    scored = [r for r in rows if _scored(r)]
    if not scored:
        raise ConfigError("no published GRPO rows to fit on", hint="mark rows' split as scored")
    mv = movers(scored)
    x = _fit_params(scored, [p for p in PRIORS if len(mv[p]) >= 2])
    return {f"{p.on}:{p.key}": float(f"{v:.3g}") for p, v in x.items()}


CONFIG_COLUMNS = (
    "framework",
    "backend",
    "model",
    "hardware",
    "gpus",
    "placement",
    "rollout_gpus",
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "rollout_tp",
    "prompts",
    "n",
    "mini_batch",
    "prompt_len",
    "response_len",
    "refit_transport",
)
"""The columns that make two rows the same configuration: a rerun of a config (NeMo-RL issue #959's reruns of the
v0.3 blog's rows) is the same config, and a fold holds out every row of it."""


def config_of(r: GrpoRow) -> tuple[str, ...]:
    return tuple((r.raw.get(c) or "").strip() for c in CONFIG_COLUMNS)


def self_solved(rows: list[GrpoRow]) -> list[str]:
    """Scored rows whose mean response length was solved from one of their own published figures (``calibrates``):
    a fitted parameter per row, which no fold redoes (it is in the row's data)."""
    return [r.id for r in rows if _scored(r) and (r.raw.get("calibrates") or "").strip()]


def cross_validate(rows: list[GrpoRow], *, method: str = "refit") -> dict[str, dict[str, float]]:
    """Held-out error of every scored row. ``refit`` (the default): leave one configuration out
    (:data:`CONFIG_COLUMNS`; reruns of a config fall in one fold): the bounded fit is redone on the other configs'
    rows (parameters that fewer than two of them move keep their priors) and the held-out rows are priced at that
    refit (each fold starts from the shipped values). ``linear``: the former one-row-out estimate, one Gauss-Newton
    step from the shipped parameters (kept to compare). Returns row id -> figure -> error %."""
    if method == "linear":
        return _cross_validate_linear(rows)
    if method != "refit":
        raise ConfigError(f"unknown cross-validation method {method!r}", hint="refit or linear")
    scored = [r for r in rows if _scored(r)]
    mv = movers(scored)
    groups: dict[tuple[str, ...], list[GrpoRow]] = {}
    for r in scored:
        groups.setdefault(config_of(r), []).append(r)
    out: dict[str, dict[str, float]] = {}
    for key, held in groups.items():
        train = [r for r in scored if config_of(r) != key]
        ids = {r.id for r in train}
        free = [p for p in PRIORS if len([i for i in mv[p] if i in ids]) >= 2]
        # from the shipped values (constants), never from a fit that saw the held-out rows
        x = _fit_params(train, free) if train else {p: p.value for p in PRIORS}
        for r in held:
            pred = _predict_at(r, x)
            out[r.id] = {k: float(100.0 * (pred[k] / v - 1)) for k, v in r.published.items()}
    return out


def _cross_validate_linear(rows: list[GrpoRow]) -> dict[str, dict[str, float]]:
    """The linearised leave-one-row-out error of every scored row: the fit redone without the row by one Gauss-Newton
    step from the shipped parameters (the Jacobian of every figure's log error, by finite differences, then
    scipy's bounded linear least squares without that row), and the row priced at that refit.
    Returns row id -> figure -> error %."""
    import numpy as np
    from scipy.optimize import lsq_linear

    scored = [r for r in rows if _scored(r)]
    mv = movers(scored)
    free = [p for p in PRIORS if len(mv[p]) >= 2]
    x0 = {p: min(max(shipped(p), p.lo), p.hi) for p in PRIORS}
    z0 = np.array([math.log(x0[p] / p.lo) / math.log(p.hi / p.lo) for p in free])

    def at(z) -> dict[Prior, float]:
        return {**x0, **{p: float(p.lo * (p.hi / p.lo) ** zi) for p, zi in zip(free, z)}}

    r0 = _resid(scored, x0)
    owner = [i for i, row in enumerate(r0) for _ in row]
    flat0 = np.array([e for row in r0 for e in row])
    cols = []
    h = 0.02
    for j in range(len(free)):
        z = z0.copy()
        z[j] = z[j] + h if z[j] + h <= 1 else z[j] - h
        rj = np.array([e for row in _resid(scored, at(z)) for e in row])
        cols.append((rj - flat0) / (z[j] - z0[j]))
    J = np.array(cols).T if cols else np.zeros((len(flat0), 0))
    out: dict[str, dict[str, float]] = {}
    for i, r in enumerate(scored):
        keep = np.array([o != i for o in owner])
        if free:
            pw = np.array([PRIOR_WEIGHT * math.log(at(z0)[p] / p.value) / math.log(p.hi / p.lo) for p in free])
            pj = np.diag([PRIOR_WEIGHT * math.log(p.hi / p.lo) / math.log(p.hi / p.lo) for p in free])
            A = np.vstack([J[keep], pj])
            b = -np.concatenate([flat0[keep], pw])
            sol = lsq_linear(A, b, bounds=(-z0, 1 - z0))
            z = z0 + sol.x
        else:
            z = z0
        pred, _ = predict(r, _hw(r, at(z)))
        out[r.id] = {k: float(100.0 * (pred[k] / v - 1)) for k, v in r.published.items()}
    return out


def _group_mape(errs: dict[str, dict[str, float]], rows: list[GrpoRow], key: str) -> dict[str, dict[str, float | int]]:
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.id in errs and key in errs[r.id]:
            for g in ("all", f"gpu:{r.raw['hardware']}", f"framework:{r.raw['framework']}"):
                by.setdefault(g, []).append(abs(errs[r.id][key]))
    return {g: {"mape": sum(v) / len(v), "rows": len(v)} for g, v in by.items()}


def bands(cv: dict[str, dict[str, float]], rows: list[GrpoRow]) -> dict[str, float]:
    """Leave-one-out step MAPE per provenance class of the rows' hardware profiles (BAND_PCT). A class is
    known no better than a better-known one: the transferred band is at least the fitted band (its own rows
    may happen to score lower), and spec-only is half again the larger."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.id in cv and "step_s" in cv[r.id]:
            by.setdefault(load_hardware(r.raw["hardware"]).provenance, []).append(abs(cv[r.id]["step_s"]))
    out = {k: sum(v) / len(v) for k, v in by.items()}
    out.setdefault("fitted", out.get("transferred", 0.0))
    out["transferred"] = max(out.get("transferred", 0.0), out["fitted"])
    out["spec-only"] = 1.5 * max(out["fitted"], out["transferred"])
    return out


_RUNS: dict[tuple[object, ...], dict[str, Any]] = {}


def run_grpo(
    *, path: str | Path | None = None, tolerance_pct: float = TOLERANCE_PCT, refit: bool = False, cv: str = "refit"
) -> dict[str, Any]:
    """:func:`_run_grpo`, kept per process for a regular file that has not changed (same path, size, inode and
    modification time; its refits take seconds; the report is a pure function of the file and the options); a deep
    copy each time."""
    import copy

    import os
    import stat

    f = Path(path) if path else GRPO_DATA_PATH
    try:
        st = os.stat(f)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):  # only a regular file is kept (read_records bounds the rest)
        return _run_grpo(path=path, tolerance_pct=tolerance_pct, refit=refit, cv=cv)
    key: tuple[object, ...] = (str(f.resolve()), st.st_mtime_ns, st.st_size, st.st_ino, tolerance_pct, refit, cv)
    if key not in _RUNS:
        if len(_RUNS) > 8:
            _RUNS.clear()
        _RUNS[key] = _run_grpo(path=path, tolerance_pct=tolerance_pct, refit=refit, cv=cv)
    return copy.deepcopy(_RUNS[key])


def _run_grpo(
    *, path: str | Path | None = None, tolerance_pct: float = TOLERANCE_PCT, refit: bool = False, cv: str = "refit"
) -> dict[str, Any]:
    """Predicted vs published per row (step and phases); in-sample and leave-one-out MAPE of the step
    and each phase, overall, per GPU type and per framework; whether the cross-validated step MAPE is
    within the tolerance. ``refit``: also run the full bounded fit and report its parameters."""
    if not (tolerance_pct > 0):
        raise ConfigError(f"--tolerance must be > 0, got {tolerance_pct}")
    rows = load_grpo_rows(path)
    scored = [r for r in rows if _scored(r)]
    if not scored:  # the report's one figure; printing None crashed the command
        raise ConfigError(
            f"{path or GRPO_DATA_PATH}: no scored row with a published figure",
            hint="mark at least one row's split as scored",
        )
    fitted = fit(rows) if refit else None
    out = []
    for r in rows:
        entry: dict[str, Any] = {
            "id": r.id,
            "split": r.split,
            "backend": r.raw.get("backend", ""),
            "hardware": r.raw.get("hardware", ""),
            "framework": r.raw.get("framework", ""),
            "source": r.raw["source"],
            "assumptions": r.raw.get("assumptions", ""),
            "published": r.published,
        }
        if _scored(r):
            pred, est = predict(r, _hw(r, None))
            entry.update(
                stack=row_stack(r),
                predicted={k: pred[k] for k in r.published},
                fits=est.fits,
                error_pct={k: 100.0 * (pred[k] / v - 1) for k, v in r.published.items()},
            )
        out.append(entry)
    cv_method = cv
    cv_err = cross_validate(rows, method=cv_method)
    for e in out:
        if e["id"] in cv_err:
            e["cv_error_pct"] = cv_err[e["id"]]
    insample = {e["id"]: e["error_pct"] for e in out if "error_pct" in e}
    keys = ("step_s", *PHASES)
    m = {
        "fit": {k: _group_mape(insample, scored, k).get("all", {}).get("mape") for k in keys},
        "cv": {k: _group_mape(cv_err, scored, k).get("all", {}).get("mape") for k in keys},
    }
    groups = {k: _group_mape(cv_err, scored, k) for k in keys}
    mv = movers(scored)
    step = m["cv"]["step_s"]
    solved = self_solved(rows)
    return {
        "cv_method": (
            "refit, leave one configuration out" if cv_method == "refit" else "linearised, leave one row out"
        ),
        "counts": {
            "scored_rows": len(scored),
            "configs": len({config_of(r) for r in scored}),
            "step_rows": sum(1 for r in scored if "step_s" in r.published),
            "step_configs": len({config_of(r) for r in scored if "step_s" in r.published}),
            "fitted_parameters": sum(1 for p in PRIORS if len(mv[p]) >= 2),
            "self_solved_means": len(solved),
            "self_solved_rows": solved,
        },
        "bands": bands(cv_err, scored),
        "rows": out,
        "mape_pct": m,
        "cv_groups": groups,
        "movers": {f"{p.on}:{p.key}": mv[p] for p in PRIORS},
        "priors": {f"{p.on}:{p.key}": {"value": p.value, "lo": p.lo, "hi": p.hi, "why": p.why} for p in PRIORS},
        "tolerance_pct": tolerance_pct,
        "refit": fitted,
        "passed": bool(step is not None and step <= tolerance_pct),
    }
