"""The time model's parameters for one hardware profile under one software stack (:class:`Efficiency`), and
which of them belong to the stack (:data:`STACK_KEYS`): core.hardware holds the chip's, core.stacks the stack's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import ConfigError
from .validation import check_keys


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Time-model parameters of one hardware profile (its ``[efficiency]`` table). One set of
    defaults, here; a profile overrides what it has measured or fitted. See costmodel/timing.py."""

    gemm_efficiency_max: float = 0.7
    """Fraction of peak a large GEMM reaches (the saturating curve's ceiling)."""
    gemm_intensity_half: float = 100.0
    """Arithmetic intensity at which a GEMM reaches half of ``gemm_efficiency_max``."""
    attention_efficiency: float = 0.5
    """Fraction of peak of core attention with the profile's ``attention_kernel``."""
    comm_efficiency: float = 0.8
    """Achieved over datasheet bandwidth of every collective."""
    hbm_efficiency: float = 0.8
    intra_node_latency_s: float = 10e-6
    inter_node_latency_s: float = 20e-6
    layer_overhead_s: float = 20e-6
    """Kernel launch/dispatch cost per layer per micro-batch (forward; backward twice)."""
    decode_step_overhead_s: float = 1e-3
    """Engine scheduler + sampler cost per decode step with CUDA graphs (a stack parameter)."""
    decode_sequence_overhead_s: float = 0.0
    """Engine cost per running sequence per decode step (scheduling, detokenising, sampling
    bookkeeping on the host; a stack parameter)."""
    eager_layer_overhead_s: float = 80e-6
    """Host time to launch one layer's kernels in a decode step when vLLM runs eager (``enforce_eager``):
    each of a layer's ~15-30 ops goes through Python and the PyTorch dispatcher; the forward takes the
    longer of these launches and the GPU's own time (costmodel.rollout), and a CUDA graph replays it as
    one launch (a stack parameter: fitted for verl-0.9.1, validate/grpo.py PRIORS)."""
    dp_overlap: float = 0.8
    """Fraction of the DP gradient reduce / parameter gather that Megatron hides behind compute."""
    tp_backward_overlap: float = 1.0
    """Fraction of the backward TP communication (and sequence parallel's re-gather) hidden behind the
    weight-gradient GEMMs. 0 exposes both, as Megatron runs without TE's tp-comm-overlap and as
    Calculon models it: with the shipped A100 curve that moves Korthikanti's 22B selective row from
    -18% to -8% and the held-out MAPE from 4.9% to 4.5%, but refitting the curve on the 4 fit rows then
    degenerates (gemm_intensity_half -> 0), so 1.0 (hidden) stays until there are more fit rows."""
    causal_attention_fraction: float = 0.5
    max_parallel_ranks: float = 0.0
    """Ranks that run at once (CPU cores); 0 = no limit."""
    micro_batch_overhead_s: float = 0.0
    """Fixed cost per micro-batch of a training or log-prob pass (data prep, schedule, loss)."""
    moe_layer_overhead_s: float = 0.0
    """Per MoE layer per micro-batch: token permutation, router, all-to-all launches (forward)."""
    decode_efficiency: float = 1.0
    """Share of the HBM roofline (``hbm_efficiency`` x bandwidth) that decode kernels reach on this GPU
    (paged attention and small-batch GEMMs stream weights and KV cache below a STREAM copy). The
    host's share of a decode step is the stack's ``decode_step_overhead_s`` and
    ``decode_sequence_overhead_s``, not this."""
    moe_decode_efficiency: float = 1.0
    """Achieved over streaming HBM bandwidth when decode reads routed experts (grouped GEMM, few tokens each)."""
    engine_sleep_s: float = 0.0
    """The stack's own rollout engine (``StackSpec.engine``: the engine its figures were fitted on) going to sleep
    after generation (vLLM sleep level 2: drop weights and KV cache), counted in verl's ``timing_s/gen``. A stack
    file sets it in its ``[engine]`` table as ``sleep_s`` (older files: ``[params] vllm_sleep_s``). A plan on
    another engine is priced with that engine's own figures (engines/)."""
    engine_wake_s: float = 0.0
    """The stack's own rollout engine waking its weights and re-allocating its KV cache, counted in
    ``timing_s/update_weights`` (``[engine] wake_s``; older files: ``[params] vllm_wake_s``)."""
    sync_tensor_overhead_s: float = 0.0
    """Per HF tensor exported (bridge conversion, gather launch) during weight sync."""
    sync_bucket_overhead_s: float = 0.0
    """Per bucket shipped to vLLM by CUDA IPC (handle rebuild, load_weights)."""
    pp_export_tensor_overhead_s: float = 0.0
    """Per HF tensor exported from a pipeline-parallel model, on top of ``sync_tensor_overhead_s``: verl's
    ``per_tensor_generator`` sends each tensor's name and shape through object collectives over the pipeline
    group (``all_gather_object``, ``broadcast_object_list``: pickling and a host sync each) before its data."""
    controller_bytes_per_s: float = 0.0
    """Bytes per second at which a single-controller framework moves a phase's batch between its driver and
    the workers (verl: the padded ``DataProto`` put into Ray's object store once per DP chunk, fetched by the
    workers, the outputs gathered back; costmodel.train_time.controller_s). 0: not priced (a stack parameter)."""
    reshard_entry_overhead_s: float = 0.0
    """Per bulk entry of NeMo-RL's NCCL-reshard refit (one xferdtensor call for a layer's FFN projection, its
    experts grouped: the shard plan, the receive-buffer pre hook and the fused-copy post hook)."""
    load_weights_scan_s: float = 0.0
    """Per vLLM parameter, per ``load_weights`` call that carries a single tensor (verl's weight sync without
    the checkpoint engine calls it once per HF tensor): each call rebuilds ``dict(named_parameters())`` and
    walks it, so the call costs this times the engine's parameter count."""
    pageable_copy_fraction: float = 0.5
    """Pageable host<->device copies over pinned ones (verl copies optimizer state pageable)."""
    packing_efficiency: float = 0.95
    """Tokens per micro-batch under dynamic batching, over the token cap (balanced partitions)."""
    pp_packed_fill: float = 0.0
    """With pipeline parallelism, the tokens a packed micro-batch computes on, over the token cap: 0 = the
    packed tokens themselves (``packing_efficiency`` of the cap; verl), 1 = every micro-batch padded to the
    longest packed bin, which first-fit-decreasing packing fills to within a short sequence of the cap
    (NeMo-RL v0.3: ``pad_full_seq_to`` = the longest bin, so that the pipeline's buffers keep one shape;
    a stack parameter)."""
    rl_compute_scale: float = 1.0
    """Achieved FLOP/s of RL training passes (short packed micro-batches, fp32 log-prob) over pretraining's."""
    grad_reduce_bytes: float = 4.0
    """Bytes per gradient element in Megatron's grad buffer and DP reduce: 4 with
    ``grad_reduce_in_fp32`` (verl's default), 2 without (NeMo-RL's). A stack parameter."""
    balance_per_optimizer_step: float = 0.0
    """1 where the framework balances each optimizer step's sequences across the DP ranks by tokens (NeMo-RL shards
    every train global batch by length for sequence packing), 0 where it balances the whole step's batch and then
    splits it into mini-batches (verl's ``trainer.balance_batch``): the update's slowest-rank spread
    (costmodel.timing.slowest_rank_factor) is then that of a subset of a balanced share. A stack parameter."""

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "efficiency") -> "Efficiency":
        data = check_keys(cls, data, where)
        values: dict[str, float] = {}
        for k, v in data.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v == float("inf"):
                raise ConfigError(f"{where}.{k} must be a finite number >= 0, got {v!r}")
            # a fraction of peak: 0 divides step times by zero, above 1 beats the hardware
            if (k.endswith("_efficiency") or k.endswith("_efficiency_max")) and not 0 < v <= 1:
                raise ConfigError(
                    f"{where}.{k} must be a fraction in (0, 1], got {v!r}",
                    hint="an efficiency is the achieved share of the peak figure",
                )
            values[k] = float(v)
        return cls(**values)


STACK_KEYS: frozenset[str] = frozenset(
    {
        "layer_overhead_s",
        "micro_batch_overhead_s",
        "moe_layer_overhead_s",
        "decode_step_overhead_s",
        "decode_sequence_overhead_s",
        "eager_layer_overhead_s",
        "engine_sleep_s",
        "engine_wake_s",
        "sync_tensor_overhead_s",
        "sync_bucket_overhead_s",
        "load_weights_scan_s",
        "reshard_entry_overhead_s",
        "pp_export_tensor_overhead_s",
        "pageable_copy_fraction",
        "packing_efficiency",
        "pp_packed_fill",
        "rl_compute_scale",
        "grad_reduce_bytes",
        "balance_per_optimizer_step",
        "controller_bytes_per_s",
    }
)
"""Efficiency fields that belong to the software stack (profiles/stacks/*.toml), not to the chip:
host costs, engine costs and framework properties. A hardware profile file may not set them."""

ENGINE_KEYS: dict[str, str] = {"sleep_s": "engine_sleep_s", "wake_s": "engine_wake_s"}
"""A stack file's ``[engine]`` table (the rollout engine its figures were fitted on): each key and the Efficiency
field it sets. The same names as the engine contract's own figures (engines/base.py ``RolloutEngineSpec.sleep_s``,
``wake_s``), which price a plan on an engine the stack was not fitted on."""
OLD_STACK_KEYS: dict[str, str] = {"vllm_sleep_s": "sleep_s", "vllm_wake_s": "wake_s"}
"""``[params]`` keys of stack files written before the engines got their own table, read as ``[engine]`` keys of a
vLLM stack (they priced vLLM's sleep and wake)."""
