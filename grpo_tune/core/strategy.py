"""Strategy (how a run is parallelized) and workload (what it trains), and the degree validator.

A Strategy is composed of one dataclass per concern: :class:`Layout`, :class:`Memory`, :class:`Batching`
and :class:`Rollout`; core/knobs.py names every knob once. Where the roles run (one pool or two) is
the run's :class:`~core.placement.Placement`, beside the strategy in a run config.
A plan that cannot exist (TP not dividing the heads, a product that differs from the GPU count)
raises :class:`InvalidDegreesError`; a plan that exists but does not fit is data (violations).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from . import bounds as _bounds
from . import knobs as _knobs
from .choices import Dtype, KvCacheDtype, PlanEngine, Offload, Recompute, RolloutPrecision, TrainPrecision, WorkloadKind
from .errors import ConfigError, InvalidDegreesError
from .knobs import OFFLOAD, RECOMPUTE, SYNC_BUCKET_MB, Knob, knobs
from .rules import check_degrees, divisors, errors, stage_layers
from .specs import ModelSpec
from .validation import FRACTION, Schema, check_names, check_value, from_mapping, hints, to_mapping, unwrap

__all__ = [
    "DEGREES",
    "OFFLOAD",
    "RECOMPUTE",
    "SYNC_BUCKET_MB",
    "Batching",
    "Cluster",
    "Layout",
    "Memory",
    "Rollout",
    "Strategy",
    "Workload",
    "divisors",
    "stage_layers",
    "validate",
]

_T = TypeVar("_T")

DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp")
"""The parallel degrees a plan sets, in Layout's field order (dp is derived from the GPU count)."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """How many GPUs (on CPU: processes) and how they group into nodes."""

    gpus: int
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        g, n = self.gpus, self.gpus_per_node
        _bounds.check("gpus", g, _bounds.MAX_GPUS, where="cluster")  # before anything walks its divisors
        _bounds.check("gpus_per_node", n, _bounds.MAX_GPUS_PER_NODE, where="cluster")
        if isinstance(g, int) and isinstance(n, int) and g > n > 0 and g % n:
            # torchrun, Slurm and verl (trainer.nnodes x n_gpus_per_node) start the same count on every node
            lower = g // n * n
            per = max(d for d in range(1, n + 1) if g % d == 0)
            raise ConfigError(
                f"{g} GPUs are not a whole number of {n}-GPU nodes: every node runs the same number of ranks",
                hint=f"use {lower} or {lower + n} GPUs ({n} per node), or {per} per node ({g // per} nodes of {per}): "
                "--gpus / --gpus-per-node, or cluster.gpus / cluster.gpus_per_node in a config",
            )

    @property
    def nnodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on the fullest node (fewer than ``gpus_per_node`` on a cluster smaller than a node)."""
        return min(self.gpus_per_node, self.gpus)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the model is split: the parallel degrees, the pipeline stage split and its interleaving."""

    tp: int = 1
    """Tensor parallel."""
    pp: int = 1
    """Pipeline parallel."""
    vpp: int = 1
    """Virtual pipeline chunks per stage (1 = no interleaving)."""
    cp: int = 1
    """Context parallel."""
    ep: int = 1
    """Expert parallel (MoE only)."""
    etp: int | None = None
    """Expert tensor parallel; None means the same as ``tp``."""
    dp: int | None = None
    """Data parallel; derived from the GPU count when None."""
    sequence_parallel: bool | None = None
    """None means on whenever tp > 1 (Megatron requires it for MoE with TP)."""
    first_stage_layers: int | None = None
    """Megatron's ``decoder_first_pipeline_num_layers``."""
    last_stage_layers: int | None = None
    """Megatron's ``decoder_last_pipeline_num_layers``."""

    @property
    def etp_(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def sp(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else (self.sequence_parallel and self.tp > 1)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    def degrees(self) -> dict[str, int | None]:
        """The parallel degrees by name, in :data:`DEGREES` order (``etp`` resolved), then ``dp``
        (None until :func:`validate` fills it in), as search's, train's and the launcher's layouts show them."""
        return {**{k: getattr(self, k) for k in DEGREES}, "etp": self.etp_, "dp": self.dp}


@dataclass(frozen=True, kw_only=True)
class Memory:
    """What is kept, recomputed or moved to the host: recompute, offload, the optimizer's placement, and
    whether the logits are materialised (fused kernels)."""

    recompute: str = "selective"
    """``none``, ``selective`` (core attention) or ``full``."""
    recompute_layers: int | None = None
    """With full recompute: layers per stage recomputed (None = all)."""
    distributed_optimizer: bool = True
    offload: tuple[str, ...] = ()
    """Subset of ``param``, ``grad``, ``optimizer`` moved to host memory between phases."""
    cpu_optimizer: float | None = None
    """Megatron's hybrid CPU optimizer: the fraction of optimizer state and step on the host
    (``optimizer_cpu_offload`` + ``optimizer_offload_fraction``). None = off."""
    overlap_cpu_optimizer: bool = False
    """Megatron's ``overlap_cpu_optimizer_d2h_h2d`` (with the CPU optimizer)."""
    precision_aware_optimizer: bool = False
    """Megatron's ``use_precision_aware_optimizer`` (bf16 master-weight-free Adam state where supported)."""
    fused_kernels: bool = False
    """verl's ``actor_rollout_ref.model.use_fused_kernels``: log-probs (and entropy) computed from the hidden
    states in vocab chunks (verl/utils/kernel/linear_cross_entropy.py, 1024 entries per split), so the
    logits are never materialised. Off: the output layer's logits feed megatron-core's vocab-parallel
    cross-entropy (the fp32 upcast it exponentiates in place and saves)."""


@dataclass(frozen=True, kw_only=True)
class Batching:
    """How a step's sequences are cut into micro-batches: a fixed size, or token caps (dynamic batching)."""

    mbs: int = 1
    """Micro-batch size (sequences)."""
    log_prob_mbs: int | None = None
    """Micro-batch size of the old/ref log-prob passes (verl's rollout and ref
    ``log_prob_micro_batch_size_per_gpu``); None = ``mbs``."""
    max_tokens_per_gpu: int | None = None
    """Dynamic batching (verl's ``use_dynamic_bsz`` + ``ppo_max_token_len_per_gpu``): micro-batches are
    packed up to this many tokens per GPU instead of ``mbs`` sequences. None = off (``mbs`` applies)."""
    log_prob_max_tokens_per_gpu: int | None = None
    """Token cap for the log-prob passes (verl's ``log_prob_max_token_len_per_gpu``); None = the update's."""

    @property
    def log_prob_mbs_(self) -> int:
        return self.mbs if self.log_prob_mbs is None else self.log_prob_mbs


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """The plan's rollout concern (``Strategy.rollout``): which engine samples (``engine``, engines/) and the
    knobs every engine shares, spelled by each engine in its own keys: its TP, memory, batching, graphs, and how
    it meets training.

    ``free_cache_engine`` (sleep during training) and the weight-sync bucket live here rather than in
    the placement: both are settings of the engine (verl spells them under ``rollout``), and the
    bucket sizes the engine's receiving side of every weight sync, colocated or not.
    """

    rollout_tp: int = 1
    """Tensor parallel of the rollout engine (vLLM)."""
    gpu_memory_utilization: float = 0.6
    """vLLM's fraction of total GPU memory for weights + KV cache during rollout."""
    max_num_seqs: int = 256
    """vLLM's ``max_num_seqs``: concurrent sequences per rollout replica (verl's default 256)."""
    max_num_batched_tokens: int = 8192
    """vLLM's ``max_num_batched_tokens``: tokens per engine step (prefill chunk + decodes)."""
    enforce_eager: bool = False
    """vLLM without CUDA graphs (a per-step launch overhead) when true."""
    chunked_prefill: bool = True
    """vLLM's ``enable_chunked_prefill``."""
    free_cache_engine: bool = True
    """verl's ``free_cache_engine``: vLLM sleeps (frees its KV cache) during training and wakes for rollout."""
    sync_bucket_mb: int = SYNC_BUCKET_MB
    """Weight-sync bucket in MiB (verl's ``rollout.checkpoint_engine.update_weights_bucket_megabytes``, used as
    ``<< 20`` bytes): the exported HF tensors are packed into buckets of this size, each shipped to vLLM by CUDA IPC."""

    engine: str = "vllm"
    """Which engine samples: ``vllm``, ``sglang`` or ``megatron`` (engines/; the CPU trainer's own sampler, the
    default of plans on a ``memory_is_host`` platform: ``HardwareSpec.default_engine``). Its knobs above are
    spelled by each engine's keys (``gpu_memory_utilization`` is SGLang's ``mem_fraction_static``)."""

    @property
    def sync_bucket_bytes(self) -> int:
        return self.sync_bucket_mb << 20

    @property
    def native(self) -> bool:
        """The trainer's own Megatron sampler samples (no second weight copy, no KV cache, nothing sleeps)."""
        return self.engine == "megatron"


@dataclass(frozen=True, kw_only=True)
class Precision:
    """The plan's number formats (docs/precision.md): training GEMMs, rollout weights, the rollout KV cache.
    FP8 needs FP8 tensor cores (``HardwareSpec.peak_flops_per_s('fp8')``)."""

    precision: str = "bf16"
    """Training: ``bf16``, or ``fp8`` (Megatron/TransformerEngine e4m3 GEMMs, blockwise recipe, bf16 master
    weights and optimizer as in bf16)."""
    rollout_precision: str = "bf16"
    """Rollout weights: ``bf16``, or ``fp8`` (block-wise FP8 W8A8, verl ``rollout.quantization=fp8``); with bf16
    training the samples are off-policy by the quantization error, so the importance-sampling correction is on."""
    kv_cache_dtype: str = "auto"
    """Rollout KV cache: ``auto`` (bf16) or ``fp8`` (e4m3: half the bytes per token)."""

    @property
    def default(self) -> bool:
        return self == _DEFAULT_PRECISION

    @property
    def off_policy_fp8(self) -> bool:
        """FP8 rollout with bf16 training: the sampler's policy differs from the trained one (needs the
        rollout importance-sampling correction)."""
        return self.rollout_precision == "fp8" and self.precision != "fp8"

    def note(self) -> str:
        """One line for an emitted launch's header: the number formats when not bf16, and why the off-policy
        correction is on (empty at the defaults)."""
        if self.default:
            return ""
        text = (
            f"Precision: training {self.precision}, rollout weights {self.rollout_precision}, "
            f"KV cache {self.kv_cache_dtype}"
        )
        if self.off_policy_fp8:
            text += (
                "; FP8 rollout with bf16 training samples from a quantized policy, so the rollout "
                "importance-sampling correction is on (docs/precision.md)"
            )
        return text + "."


_DEFAULT_PRECISION = Precision()

_CONCERN_TYPES: dict[str, type] = {
    "layout": Layout,
    "memory": Memory,
    "batching": Batching,
    "rollout": Rollout,
    "precision": Precision,
}
"""The dataclass of each concern (core/knobs.py CONCERNS)."""
_FLAT = ("layout", "memory", "batching", "rollout", "precision")
"""The concerns, whose fields a plan's ``strategy`` section lists flat."""


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """A plan: how a run is laid out, kept in memory, batched and rolled out.

    One frozen dataclass per concern, composed (torchtitan's job config does the same). Callers read a
    knob through its concern (``plan.layout.tp``, ``plan.batching.mbs``); :meth:`of` and :meth:`replace`
    take the knobs by their flat names (the table core/knobs.py says which concern each belongs to), as
    a plan's ``strategy`` section, the CLI's pins and the search space spell them. The reference model
    uses the actor's layout.

    Placement is not a concern of the strategy: it decides which GPUs the strategy's layout spans (the
    training pool's), so a run config carries it beside the strategy (core/config.py), and the
    separate-pool pricing takes both (costmodel/pools.py).
    """

    layout: Layout = Layout()
    memory: Memory = Memory()
    batching: Batching = Batching()
    rollout: Rollout = Rollout()
    precision: Precision = Precision()

    @classmethod
    def of(cls, **knobs: object) -> "Strategy":
        """The plan with these knobs (flat names, core/knobs.py) and every other at its default."""
        return _DEFAULT.replace(**knobs) if knobs else _DEFAULT

    def replace(self, **kw: object) -> "Strategy":
        """A copy with some knobs (flat names) or whole concerns (``layout=Layout(...)``) replaced.

        The search prices thousands of plans and ``estimate`` resolves every one through here, so the
        copy skips ``__init__`` (no concern has a ``__post_init__``): each touched concern is copied once,
        field by field (:func:`_copy`), which keeps the copies' attribute reads as fast as a constructed
        object's."""
        route = _route()
        parts: dict[str, dict[str, object]] = {}
        whole: dict[str, object] = {}
        for k, v in kw.items():
            r = route.get(k)
            if r is None:
                if k not in _CONCERN_TYPES:
                    raise TypeError(f"Strategy.replace() got an unexpected keyword argument {k!r}")
                whole[k] = v
            else:
                parts.setdefault(r[0], {})[r[1]] = v
        for concern, upd in parts.items():
            whole[concern] = _copy(whole.get(concern, getattr(self, concern)), upd)
        return _copy(self, whole)

    def _with_layout(self, **fields: object) -> "Strategy":
        """A copy with some :class:`Layout` fields replaced: :meth:`replace` without its routing, for
        :func:`validate`, which every estimate runs."""
        return _copy(self, {"layout": _copy(self.layout, fields)})

    @staticmethod
    def knob_names() -> list[str]:
        """The keys of a plan's ``strategy`` section, in table order (core/knobs.py)."""
        return [k.name for k in knobs() if k.concern in _FLAT]

    @staticmethod
    def knob_type(name: str) -> object:
        """A knob's value type without its ``None`` (``int`` for ``tp`` and ``etp``, ``bool``, ``str``, ...)."""
        concern, field = _route()[name]
        return unwrap(hints(_CONCERN_TYPES[concern])[field])[0]

    def knob(self, name: str) -> object:
        """One knob's value by its flat name, or a concern's derived value (``etp_``, ``sp``) by its name:
        how tables that spell the knobs otherwise (verl's keys, a launch's pins) read a plan."""
        r = _route().get(name)
        if r is not None:
            return getattr(getattr(self, r[0]), r[1])
        for c in _FLAT:
            part = getattr(self, c)
            if isinstance(getattr(type(part), name, None), property):
                return getattr(part, name)
        raise AttributeError(f"a plan has no knob {name!r}")

    def knobs(self) -> dict[str, object]:
        """Every knob of the layout, memory, batching and rollout concerns by its flat name, in table order."""
        return {k.name: getattr(getattr(self, k.concern), k.field) for k in knobs() if k.concern in _FLAT}

    def to_dict(self) -> dict[str, object]:
        """The ``strategy`` section: the knobs flat, in table order (as since schema 1)."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in self.knobs().items()}
        if d["log_prob_mbs"] is None:  # unset means mbs: plans (best.yaml, --json) without it read as before
            del d["log_prob_mbs"]
        for k, default in _QUIET_DEFAULTS.items():  # added after schema 1: a plan at their defaults reads as before
            if d.get(k) == default:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, data: object, *, where: str = "strategy") -> "Strategy":
        """A plan from a ``strategy`` section (its knobs flat)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a table/mapping, got {type(data).__name__}")
        check_names(data, cls.knob_names(), where)
        data = dict(data)
        if "offload" in data:
            off = data["offload"]
            if isinstance(off, str):
                off = [o for o in off.split(",") if o]
            if not isinstance(off, (list, tuple)) or not all(isinstance(o, str) for o in off):
                raise ConfigError(f"{where}.offload must be a list of {', '.join(OFFLOAD)}")
            data["offload"] = tuple(sorted(set(off), key=lambda o: OFFLOAD.index(o) if o in OFFLOAD else 99))
        route = _route()
        split: dict[str, dict[str, object]] = {c: {} for c in _FLAT}
        for k, v in data.items():  # in the section's order, as each value's error names it
            _bounds.check(k, v, _bounds.BY_FLAG.get(k, _bounds.MAX_INT), where=where)
            concern, name = route[k]
            cls_ = _CONCERN_TYPES[concern]
            check_value(where, k, hints(cls_)[name], v, _SCHEMAS.get(concern, _PLAIN))
            split[concern][name] = v
        parts = {c: _CONCERN_TYPES[c](**split[c]) for c in _FLAT}
        return cls(**parts)

    def layout_text(self) -> str:
        """``tp=.. pp=.. vpp=.. cp=.. ep=.. etp=.. dp=.. mbs=..`` (and ``log_prob_mbs=..`` when set): how
        verl.sh's plan line and ``grpo-tune estimate`` begin."""
        b, lay = self.batching, self.layout
        lp = "" if b.log_prob_mbs is None else f" log_prob_mbs={b.log_prob_mbs}"
        deg = lay.degrees()
        if lay.etp is None and lay.ep == 1:  # a dense model's (validate leaves it unset): no expert TP to show
            deg.pop("etp")
        return " ".join(f"{k}={v}" for k, v in deg.items()) + f" mbs={b.mbs}{lp}"


_DEFAULT = Strategy()
_QUIET_DEFAULTS = {"engine": "vllm", "precision": "bf16", "rollout_precision": "bf16", "kv_cache_dtype": "auto"}
"""Knobs left out of a plan's strategy section at their default (they came after schema 1's section)."""
_FIELDS: dict[type, tuple[str, ...]] = {
    t: tuple(f.name for f in dataclasses.fields(t)) for t in (Strategy, Layout, Memory, Batching, Rollout, Precision)
}
_set = object.__setattr__


def layout_of(s: Strategy) -> dict[str, int | None]:
    """What makes a layout: the parallel degrees and the pipeline split (not mbs, recompute, offload, rollout)."""
    return {
        **s.layout.degrees(),
        "first_stage_layers": s.layout.first_stage_layers,
        "last_stage_layers": s.layout.last_stage_layers,
    }


def layout_key(s: Strategy) -> tuple[int | None, ...]:
    """:func:`layout_of` as a hashable key (search's one-row-per-layout table, the report's plots)."""
    return tuple(layout_of(s).values())


def _copy(obj: _T, upd: dict[str, object]) -> _T:
    """``obj`` with the fields in ``upd`` replaced, without ``__init__``. Field by field through
    ``object.__setattr__`` and ``getattr``, never through ``__dict__``: CPython 3.11 reads the attributes
    of an object whose ``__dict__`` was touched (copied into or out of) about twice as slowly, and every
    estimate reads a plan's knobs hundreds of times."""
    cls = type(obj)
    names = _FIELDS.get(cls)
    if names is None:  # a concern extended elsewhere (a test adds a knob by subclassing one)
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    new = object.__new__(cls)
    for k in names:
        _set(new, k, upd[k] if k in upd else getattr(obj, k))
    return new


_ROUTE: tuple[tuple[Knob, ...], dict[str, tuple[str, str]]] | None = None


def _route() -> dict[str, tuple[str, str]]:
    """Flat knob name -> (concern, field), rebuilt only when the table object changes (a test may extend it)."""
    global _ROUTE
    table = _knobs.KNOBS
    if _ROUTE is None or _ROUTE[0] is not table:
        _ROUTE = (table, {k.name: (k.concern, k.field) for k in table})
    return _ROUTE[1]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A GRPO step (default) or a plain pretraining step.

    The defaults follow common verl GRPO practice (verl's GRPO examples): 1024 prompts, n=5,
    1024/1024 tokens, mini-batch 256, KL on. The CLI's flag defaults are these (autotune/options.py).
    """

    kind: str = "grpo"
    """``grpo`` or ``pretrain``."""
    prompts: int = 1024
    """Prompts per step (verl's ``data.train_batch_size``)."""
    n: int = 5
    """Group size: responses per prompt (verl's ``actor_rollout_ref.rollout.n``)."""
    prompt_len: int = 1024
    """Maximum prompt tokens."""
    prompt_len_mean: int | None = None
    """Mean prompt tokens (None = the maximum)."""
    response_len: int = 1024
    """Maximum response tokens."""
    response_len_mean: int | None = None
    """Mean response tokens (None = the maximum); sets the work, the maximum sets the decode tail."""
    response_len_quantiles: tuple[int, ...] | None = None
    """Measured response lengths at the midpoints of equal-mass bins (``--lengths``); None = the
    cost model's assumed distribution fitted to the mean and the maximum (costmodel/lengths.py)."""
    lengths_source: str | None = None
    """Where the length statistics came from (a dataset or run log path and how it was measured)."""
    mini_batch: int = 256
    """Prompts per PPO mini-batch (verl's ``ppo_mini_batch_size``)."""
    ppo_epochs: int = 1
    kl: bool = True
    """KL loss against a frozen reference model (needs the reference log-prob phase)."""
    entropy: bool = False
    """The update computes the entropy over the vocabulary (verl: ``actor.entropy_coeff`` != 0 or
    ``actor.calculate_entropy``; verl/trainer/ppo/ray_trainer.py ``_update_actor``), which keeps a clone
    of the logits and the entropy's own saved softmax (costmodel.activations.logits_bytes_per_logit)."""
    dtype: str = "bf16"
    seq_len: int = 4096
    """Pretraining sequence length."""
    gbs: int = 1024
    """Pretraining global batch (sequences)."""

    @property
    def sequences(self) -> int:
        return self.prompts * self.n if self.kind == "grpo" else self.gbs

    @property
    def train_seq_len(self) -> int:
        return self.prompt_len + self.response_len if self.kind == "grpo" else self.seq_len

    @property
    def mean_response_len(self) -> float:
        return float(self.response_len if self.response_len_mean is None else self.response_len_mean)

    @property
    def mean_prompt_len(self) -> float:
        return float(self.prompt_len if self.prompt_len_mean is None else self.prompt_len_mean)

    @property
    def mean_seq_len(self) -> float:
        """Real (unpadded) tokens of a sequence on average: what packed training passes pay for."""
        if self.kind != "grpo":
            return float(self.seq_len)
        return self.mean_prompt_len + self.mean_response_len

    def to_dict(self) -> dict[str, object]:
        return to_mapping(self)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "workload") -> "Workload":
        data = dict(data) if isinstance(data, dict) else data
        q = data.pop("response_len_quantiles", None) if isinstance(data, dict) else None
        if q is not None and (
            not isinstance(q, (list, tuple))
            or not q
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in q)
        ):
            raise ConfigError(f"{where}.response_len_quantiles must be a list of token counts, got {q!r}")
        obj = from_mapping(cls, data, where, _WORKLOAD_SCHEMA)
        if q is not None:
            obj = dataclasses.replace(obj, response_len_quantiles=tuple(sorted(q)))
        return _check_workload(obj, where)

    def replace(self, **kw: object) -> "Workload":
        return dataclasses.replace(self, **kw)  # type: ignore[arg-type]


# ints are positive; the two fractions (the CPU optimizer's share, vLLM's memory) are in (0, 1].
_PLAIN = Schema()
_SCHEMAS = {
    "memory": Schema(ranges={"cpu_optimizer": FRACTION}, choices={"recompute": Recompute, "offload": Offload}),
    "rollout": Schema(ranges={"gpu_memory_utilization": FRACTION}, choices={"engine": PlanEngine}),
    "precision": Schema(
        choices={"precision": TrainPrecision, "rollout_precision": RolloutPrecision, "kv_cache_dtype": KvCacheDtype}
    ),
}
_WORKLOAD_SCHEMA = Schema(choices={"kind": WorkloadKind, "dtype": Dtype})


def _check_workload(obj: Workload, where: str) -> Workload:
    """The rules between a workload's fields (each field's own range is in ``_WORKLOAD_SCHEMA``)."""
    for name in ("prompts", "n", "mini_batch", "gbs"):
        _bounds.check(name, getattr(obj, name), _bounds.MAX_BATCH, where=where)
    for name in ("prompt_len", "response_len", "prompt_len_mean", "response_len_mean"):  # seq_len: vs the model
        _bounds.check(name, getattr(obj, name), _bounds.MAX_TOKENS, where=where)
    _bounds.check("ppo_epochs", obj.ppo_epochs, _bounds.MAX_STEPS, where=where)
    if obj.kind == "grpo" and obj.mini_batch > obj.prompts:
        raise ConfigError(
            f"{where}: mini_batch ({obj.mini_batch}) exceeds prompts ({obj.prompts})",
            hint="verl requires ppo_mini_batch_size <= data.train_batch_size",
        )
    if obj.kind == "grpo" and obj.prompts % obj.mini_batch:
        raise ConfigError(f"{where}: prompts ({obj.prompts}) is not a multiple of mini_batch ({obj.mini_batch})")
    if obj.response_len_mean is not None and obj.response_len_mean > obj.response_len:
        raise ConfigError(f"{where}: response_len_mean exceeds response_len")
    if obj.prompt_len_mean is not None and obj.prompt_len_mean > obj.prompt_len:
        raise ConfigError(f"{where}: prompt_len_mean exceeds prompt_len")
    q = obj.response_len_quantiles
    if q is not None and max(q) > obj.response_len:
        raise ConfigError(f"{where}: response_len_quantiles exceed response_len ({max(q)} > {obj.response_len})")
    return obj


def validate(
    model: ModelSpec, s: Strategy, gpus: int, *, gpus_per_node: int | None = None, allow_cross_node_tp: bool = False
) -> Strategy:
    """Check that the degrees can exist; return the strategy with ``dp`` and (for an MoE model) ``etp`` resolved.

    Raises :class:`InvalidDegreesError` (code ``INVALID_DEGREES``) with the first error of
    :func:`core.rules.check_degrees`.
    """
    for f in errors(
        check_degrees(model, s, gpus, gpus_per_node=gpus_per_node, allow_cross_node_tp=allow_cross_node_tp)
    ):
        raise InvalidDegreesError(f.message, f.hint)
    lay = s.layout
    # a dense model has no expert TP: it stays unset (verl's null, Megatron's "same as TP"), not a copy of TP
    etp = lay.etp_ if model.is_moe or lay.etp not in (None, lay.tp) else None
    return s._with_layout(dp=gpus // (lay.tp * lay.pp * lay.cp), etp=etp, sequence_parallel=lay.sp)


def _drop_class_defaults(*types: type) -> None:
    """Remove the class attributes ``@dataclass`` leaves for field defaults (``__init__`` keeps its own):
    CPython 3.11 does not specialise an instance attribute read that a class attribute shadows, and the
    cost model reads a plan's knobs hundreds of times per estimate."""
    for t in types:
        for f in dataclasses.fields(t):
            if f.name in t.__dict__:
                delattr(t, f.name)


_drop_class_defaults(Strategy, Layout, Memory, Batching, Rollout)
