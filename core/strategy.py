"""Strategy (how a run is parallelized) and workload (what it trains), and the degree validator.

A plan that cannot exist (TP not dividing the heads, a product that differs from the GPU count)
raises :class:`InvalidDegreesError`; a plan that exists but does not fit is data (violations).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, InvalidDegreesError
from .specs import ModelSpec, check_keys

RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("param", "grad", "optimizer")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """How many GPUs (on CPU: processes) and how they group into nodes."""

    gpus: int
    gpus_per_node: int = 8

    @property
    def nnodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """Training degrees, memory options and rollout degrees. The reference model uses the actor's."""

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
    mbs: int = 1
    """Micro-batch size (sequences)."""
    sequence_parallel: bool | None = None
    """None means on whenever tp > 1 (Megatron requires it for MoE with TP)."""
    recompute: str = "selective"
    """``none``, ``selective`` (core attention) or ``full``."""
    recompute_layers: int | None = None
    """With full recompute: layers per stage recomputed (None = all)."""
    distributed_optimizer: bool = True
    offload: tuple[str, ...] = ()
    """Subset of ``param``, ``grad``, ``optimizer`` moved to host memory between phases."""
    first_stage_layers: int | None = None
    """Megatron's ``decoder_first_pipeline_num_layers``."""
    last_stage_layers: int | None = None
    """Megatron's ``decoder_last_pipeline_num_layers``."""
    rollout_tp: int = 1
    """Tensor parallel of the rollout engine (vLLM)."""
    gpu_memory_utilization: float = 0.6
    """vLLM's fraction of total GPU memory for weights + KV cache during rollout."""
    max_tokens_per_gpu: int | None = None
    """Dynamic batching (verl's ``use_dynamic_bsz`` + ``ppo_max_token_len_per_gpu``): micro-batches are
    packed up to this many tokens per GPU instead of ``mbs`` sequences. None = off (``mbs`` applies)."""
    log_prob_max_tokens_per_gpu: int | None = None
    """Token cap for the log-prob passes (verl's ``log_prob_max_token_len_per_gpu``); None = the update's."""
    cpu_optimizer: float | None = None
    """Megatron's hybrid CPU optimizer: the fraction of optimizer state and step on the host
    (``optimizer_cpu_offload`` + ``optimizer_offload_fraction``). None = off."""
    overlap_cpu_optimizer: bool = False
    """Megatron's ``overlap_cpu_optimizer_d2h_h2d`` (with the CPU optimizer)."""
    precision_aware_optimizer: bool = False
    """Megatron's ``use_precision_aware_optimizer`` (bf16 master-weight-free Adam state where supported)."""
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

    @property
    def etp_(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def sp(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else (self.sequence_parallel and self.tp > 1)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["offload"] = list(self.offload)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "strategy") -> "Strategy":
        data = check_keys(cls, data, where)
        if "offload" in data:
            off = data["offload"]
            if isinstance(off, str):
                off = [o for o in off.split(",") if o]
            if not isinstance(off, (list, tuple)) or not all(isinstance(o, str) for o in off):
                raise ConfigError(f"{where}.offload must be a list of {', '.join(OFFLOAD)}")
            data["offload"] = tuple(sorted(set(off), key=lambda o: OFFLOAD.index(o) if o in OFFLOAD else 99))
        return _typed(cls(**data), where)

    def replace(self, **kw) -> "Strategy":
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A GRPO step (default) or a plain pretraining step."""

    kind: str = "grpo"
    """``grpo`` or ``pretrain``."""
    prompts: int = 1024
    """Prompts per step (verl's ``data.train_batch_size``)."""
    n: int = 5
    """Group size: responses per prompt (verl's ``actor_rollout_ref.rollout.n``)."""
    prompt_len: int = 1024
    """Maximum prompt tokens."""
    response_len: int = 1024
    """Maximum response tokens."""
    prompt_len_mean: int | None = None
    """Mean prompt tokens (None = the maximum)."""
    response_len_mean: int | None = None
    """Mean response tokens (None = the maximum); sets the work, the maximum sets the decode tail."""
    mini_batch: int = 256
    """Prompts per PPO mini-batch (verl's ``ppo_mini_batch_size``)."""
    ppo_epochs: int = 1
    kl: bool = True
    """KL loss against a frozen reference model (needs the reference log-prob phase)."""
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "workload") -> "Workload":
        return _typed(cls(**check_keys(cls, data, where)), where)

    def replace(self, **kw) -> "Workload":
        return dataclasses.replace(self, **kw)


def _typed(obj, where: str):
    """Type and range checks shared by Strategy and Workload: coded errors only."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        t = f.type
        if v is None and "None" in t:
            continue
        if t.startswith("int"):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{where}.{f.name} must be a positive integer, got {v!r}")
        elif t.startswith("float"):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (0 < v <= 1):
                raise ConfigError(f"{where}.{f.name} must be a number in (0, 1], got {v!r}")
        elif t.startswith("bool"):
            if not isinstance(v, bool):
                raise ConfigError(f"{where}.{f.name} must be true or false, got {v!r}")
        elif t == "str" and not isinstance(v, str):
            raise ConfigError(f"{where}.{f.name} must be a string, got {v!r}")
    if isinstance(obj, Strategy):
        if obj.recompute not in RECOMPUTE:
            raise ConfigError(f"{where}.recompute must be one of {', '.join(RECOMPUTE)}, got {obj.recompute!r}")
        bad = [o for o in obj.offload if o not in OFFLOAD]
        if bad:
            raise ConfigError(f"{where}.offload: unknown {bad[0]!r}", hint=f"choose from {', '.join(OFFLOAD)}")
    if isinstance(obj, Workload):
        if obj.kind not in ("grpo", "pretrain"):
            raise ConfigError(f"{where}.kind must be grpo or pretrain, got {obj.kind!r}")
        if obj.dtype not in ("bf16", "fp16", "fp32"):
            raise ConfigError(f"{where}.dtype must be bf16, fp16 or fp32, got {obj.dtype!r}")
        if obj.kind == "grpo" and obj.mini_batch > obj.prompts:
            raise ConfigError(f"{where}: mini_batch ({obj.mini_batch}) exceeds prompts ({obj.prompts})",
                              hint="verl requires ppo_mini_batch_size <= data.train_batch_size")
        if obj.kind == "grpo" and obj.prompts % obj.mini_batch:
            raise ConfigError(f"{where}: prompts ({obj.prompts}) is not a multiple of mini_batch ({obj.mini_batch})")
        if obj.response_len_mean is not None and obj.response_len_mean > obj.response_len:
            raise ConfigError(f"{where}: response_len_mean exceeds response_len")
    return obj


def stage_layers(model: ModelSpec, s: Strategy) -> list[int]:
    """Layers on each pipeline stage (Megatron's uneven first/last stage rule)."""
    if s.pp == 1:
        return [model.layers]
    first, last = s.first_stage_layers, s.last_stage_layers
    if first is None and last is None:
        return [model.layers // s.pp] * s.pp
    middle = s.pp - (first is not None) - (last is not None)
    rest = model.layers - (first or 0) - (last or 0)
    per = rest // middle if middle else 0
    out = [per] * s.pp
    if first is not None:
        out[0] = first
    if last is not None:
        out[-1] = last
    return out


def validate(model: ModelSpec, s: Strategy, gpus: int, *, gpus_per_node: int | None = None,
             allow_cross_node_tp: bool = False) -> Strategy:
    """Check that the degrees can exist; return the strategy with ``dp`` and ``etp`` resolved."""

    def bad(msg: str, hint: str = "") -> InvalidDegreesError:
        return InvalidDegreesError(msg, hint)

    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise bad(f"GPU count must be a positive integer, got {gpus!r}")
    mp = s.tp * s.pp * s.cp
    if gpus % mp:
        raise bad(f"tp*pp*cp = {s.tp}*{s.pp}*{s.cp} = {mp} does not divide {gpus} GPUs",
                  "choose degrees whose product divides the GPU count")
    dp = gpus // mp
    if s.dp is not None and s.dp != dp:
        raise bad(f"tp*pp*cp*dp = {mp * s.dp} differs from the {gpus} GPUs",
                  f"with tp={s.tp} pp={s.pp} cp={s.cp}, dp must be {dp}")
    if model.heads % s.tp:
        raise bad(f"tp={s.tp} does not divide the {model.heads} attention heads of {model.name}",
                  f"use a tp among {', '.join(map(str, divisors(model.heads)))}")
    kv = model.heads if model.is_mla else model.kv_heads
    if kv % s.tp:
        raise bad(f"tp={s.tp} does not divide the {kv} key/value heads of {model.name} "
                  "(Megatron splits query groups evenly)",
                  f"use a tp among {', '.join(map(str, divisors(kv)))}")
    if gpus_per_node and s.tp > gpus_per_node and not allow_cross_node_tp:
        raise bad(f"tp={s.tp} spans nodes of {gpus_per_node} GPUs", "keep tp <= GPUs per node, or allow it explicitly")
    if s.first_stage_layers is not None or s.last_stage_layers is not None:
        if s.pp == 1:
            raise bad("uneven first/last stage layers need pp > 1")
        stages = stage_layers(model, s)
        middle = s.pp - (s.first_stage_layers is not None) - (s.last_stage_layers is not None)
        rest = model.layers - (s.first_stage_layers or 0) - (s.last_stage_layers or 0)
        if rest < 0 or (middle and rest % middle) or (not middle and rest) or min(stages) < 1:
            raise bad(f"first/last stage layers ({s.first_stage_layers}/{s.last_stage_layers}) leave {rest} "
                      f"layers that do not split evenly over {middle} middle stages of {model.name}'s {model.layers}")
    elif model.layers % s.pp:
        raise bad(f"pp={s.pp} does not divide the {model.layers} layers of {model.name}",
                  "use --first-stage-layers/--last-stage-layers for uneven stages, or another pp")
    if s.vpp > 1:
        if s.pp == 1:
            raise bad("vpp > 1 needs pp > 1")
        stages = stage_layers(model, s)
        if any(n % s.vpp for n in stages):
            raise bad(f"vpp={s.vpp} does not divide the layers per stage {stages}")
    etp = s.etp_
    if model.is_moe:
        if model.experts % s.ep:
            raise bad(f"ep={s.ep} does not divide the {model.experts} experts of {model.name}",
                      f"use an ep among {', '.join(map(str, divisors(model.experts)))}")
        if (s.tp * s.cp * dp) % (s.ep * etp):
            raise bad(f"ep*etp = {s.ep}*{etp} does not divide tp*cp*dp = {s.tp * s.cp * dp} "
                      "(Megatron's MoE parallel folding)", "lower ep or etp")
    elif s.ep > 1 or (s.etp is not None and s.etp != s.tp):
        raise bad(f"{model.name} is dense: ep/etp apply to MoE models only")
    if gpus % s.rollout_tp:
        raise bad(f"rollout_tp={s.rollout_tp} does not divide {gpus} GPUs")
    if model.heads % s.rollout_tp:
        raise bad(f"rollout_tp={s.rollout_tp} does not divide the {model.heads} attention heads")
    if kv % s.rollout_tp and s.rollout_tp % kv:
        raise bad(f"rollout_tp={s.rollout_tp} neither divides nor is a multiple of the {kv} KV heads")
    return dataclasses.replace(s, dp=dp, etp=etp, sequence_parallel=s.sp)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, by trial division up to sqrt(n) (a billion GPUs: 31,623 steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]
