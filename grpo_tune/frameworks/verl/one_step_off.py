"""verl 0.9.1's one-step-off trainer, read back: ``python3 -m verl.experimental.one_step_off_policy.main_ppo
--config-name=one_step_off_ppo_megatron_trainer``.

The recipe behind verl's own one-step-off results (``docs/advance/one_step_off.md``; the Qwen2.5-Math-7B 4 + 12 H20
run scored by ``validate --grpo``). Its config (``verl/experimental/one_step_off_policy/config``) is
``ppo_megatron_trainer`` plus a rollout pool (``rollout.nnodes`` x ``rollout.n_gpus_per_node``; the training pool is
``trainer.nnodes`` x ``trainer.n_gpus_per_node``), vLLM kept awake (``free_cache_engine=False``), the NCCL checkpoint
engine, and ``rollout_correction.bypass_mode=True`` (the rollout's log-probs are the old ones) by default; its
trainer asserts ``hybrid_engine=False``. The generation of step s + 1 overlaps the training of step s, with the
weights of step s: staleness exactly 1, no partial rollout, the weights synced after every step of
``data.train_batch_size`` prompts.

``diagnose`` and ``tune`` read such a launch as separate pools at staleness 1. grpo-tune does not emit it: the
fully-async trainer (frameworks/verl/fully_async.py) expresses every plan the search proposes, this one included,
so ``tune`` writes its proposal as a fully-async launch. The composed keys ship as
``frameworks/verl/data/verl-0.9.1-one-step-off-keys.json`` (``python -m grpo_tune.frameworks.verl.one_step_off
--write-snapshot``; checked against the wheel in tests/test_verl_one_step_off.py).
"""

from __future__ import annotations

import sys
from typing import Callable

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.placement import Placement
from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl.experimental import WheelConfig

ENTRY = "verl.experimental.one_step_off_policy.main_ppo"
CONFIG_NAME = "one_step_off_ppo_megatron_trainer"
CONFIG = WheelConfig(
    entry=ENTRY,
    name=CONFIG_NAME,
    subdir="verl/experimental/one_step_off_policy/config",
    module="grpo_tune.frameworks.verl.one_step_off",
    what="one-step-off",
)
"""Its config in the wheel, composed for real; ``CONFIG.snapshot()``: the keys it adds (verl/experimental.py)."""

STALENESS = 1
"""Generation runs one step ahead of training, with the weights of the step before."""


def placement_of(get: Callable[[str], object], where: str) -> Placement:
    """A one-step-off launch's placement (its key reader ``get``): the rollout pool, staleness 1, no partial
    rollout, a sync after every step; the old log-probs recomputed only with ``bypass_mode=False``."""
    rg, rn = get("rollout.n_gpus_per_node"), get("rollout.nnodes")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (rg, rn)):
        raise ConfigError(
            f"{where}: rollout.n_gpus_per_node={rg!r} x rollout.nnodes={rn!r} is not a rollout pool",
            hint="set both to positive integers",
        )
    assert isinstance(rg, int) and isinstance(rn, int)
    return Placement(
        mode="separate",
        rollout_gpus=rg * rn,
        staleness=STALENESS,
        partial_rollout=False,
        recompute_logprobs=get("algorithm.rollout_correction.bypass_mode") is False,
    )


def main(argv: list[str] | None = None) -> int:
    return verl.maintain(argv, CONFIG.config_dir, CONFIG.write_snapshot)


if __name__ == "__main__":
    sys.exit(main())
