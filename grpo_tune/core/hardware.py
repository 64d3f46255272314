"""Hardware profiles: one GPU kind and the node around it (:class:`HardwareSpec`), with the time model's
parameters for it (:class:`Efficiency`). Loaded from ``profiles/hardware/*.toml`` by ``core.specs.load_hardware``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .validation import FINITE_NON_NEGATIVE, FINITE_POSITIVE, POSITIVE, Schema, check_keys, from_mapping, to_mapping


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
    """Extra launch cost per layer per decode step when vLLM runs eager (``enforce_eager``): ~10 kernel
    launches per layer at ~8 us each, which CUDA graphs replay as one (an estimate, not fitted)."""
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
    vllm_sleep_s: float = 0.0
    """vLLM sleep (level 2: drop weights and KV cache), counted in verl's ``timing_s/gen``."""
    vllm_wake_s: float = 0.0
    """vLLM wake of weights and re-allocation of the KV cache, counted in ``timing_s/update_weights``."""
    sync_tensor_overhead_s: float = 0.0
    """Per HF tensor exported (bridge conversion, gather launch) during weight sync."""
    sync_bucket_overhead_s: float = 0.0
    """Per bucket shipped to vLLM by CUDA IPC (handle rebuild, load_weights)."""
    pageable_copy_fraction: float = 0.5
    """Pageable host<->device copies over pinned ones (verl copies optimizer state pageable)."""
    packing_efficiency: float = 0.95
    """Tokens per micro-batch under dynamic batching, over the token cap (balanced partitions)."""
    rl_compute_scale: float = 1.0
    """Achieved FLOP/s of RL training passes (short packed micro-batches, fp32 log-prob) over pretraining's."""
    grad_reduce_bytes: float = 4.0
    """Bytes per gradient element in Megatron's grad buffer and DP reduce: 4 with
    ``grad_reduce_in_fp32`` (verl's default), 2 without (NeMo-RL's). A stack parameter."""

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "efficiency") -> "Efficiency":
        data = check_keys(cls, data, where)
        for k, v in data.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v == float("inf"):
                raise ConfigError(f"{where}.{k} must be a finite number >= 0, got {v!r}")
            # a fraction of peak: 0 divides step times by zero, above 1 beats the hardware (diag, issue 14 #8)
            if (k.endswith("_efficiency") or k.endswith("_efficiency_max")) and not 0 < v <= 1:
                raise ConfigError(
                    f"{where}.{k} must be a fraction in (0, 1], got {v!r}",
                    hint="an efficiency is the achieved share of the peak figure",
                )
        return cls(**{k: float(v) for k, v in data.items()})


STACK_KEYS: frozenset[str] = frozenset(
    {
        "layer_overhead_s",
        "micro_batch_overhead_s",
        "moe_layer_overhead_s",
        "decode_step_overhead_s",
        "decode_sequence_overhead_s",
        "eager_layer_overhead_s",
        "vllm_sleep_s",
        "vllm_wake_s",
        "sync_tensor_overhead_s",
        "sync_bucket_overhead_s",
        "pageable_copy_fraction",
        "packing_efficiency",
        "rl_compute_scale",
        "grad_reduce_bytes",
    }
)
"""Efficiency fields that belong to the software stack (profiles/stacks/*.toml), not to the chip:
host costs, engine costs and framework properties. A hardware profile file may not set them."""

PROVENANCES = ("fitted", "transferred", "spec-only")
"""How a hardware profile's time-model parameters were obtained: ``fitted`` on measurements (cited),
``transferred`` from another profile by stated ratios, or ``spec-only`` (datasheet figures and defaults)."""

ROLLOUT_ENGINES = ("vllm", "megatron")
"""Who samples the responses, as the trainer's ``rollout_engine`` names them (core.choices.RolloutEngine less
``auto``): vLLM, or the trainer's own Megatron model."""
OLD_ROLLOUT_ENGINES = {"megatron-native": "megatron"}
"""Spellings profiles used before the two vocabularies became one, read as their current names."""
ATTENTION_KERNELS = ("flash", "unfused")
ACTIVATION_LAYOUTS = ("te-bf16", "local-fp32")


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One GPU kind and the node around it. Every key carries its unit."""

    name: str
    source: str
    bf16_dense_flops_per_s: float
    """Peak dense bf16 tensor-core FLOP/s (fp32 for the ``cpu`` profile)."""
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    """Per GPU, one direction (NVLink: half the bidirectional datasheet figure)."""
    inter_node_bandwidth_bytes_per_s: float
    """Per GPU, one direction (NICs per node x line rate / GPUs per node)."""
    host_memory_bytes: float
    """Per node."""
    host_to_device_bandwidth_bytes_per_s: float
    reserved_memory_bytes: float
    """CUDA context, NCCL buffers and allocator fragmentation that no tensor can use."""
    host_flops_per_s: float = 5e12
    """fp32 FLOP/s of the host CPUs per node (Megatron's CPU optimizer runs Adam there)."""
    host_memory_bandwidth_bytes_per_s: float = 300e9
    """Host DRAM bandwidth per node (CPU Adam is bound by it)."""
    rollout_engine: str = "vllm"
    """``vllm`` (colocated, KV cache) or ``megatron`` (the trainer's own sampler, no KV cache; profiles written
    before may say ``megatron-native``)."""
    attention_kernel: str = "flash"
    """``flash`` (no score matrix kept; causal block skipping) or ``unfused`` (softmax scores kept)."""
    activation_layout: str = "te-bf16"
    """``te-bf16`` (TransformerEngine fused layers, bf16) or ``local-fp32`` (megatron's local spec in fp32)."""
    price_per_gpu_hour_usd: float | None = None
    aliases: tuple[str, ...] = ()
    nvlink_domain_gpus: int = 0
    """GPUs in one NVLink domain (0: the node's ``gpus_per_node``). GB200 NVL72: 72 GPUs in one
    domain at 4 per host; groups inside a domain run at NVLink speed even across hosts."""
    provenance: str = "spec-only"
    """How the time-model parameters were obtained (one of :data:`PROVENANCES`)."""
    provenance_note: str = ""
    """What they were fitted on, or transferred from which profile by which ratios."""
    default_stack: str = ""
    """The software stack priced when none is chosen (empty: ``core.stacks.DEFAULT_STACK``)."""
    stack: str = ""
    """The stack whose parameters ``efficiency`` carries (set by ``core.stacks.apply_stack``)."""
    efficiency: Efficiency = field(default_factory=Efficiency)
    """Time-model parameters (see costmodel.timing): the chip's from the hardware profile, the
    software's from the stack profile."""

    @property
    def nvlink_domain(self) -> int:
        """GPUs that share one NVLink domain (at least a node)."""
        return max(self.nvlink_domain_gpus, self.gpus_per_node)

    @property
    def ridge_point(self) -> float:
        """Peak dense FLOP/s over HBM bytes/s: the arithmetic intensity where a roofline turns flat."""
        return self.bf16_dense_flops_per_s / self.hbm_bandwidth_bytes_per_s

    @property
    def native_rollout(self) -> bool:
        """The trainer samples with its own Megatron model (no second weight copy, no KV cache)."""
        return self.rollout_engine == "megatron"

    def to_dict(self) -> dict[str, Any]:
        """The profile as a file holds it: the stack's parameters stay in the stack (named by ``stack``)."""
        d = to_mapping(self)
        d["efficiency"] = {k: v for k, v in d["efficiency"].items() if k not in STACK_KEYS}
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "hardware") -> "HardwareSpec":
        """A profile (a file's table, or ``to_dict`` output) with its stack's parameters applied: the
        one named by ``stack``, else ``default_stack``, else ``core.stacks.DEFAULT_STACK``."""
        hw = cls._from_dict(data, where=where)
        from .stacks import apply_stack, load_stack

        return apply_stack(hw, load_stack(hw.stack or hw.default_stack or None))

    @classmethod
    def _from_dict(cls, data: dict[str, Any], *, where: str = "hardware") -> "HardwareSpec":
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a table/mapping, got {type(data).__name__}")
        data = dict(data)
        if "aliases" in data:
            al = data["aliases"]
            if not isinstance(al, (list, tuple)) or not all(isinstance(a, str) for a in al):
                raise ConfigError(f"{where}.aliases must be a list of names, got {al!r}")
            data["aliases"] = tuple(al)
        eff = data.get("efficiency")
        if isinstance(eff, dict):
            data["efficiency"] = Efficiency.from_dict(eff, where=f"{where}.efficiency")
        elif eff is not None and not isinstance(eff, Efficiency):
            raise ConfigError(f"{where}.efficiency must be a table of numbers, got {eff!r}")
        if data.get("rollout_engine") in OLD_ROLLOUT_ENGINES:
            data["rollout_engine"] = OLD_ROLLOUT_ENGINES[data["rollout_engine"]]
        for key, allowed in (
            ("rollout_engine", ROLLOUT_ENGINES),
            ("attention_kernel", ATTENTION_KERNELS),
            ("activation_layout", ACTIVATION_LAYOUTS),
        ):
            if key in data and data[key] not in allowed:
                raise ConfigError(f"{where}.{key} must be one of {', '.join(allowed)}, got {data[key]!r}")
        if "provenance" in data and data["provenance"] not in PROVENANCES:
            raise ConfigError(
                f"{where}.provenance must be one of {', '.join(PROVENANCES)}, got {data['provenance']!r}",
                hint="fitted (on cited measurements), transferred (from another profile) or spec-only",
            )
        hw = from_mapping(cls, data, where, _HARDWARE_SCHEMA)
        if hw.reserved_memory_bytes >= hw.hbm_bytes:
            # capacity = hbm - reserved: zero or negative would make every plan "not fit" by a wrong amount
            raise ConfigError(
                f"{where}.reserved_memory_bytes ({hw.reserved_memory_bytes:.4g}) must be below "
                f"hbm_bytes ({hw.hbm_bytes:.4g})",
                hint="reserved_memory_bytes is the part of HBM no tensor can use (CUDA context, "
                "NCCL buffers), typically a few GiB",
            )
        return hw

    def with_efficiency(self, **eff: float) -> "HardwareSpec":
        return dataclasses.replace(self, efficiency=dataclasses.replace(self.efficiency, **eff))

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                self.bf16_dense_flops_per_s,
                self.hbm_bytes,
                self.gpus_per_node,
                self.nvlink_domain_gpus,
                self.stack,
                self.efficiency,
                self.rollout_engine,
                self.attention_kernel,
                self.activation_layout,
            )
        )


_HARDWARE_SCHEMA = Schema(
    ints=FINITE_NON_NEGATIVE,
    floats=FINITE_NON_NEGATIVE,
    ranges={
        "gpus_per_node": POSITIVE,
        **{
            k: FINITE_POSITIVE
            for k in (
                "bf16_dense_flops_per_s",
                "hbm_bytes",
                "hbm_bandwidth_bytes_per_s",
                "intra_node_bandwidth_bytes_per_s",
                "inter_node_bandwidth_bytes_per_s",
                "host_to_device_bandwidth_bytes_per_s",
                "host_flops_per_s",
                "host_memory_bandwidth_bytes_per_s",
            )
        },
    },
)
