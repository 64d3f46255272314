"""verl 0.9.1's launch for separate rollout and training pools: the fully-async trainer, composed for real.

verl 0.9.1 ships three ways to run rollout apart from training (docs/placement.md says why this one):
``verl.experimental.one_step_off_policy`` (staleness exactly 1), ``verl.trainer.main_ppo`` with
``trainer.v1.trainer_mode=separate_async`` (the v1 trainer; needs the transfer_queue package) and
``verl.experimental.fully_async_policy.fully_async_main`` with its Megatron config
``fully_async_ppo_megatron_trainer``. grpo-tune emits the last: it expresses every separate plan the
search proposes (staleness 0 as its on-policy pipeline, ``staleness_threshold`` K, partial rollout on
or off, the sync interval) with a Megatron engine.

How a separate plan maps to its keys (the asserts it must pass are in the rollouter/trainer of 0.9.1):
``trainer.nnodes`` x ``trainer.n_gpus_per_node`` is the training pool, ``rollout.nnodes`` x
``rollout.n_gpus_per_node`` the rollout pool; ``data.train_batch_size=0`` and ``data.gen_batch_size=1``
(asserted), ``rollout.total_rollout_steps`` = prompts x steps; one grpo-tune step is one parameter
version: ``async_training.trigger_parameter_sync_step`` = prompts / mini_batch x sync interval with
``require_batches=1`` (the trainer takes each mini-batch as it arrives: at staleness 0 the on-policy stream that
costmodel.streaming prices; a staleness-0 plan with ``stream: false`` fetches the whole batch, ``require_batches``
= prompts / mini_batch, one fetch per version); ``staleness_threshold`` = K (the rollouter runs at most K batches
ahead);
``partial_rollout``; vLLM stays awake (``free_cache_engine=False``), weights move by the NCCL checkpoint
engine; the proximal log-probs are recomputed (``rollout_correction.bypass_mode=False``) and corrected
with token-level truncated importance sampling (``rollout_is=token``, threshold 2.0), as grpo-tune's own
trainer does, unless the plan takes the rollout's log-probs as the old ones (``recompute_logprobs: false``:
``bypass_mode=True``, verl's fully-async default, no old log-prob pass).

The composed key tree ships as ``frameworks/verl/data/verl-0.9.1-fully-async-keys.json`` (the keys that the
fully-async config adds to or changes in ``ppo_megatron_trainer``), rebuilt by
``python -m grpo_tune.frameworks.verl.fully_async --write-snapshot`` and checked against the wheel in
tests/test_verl_async.py.
"""

from __future__ import annotations

import shlex
import sys
from typing import Callable

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl import table
from grpo_tune.frameworks.verl.experimental import WheelConfig
from grpo_tune.frameworks.verl.export import ENV_DEFAULTS, _quote_override, verl_values
from grpo_tune.frameworks.base.inputs import check_name, comment_safe
from grpo_tune.core.config import RunConfig
from grpo_tune.core.errors import ConfigError

ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
CONFIG_NAME = "fully_async_ppo_megatron_trainer"
CONFIG_SUBDIR = "verl/experimental/fully_async_policy/config"
IS_THRESHOLD = 2.0
"""Token-level truncated importance sampling bound (verl's ``rollout_is_threshold`` default)."""


CONFIG = WheelConfig(
    entry=ENTRY,
    name=CONFIG_NAME,
    subdir=CONFIG_SUBDIR,
    module="grpo_tune.frameworks.verl.fully_async",
    what="fully-async",
)
"""The fully-async config in the wheel: composed for real, its snapshot shipped (frameworks/verl/experimental.py)."""
config_dir = CONFIG.config_dir
compose = CONFIG.compose
snapshot = CONFIG.snapshot
default = CONFIG.default
declared = CONFIG.declared
write_snapshot = CONFIG.write_snapshot


# -- the launch --------------------------------------------------------------------------------


def pool_keys(cfg: RunConfig) -> dict[str, object]:
    """The pools, the async schedule and the off-policy correction of a separate plan, as verl keys."""
    from grpo_tune.core.placement import pools

    p, w, c = cfg.placement, cfg.workload, cfg.cluster
    ps = pools(c, p.rollout_gpus)
    aro = table.ARO
    units = w.prompts // w.mini_batch
    fetch_each = p.stream or p.staleness > 0  # issue 40: the on-policy stream is verl's mini-batch fetch
    return {
        "trainer.nnodes": ps.train.gpus // ps.train.gpus_per_node,
        "trainer.n_gpus_per_node": ps.train.gpus_per_node,
        "rollout.nnodes": ps.rollout.gpus // ps.rollout.gpus_per_node,
        "rollout.n_gpus_per_node": ps.rollout.gpus_per_node,
        "rollout.n": w.n,
        "rollout.total_rollout_steps": w.prompts * cfg.trainer.steps,
        "data.train_batch_size": 0,
        "data.gen_batch_size": 1,
        "async_training.staleness_threshold": float(p.staleness),
        # streaming (and any staleness > 0): the trainer fetches one mini-batch at a time, trigger_parameter_sync_step
        # of them per version; a staleness-0 plan that does not stream fetches the whole batch at once
        "async_training.trigger_parameter_sync_step": (units if fetch_each else 1) * p.sync_interval,
        "async_training.require_batches": 1 if fetch_each else units,
        # a sample is a prompt with its n responses: vLLM's max_num_seqs sequences per replica
        "async_training.concurrent_samples_per_replica": max(1, -(-cfg.strategy.rollout.max_num_seqs // w.n)),
        "async_training.partial_rollout": bool(p.partial_rollout),
        f"{aro}.hybrid_engine": False,
        f"{aro}.rollout.free_cache_engine": False,
        f"{aro}.rollout.calculate_log_probs": True,
        f"{aro}.rollout.checkpoint_engine.backend": "nccl",
        # decoupled PPO recomputes the proximal log-probs; off: the rollout's log-probs are the old ones
        "algorithm.rollout_correction.bypass_mode": not p.recompute_logprobs,
        "algorithm.rollout_correction.rollout_is": "token",
        "algorithm.rollout_correction.rollout_is_threshold": IS_THRESHOLD,
    }


def recomputes_logprobs(get: Callable[[str], object]) -> bool:
    """Whether a fully-async launch (its key reader) recomputes the old log-probs on the training pool:
    ``rollout_correction.bypass_mode`` false. 0.9.1's fully-async default is true (the rollout's are the old ones)."""
    return get("algorithm.rollout_correction.bypass_mode") is False


def values(cfg: RunConfig, **kw: str) -> dict[str, object]:
    """Every verl key of the separate plan: the colocated launch's (training layout, vLLM engine, batch) with
    the pool and async keys replacing theirs."""
    if not cfg.placement.separate:
        raise ConfigError("the fully-async launch is for separate pools", hint="set placement.mode: separate")
    out = verl_values(cfg, **kw)
    pk = pool_keys(cfg)
    out = {k: v for k, v in out.items() if k.lstrip("+") not in pk}
    out.update(pk)
    return out


def overrides(cfg: RunConfig, **kw: str) -> list[str]:
    """Hydra overrides for ``python3 -m verl.experimental.fully_async_policy.fully_async_main``; ``+`` marks
    keys neither config declares."""
    out = []
    for k, v in values(cfg, **kw).items():
        bare = k.lstrip("+")
        key = bare if declared(bare) else ("+" + bare)
        out.append(f"{key}={table.format_value(v)}")
    return out


def script(cfg: RunConfig) -> str:
    """The bash launch of a separate plan (the colocated verl.sh's header, variables and quoting)."""
    s, c, m, p = cfg.strategy, cfg.cluster, cfg.model, cfg.placement
    for value, what in ((m.name, "model name"), (m.hf_id or "", "model hf_id"), (cfg.hardware.name, "hardware name")):
        check_name(value, what)
    if p.rollout_hardware:
        check_name(p.rollout_hardware, "rollout hardware name")
    train = c.gpus - p.rollout_gpus
    plan = (
        f"{s.layout_text()} recompute={s.memory.recompute} "
        f"offload={','.join(s.memory.offload) or 'none'} "
        f"rollout_tp={s.rollout.rollout_tp} "
        f"gpu_memory_utilization={s.rollout.gpu_memory_utilization}"
    )
    lines = [
        "#!/usr/bin/env bash",
        comment_safe(
            f"# GRPO for {m.name} on {c.gpus} x {cfg.hardware.name}: separate pools, {p.rollout_gpus} rollout"
            f"{' (' + p.rollout_hardware + ')' if p.rollout_hardware else ''} + {train} training GPUs, "
            f"staleness {p.staleness}, partial rollout {'on' if p.partial_rollout else 'off'}; "
            f"verl {verl.VERL_VERSION} fully-async trainer + Megatron."
        ),
        comment_safe(f"# Emitted by grpo-tune. Training plan: {plan}"),
        "# Check it before a run: grpo-tune diagnose THIS_FILE",
        "set -euo pipefail",
        "",
        f"DEFAULT_MODEL_PATH={shlex.quote(m.hf_id or m.name)}",
        "MODEL_PATH=${MODEL_PATH:-$DEFAULT_MODEL_PATH}",
    ]
    for k, v in ENV_DEFAULTS.items():
        lines.append(f"{k}=${{{k}:-{v}}}")
    lines += [
        "# the fully-async config finds ppo_megatron_trainer on its search path: verl's own trainer config",
        "VERL_DIR=${VERL_DIR:-$(python3 -c 'import os, verl; print(os.path.dirname(verl.__file__))')}",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        "",
        f"python3 -m {ENTRY} \\",
        '    --config-path="$VERL_DIR/experimental/fully_async_policy/config" \\',
        f"    --config-name={CONFIG_NAME} \\",
        '    "hydra.searchpath=[file://$VERL_DIR/trainer/config]" \\',
    ]
    for o in overrides(cfg):
        lines.append(f"    {_quote_override(o)} \\")
    lines.append('    "$@"')
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return verl.maintain(argv, config_dir, write_snapshot)


if __name__ == "__main__":
    sys.exit(main())
