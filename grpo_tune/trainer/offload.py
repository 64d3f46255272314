"""Offload of the actor's parameters, gradients and optimizer state to host memory around the rollout.

On a GPU the rollout engine (vLLM's KV cache) wants the memory that training state holds, so the
loop moves ``strategy.offload`` parts to pinned host memory after the weight sync and back before
the log-prob phases. The mechanics follow verl's megatron offload (verl/utils/megatron_utils.py,
``offload_megatron_model_to_cpu`` / ``offload_megatron_optimizer``): megatron's DDP keeps
parameters and gradients in contiguous buffers, so the buffer's storage is copied out and resized
to 0 (freeing the device memory while every parameter view stays valid), then resized and
refilled. Gradients are zero between steps, so they are dropped, not copied.

On CPU there is no device memory to free: the offloader is a no-op and says so once.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("grpo_tune.trainer.offload")


class Offloader:
    def __init__(self, engine, parts: tuple[str, ...] | list[str]):
        self.engine = engine
        self.parts = tuple(parts)
        self.active = bool(self.parts) and torch.cuda.is_available()
        self.offloaded: set[str] = set()
        self._moved: list = []  # (optimizer state dict, key) pairs moved to host
        if self.parts and not self.active:
            log.warning(
                "offload of %s requested: a no-op on CPU (training state already lives in host memory)",
                ",".join(self.parts),
            )

    # -- buffers of megatron's DDP ------------------------------------------------------------
    def _buffers(self):
        for chunk in self.engine.chunks:
            for group in (getattr(chunk, "buffers", []), getattr(chunk, "expert_parallel_buffers", [])):
                yield from group

    def _optimizers(self):
        opt = self.engine.optimizer
        return [] if opt is None else getattr(opt, "chained_optimizers", [opt])

    def offload(self, *, keep_params: bool = False) -> None:
        """Move the configured parts to host; ``keep_params`` when the rollout runs on these parameters."""
        if not self.active:
            return
        parts = [p for p in self.parts if not (p == "param" and keep_params) and p not in self.offloaded]
        for buf in self._buffers():
            if "param" in parts and buf.param_data is not None and buf.param_data.untyped_storage().size() > 0:
                buf._cpu_param = buf.param_data.detach().to("cpu", non_blocking=True).pin_memory()
                buf._param_bytes = buf.param_data.untyped_storage().size()
                buf.param_data.untyped_storage().resize_(0)
            if "grad" in parts and buf.grad_data.untyped_storage().size() > 0:
                buf._grad_bytes = buf.grad_data.untyped_storage().size()
                buf.grad_data.untyped_storage().resize_(0)
        if "param" in parts:
            for chunk in self.engine.chunks:  # parameters outside the buffers (no distributed optimizer)
                for p in chunk.parameters():
                    if p.is_cuda and p.untyped_storage().size() and not self._in_buffer(p):
                        p._cpu_copy = p.data.to("cpu", non_blocking=True)
                        p.data = p._cpu_copy
        if "optimizer" in parts:
            for o in self._optimizers():
                for st in o.optimizer.state.values():
                    for k, v in st.items():
                        if torch.is_tensor(v) and v.is_cuda:
                            st[k] = v.to("cpu", non_blocking=True)
                            self._moved.append((st, k))
                for g in getattr(o, "shard_fp32_from_float16_groups", []):
                    for p in g:
                        p.data = p.data.to("cpu", non_blocking=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        self.offloaded.update(parts)

    def reload(self) -> None:
        if not self.active or not self.offloaded:
            return
        dev = torch.device("cuda", torch.cuda.current_device())
        for buf in self._buffers():
            if "param" in self.offloaded and hasattr(buf, "_cpu_param"):
                buf.param_data.untyped_storage().resize_(buf._param_bytes)
                buf.param_data.copy_(buf._cpu_param, non_blocking=True)
                del buf._cpu_param
            if "grad" in self.offloaded and hasattr(buf, "_grad_bytes"):
                buf.grad_data.untyped_storage().resize_(buf._grad_bytes)
                buf.grad_data.zero_()
        if "param" in self.offloaded:
            for chunk in self.engine.chunks:
                for p in chunk.parameters():
                    if hasattr(p, "_cpu_copy"):
                        p.data = p._cpu_copy.to(dev, non_blocking=True)
                        del p._cpu_copy
        if "optimizer" in self.offloaded:
            for st, k in self._moved:
                st[k] = st[k].to(dev, non_blocking=True)
            self._moved.clear()
            for o in self._optimizers():
                for g in getattr(o, "shard_fp32_from_float16_groups", []):
                    for p in g:
                        p.data = p.data.to(dev, non_blocking=True)
        torch.cuda.synchronize()
        self.offloaded.clear()

    def _in_buffer(self, p) -> bool:
        return any(
            buf.param_data is not None
            and p.data_ptr() >= buf.param_data.data_ptr()
            and p.data_ptr() < buf.param_data.data_ptr() + buf.param_data.numel() * buf.param_data.element_size()
            for buf in self._buffers()
        )
