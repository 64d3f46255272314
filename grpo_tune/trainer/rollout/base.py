"""The narrow rollout interface every generation backend implements.

A rollout engine turns token-id prompts into token-id responses. The GRPO loop owns the group
structure: it repeats each prompt ``n`` times before calling :meth:`RolloutEngine.generate`, so an
engine never needs to know the group size. Between rollouts the loop calls :meth:`release` (free
the engine's memory for training) and, before the next rollout, :meth:`resume` followed by
:meth:`update_weights` with the freshly trained weights (verl's sleep/wake cycle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

from grpo_tune.core.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to sample one response per prompt."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to >= top_p."""
    max_tokens: int = 64
    """At most this many response tokens (a stop token counts as one)."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra tokens that end a response besides EOS. The stop token is kept in the response."""
    seed: int | None = None
    """Seed for this call's sampling (None: the engine's own RNG stream). Engines that support it
    make the same seed and weights give the same responses, which exact resume relies on."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0):
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@runtime_checkable
class RolloutEngine(Protocol):
    """What the GRPO loop needs from a generation backend (``megatron`` on CPU, ``vllm`` on GPU)."""

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """One response per prompt, in prompt order.

        ``prompt_ids`` are already repeated ``n`` times by the caller. A response holds only the
        generated ids (never the prompt), at most ``params.max_tokens`` of them, ending with the
        EOS/stop token when one was sampled (then it is the last id) and no padding.
        """
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, "object"]]) -> None:
        """Load new policy weights, given as ``(hf_name, full_tensor)`` pairs in Hugging Face
        naming (what ``Engine.named_parameters_for_export()`` yields). Engines that share the
        training model's parameters may treat this as a no-op."""
        ...

    def release(self) -> None:
        """Free the engine's memory (weights and KV cache) so the training phases can use it."""
        ...

    def resume(self) -> None:
        """Undo :meth:`release` before the next :meth:`update_weights` / :meth:`generate`."""
        ...
