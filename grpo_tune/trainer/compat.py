"""The one CPU compatibility layer for megatron-core 0.16.1: active only when no CUDA device exists.

megatron-core assumes CUDA in a few recurring ways (measured on the CPU build):

1. literal ``device="cuda"`` / ``torch.cuda.current_device()`` allocations and ``tensor.cuda()``
   in the pipeline schedules, optimizer, grad clipping, causal mask, RoPE and MoE router;
2. ``torch.cuda`` runtime calls: synchronize, streams, events, empty_cache, memory counters;
3. the CUDA RNG tracker (``model_parallel_cuda_manual_seed``, recompute's RNG restore);
4. optimizer and grad-clipping asserts on type strings such as ``torch.cuda.FloatTensor``;
5. the torch norm fallback refuses sequence parallel (TE/Apex are GPU-only).

:func:`enable` fixes them without editing megatron's files:
(1) and (4) by a :class:`~torch.overrides.TorchFunctionMode` that maps CUDA devices to CPU and
reports ``Tensor.type()`` with the ``cuda`` infix; (2) and (3) by replacing a handful of
``torch.cuda`` functions with CPU equivalents (the RNG ones forward to the CPU generator, so a
fork of the "CUDA" RNG is a fork of the CPU RNG); (5) by a norm that marks its weight
``sequence_parallel`` so that ``finalize_model_grads`` all-reduces its gradient over TP, as
TE's norm does. On a machine with CUDA, :func:`enable` does nothing and returns False.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

_lock = threading.Lock()
_active = False


def needed() -> bool:
    """True when megatron-core must be shimmed: no usable CUDA device."""
    return not torch.cuda.is_available()


def active() -> bool:
    return _active


_all_to_all_single = torch.distributed.all_to_all_single
_all_gather = torch.distributed.all_gather
_reduce_scatter = torch.distributed.reduce_scatter


def _uneven_all_gather(tensor_list, tensor, group=None, async_op=False):
    """gloo's all_gather needs equal shapes; MoE with expert TP gathers uneven token counts.
    Pad every piece to the longest, gather, and copy the real rows back."""
    n = max(t.shape[0] for t in tensor_list)
    pad = lambda t: torch.cat([t, t.new_zeros(n - t.shape[0], *t.shape[1:])]) if t.shape[0] < n else t
    bufs = [torch.empty(n, *t.shape[1:], dtype=t.dtype) for t in tensor_list]
    _all_gather(bufs, pad(tensor.contiguous()), group=group)
    for out, b in zip(tensor_list, bufs):
        out.copy_(b[: out.shape[0]])
    return None


def _reduce_scatter_by_all_reduce(output, input_list, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
    """gloo has no list reduce_scatter: all-reduce the concatenation and keep this rank's piece."""
    full = torch.cat([t.contiguous().view(t.shape[0], -1) if t.dim() else t.view(1) for t in input_list])
    torch.distributed.all_reduce(full, op=op, group=group)
    rank = torch.distributed.get_rank(group)
    start = sum(t.shape[0] if t.dim() else 1 for t in input_list[:rank])
    output.copy_(full[start : start + (output.shape[0] if output.dim() else 1)].view_as(output))
    return None


def _is_cuda(d) -> bool:
    if isinstance(d, int) and not isinstance(d, bool):
        return True  # an int device means cuda:<int> in torch
    if isinstance(d, str):
        return d.startswith("cuda")
    return isinstance(d, torch.device) and d.type == "cuda"


def _device_like(x) -> bool:
    return isinstance(x, (str, torch.device)) or (isinstance(x, int) and not isinstance(x, bool))


class _CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA devices to CPU in every torch call; makes ``Tensor.cuda()`` a no-op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = dict(kwargs, device="cpu")
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and _device_like(args[1]) and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        if func is torch.Tensor.record_stream:
            return None
        if func is _all_gather and len({tuple(t.shape) for t in args[0]}) > 1:
            return _uneven_all_gather(*args, **kwargs)
        if func is _reduce_scatter:
            return _reduce_scatter_by_all_reduce(*args, **kwargs)
        if func is _all_to_all_single:
            # megatron's MoE dispatcher passes numpy split sizes; this torch's binding wants ints
            for k in ("output_split_sizes", "input_split_sizes"):
                if kwargs.get(k) is not None:
                    kwargs = dict(kwargs, **{k: [int(x) for x in kwargs[k]]})
        out = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and isinstance(out, str):
            # megatron's optimizers assert 'torch.cuda.FloatTensor' and friends
            return out.replace("torch.", "torch.cuda.", 1)
        return out


class _Stream:
    """Stand-in for torch.cuda.Stream/Event: CPU ops are synchronous, so every wait is a no-op."""

    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _Stream()

    def record(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


def _cpu_get_rng_state(device="cuda", clone=False, graph_safe=False):
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


def enable() -> bool:
    """Install the shims once per process when CUDA is absent. Returns whether they are active."""
    global _active
    with _lock:
        if _active:
            return True
        if not needed():
            return False
        cuda = torch.cuda
        cuda.current_device = lambda: 0
        cuda.device_count = lambda: 0
        cuda.set_device = lambda *a, **k: None
        cuda.synchronize = lambda *a, **k: None
        cuda.empty_cache = lambda: None
        cuda.Stream = _Stream
        cuda.Event = _Stream
        cuda.current_stream = lambda *a, **k: _Stream()
        cuda.default_stream = lambda *a, **k: _Stream()
        cuda.stream = lambda *a, **k: contextlib.nullcontext()
        # torch.manual_seed itself calls cuda.manual_seed_all: that one must not recurse.
        cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
        cuda.manual_seed_all = lambda seed: None
        cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
        cuda.set_rng_state = lambda s, *a, **k: torch.set_rng_state(s)
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
            setattr(cuda, name, lambda *a, **k: 0)
        cuda.reset_peak_memory_stats = lambda *a, **k: None

        from megatron.core.tensor_parallel import random as mrandom

        mrandom._get_cuda_rng_state = _cpu_get_rng_state
        mrandom._set_cuda_rng_state = _cpu_set_rng_state

        _patch_torch_norm()
        fix_missing_te_symbols()
        # Pushed for the life of the process: megatron allocates on "cuda" deep inside its calls.
        mode = _CudaToCpu()
        mode.__enter__()
        _patch_custom_backward(mode)
        _active = True
        return True


def fix_missing_te_symbols() -> None:
    """megatron 0.16.1's MoE router calls ``te_general_gemm`` when it is None-checked but only
    defined if TransformerEngine imported; without TE the name is undefined (NameError). Defining
    it as None selects megatron's own torch.mm path. Harmless with TE (the name then exists)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    # MLA: megatron's extensions module imports without TE but leaves TELinear a non-type, and
    # MLASelfAttention's isinstance(..., TELinear) then raises; without TE there is no TE layer.
    from megatron.core.transformer import multi_latent_attention as mla

    if mla.HAVE_TE and not isinstance(mla.TELinear, type):
        mla.HAVE_TE = False


def fix_shape_exchange() -> None:
    """megatron-core 0.16.1 exchanges micro-batch shapes (``variable_seq_lengths``, which
    token-budget micro-batches need) with one ``batch_isend_irecv`` of up to four ops. With pp = 2
    the previous and the next stage are the same peer, so the interleaved (VPP) schedule's combined
    send/recv in both directions pairs this rank's "to previous" send with the peer's "from
    previous" receive: shapes swap or the ranks wait on each other (seen as a hang on CPU, PP2xVPP2).
    Route the shapes through megatron's own ``_p2p_ops``, which keeps the two directions apart (as
    the tensors themselves travel with ``batch_p2p_comm=False``). Device-independent, idempotent."""
    import torch
    from megatron.core.pipeline_parallel import p2p_communication as p2p

    if getattr(p2p.P2PCommunicator, "_grpo_shapes_fixed", False):
        return

    def _communicate_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next):
        dev = torch.cuda.current_device()

        def shape_of(t):
            return None if t is None else torch.tensor(t.size(), device=dev, dtype=torch.int64)

        rp = torch.empty((3,), device=dev, dtype=torch.int64) if recv_prev else None
        rn = torch.empty((3,), device=dev, dtype=torch.int64) if recv_next else None
        reqs = p2p._p2p_ops(
            tensor_send_prev=shape_of(tensor_send_prev),
            tensor_recv_prev=rp,
            tensor_send_next=shape_of(tensor_send_next),
            tensor_recv_next=rn,
            group=self.pp_group,
            prev_pipeline_rank=self.prev_rank,
            next_pipeline_rank=self.next_rank,
        )
        for r in reqs.values() if isinstance(reqs, dict) else reqs:
            r.wait()
        return (rp.tolist() if rp is not None else [0, 0, 0]), (rn.tolist() if rn is not None else [0, 0, 0])

    p2p.P2PCommunicator._communicate_shapes = _communicate_shapes
    p2p.P2PCommunicator._grpo_shapes_fixed = True


def _patch_custom_backward(mode: TorchFunctionMode) -> None:
    """Re-enter the mode in custom autograd backward passes.

    The autograd engine runs a Python ``Function.backward`` with an empty torch-function mode
    stack, and megatron's backward passes allocate on "cuda" too (recompute, SP gathers).
    """
    from torch.autograd import function as af
    from torch.overrides import _get_current_function_mode_stack

    orig = af.BackwardCFunction.apply

    def apply(self, *args):
        if _get_current_function_mode_stack():
            return orig(self, *args)
        with mode:
            return orig(self, *args)

    af.BackwardCFunction.apply = apply


def _patch_torch_norm() -> None:
    """Let megatron's torch norm fallback run with sequence parallel.

    Under SP each TP rank normalizes its own slice of the sequence, so the norm weight's gradient
    is partial; megatron sums it over TP in ``finalize_model_grads`` for every parameter marked
    ``sequence_parallel`` (what TE's norm does), so marking the weight is all that is needed.
    """
    from megatron.core.transformer import torch_norm

    orig_new = torch_norm.WrappedTorchNorm.__new__
    if getattr(orig_new, "_grpo_tune", False):
        return

    def __new__(cls, config, hidden_size, eps=1e-5, **kw):
        sp = config.sequence_parallel
        if sp:
            config.sequence_parallel = False
        try:
            norm = orig_new(cls, config, hidden_size, eps, **kw)
        finally:
            config.sequence_parallel = sp
        for p in norm.parameters():
            p.sequence_parallel = sp
        return norm

    __new__._grpo_tune = True
    torch_norm.WrappedTorchNorm.__new__ = staticmethod(__new__)
