"""The rollout-engine contract: what an engine is to the cost model and to the framework tables.

An engine (``engines/<name>/``, beside ``frameworks/<name>/``) owns:

- its knobs: the plan's shared rollout knobs it honours (:attr:`RolloutEngineSpec.knobs`, as verl's
  ``RolloutConfig`` keeps ``name`` plus engine kwargs) and their spelling in its own launcher;
- its memory and KV rules: bytes per weight and per KV-cache value in each precision
  (:meth:`weight_bytes`, :meth:`kv_bytes`), the largest batch its CUDA graphs capture;
- its costs: whether its scheduler overlaps the host's per-step work with the GPU's (:attr:`overlaps_host`),
  and its sleep and wake: a stack fitted on it prices them in its ``[engine]`` table (``sleep_s``, ``wake_s``;
  ``profiles/stacks/*.toml``), and an engine the stack was not fitted on prices them with its own figures
  (:meth:`own_sleep_wake_s`);
- its trainer adapter, by import path (:attr:`adapter`: only ``trainer/`` imports it);
- its key names, which the framework tables ask for (:attr:`verl_name`, :meth:`verl_kv_key`, :attr:`nemo_rl_backend`).

Pure data and small rules: no torch, no vLLM, no SGLang (tests/test_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0 + 4.0 / (128 * 128)}
"""Bytes per linear-layer weight: bf16, or block-wise FP8 (e4m3, one fp32 scale per 128 x 128 block: DeepSeek-V3
technical report sec. 3.3.2; vLLM's and SGLang's ``fp8`` block quantization use the same 128 x 128 blocks)."""
KV_BYTES = {"auto": 2.0, "fp8": 1.0}
"""Bytes per KV-cache value: ``auto`` keeps the activation dtype (bf16), ``fp8`` stores e4m3 (vLLM
``kv_cache_dtype=fp8``, SGLang ``kv_cache_dtype=fp8_e4m3``; per-tensor scales, negligible)."""


@dataclass(frozen=True)
class RolloutEngineSpec:
    """One rollout engine behind the contract (see the module docstring)."""

    name: str
    """As the plan's ``engine`` knob and ``--rollout-engine`` spell it (``megatron``: the trainer's own sampler)."""
    title: str
    adapter: str | None
    """Import path of the trainer's adapter (None: the trainer has none; plans are priced and exported only)."""
    knobs: tuple[str, ...]
    """The plan's rollout knobs this engine honours."""
    kv_cache: bool = True
    """Keeps a paged KV cache (the trainer's own sampler recomputes every prefix)."""
    overlaps_host: bool = False
    """The scheduler prepares step i+1 on the host while the GPU runs step i, so the per-step host costs
    (``decode_step_overhead_s``, ``decode_sequence_overhead_s``) hide under the GPU's time instead of adding to it."""
    cuda_graph_max_batch: int = 512
    """Largest decode batch its CUDA graphs capture at rollout TP < 4; above it a step runs eager."""
    cuda_graph_max_batch_tp4: int = 512
    """The same at rollout TP >= 4."""
    memory_map_s_per_gib: float | None = None
    """Its own sleep and wake price, where a stack was not fitted on it: seconds per GiB of its memory pool (weights
    + KV cache, ``gpu_memory_utilization`` of the GPU) that its sleep unmaps and its wake maps back, neither copied
    (the weights are reloaded from the trainer after the wake). None: no figures of its own; the stack's
    ``[engine]`` figures price it."""
    fp8_kv_name: str = "fp8"
    """Its spelling of an FP8 KV cache (``kv_cache_dtype``)."""
    verl_name: str = ""
    """verl 0.9.1's ``actor_rollout_ref.rollout.name`` (empty: verl cannot run it)."""
    nemo_rl_backend: str = ""
    """NeMo-RL's ``policy.generation.backend`` (empty: NeMo-RL cannot run it)."""

    def own_sleep_wake_s(self, pool_bytes: float) -> tuple[float, float] | None:
        """Its own (sleep, wake) seconds for a memory pool of ``pool_bytes`` per GPU (None: it has none)."""
        if self.memory_map_s_per_gib is None:
            return None
        t = pool_bytes / 2**30 * self.memory_map_s_per_gib
        return t, t

    def graph_batch(self, rollout_tp: int) -> int:
        """Largest decode batch its CUDA graphs capture at this rollout TP."""
        return self.cuda_graph_max_batch if rollout_tp < 4 else self.cuda_graph_max_batch_tp4

    def weight_bytes(self, precision: str) -> float:
        """Bytes per rollout weight of a linear layer in ``precision`` (bf16 | fp8)."""
        return WEIGHT_BYTES[precision]

    def kv_bytes(self, kv_cache_dtype: str) -> float:
        """Bytes per KV-cache value (auto | fp8)."""
        return KV_BYTES[kv_cache_dtype]

    def verl_kv_key(self) -> str:
        """The verl 0.9.1 override that sets its KV-cache dtype (an engine kwarg: verl passes
        ``rollout.engine_kwargs.<engine>`` to the engine's constructor)."""
        return f"+actor_rollout_ref.rollout.engine_kwargs.{self.verl_name}.kv_cache_dtype"

    def kv_value(self, kv_cache_dtype: str) -> str:
        """Its spelling of ``kv_cache_dtype``."""
        return self.fp8_kv_name if kv_cache_dtype == "fp8" else "auto"
