"""The native rollout engine: batched sampling on the training model itself (CPU and fallback).

It runs :func:`trainer.rollout.sampling.sample` with ``Engine.next_token_logits`` as the logits
function, so generation uses the actor's own TP/PP/DP layout and parameters: no weight copy is
needed (``shares_actor_weights``) and rollout TP is the training TP. Every rank calls
:meth:`generate` with all prompts (``collective_batch``): each decoding step is one forward-only
pipeline pass whose DP ranks split the rows, and every rank gets the full logits back, so every
rank draws the same tokens from identically seeded generators and stops on the same step.
By default it decodes from a KV cache (megatron-core's static inference context on the training
model's own layout, ``Engine.kv_session``), giving the uncached sampler's tokens at O(T) work per
token; ``kv_cache=False`` re-runs the whole prefix each step (the reference the tests compare to).
"""

from __future__ import annotations

from typing import Iterable

import torch

from .base import SamplingParams
from .sampling import sample


class MegatronRollout:
    collective_batch = True
    shares_actor_weights = True

    def __init__(
        self,
        *,
        engine,
        tokenizer,
        max_seq_len: int | None = None,
        seed: int | None = None,
        micro_batch_size: int | None = None,
        kv_cache: bool = True,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_seq_len = min(max_seq_len or engine.spec.max_seq_len, engine.spec.max_seq_len)
        self.micro_batch_size = micro_batch_size
        self.kv_cache = kv_cache
        s = engine.cfg.trainer.seed if seed is None else seed
        # Same seed on every rank; advanced identically because every rank samples every row.
        self.generator = torch.Generator().manual_seed(int(s) + 7919)

    def _next_logits(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.engine.next_token_logits(tokens, lengths, micro_batch_size=self.micro_batch_size)

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, *, rows: tuple[int, int] | None = None
    ) -> list[list[int]]:
        """``rows = (offset, total)``: the prompts are that slice of a batch of ``total`` and draw its rows'
        uniforms (:func:`trainer.rollout.sampling.sample`), so a batch sampled in parts is the whole batch's."""
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else self.generator
        kw = dict(
            pad_id=self.tokenizer.pad_id,
            eos_id=self.tokenizer.eos_id,
            generator=gen,
            max_seq_len=self.max_seq_len,
            rows=rows,
        )
        with torch.no_grad():
            if not self.kv_cache or not prompt_ids:
                return sample(self._next_logits, prompt_ids, params, **kw)
            width = max(len(p) for p in prompt_ids) + params.max_tokens
            with self.engine.kv_session(
                len(prompt_ids), min(width, self.max_seq_len), micro_batch_size=self.micro_batch_size
            ) as step:
                return sample(step, prompt_ids, params, cached=True, **kw)

    def update_weights(self, named_tensors: Iterable[tuple[str, object]]) -> None:
        """No-op: generation reads the actor's live parameters. Consumes nothing, so a collective
        iterator passed here is never started (callers skip sync when ``shares_actor_weights``).
        So ``strategy.sync_bucket_mb`` has nothing to size here (the cost model prices no sync on CPU)."""

    def release(self) -> None:
        """Nothing to free: the engine has no cache of its own."""

    def resume(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.generator.set_state(sd["generator"])
