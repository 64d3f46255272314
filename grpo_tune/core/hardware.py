"""Hardware profiles: one GPU kind and the node around it (:class:`HardwareSpec`), with the time model's
parameters for it (:class:`core.efficiency.Efficiency`) under a software stack (:func:`apply_stack`).
Loaded from ``profiles/hardware/*.toml`` by ``core.specs.load_hardware``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Mapping
from functools import lru_cache

from .efficiency import STACK_KEYS, Efficiency
from .errors import ConfigError, UnsupportedPrecisionError
from .stacks import StackSpec, load_stack
from .validation import FINITE_NON_NEGATIVE, FINITE_POSITIVE, POSITIVE, Schema, from_mapping, to_mapping


PROVENANCES = ("fitted", "transferred", "spec-only")
"""How a hardware profile's time-model parameters were obtained: ``fitted`` on measurements (cited),
``transferred`` from another profile by stated ratios, or ``spec-only`` (datasheet figures and defaults)."""

ROLLOUT_ENGINES = ("vllm", "megatron")
"""The engines a platform without GPU engines (``memory_is_host``: ``cpu``) prices: its trainer's own Megatron
sampler, or vLLM's CPU build where the stack has its costs (:func:`with_rollout_engine`)."""
OLD_ROLLOUT_ENGINES = {"megatron-native": "megatron"}
"""Spellings run configs used for the trainer's own sampler before the two vocabularies became one."""
NATIVE_ENGINE = "megatron"
"""The trainer's own sampler (engines/megatron): the default engine of plans on a ``memory_is_host`` platform."""
FP8_GEMM_EFFICIENCY = 0.72
"""Achieved FP8 GEMM FLOP/s over twice the achieved bf16 FLOP/s at the same shape
(:meth:`HardwareSpec.gemm_flops_per_s`): vLLM's ``benchmark_fp8_gemm.py`` on an H100 (vllm-project/vllm#49363,
N=12288 K=5376) gives block-wise FP8 263.3 against bf16 182.6 TFLOP/s at 64 tokens (1.44x) and FP8 with the
per-token activation quantization 505.7 against 352.6 at 128 (1.43x): 0.72 of the 2x the datasheets' peaks promise.
Measured on Hopper; other FP8 GPUs take it until measured (docs/precision.md)."""
ATTENTION_KERNELS = ("flash", "unfused")
ACTIVATION_LAYOUTS = ("te-bf16", "local-fp32")


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One GPU kind and the node around it. Every key carries its unit."""

    name: str
    source: str
    bf16_dense_flops_per_s: float
    """Peak dense bf16 tensor-core FLOP/s (fp32 for the ``cpu`` profile). Read through :meth:`peak_flops_per_s`."""
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
    memory_is_host: bool = False
    """The ranks compute in the node's RAM (the ``cpu`` profile): every rank of a node shares ``hbm_bytes``
    (:meth:`rank_memory_bytes`), and offloading moves nothing off it."""
    host_flops_per_s: float = 5e12
    """fp32 FLOP/s of the host CPUs per node (Megatron's CPU optimizer runs Adam there)."""
    host_memory_bandwidth_bytes_per_s: float = 300e9
    """Host DRAM bandwidth per node (CPU Adam is bound by it)."""
    attention_kernel: str = "flash"
    """``flash`` (no score matrix kept; causal block skipping) or ``unfused`` (softmax scores kept)."""
    activation_layout: str = "te-bf16"
    """``te-bf16`` (TransformerEngine fused layers, bf16) or ``local-fp32`` (megatron's local spec in fp32)."""
    fp8_dense_flops_per_s: float | None = None
    """Peak dense FP8 (e4m3) tensor-core FLOP/s, the datasheet's figure without sparsity; None: the GPU has no FP8
    tensor cores (A100), and a plan that asks for FP8 there is an UNSUPPORTED_PRECISION error."""
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
    """The stack whose parameters ``efficiency`` carries (set by :func:`apply_stack`)."""
    stack_engine: str = "vllm"
    """That stack's rollout engine (``StackSpec.engine``, set by :func:`apply_stack`): ``efficiency``'s
    ``engine_sleep_s`` / ``engine_wake_s`` are its figures (engines.sleep_wake_s)."""
    engine_costs: str = ""
    """The stack's ``[engines.<name>]`` table ``efficiency`` carries (set by :func:`with_rollout_engine` for a plan
    whose engine has one; empty: the stack's own ``[params]``). Pricing state like ``stack``, not a profile key: the
    engine is the plan's (``Strategy.rollout.engine``), and the profile only says what the platform is."""
    efficiency: Efficiency = field(default_factory=Efficiency)
    """Time-model parameters (see costmodel.timing): the chip's from the hardware profile, the
    software's from the stack profile."""

    @property
    def nvlink_domain(self) -> int:
        """GPUs that share one NVLink domain (at least a node)."""
        return max(self.nvlink_domain_gpus, self.gpus_per_node)

    def peak_flops_per_s(self, dtype: str = "bf16") -> float:
        """Peak dense tensor-core FLOP/s for GEMMs in ``dtype`` (``bf16`` or ``fp8``): the one place the cost
        model reads a chip's FLOP/s. FP8 on a profile without FP8 FLOP/s raises UNSUPPORTED_PRECISION."""
        if dtype == "fp8":
            if self.fp8_dense_flops_per_s is None:
                raise UnsupportedPrecisionError(
                    f"{self.name} has no FP8 tensor cores (its profile gives no fp8_dense_flops_per_s): "
                    "FP8 training or rollout cannot run there"
                )
            return self.fp8_dense_flops_per_s
        return self.bf16_dense_flops_per_s

    def gemm_flops_per_s(self, dtype: str = "bf16") -> float:
        """The peak a GEMM in ``dtype`` is priced against: :meth:`peak_flops_per_s`, and for FP8 that times
        :data:`FP8_GEMM_EFFICIENCY` (FP8 kernels reach a lower share of their peak than bf16 ones: the efficiency
        curve, fitted on bf16, then applies to both)."""
        peak = self.peak_flops_per_s(dtype)
        return peak * FP8_GEMM_EFFICIENCY if dtype == "fp8" else peak

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_dense_flops_per_s is not None

    @property
    def ridge_point(self) -> float:
        """Peak dense FLOP/s over HBM bytes/s: the arithmetic intensity where a roofline turns flat."""
        return self.peak_flops_per_s() / self.hbm_bandwidth_bytes_per_s

    def rank_memory_bytes(self, ranks_per_node: int) -> float:
        """Memory one rank computes in: a GPU's ``hbm_bytes``, or, where the ranks share the node's RAM
        (``memory_is_host``), its share of it among ``ranks_per_node`` ranks."""
        return self.hbm_bytes / max(1, ranks_per_node) if self.memory_is_host else self.hbm_bytes

    def rank_capacity_bytes(self, ranks_per_node: int) -> float:
        """What one rank's tensors may use: :meth:`rank_memory_bytes` less the reserved bytes."""
        return self.rank_memory_bytes(ranks_per_node) - self.reserved_memory_bytes

    @property
    def default_engine(self) -> str:
        """The rollout engine of a plan built on this platform when the plan names none: the trainer's own sampler
        where the ranks compute in host memory (``memory_is_host``: no GPU engine), else vLLM (engines.DEFAULT)."""
        return NATIVE_ENGINE if self.memory_is_host else "vllm"

    def to_dict(self) -> dict[str, object]:
        """The profile as a file holds it: the stack's parameters stay in the stack (named by ``stack``)."""
        d = to_mapping(self)
        d.pop("stack_engine", None)  # the stack's, named by ``stack``
        d.pop("engine_costs", None)  # the plan's engine's, applied again when the plan is read back
        d["efficiency"] = {k: v for k, v in self.efficiency.to_dict().items() if k not in STACK_KEYS}
        return d

    @classmethod
    def from_dict(cls, data: object, *, where: str = "hardware") -> "HardwareSpec":
        """A profile (a file's table, or ``to_dict`` output) with its stack's parameters applied: the
        one named by ``stack``, else ``default_stack``, else ``core.stacks.DEFAULT_STACK``."""
        hw = cls._from_dict(data, where=where)
        return apply_stack(hw, load_stack(hw.stack or hw.default_stack or None))

    @classmethod
    def _from_dict(cls, data: object, *, where: str = "hardware") -> "HardwareSpec":
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
        if "rollout_engine" in data:
            raise ConfigError(
                f"{where}.rollout_engine: the rollout engine is the plan's, not the hardware profile's "
                f"(got {data['rollout_engine']!r})",
                hint="delete the key; choose the engine with --rollout-engine vllm|sglang|auto (a plan's strategy "
                "'engine'); a memory_is_host profile (cpu) defaults to the trainer's own sampler",
            )
        for key, allowed in (
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
                self.peak_flops_per_s(),
                self.fp8_dense_flops_per_s,
                self.hbm_bytes,
                self.gpus_per_node,
                self.nvlink_domain_gpus,
                self.stack,
                self.stack_engine,
                self.efficiency,
                self.engine_costs,
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
                "fp8_dense_flops_per_s",
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


@lru_cache(maxsize=256)
def apply_stack(hw: HardwareSpec, stack: StackSpec, engine: str | None = None) -> HardwareSpec:
    """``hw`` priced under ``stack``: its efficiency carries the stack's parameters (its ``[engines.<engine>]``
    table's where ``engine``, the plan's, has one: ``engine_costs`` names it; None: the one ``hw`` carries),
    ``hw.stack`` names it."""
    costs = hw.engine_costs if engine is None else engine
    costs = costs if costs in stack.engines else ""
    eff = stack.efficiency(hw.efficiency, costs)
    if hw.stack == stack.name and hw.efficiency == eff and hw.stack_engine == stack.engine and hw.engine_costs == costs:
        return hw
    return dataclasses.replace(hw, stack=stack.name, stack_engine=stack.engine, efficiency=eff, engine_costs=costs)


def with_stack(hw: HardwareSpec, name: str | None) -> HardwareSpec:
    """``hw`` under the stack ``name`` (None: as loaded, its default stack)."""
    return hw if not name else apply_stack(hw, load_stack(name))


def plan_engine(pins: Mapping[str, object], hw: HardwareSpec) -> str:
    """The engine of plans built from ``pins`` on ``hw``: the pinned one, else (no pin, or ``auto`` on a platform with
    one engine) the platform's default (:attr:`HardwareSpec.default_engine`). ``auto`` on a GPU stays ``auto`` (the
    search tries each engine)."""
    e = pins.get("engine")
    if isinstance(e, str) and e not in ("", "auto"):
        return e
    return hw.default_engine if (e is None or hw.default_engine == NATIVE_ENGINE) else "auto"


def with_rollout_engine(hw: HardwareSpec, engine: str, stack: str | None = None) -> HardwareSpec:
    """``hw`` priced for a plan whose rollout engine is ``engine``. On a platform whose default engine is the
    trainer's own sampler (``memory_is_host``: ``cpu``), another engine (vllm) is priced with its stack's
    ``[engines.<engine>]`` costs (the ``grpo-tune-cpu`` stack's vLLM-on-CPU decode costs); other platforms and the
    default engine come back unchanged. SGLang there, or a stack without that table, is a NOT_PRICED error: its
    costs are the native sampler's. ``stack``: the stack ``hw`` is priced under, by name or path (default: the one
    ``hw.stack`` names)."""
    if engine in ("auto", "", hw.default_engine, hw.engine_costs) or hw.default_engine != NATIVE_ENGINE:
        return hw  # already priced for it (under the stack it was priced with), or nothing to price
    spec = load_stack(stack or hw.stack or hw.default_stack or None)
    if engine not in ROLLOUT_ENGINES:  # SGLang: no CPU build the trainer runs
        raise ConfigError(
            f"{hw.name} samples with the trainer's own model or vLLM's CPU build, not {engine}: a plan with {engine} "
            "on it is not priced",
            hint="--rollout-engine vllm (vLLM's CPU build), or leave it out for the native sampler",
            code="NOT_PRICED",
        )
    if engine not in spec.engines:
        raise ConfigError(
            f"{hw.name} samples with the trainer's own model, and its stack {spec.name} has no {engine} costs "
            f"(no [engines.{engine}] table): a plan with {engine} on it is not priced",
            hint=f"fit them (docs/measurements.md, 'vLLM on CPU') into the stack's [engines.{engine}] table, or leave "
            "--rollout-engine out for the native sampler",
            code="NOT_PRICED",
        )
    return apply_stack(hw, spec, engine)
