"""Cutting a whole batch into this data-parallel rank's micro-batches, as the Engine feeds them to
megatron's pipeline schedule: fixed-size micro-batches (``micro_batch_size`` rows) or token-budget
ones (verl's ``use_dynamic_bsz``, packed by :mod:`trainer.batching`).

Every function here takes the DP size and rank explicitly; only :func:`split_budget` talks to the
DP group (an all-reduce of the micro-batch count, so that every DP rank runs the same schedule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .batching import count, pack

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.strategy import Strategy


def _batch_rows(v, B: int) -> bool:
    """A tensor that carries one entry per batch row (it travels with the rows it is cut into)."""
    return torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == B


def repeat_last_row(batch: dict, B: int, extra: int) -> dict:
    """The batch with its last row repeated ``extra`` times (filler rows whose results are dropped)."""

    def grow(v):
        return torch.cat([v, v[-1:].expand(extra, *v.shape[1:])], 0) if _batch_rows(v, B) else v

    return {k: grow(v) for k, v in batch.items()}


def dp_rows(B: int, dp: int, rank: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a batch of ``B`` (a multiple of ``dp``) that DP rank ``rank`` holds."""
    per = B // dp
    return rank * per, (rank + 1) * per


def padded_rows(B: int, mbs: int, dp: int, s: Strategy) -> int:
    """``B`` rounded up to whole micro-batches on every DP rank, and under VPP to at least pp of them
    (megatron's interleaved schedule needs as many micro-batches per DP rank as stages)."""
    unit = dp * mbs
    least = unit * s.layout.pp if s.layout.vpp > 1 else unit
    return max(-(-B // unit) * unit, least)


def split_rows(batch: dict, mbs: int, *, dp: int, rank: int, s: Strategy, device, pad_ok: bool):
    """This DP rank's rows of the batch, cut into micro-batches of ``mbs`` rows.

    A batch that does not fill whole micro-batches on every rank is padded with repeats of its last
    row when ``pad_ok`` (forward-only passes), and refused otherwise (a training step must not
    weigh a row twice). Returns (micro-batches, lo, hi)."""
    B = batch["tokens"].shape[0]
    unit = dp * mbs
    need = padded_rows(B, mbs, dp, s)
    if need != B:
        if not pad_ok:
            raise ValueError(
                f"batch of {B} sequences is not a multiple of dp*micro_batch_size = {dp}*{mbs}"
                + (f" or has fewer than pp={s.layout.pp} micro-batches per DP rank (VPP)" if B >= unit else "")
            )
        batch = repeat_last_row(batch, B, need - B)
        B = need
    lo, hi = dp_rows(B, dp, rank)
    micro = [
        {k: v[i : i + mbs].to(device) if _batch_rows(v, B) else v for k, v in batch.items()} for i in range(lo, hi, mbs)
    ]
    return micro, lo, hi


def split_budget(
    batch: dict,
    lengths: torch.Tensor,
    max_tokens: int,
    *,
    dp: int,
    rank: int,
    dp_group,
    s: Strategy,
    device,
    thd: bool,
    pad_ok: bool,
    width: int | None = None,
):
    """This DP rank's rows packed into token-budget micro-batches (trainer/batching.py).

    Every DP rank runs the same number of micro-batches (the maximum, all-reduced over the DP
    group; a multiple of pp under VPP). Each micro-batch is cut to its own longest row (padded
    to the sequence-parallel multiple): on CPU and with megatron's local spec that right
    padding is the only packing; THD packing (``PackedSeqParams``, ``thd``) needs
    TransformerEngine's attention, see :func:`packed_seq_params`. ``mb["_rows"]`` holds the batch
    rows, ``mb["_len"]`` the real width, ``mb["_dummy"]`` marks a filler of one fully masked row
    (a rank with fewer rows than micro-batches). Returns (micro-batches, lo, hi).
    """
    B, Sp = batch["tokens"].shape
    S = width or Sp  # the unpadded width: [B, S-1] tensors (mask, log-probs) are cut to L-1
    if B % dp:
        if not pad_ok:
            raise ValueError(f"batch of {B} sequences is not a multiple of dp = {dp}")
        extra = dp - B % dp
        batch = repeat_last_row(batch, B, extra)
        lengths = torch.cat([lengths, lengths[-1:].expand(extra)])
        B += extra
    lo, hi = dp_rows(B, dp, rank)
    mine = [int(x) for x in lengths[lo:hi]]
    k = torch.tensor([count(mine, max_tokens)], dtype=torch.long, device=device)
    if dp > 1:
        dist.all_reduce(k, op=dist.ReduceOp.MAX, group=dp_group)
    groups = pack(mine, max_tokens, min_count=int(k.item()), multiple=s.layout.pp if s.layout.vpp > 1 else 1)
    mult = s.layout.tp if s.layout.sp else 1
    # megatron's interleaved (VPP) schedule pairs a stage's sends and receives across calls, which
    # its per-call shape exchange (variable_seq_lengths) cannot follow (it hangs): under VPP every
    # micro-batch keeps one shape, [most rows, full width], filler rows fully masked
    uniform = s.layout.vpp > 1
    most = max((len(g) for g in groups), default=1) or 1
    micro = []
    for g in groups:
        dummy = not g
        rows = [lo + i for i in g] if g else [lo]
        L = S if uniform else min(S, max(2, max(int(lengths[r]) for r in rows)))
        Lp = Sp if uniform else min(-(-L // mult) * mult, Sp)
        real = 0 if dummy else len(rows)
        take = rows + [rows[-1]] * (most - len(rows)) if uniform else rows
        idx = torch.tensor(take, dtype=torch.long)
        mb = {}
        for key, v in batch.items():
            if _batch_rows(v, B):
                v = v[idx]
                if v.dim() >= 2 and v.shape[1] == Sp:
                    v = v[:, :Lp]
                elif v.dim() >= 2 and v.shape[1] == S - 1:
                    v = v[:, : L - 1]
                if key == "mask" and real < len(take):
                    v = v.clone()
                    v[real:] = 0
                v = v.to(device)
            mb[key] = v
        mb.update(_rows=rows, _len=L, _dummy=dummy)
        if thd and not uniform:
            mb["_lens"] = [int(lengths[r]) for r in rows]
        micro.append(mb)
    return micro, lo, hi


def packed_seq_params(lengths: list[int], device):
    """THD packing for TransformerEngine's attention on a GPU: one row of concatenated
    sequences with cumulative lengths. Used only when TE is present (megatron's local
    DotProductAttention asserts ``packed_seq_params is None``)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32, device=device), 0)
    mx = int(max(lengths))
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=mx, max_seqlen_kv=mx)
