"""Batched autoregressive sampling driven by a next-token-logits callable.

The sampler knows nothing about Megatron: ``next_logits_fn(tokens, lengths)`` returns the logits
of the token after position ``lengths[b] - 1`` of each row, so the same code runs on the pipeline
model (``Engine.next_token_logits``), on a plain torch model in a unit test, or on a fake.

Collective safety: every decoding step calls ``next_logits_fn`` once with *all* rows, finished or
not, and the loop ends on the same step on every rank as long as every rank sees the same logits
and draws from a generator in the same state. Under TP/PP the logits are identical on each rank
of the group, so pass each rank a generator seeded the same way (or ``params.seed``).
:func:`sample` without a KV cache re-runs the whole prefix each step (O(T^2) work); with ``cached=True``
it gives the same tokens from a KV cache (``Engine.kv_session``), O(T).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .base import SamplingParams

NextLogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
StepFn = Callable[[torch.Tensor, int], torch.Tensor]


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one token per row from ``logits[B, V]``; returns LongTensor[B].

    temperature 0 is greedy. Top-p follows Holtzman et al. 2020 (nucleus sampling, sec. 3.1): keep
    the smallest prefix of the probability-sorted vocabulary whose mass reaches ``top_p``.
    """
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)  # the top token always stays (before=0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    # inverse-CDF draw: one uniform per row (torch.multinomial is several times slower on CPU);
    # right=True skips zero-probability tokens, whose CDF interval is empty
    cdf = probs.cumsum(dim=-1)
    if u is None:  # one uniform per row; a caller may pass its own (the cached sampler does)
        u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)
    u = u.to(device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _padded_prompts(
    prompt_ids: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    pad_id: int,
    max_seq_len: int | None,
    device: torch.device | str | None = None,
) -> tuple[list[int], list[int], torch.Tensor]:
    """Each prompt's length, its response budget (``params.max_tokens``, cut so that prompt + response fits
    ``max_seq_len``) and the prompts padded to the longest prompt + budget, ``LongTensor[B, W]``."""
    lens = [len(p) for p in prompt_ids]
    if min(lens) < 1:
        raise ValueError("every prompt needs at least one token (e.g. BOS)")
    budget = [
        params.max_tokens if max_seq_len is None else max(0, min(params.max_tokens, max_seq_len - k)) for k in lens
    ]
    width = max(k + b for k, b in zip(lens, budget))
    tokens = torch.tensor(
        [list(p) + [pad_id] * (width - k) for p, k in zip(prompt_ids, lens)], dtype=torch.long, device=device
    )
    return lens, budget, tokens


def sample(
    logits_fn: NextLogitsFn | StepFn,
    prompt_ids: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    pad_id: int,
    eos_id: int,
    generator: torch.Generator | None = None,
    max_seq_len: int | None = None,
    device: torch.device | str | None = None,
    cached: bool = False,
    rows: tuple[int, int] | None = None,
) -> list[list[int]]:
    """Sample one response per prompt; returns the response ids only (see ``RolloutEngine.generate``).

    A response ends after EOS or any of ``params.stop_token_ids`` (kept as its last id), after
    ``params.max_tokens`` ids, or when prompt + response reaches ``max_seq_len``.
    ``generator`` wins over ``params.seed``; with neither, torch's global RNG is used.

    ``logits_fn`` is a :data:`NextLogitsFn` (each step re-runs the whole prefix), or with
    ``cached=True`` a KV-cache :data:`StepFn` (``Engine.kv_session``): the same responses, draw for draw.

    ``rows = (offset, total)``: these prompts are rows ``offset .. offset + len(prompt_ids) - 1`` of a batch of
    ``total``, and each row draws the uniforms that row of the whole batch would draw (each draw is made for all
    ``total`` rows and sliced), so sampling a batch in parts gives the whole batch's responses, draw for draw
    (a rollout pool that streams a step's mini-batches samples them so: trainer/separate.py).
    """
    if len(prompt_ids) == 0:
        return []
    lens, budget, tokens = _padded_prompts(prompt_ids, params, pad_id=pad_id, max_seq_len=max_seq_len, device=device)
    batch = _Batch(lens, budget, tokens, params, {eos_id, *params.stop_token_ids}, generator, rows)
    return _decode_cached(logits_fn, batch) if cached else _decode(logits_fn, batch)


@dataclass
class _Batch:
    """What both decoding loops start from: each prompt's length and response budget, the padded token
    buffer (responses are written into it), the sampling settings and stop ids, and the generator."""

    lens: list[int]
    budget: list[int]
    tokens: torch.Tensor
    params: SamplingParams
    stop_ids: set[int]
    generator: torch.Generator | None
    rows: tuple[int, int] | None = None
    """(offset, total): these rows' share of a whole batch's draws (see :func:`sample`); None: the batch is whole."""

    def uniforms(self, device: torch.device) -> torch.Tensor:
        """One decoding step's uniforms, one per row ``[B, 1]``: from the generator, over the whole batch."""
        n = len(self.lens)
        if self.rows is None:
            return torch.rand((n, 1), generator=self.rng(device), device=device)
        off, total = self.rows
        return torch.rand((total, 1), generator=self.rng(device), device=device)[off : off + n]

    def rng(self, device: torch.device) -> torch.Generator | None:
        """The caller's generator, else one seeded with ``params.seed`` on the logits' device (made on first use),
        else None (torch's global RNG)."""
        if self.generator is None and self.params.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(self.params.seed)
        return self.generator


def _decode(next_logits_fn: NextLogitsFn, batch: _Batch) -> list[list[int]]:
    """The uncached loop: each step feeds every row's whole prefix to ``next_logits_fn``."""
    lens, budget, tokens, params = batch.lens, batch.budget, batch.tokens, batch.params
    n, device = len(lens), tokens.device
    lengths = torch.tensor(lens, dtype=torch.long, device=device)
    stop = torch.tensor(sorted(batch.stop_ids), dtype=torch.long, device=device)
    done = torch.tensor([b == 0 for b in budget], dtype=torch.bool, device=device)
    limit = torch.tensor(budget, dtype=torch.long, device=device)
    produced = torch.zeros(n, dtype=torch.long, device=device)
    rows = torch.arange(n, device=device)

    for _ in range(max(budget)):
        if bool(done.all()):
            break
        cur = int(lengths.max())
        logits = next_logits_fn(tokens[:, :cur], lengths)
        u = batch.uniforms(logits.device) if batch.rows is not None and params.temperature != 0 else None
        nxt = sample_next(
            logits, temperature=params.temperature, top_p=params.top_p, generator=batch.rng(logits.device), u=u
        ).to(tokens.device)
        live = ~done
        tokens[rows[live], lengths[live]] = nxt[live]
        lengths = lengths + live.long()
        produced = produced + live.long()
        done = done | (live & torch.isin(nxt, stop)) | (produced >= limit)

    rows_out, ends = tokens.tolist(), lengths.tolist()
    return [row[k:e] for row, k, e in zip(rows_out, lens, ends)]


def _decode_cached(step_fn: StepFn, batch: _Batch) -> list[list[int]]:
    """The KV-cache loop: each token's logits from one new position.

    ``step_fn(chunk [B, T], start)`` feeds positions ``start .. start+T-1`` of every row to the
    cache and returns the logits of the chunk's last position ``[B, V]``. Rows share positions
    (the cache is aligned): the first call is the shortest prompt, then one position per call; a
    row still inside its prompt gets its prompt token, a live row its sampled token, a finished
    row padding (never read by another row). Work is O(T) per token instead of O(T^2).

    Sampling matches :func:`_decode` draw for draw: there, decoding step k draws one uniform per
    row and row b's k-th token uses its own; here row b reaches its k-th token at position
    ``len(prompt_b) + k``, so the k-th batch of uniforms is drawn (from the same generator, in
    the same order) the first time any row needs it. Greedy (temperature 0) draws nothing.
    """
    lens, budget, tokens, params = batch.lens, batch.budget, batch.tokens, batch.params
    n, width = len(lens), tokens.shape[1]
    produced = [0] * n
    done = [b == 0 for b in budget]
    draws: list[torch.Tensor] = []
    pos = min(lens)
    logits = step_fn(tokens[:, :pos], 0) if not all(done) else None
    while not all(done) and pos < width:
        live = [b for b in range(n) if not done[b] and lens[b] + produced[b] == pos]
        if live:
            generator = batch.rng(logits.device)
            u = None
            if params.temperature != 0:
                for k in sorted({produced[b] for b in live}):
                    while len(draws) <= k:
                        draws.append(batch.uniforms(logits.device))
                u = torch.stack([draws[produced[b]][b] for b in live])
            rows = torch.tensor(live)
            nxt = sample_next(
                logits[rows], temperature=params.temperature, top_p=params.top_p, generator=generator, u=u
            ).tolist()
            for b, t in zip(live, nxt):
                tokens[b, pos] = t
                produced[b] += 1
                if t in batch.stop_ids or produced[b] >= budget[b]:
                    done[b] = True
        if all(done) or pos + 1 >= width:
            break
        logits = step_fn(tokens[:, pos : pos + 1], pos)
        pos += 1
    return [tokens[b, lens[b] : lens[b] + produced[b]].tolist() for b in range(n)]


def pack(
    prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], *, pad_id: int, width: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded training rows ``prompt + response + pad`` and the masks the loss needs.

    Returns ``tokens`` LongTensor[B, S] and ``response_mask`` FloatTensor[B, S-1] with a 1 where
    ``tokens[:, 1:]`` is a response token, i.e. aligned with ``Engine.logprobs`` (log p of
    ``tokens[:, 1:]``). ``width`` fixes S (pipeline stages need one sequence length); it must fit
    the longest row. ``prompt_lengths`` and ``response_lengths`` (LongTensor[B]) come along.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    total = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    s = max(total) if width is None else width
    if total and max(total) > s:
        raise ValueError(f"a row of {max(total)} tokens does not fit width {s}")
    b = len(prompt_ids)
    tokens = torch.full((b, s), pad_id, dtype=torch.long)
    mask = torch.zeros((b, max(s - 1, 0)), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        row = list(p) + list(r)
        tokens[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        # position t of the mask predicts token t+1: response tokens sit at len(p) .. len(p)+len(r)-1
        mask[i, len(p) - 1 : len(p) - 1 + len(r)] = 1.0
    return {
        "tokens": tokens,
        "response_mask": mask,
        "prompt_lengths": torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
        "response_lengths": torch.tensor([len(r) for r in response_ids], dtype=torch.long),
    }
