"""``plan_inputs`` with the values the search-level tests share (a plain module, not a test file)."""

from __future__ import annotations

from autotune.options import plan_inputs
from core.specs import ModelSpec

# A GRPO workload with the KL term, one PPO epoch, the hardware's default node size.
GRPO = dict(gpus_per_node=None, workload="grpo", ppo_epochs=1, kl=True)


def grpo_inputs(model: str, hardware: str, gpus: int, **workload):
    """(model, hardware, cluster, workload) as the CLI builds them; ``workload`` gives the sizes (prompts, n,
    prompt_len, response_len, mini_batch, seq_len, gbs, and optionally lengths)."""
    return plan_inputs(model=model, hardware=hardware, gpus=gpus, **GRPO, **workload)


def gpt_spec(h: int, a: int, layers: int, *, vocab: int = 51200, tied: bool) -> ModelSpec:
    """A GPT-3-style model as Megatron-LM's papers size them: MHA, a GeLU MLP of 4h."""
    return ModelSpec(
        name=f"gpt-{h}",
        family="gpt",
        layers=layers,
        hidden=h,
        ffn_hidden=4 * h,
        heads=a,
        kv_heads=a,
        head_dim=h // a,
        vocab=vocab,
        gated_mlp=False,
        tied_embeddings=tied,
    )
