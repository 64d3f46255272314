"""Token-budget micro-batches (verl's ``use_dynamic_bsz`` + ``ppo_max_token_len_per_gpu``). Torch-free.

:func:`pack` splits one DP rank's sequences into micro-batches whose summed real lengths stay
within ``max_tokens`` (a single longer sequence gets a micro-batch of its own; the pre-start check
refuses budgets below the longest sequence, as verl's ``rearrange_micro_batches`` asserts):

1. sort the rows by length, longest first (so a micro-batch holds rows of similar length and
   padding each one to its own longest row wastes little);
2. greedy first-fit: each row goes into the first open micro-batch with room left, else opens one;
3. the count is raised to ``min_count`` (the maximum over DP ranks, all-reduced by the caller, so
   every rank runs the same number of micro-batches and the pipeline schedules stay in step) and
   to a multiple of ``multiple`` (pp for the interleaved schedule) by splitting the micro-batch
   with the most tokens; a rank with fewer rows than micro-batches gets empty ones (the engine
   fills them with one fully masked row).

The loss does not depend on the split: the GRPO loss is normalized by the mini-batch's totals
and each micro-batch contributes its partial sum (trainer/loop.py, engine.py "Loss scaling").
"""

from __future__ import annotations

from typing import Sequence


def pack(lengths: Sequence[int], max_tokens: int, *, min_count: int = 1, multiple: int = 1) -> list[list[int]]:
    """Row indices of each micro-batch (each list sorted ascending; empty lists are padding)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = int(lengths[i])
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max_tokens - n)
    target = max(len(bins), min_count, 1)
    target = -(-target // multiple) * multiple
    while len(bins) < target:
        # split the micro-batch holding the most tokens (of those with >= 2 rows)
        cands = [b for b in range(len(bins)) if len(bins[b]) > 1]
        if not cands:
            bins.append([])
            continue
        b = max(cands, key=lambda k: (sum(int(lengths[i]) for i in bins[k]), -k))
        rows = bins[b]
        half = len(rows) // 2
        bins[b], extra = rows[:half], rows[half:]
        bins.append(extra)
    return [sorted(b) for b in bins]


def count(lengths: Sequence[int], max_tokens: int) -> int:
    """Micro-batches :func:`pack` makes before equalizing (what a rank reports for the all-reduce)."""
    return len(pack(lengths, max_tokens))
