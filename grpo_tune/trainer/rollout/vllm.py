"""The vLLM rollout engine (GPU): colocated with the Megatron trainer in the same torchrun processes.

How it works (the same scheme as verl's SPMD vLLM rollout):

* One ``vllm.LLM`` per process with ``distributed_executor_backend="external_launcher"`` when
  torch.distributed runs: vLLM reuses torchrun's process group and forms rollout replicas of
  ``strategy.rollout_tp`` consecutive ranks. The caller (trainer.loop) hands every rank of a
  replica the same prompts; replicas sample different shares. One process without torchrun uses
  a plain in-process ``LLM``.
* The engine starts from the model's ``config.json`` with ``load_format="dummy"``: no weights are
  read from disk because the trainer pushes its own before every rollout. For a random-init preset
  (``tiny``) the config is written from the model spec (``trainer.hf.hf_config``).
* ``update_weights`` streams ``(hf_name, full_tensor)`` pairs (``Engine.named_parameters_for_export``)
  in buckets of ``bucket_bytes`` (the plan's ``strategy.sync_bucket_mb``, verl's
  ``update_weights_bucket_megabytes``, which the cost model prices) into the in-process model's
  ``load_weights``, which slices each full tensor for this rank's rollout-TP shard, so rollout TP need
  not equal training TP. Unlike verl there is no CUDA IPC hop (vLLM lives in the same process): a bucket
  is a list of tensors staged on the GPU, flushed once it reaches the bucket size.
* Sleep mode (``enable_sleep_mode=True``): ``release()`` calls ``llm.sleep(level)``; ``resume()``
  wakes the weights only, and the KV cache is woken just before the next ``generate`` so the
  weight copy never overlaps a full KV cache (vLLM's documented RLHF pattern). Level 2 (default)
  discards the old weights instead of backing them up in host memory, which is right here since
  every rollout is preceded by a full weight push. Use level 1 if something else calls
  ``generate`` without pushing weights first.

* The engine is the one the plan priced: ``enforce_eager``, ``max_num_seqs``,
  ``max_num_batched_tokens``, ``enable_chunked_prefill`` (``strategy.chunked_prefill``),
  ``gpu_memory_utilization``, the rollout TP, and sleep mode only when ``strategy.free_cache_engine``
  (verl's ``free_cache_engine``: off keeps weights and KV cache resident, as the memory model prices
  it). :func:`engine_kwargs` is that mapping.
* Start-up memory: vLLM refuses to start when the GPU's free memory is below
  ``gpu_memory_utilization`` x total ("Free memory on device ... is less than desired GPU memory
  utilization"). ``trainer.build.build`` therefore builds the vLLM engine *before* the actor and
  the reference, then puts it to sleep, so the check sees an empty GPU; :func:`check_startup_memory`
  runs the same arithmetic first and turns a refusal (another process on the GPU) into a coded
  error that names the largest fraction that would start.

vllm is imported only inside this module's functions, so importing trainer.rollout never needs it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import torch

from grpo_tune.core.errors import ConfigError, try_import

from .base import SamplingParams

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import RunConfig

_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
}


def _inner_model(llm):
    """The torch model inside an in-process vLLM engine (V1 external_launcher/uniproc, or V0)."""
    engine = llm.llm_engine
    paths = (
        lambda: engine.model_executor.driver_worker.worker.model_runner.model,
        lambda: engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model,
        lambda: engine.model_executor.driver_worker.model_runner.model,
    )
    for p in paths:
        try:
            model = p()
        except AttributeError:
            continue
        if model is not None:
            return model
    raise RuntimeError(
        "cannot reach the model inside vLLM (multiprocess engine?): run under torchrun "
        "(external_launcher) or set VLLM_ENABLE_V1_MULTIPROCESSING=0"
    )


def engine_kwargs(cfg: RunConfig) -> dict:
    """The ``vllm.LLM`` options that are the plan's own engine knobs (what the cost model priced)."""
    s = cfg.strategy
    return dict(
        tensor_parallel_size=s.rollout.rollout_tp,
        gpu_memory_utilization=s.rollout.gpu_memory_utilization,
        enforce_eager=s.rollout.enforce_eager,
        max_num_seqs=s.rollout.max_num_seqs,
        max_num_batched_tokens=s.rollout.max_num_batched_tokens,
        enable_chunked_prefill=s.rollout.chunked_prefill,
        enable_sleep_mode=s.rollout.free_cache_engine,
    )


def check_startup_memory(fraction: float, free_bytes: int, total_bytes: int) -> None:
    """vLLM's start-up check, done first: it asks for ``fraction`` x total and refuses to start when
    less than that is free. Raises OOM_RISK with the largest fraction that would start."""
    want = fraction * total_bytes
    if want <= free_bytes:
        return
    gib = 2**30
    fits = math.floor(100 * free_bytes / total_bytes) / 100
    raise ConfigError(
        f"vLLM would refuse to start: gpu_memory_utilization={fraction} asks for {want / gib:.2f} GiB of this "
        f"GPU's {total_bytes / gib:.2f} GiB, but only {free_bytes / gib:.2f} GiB is free "
        f"({(total_bytes - free_bytes) / gib:.2f} GiB is held by something else before the engine starts)",
        hint=f"free the GPU (nvidia-smi shows who holds it), or lower strategy.gpu_memory_utilization to "
        f"{fits:.2f} or less (the plan then has a smaller KV cache than it priced)",
        code="OOM_RISK",
    )


def _seeded(seed: int, i: int) -> int:
    # distinct per request: copies of one prompt in a GRPO group must not share a seed
    return (seed * 1_000_003 + i) % (2**31 - 1)


class VLLMRollout:
    """``RolloutEngine`` on vLLM. Keyword arguments override the config-derived engine options.

    ``cfg`` is the RunConfig (model spec, ``strategy.rollout_tp``, ``strategy.gpu_memory_utilization``,
    ``workload.prompt_len + response_len`` as the context length, ``workload.dtype``,
    ``trainer.hf_checkpoint``, ``trainer.seed``). ``engine`` and ``tokenizer`` are accepted for
    the registry's common signature; only ``tokenizer.eos_id`` is used (vLLM gets token ids, not text).
    """

    collective_batch = False  # each rollout replica samples its own share (see trainer.loop)
    shares_actor_weights = False

    def __init__(
        self,
        *,
        cfg: RunConfig,
        engine=None,
        tokenizer=None,
        sleep_level: int = 2,
        bucket_bytes: int | None = None,
        device: str | None = None,
        **llm_kwargs,
    ):
        vllm = try_import("vllm", "gpu")
        if device is None and not torch.cuda.is_available():
            raise ConfigError("the vllm rollout engine needs a CUDA GPU", hint="use rollout_engine: megatron on CPU")
        # where update_weights stages tensors (default: this rank's GPU); tests with a fake vllm use "cpu"
        self._device = torch.device(device) if device else torch.device("cuda", torch.cuda.current_device())
        if sleep_level not in (1, 2):
            raise ConfigError(f"sleep_level must be 1 or 2, got {sleep_level}")
        self._vllm = vllm
        w, s = cfg.workload, cfg.strategy
        # the bucket the plan priced (weight_sync memory and per-bucket time); bucket_bytes overrides it in tests
        self.sleep_level = sleep_level
        self.bucket_bytes = s.rollout.sync_bucket_bytes if bucket_bytes is None else int(bucket_bytes)
        self.eos_id = getattr(tokenizer, "eos_id", None)
        model_path = cfg.trainer.hf_checkpoint or self._write_config(cfg)
        dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
        kw = dict(
            model=str(model_path),
            skip_tokenizer_init=True,  # ids in, ids out
            load_format="dummy",  # weights arrive through update_weights
            dtype=_DTYPES.get(w.dtype, w.dtype),
            max_model_len=w.prompt_len + w.response_len,
            enable_prefix_caching=True,  # the n copies of a prompt share its prefill
            seed=cfg.trainer.seed,
            **engine_kwargs(cfg),
        )
        self.sleeps = bool(kw["enable_sleep_mode"])
        if dist_on:
            kw["distributed_executor_backend"] = "external_launcher"
            world = torch.distributed.get_world_size()
            if world % s.rollout.rollout_tp:
                raise ConfigError(f"rollout_tp={s.rollout.rollout_tp} does not divide the {world} processes")
            # recent vLLM wants the replica count spelled out under external_launcher (its
            # torchrun_dp_example); ranks are grouped tp-fastest, i.e. replica = rank // rollout_tp,
            # the split trainer.loop uses
            if world > s.rollout.rollout_tp and "data_parallel_size" in {
                f.name for f in dataclasses.fields(vllm.EngineArgs)
            }:
                kw["data_parallel_size"] = world // s.rollout.rollout_tp
        else:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the model in this process
        kw.update(llm_kwargs)
        if self._device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self._device)
            check_startup_memory(float(kw["gpu_memory_utilization"]), int(free), int(total))
        self.llm = vllm.LLM(**kw)
        self._model = _inner_model(self.llm)
        self._tags = "tags" in inspect.signature(self.llm.wake_up).parameters
        self._kv_asleep = self._asleep = self._stale_prefixes = False
        self.release()  # hand the memory back to training until the first rollout

    @staticmethod
    def _write_config(cfg: RunConfig) -> Path:
        from .. import hf

        folder = Path(tempfile.mkdtemp(prefix="grpo-tune-vllm-"))
        dtype = _DTYPES.get(cfg.workload.dtype, "bfloat16")
        (folder / "config.json").write_text(json.dumps(hf.hf_config(cfg.model, dtype), indent=2))
        # generation_config.json is optional for vLLM; eos comes in through SamplingParams instead
        return folder

    # -- RolloutEngine -----------------------------------------------------------------------------
    def release(self) -> None:
        if not self.sleeps:  # free_cache_engine off: weights and KV cache stay resident, as priced
            return
        if not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = self._kv_asleep = True

    def resume(self) -> None:
        if not self._asleep:
            return
        if self._tags:
            self.llm.wake_up(tags=["weights"])  # the KV cache waits until generate()
        else:
            self.llm.wake_up()
            self._kv_asleep = False
        self._asleep = False

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push full HF-named tensors in buckets; the iterable is consumed to the end on every
        rank (it is a collective on the training side)."""
        if self._asleep:
            self.resume()
        bucket, size = [], 0
        for name, t in named_tensors:
            bucket.append((name, t.detach().to(self._device, non_blocking=True)))
            size += t.numel() * t.element_size()
            if size >= self.bucket_bytes:
                self._model.load_weights(bucket)
                bucket, size = [], 0
        if bucket:
            self._model.load_weights(bucket)
        self._stale_prefixes = True
        if self._device.type == "cuda":
            torch.cuda.synchronize()

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[list[int]]:
        return self.generate_with_logprobs(prompt_ids, params, logprobs=False)[0]

    def generate_with_logprobs(
        self, prompt_ids: list[list[int]], params: SamplingParams, *, logprobs: bool = True
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """Responses (as :meth:`generate`) and, with ``logprobs``, vLLM's log-probability of each
        sampled token: what a rollout-vs-training mismatch check compares against Engine.logprobs."""
        if not prompt_ids:
            return [], ([] if logprobs else None)
        if self._asleep:
            self.resume()
        if self._kv_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._kv_asleep = False
        if self._stale_prefixes and hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self._stale_prefixes = False
        stop = sorted({*params.stop_token_ids, *([] if self.eos_id is None else [self.eos_id])})
        base = dict(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop_token_ids=stop,
            detokenize=False,
        )
        if logprobs:
            base["logprobs"] = 0  # the sampled token's own log-prob only
        if params.seed is None:
            sps = self._vllm.SamplingParams(**base)
        else:
            sps = [self._vllm.SamplingParams(**base, seed=_seeded(params.seed, i)) for i in range(len(prompt_ids))]
        outs = self.llm.generate(
            [{"prompt_token_ids": list(map(int, p))} for p in prompt_ids], sampling_params=sps, use_tqdm=False
        )
        stops = set(stop)
        ids_out, lps_out = [], []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)[: params.max_tokens]
            cut = next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))  # the stop id ends it, kept
            ids_out.append(ids[:cut])
            if logprobs:
                lps_out.append([float(c.logprobs[k][t].logprob) for k, t in enumerate(ids[:cut])])
        return ids_out, (lps_out if logprobs else None)
