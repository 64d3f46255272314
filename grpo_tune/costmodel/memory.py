"""Bytes per rank, per GRPO phase: ``phase_memory(model, hardware, cluster, strategy, workload)``.

Every figure is the most loaded rank of the worst pipeline stage, per phase. Phases:

- ``update``: the actor's forward/backward/step. Model state follows Megatron's rule
  (docs/source/api-guide/dist_optimizer.md, "bf16 param, fp32 grads": 18 B/param, or 6 + 12/d with
  the distributed optimizer, d the data-parallel group *with* context parallel, since Megatron shards
  the optimizer over the DP x CP group). Activations follow Korthikanti et al. 2022
  (arXiv 2205.05198) per tensor; see :func:`layer_activation_bytes` for our variant.
- ``old_logprob`` / ``ref_logprob``: forward only (one layer's working set + logits).
- ``rollout``: verl's colocated hybrid engine: vLLM takes ``gpu_memory_utilization`` x HBM for its
  weights, its working set and the KV cache; training state that is not offloaded stays resident.
  A plan with ``engine = "megatron"`` (the default on ``cpu``) samples with the trainer's own
  Megatron model instead: the actor's weights and one forward's activations, no second copy, no KV cache.
- vLLM in the training phases: nothing with ``free_cache_engine`` (it sleeps; :func:`sleeps`), else its whole
  fraction (``vllm_resident``). vLLM's CPU build cannot sleep: on a ``memory_is_host`` profile its weights and the KV
  cache the trainer gives it (:func:`host_vllm_resident_bytes`) stay resident whatever ``free_cache_engine`` says.
- ``weight_sync``: training weights + the rollout copy + one gathered tensor (verl reshards per tensor).

Offloaded state lives in host memory outside the phase that needs it; the host total per node is
checked against the profile. On the ``cpu`` profile the activations follow the trainer's CPU build
(megatron's local spec, fp32), measured with autograd's saved-tensor hooks to within 1%.
``reserved_memory_bytes`` (CUDA context, NCCL, fragmentation) is already subtracted from the
capacity, so no framework overhead is added here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from grpo_tune.engines.base import KV_BYTES, WEIGHT_BYTES

from .activations import (  # re-exported: callers and tests read them from costmodel.memory
    BF16,
    FP32,
    Kernels,
    GPU_KERNELS,
    CPU_KERNELS,
    kernels_for,
    paper_layer_activation_bytes,
    LayerCoeffs,
    layer_coeffs,
    layer_activation_bytes,
    in_flight_microbatches,
    train_activation_bytes,
    forward_activation_bytes,
    logits_bytes,
)
from .results import PhaseMemory, Violation
from .params import optimizer_params, per_stage_params, total_params
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.rules import micro_batches
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.core.units import GiB


# vLLM's max_num_batched_tokens / max_num_seqs (Strategy fields; verl 0.9.1 defaults 8192 / 256,
# rollout.yaml l.78/l.84) size vLLM's profiling run, whose peak is kept out of the KV cache.
ADAM_STEP_TEMP = 4 / 12  # Adam step temporaries over optimizer-state bytes (one fp32 per param of 12 B of state)
CUDA_GRAPH_BYTES = 0.5 * 2**30
"""vLLM's captured CUDA graphs (decode batches up to 512), kept outside the KV cache; an assumption
of the size vLLM logs for 7-8B models ("Graph capturing finished ... took ~0.5 GiB"), not measured here."""


def captures_cuda_graphs(hardware: HardwareSpec, enforce_eager: bool) -> bool:
    """vLLM captures CUDA graphs (:data:`CUDA_GRAPH_BYTES`, and decodes without eager launches) on a GPU without
    ``enforce_eager``. On a profile whose ranks compute in host memory (``memory_is_host``: ``cpu``, vLLM's CPU
    build) it captures none whatever the plan asks: vLLM's CPU platform sets ``enforce_eager`` itself and empties
    the capture sizes (vllm/platforms/cpu.py, ``CpuPlatform.check_and_update_config``)."""
    return not (enforce_eager or hardware.memory_is_host)


def sleeps(hardware: HardwareSpec, free_cache_engine: bool) -> bool:
    """A colocated vLLM sleeps through the training phases (releases its weights and KV cache, and takes the stack's
    sleep and wake seconds) when the plan sets ``free_cache_engine``, except on a profile whose ranks compute in
    host memory (``memory_is_host``: ``cpu``, vLLM's CPU build): sleep mode is for CUDA, ROCm and XPU only
    (vllm/platforms/interface.py ``is_sleep_mode_available``; the CPU platform raises "Sleep mode is not supported on
    current platform"), so the trainer turns it off and the engine stays resident (trainer/rollout/vllm.py)."""
    return free_cache_engine and not hardware.memory_is_host


# ---------------------------------------------------------------------------------------------
# Model state
# ---------------------------------------------------------------------------------------------

# docs/source/api-guide/dist_optimizer.md, bytes per parameter as (weights, grads, optimizer):
# bf16 params + fp32 grads: 2 + 4 + 12 (fp32 master, m, v) = 18; fp16 params + fp16 grads:
# 2 + 2 + 16 (fp32 master params and grads, m, v) = 20; fp32: 4 + 4 + 8 (m, v) = 16.
STATE_BYTES = {"bf16": (2, 4, 12), "fp16": (2, 2, 16), "fp32": (4, 4, 8)}


def model_state_bytes_per_param(d: int, distributed_optimizer: bool, dtype: str = "bf16") -> float:
    """Megatron's rule: 18 B/param for bf16, or 6 + 12/d with the distributed optimizer (which
    shards only the optimizer part over the d data-parallel ranks)."""
    w, g, o = STATE_BYTES[dtype]
    return w + g + (o / d if distributed_optimizer else o)


@dataclass(frozen=True)
class ModelState:
    weights: float
    grads: float
    optimizer: float


PRECISION_AWARE_OPTIMIZER_BYTES = 2 + 4 + 4
"""megatron-core 0.16.1 with use_precision_aware_optimizer (bf16): the main params are held by TE's
FusedAdam with store_param_remainders (optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups:
master_weights, store_param_remainders; distrib_optimizer.py _build_model_and_main_param_groups keeps no
fp32 shard_main_param), so a parameter's state is its 16-bit remainder + fp32 m and v: 10 B, not 12."""
CPU_OPTIMIZER_MAIN_PARAM_BYTES = 4
"""Without the precision-aware optimizer, the distributed optimizer's fp32 copy of the param shard
(distrib_optimizer.py _build_model_and_main_param_groups: shard_main_param = shard_model_param.clone().float())
stays on the GPU when the hybrid CPU optimizer steps the state on the host."""


FP8_WEIGHT_COPY_BYTES = 2
"""FP8 training without FP8 parameters (Megatron ``fp8_param`` off, the default): TransformerEngine keeps, besides
the bf16 weight, its e4m3 cast in both layouts a GEMM needs (row-wise for the forward, column-wise for the
backward's data gradient: 1 B each) for the whole step (cached across micro-batches)."""


def model_state_bytes(
    dense: int,
    expert: int,
    s: Strategy,
    dtype: str = "bf16",
    *,
    grad_bytes: float | None = None,
) -> ModelState:
    """Weights, main grads (Megatron's DDP grad buffer, ``grad_bytes`` each: the stack's gradient dtype,
    4 with grad_reduce_in_fp32) and optimizer state on one rank of ``s`` holding ``dense`` + ``expert``
    parameters (the optimizer's share: :func:`optimizer_params`)."""
    w, g0, o = STATE_BYTES[dtype]
    g = float(grad_bytes) if (grad_bytes is not None and dtype == "bf16") else float(g0)
    n = dense + expert
    if s.precision.precision == "fp8":
        w += FP8_WEIGHT_COPY_BYTES
    return ModelState(weights=float(w * n), grads=float(g * n), optimizer=float(o * optimizer_params(dense, expert, s)))


# ---------------------------------------------------------------------------------------------
# Rollout (vLLM, colocated)
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def rollout_weight_bytes(m: ModelSpec, rollout_tp: int, precision: str = "bf16") -> float:
    """Weights on one rollout rank: linears and vocab split by TP, norms/router replicated.

    With rollout_tp > kv_heads, vLLM replicates each KV head, so K/V weights do not shrink below one head.
    ``precision`` fp8: the linear layers' weights block-wise FP8 (engines.WEIGHT_BYTES), the embedding and the
    output layer kept in bf16 (vLLM's and SGLang's FP8 linear methods quantize the decoder's linears only).
    """
    st = per_stage_params(m, Strategy.of(tp=rollout_tp, etp=rollout_tp))[0]
    n = float(st.total)
    if not m.is_mla and rollout_tp > m.kv_heads:
        kv_w = 2 * m.hidden * m.kv_heads * m.head_dim + (2 * m.kv_heads * m.head_dim if m.qkv_bias else 0)
        n += m.layers * kv_w * (1 / m.kv_heads - 1 / rollout_tp)
    if precision == "bf16":
        return BF16 * n
    emb = (1 if m.tied_embeddings else 2) * m.vocab * m.hidden / rollout_tp
    return BF16 * emb + WEIGHT_BYTES[precision] * (n - emb)


@lru_cache(maxsize=1024)
def kv_bytes_per_token(m: ModelSpec, rollout_tp: int, kv_cache_dtype: str = "auto") -> float:
    """KV-cache bytes per token on one rollout rank (bf16; ``kv_cache_dtype`` fp8: half of it, engines.KV_BYTES).

    GQA/MHA: 2 (K, V) x layers x kv heads per rank x head_dim x 2 B, kv heads replicated when
    rollout_tp > kv_heads. MLA (DeepSeek-V2 sec. 2.1.2): the latent (kv_lora_rank + rope dim) per
    layer, which vLLM keeps whole on every TP rank.
    """
    b = BF16 if kv_cache_dtype == "auto" else KV_BYTES[kv_cache_dtype]
    if m.is_mla:
        return float(m.layers * (m.kv_lora_rank + m.qk_rope_head_dim) * b)
    heads = max(1, m.kv_heads // rollout_tp)
    return float(2 * m.layers * heads * m.head_dim * b)


@lru_cache(maxsize=1024)
def rollout_working_bytes(
    m: ModelSpec, rollout_tp: int, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192
) -> float:
    """vLLM's profiled peak outside weights and KV: one layer's forward at max_num_batched_tokens
    (no score matrix, paged/flash attention) plus the sampler's fp32 logits for max_num_seqs."""
    c = layer_coeffs(m, m.is_moe, rollout_tp, rollout_tp, False, flash=True)
    return max_num_batched_tokens * (c.linear + 2 * 2 * m.hidden) + max_num_seqs * m.vocab * FP32


@dataclass(frozen=True)
class KvCapacity:
    budget_bytes: float
    """gpu_memory_utilization x HBM: what vLLM takes."""
    weights_bytes: float
    working_bytes: float
    kv_bytes: float
    """What is left for the KV cache (can be <= 0: vLLM would fail to start)."""
    bytes_per_token: float
    tokens: int
    sequences: int
    """Sequences of prompt_len + response_len that fit at once, per rollout replica."""
    replicas: int

    def to_info(self) -> dict[str, float]:
        return {
            "kv_cache_tokens": self.tokens,
            "max_concurrent_sequences": self.sequences,
            "rollout_replicas": self.replicas,
            "kv_bytes_per_token": self.bytes_per_token,
        }


def kv_cache_capacity(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: Strategy,
    workload: Workload,
    gpus: int | None = None,
    ranks_per_node: int = 0,
) -> KvCapacity:
    """The KV cache that ``gpu_memory_utilization`` leaves, and the concurrent sequences it holds. ``ranks_per_node``:
    on a profile whose ranks share the node's RAM (``memory_is_host``: vLLM's CPU build) the fraction is of one
    rank's share, as the trainer gives it (trainer/rollout/vllm.py ``cpu_kv_cache_bytes``); 0 or a GPU: of HBM."""
    eng = strategy.rollout
    mem = hardware.rank_memory_bytes(ranks_per_node) if ranks_per_node else hardware.hbm_bytes
    budget = eng.gpu_memory_utilization * mem
    prec = strategy.precision
    w = rollout_weight_bytes(model, eng.rollout_tp, prec.rollout_precision)
    work = rollout_working_bytes(model, eng.rollout_tp, eng.max_num_seqs, eng.max_num_batched_tokens)
    if captures_cuda_graphs(hardware, eng.enforce_eager):
        work += CUDA_GRAPH_BYTES
    kv = budget - w - work
    per_tok = kv_bytes_per_token(model, eng.rollout_tp, prec.kv_cache_dtype)
    tokens = int(kv // per_tok) if kv > 0 else 0
    seq = workload.prompt_len + workload.response_len
    return KvCapacity(
        budget_bytes=budget,
        weights_bytes=w,
        working_bytes=work,
        kv_bytes=kv,
        bytes_per_token=per_tok,
        tokens=tokens,
        sequences=tokens // seq,
        replicas=(gpus // eng.rollout_tp) if gpus else 0,
    )


HOST_KV_BLOCK_SIZE = 128
"""Tokens per KV-cache block of vLLM 0.32's CPU backend (its ``cache_config.block_size`` there; read back in
tests/test_vllm_cpu.py)."""
HOST_VLLM_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per value of vLLM's weights and KV cache on CPU: the workload's ``dtype``, which the trainer passes to vLLM
(``dtype=``; no quantization, no ``kv_cache_dtype``)."""


def _host_dtype_scale(workload: Workload) -> float:
    """vLLM's bytes per value on CPU (the workload's dtype, :data:`HOST_VLLM_DTYPE_BYTES`) over the bf16 that
    :func:`kv_bytes_per_token` and :func:`rollout_weight_bytes` price."""
    return HOST_VLLM_DTYPE_BYTES.get(workload.dtype, 2) / 2


def host_kv_cache_bytes(
    model: ModelSpec, hardware: HardwareSpec, strategy: Strategy, workload: Workload, ranks_per_node: int
) -> int:
    """The KV cache the trainer gives vLLM on a ``memory_is_host`` profile (vLLM's CPU build), in bytes: what it
    passes as ``kv_cache_memory_bytes`` (trainer/rollout/vllm.py ``cpu_kv_cache_bytes`` calls this).

    :func:`kv_cache_capacity`'s arithmetic (``gpu_memory_utilization`` x the rank's memory, less vLLM's weights and
    working set) on this rank's share of the host's RAM among ``ranks_per_node`` ranks, capped at what
    ``max_num_seqs`` sequences of ``prompt_len + response_len`` can ever hold at the workload's dtype (vLLM allocates
    the whole budget at start-up; more is never used), and at least one full-length sequence (vLLM refuses to start
    below that). A sequence holds whole blocks of :data:`HOST_KV_BLOCK_SIZE` tokens, so the cap counts each one
    rounded up to blocks.
    """
    import dataclasses as dc

    w, eng = workload, strategy.rollout
    rank_mem = hardware.rank_memory_bytes(max(1, ranks_per_node))
    cap = kv_cache_capacity(model, dc.replace(hardware, hbm_bytes=int(rank_mem)), strategy, w)
    per_tok = cap.bytes_per_token * _host_dtype_scale(w)
    seq = -(-(w.prompt_len + w.response_len) // HOST_KV_BLOCK_SIZE) * HOST_KV_BLOCK_SIZE
    most = eng.max_num_seqs * seq * per_tok
    least = seq * per_tok
    return int(max(least, min(cap.kv_bytes, most)))  # bytes left are bytes: a wider dtype holds fewer tokens


def host_vllm_resident_bytes(
    model: ModelSpec, hardware: HardwareSpec, strategy: Strategy, workload: Workload, ranks_per_node: int
) -> tuple[float, int]:
    """(weights, KV cache) bytes that vLLM's CPU build holds on a rank from its start to the end of the run, training
    phases included (it cannot sleep: :func:`sleeps`): its weights at the workload's dtype (the trainer passes no
    quantization, so ``rollout_precision`` does not apply) and :func:`host_kv_cache_bytes`. Its profiling run's
    working set is freed after start-up and is not charged outside the rollout."""
    w = rollout_weight_bytes(model, strategy.rollout.rollout_tp, "bf16") * _host_dtype_scale(workload)
    return w, host_kv_cache_bytes(model, hardware, strategy, workload, ranks_per_node)


@lru_cache(maxsize=1024)
def sync_bucket_bytes(m: ModelSpec, ep: int) -> float:
    """The largest tensor gathered whole while verl reshards training weights for vLLM
    (verl.utils.megatron_utils.per_tensor_generator gathers one tensor at a time over TP/EP)."""
    biggest = max(m.vocab * m.hidden, 2 * m.ffn_hidden * m.hidden, (m.heads + 2 * m.kv_heads) * m.head_dim * m.hidden)
    if m.is_moe:
        biggest = max(biggest, ep * 2 * m.expert_ffn_hidden * m.hidden)
    return float(BF16 * biggest)


# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------


def _microbatches(s: Strategy, w: Workload) -> int:
    lay = s.layout
    bat = s.batching
    seqs = w.mini_batch * w.n if w.kind == "grpo" else w.gbs
    dp = lay.dp
    assert dp is not None, "phase_memory takes a resolved strategy (validate fills dp)"
    if bat.max_tokens_per_gpu:
        return max(1, -(-int(seqs * w.mean_seq_len) // (dp * bat.max_tokens_per_gpu * lay.cp)))
    return micro_batches(seqs, dp=dp, mbs=bat.mbs)


def micro_batch_shape(s: Strategy, w: Workload, cap: int | None, *, mbs: int | None = None) -> tuple[int, float]:
    """(sequence length, sequences) of the largest micro-batch a rank holds: ``mbs`` (default
    ``s.batching.mbs``) sequences of the maximum length, or with dynamic batching a token cap filled by
    sequences of up to the maximum length (verl asserts the cap holds the longest sequence)."""
    lay = s.layout
    bat = s.batching
    seq = w.train_seq_len
    if not cap:
        return seq, float(mbs or bat.mbs)
    cap_rank = cap  # per CP rank (verl scales the cap by the CP size, and CP splits the sequence)
    seq_eff = min(seq, cap_rank * lay.cp)
    return seq_eff, cap_rank * lay.cp / seq_eff


def phase_memory(
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    strategy: Strategy,
    workload: Workload,
    *,
    kernels: Kernels | None = None,
    colocated: bool = True,
) -> tuple[dict[str, PhaseMemory], float, list[Violation]]:
    """Bytes per phase on the most loaded rank, host bytes per node, and coded violations.

    ``strategy`` must be resolved (``validate`` fills dp/etp/sequence_parallel). ``kernels``: what
    the layers run (default: :func:`kernels_for`, from the profile's attention kernel and
    activation layout). ``colocated`` False: a separate placement's training pool, whose ranks hold no rollout
    engine (costmodel.pools.train_pool; on a GPU its plan's sleeping, eager vLLM already holds nothing there).
    """
    m, s, w = model, strategy, workload
    smem = s.memory
    k = kernels or kernels_for(hardware, w)
    dtype = "fp32" if k.act_bytes == FP32 else w.dtype
    stages = per_stage_params(m, s)
    seq, mbs = micro_batch_shape(s, w, s.batching.max_tokens_per_gpu)
    acts = train_activation_bytes(m, s, seq_len=seq, mbs=mbs, microbatches=_microbatches(s, w), kernels=k)
    grpo = w.kind == "grpo"
    # the update computes the entropy only when the loss uses it (verl: entropy_coeff != 0); pretraining none
    logit = logits_bytes(m, s, seq_len=seq, mbs=mbs, act_bytes=k.act_bytes, entropy=grpo and w.entropy)
    last = len(stages) - 1
    # Stages with the same parameters differ only in activations: per (params, last?) keep the
    # stage that holds the most. Two or three candidates instead of pp, for speed.
    best: dict[tuple[int, int, bool], int] = {}
    for i, p in enumerate(stages):
        key = (p.dense, p.expert, i == last)
        j = best.get(key)
        if j is None or acts[i] > acts[j]:
            best[key] = i
    gb = hardware.efficiency.grad_reduce_bytes
    full = {
        i: model_state_bytes(stages[i].dense, stages[i].expert, s, dtype, grad_bytes=gb) for i in sorted(best.values())
    }
    # Megatron's hybrid CPU optimizer keeps only the GPU share of the optimizer state on the GPU, and,
    # without the precision-aware optimizer, the fp32 copy of the param shard as well.
    gpu_share = 1.0 - (smem.cpu_optimizer or 0.0)
    main, pa = 0.0, 1.0
    if dtype == "bf16" and smem.precision_aware_optimizer:  # TE FusedAdam on the GPU share (the host's keeps 12 B)
        pa = PRECISION_AWARE_OPTIMIZER_BYTES / STATE_BYTES["bf16"][2]
    elif dtype == "bf16" and smem.cpu_optimizer:
        main = CPU_OPTIMIZER_MAIN_PARAM_BYTES
    states = {
        i: ModelState(
            st.weights,
            st.grads,
            st.optimizer * gpu_share * pa + main * optimizer_params(stages[i].dense, stages[i].expert, s),
        )
        for i, st in full.items()
    }
    kvc = (
        kv_cache_capacity(m, hardware, s, w, cluster.gpus, cluster.ranks_per_node)
        if (w.kind == "grpo" and not s.rollout.native)
        else None
    )
    held = None  # what vLLM keeps through the training phases: None where it sleeps or holds its whole fraction
    if kvc is not None and hardware.memory_is_host and colocated:
        held = sum(host_vllm_resident_bytes(m, hardware, s, w, cluster.ranks_per_node))
    out = _phases(m, hardware, s, w, k, states, acts, logit, last, kvc, held)
    violations = _violations(out, hardware, w, kvc, hardware.rank_capacity_bytes(cluster.ranks_per_node))
    host = _host_bytes(s, w, full, cluster)
    if host > hardware.host_memory_bytes:
        violations.append(
            Violation(
                "OOM_RISK",
                f"offloaded state needs {host / GiB:.1f} GiB of host memory per node "
                f"> {hardware.host_memory_bytes / GiB:.1f} GiB",
                phase="host",
                bytes_over=host - hardware.host_memory_bytes,
            )
        )
    elif hardware.memory_is_host and host > 0:  # offloaded to the RAM the ranks compute in
        peak = max((pm.total_bytes for pm in out.values()), default=0.0)
        need = host + cluster.ranks_per_node * (peak + hardware.reserved_memory_bytes)
        if need > hardware.host_memory_bytes:
            violations.append(
                Violation(
                    "OOM_RISK",
                    f"the node's {cluster.ranks_per_node} ranks and what they offload share its RAM: "
                    f"{need / GiB:.1f} GiB > {hardware.host_memory_bytes / GiB:.1f} GiB",
                    phase="host",
                    bytes_over=need - hardware.host_memory_bytes,
                )
            )
    return out, host, violations


def _phases(
    m: ModelSpec,
    hardware: HardwareSpec,
    s: Strategy,
    w: Workload,
    k: Kernels,
    states: dict[int, ModelState],
    acts: list[float],
    logit: float,
    last: int,
    kvc: KvCapacity | None,
    held: float | None = None,
) -> dict[str, PhaseMemory]:
    """Per phase, the worst candidate stage's parts. Offload follows verl 0.9.1
    (verl/utils/megatron_utils.py): param_offload moves weights to the host and frees the gradient
    buffers outside the update; optimizer_offload brings the optimizer back for the whole update
    (all mini-batches), so it adds to the activations' peak rather than replacing it. ``held``: the bytes vLLM keeps
    through the training phases where it cannot sleep (:func:`host_vllm_resident_bytes`), whatever
    ``free_cache_engine`` asks."""
    smem, bat, eng = s.memory, s.batching, s.rollout
    off = set(smem.offload)
    kl = w.kind == "grpo" and w.kl
    p_off, o_off = "param" in off, "optimizer" in off
    g_off = "grad" in off or p_off
    native = eng.native
    if held is not None:  # vLLM's CPU build: no sleep mode, its weights and the trainer's KV cache stay
        resident = held
    else:
        resident = kvc.budget_bytes if (kvc is not None and not eng.free_cache_engine) else 0.0
    # A sleeping vLLM (free_cache_engine) releases its weights and KV cache but keeps its captured
    # CUDA graphs' memory pool through the training phases (vllm-project/vllm#56373: "Level-1 cuMem
    # sleep releases weights and KV cache, but leaves graph executables and native CUDA graph pools
    # resident"; #45648 shows the same at level 2 on H20).
    asleep = kvc is not None and sleeps(hardware, eng.free_cache_engine)
    graphs = CUDA_GRAPH_BYTES if (asleep and captures_cuda_graphs(hardware, eng.enforce_eager)) else 0.0
    ref = ("ref_weights",) if kl else ()
    state_keys = ("weights", "grads", "optimizer") + ref
    extra = ("vllm_resident",) if resident else (("vllm_cuda_graphs",) if graphs else ())
    resident = resident or graphs

    def res(st: ModelState, weights_needed: bool) -> tuple[float, ...]:
        r = (
            st.weights if (weights_needed or not p_off) else 0.0,
            0.0 if g_off else st.grads,
            0.0 if o_off else st.optimizer,
        )
        return r + ((0.0 if p_off else st.weights),) if kl else r

    rows: dict[str, tuple[tuple[str, ...], list[tuple[float, ...]]]] = {}
    upd = []
    for i, st in states.items():
        refw = (0.0 if p_off else st.weights,) if kl else ()
        tail = (resident,) if resident else ()
        fb = (st.weights, st.grads, st.optimizer) + refw + (acts[i], logit if i == last else 0.0, 0.0) + tail
        # The optimizer step, after the activations are freed: torch's foreach Adam (what Megatron
        # falls back to, verl#3124's traceback) allocates sqrt(exp_avg_sq) for the whole shard, one
        # fp32 value per parameter (torch/optim/adam.py _multi_tensor_adam): a third of the 12 B of state.
        step = (st.weights, st.grads, st.optimizer) + refw + (0.0, 0.0, st.optimizer * ADAM_STEP_TEMP) + tail
        upd.append(fb if sum(fb) >= sum(step) else step)
    if w.kind == "grpo":
        fseq, fmbs = micro_batch_shape(
            s, w, bat.log_prob_max_tokens_per_gpu or bat.max_tokens_per_gpu, mbs=bat.log_prob_mbs_
        )
        fwd = forward_activation_bytes(m, s, seq_len=fseq, mbs=fmbs, kernels=k)
        # verl's old log-prob always computes the entropy (a metric); no backward, nothing saved
        flog = logits_bytes(m, s, seq_len=fseq, mbs=fmbs, act_bytes=k.act_bytes, grad=False, entropy=True)
        olp, rlp, ws, ro = [], [], [], []
        bucket = min(eng.sync_bucket_bytes, BF16 * float(total_params(m))) + sync_bucket_bytes(m, s.layout.ep)
        for i, st in states.items():
            lg = flog if i == last else 0.0
            need = res(st, True)
            olp.append(need + (fwd, lg) + ((resident,) if resident else ()))
            if kl:
                rlp.append(res(st, False)[:3] + (st.weights, fwd, lg) + ((resident,) if resident else ()))
            if native:  # the trainer's own sampler: live actor weights, one forward, no KV cache
                ws.append(need + (0.0, 0.0))
                ro.append(need + (0.0, fwd + lg, 0.0))
            else:  # verl wakes vLLM's weights first, the KV cache only after the sync
                assert kvc is not None  # a GRPO step on vLLM has its KV cache priced
                ws.append(need + (kvc.weights_bytes, bucket))
                ro.append(res(st, False) + (kvc.weights_bytes, kvc.working_bytes, max(0.0, kvc.kv_bytes)))
        rows["rollout"] = (state_keys + ("rollout_weights", "rollout_activations", "rollout_kv_cache"), ro)
        rows["weight_sync"] = (state_keys + ("rollout_weights", "sync_bucket"), ws)
        rows["old_logprob"] = (state_keys + ("activations", "logits") + extra, olp)
        if kl:
            rows["ref_logprob"] = (state_keys + ("activations", "logits") + extra, rlp)
    rows["update"] = (state_keys + ("activations", "logits", "optimizer_step") + extra, upd)
    out: dict[str, PhaseMemory] = {}
    for name, (keys, vals) in rows.items():
        worst = vals[0] if len(vals) == 1 else max(vals, key=sum)
        info: dict[str, float] = {}
        if name == "rollout":
            info = {"native_rollout": 1.0} if native or kvc is None else kvc.to_info()
        out[name] = PhaseMemory(name, dict(zip(keys, map(float, worst))), info)
    return out


def _violations(
    out: dict[str, PhaseMemory], hardware: HardwareSpec, w: Workload, kvc: KvCapacity | None, cap: float
) -> list[Violation]:
    violations: list[Violation] = []
    for name, pm in out.items():
        tot = pm.total_bytes
        if tot > cap:
            violations.append(
                Violation(
                    "OOM_RISK",
                    f"phase {name} needs {tot / GiB:.1f} GiB > {cap / GiB:.1f} GiB capacity "
                    f"({(tot - cap) / GiB:.1f} GiB over; largest part: {max(pm.parts, key=lambda k: pm.parts[k])})",
                    phase=name,
                    bytes_over=tot - cap,
                )
            )
    if kvc is not None:
        if kvc.kv_bytes <= 0:
            violations.append(
                Violation(
                    "OOM_RISK",
                    f"gpu_memory_utilization gives vLLM {kvc.budget_bytes / GiB:.1f} GiB, less than its "
                    f"weights + working set ({(kvc.weights_bytes + kvc.working_bytes) / GiB:.1f} GiB): no KV cache",
                    phase="rollout",
                    bytes_over=-kvc.kv_bytes,
                )
            )
        elif kvc.sequences < 1:
            need = (w.prompt_len + w.response_len) * kvc.bytes_per_token
            violations.append(
                Violation(
                    "OOM_RISK",
                    f"the KV cache ({kvc.tokens} tokens) cannot hold one sequence of "
                    f"{w.prompt_len + w.response_len} tokens; raise gpu_memory_utilization or rollout_tp",
                    phase="rollout",
                    bytes_over=need - kvc.kv_bytes,
                )
            )
    return violations


def _host_bytes(s: Strategy, w: Workload, states: dict[int, ModelState], cluster: Cluster) -> float:
    """Host memory per node: every rank keeps its offloaded state there (worst stage), and the
    CPU optimizer's share of the optimizer state (fp32 master + moments) plus its fp32 grad copy."""
    smem = s.memory
    off = set(smem.offload)
    kl = w.kind == "grpo" and w.kl
    host_rank = 0.0
    f = smem.cpu_optimizer or 0.0
    for st in states.values():
        h = (st.weights * (2 if kl else 1) if "param" in off else 0.0) + (st.grads + st.optimizer) * f
        if "optimizer" in off:
            h += st.optimizer * (1.0 - f)
        host_rank = max(host_rank, h)
    return host_rank * cluster.ranks_per_node


__all__ = [
    "CPU_KERNELS",
    "GPU_KERNELS",
    "Kernels",
    "KvCapacity",
    "LayerCoeffs",
    "ModelState",
    "forward_activation_bytes",
    "host_kv_cache_bytes",
    "host_vllm_resident_bytes",
    "in_flight_microbatches",
    "kernels_for",
    "kv_bytes_per_token",
    "kv_cache_capacity",
    "layer_activation_bytes",
    "layer_coeffs",
    "logits_bytes",
    "model_state_bytes",
    "model_state_bytes_per_param",
    "paper_layer_activation_bytes",
    "phase_memory",
    "rollout_weight_bytes",
    "sleeps",
    "sync_bucket_bytes",
    "train_activation_bytes",
]
