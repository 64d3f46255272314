"""Inputs several test files share (a plain module, not a test file): plan_inputs with the common GRPO values,
a GPT-3-style ModelSpec, and the published parameter counts of presets."""

from __future__ import annotations

import csv
from pathlib import Path

from grpo_tune.jobs.inputs import plan_inputs
from grpo_tune.core.specs import ModelSpec

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


def param_counts() -> dict[str, dict]:
    """Published parameter counts of presets, exact (tolerance zero), each row with its source
    (tests/fixtures/param_counts.csv): ``total``, and ``active`` and ``tied`` where the source states them."""
    with open(Path(__file__).parent / "fixtures" / "param_counts.csv", newline="") as f:
        return {
            r["model"]: {
                "total": int(r["total_params"]),
                "active": int(r["active_params"]) if r["active_params"] else None,
                "tied": {"true": True, "false": False}.get(r["tied_embeddings"]),
            }
            for r in csv.DictReader(f)
        }
