"""Export a run config as a verl 0.9.1 launch (Hydra overrides + bash script).

Every verl key emitted here is composed against verl 0.9.1's real ``ppo_megatron_trainer`` config
in tests/test_verl_compose.py.
"""

from __future__ import annotations

import shlex
from grpo_tune.frameworks.base.models import positions_override
from grpo_tune.frameworks.verl import table
from grpo_tune.frameworks.verl.snapshot import CONFIG_NAME, VERL_VERSION
from grpo_tune.core.config import RunConfig
from grpo_tune.core.errors import ConfigError
from grpo_tune.frameworks.base.inputs import check_name, comment_safe
from grpo_tune.frameworks.base.sections import sections_of

ENV_DEFAULTS = {
    "TRAIN_FILES": "$HOME/data/gsm8k/train.parquet",
    "VAL_FILES": "$HOME/data/gsm8k/test.parquet",
}


def verl_values(
    cfg: RunConfig, *, model_path: str = "$MODEL_PATH", train_files: str = "$TRAIN_FILES", val_files: str = "$VAL_FILES"
) -> dict[str, object]:
    """Every verl key grpo-tune sets for this plan -> its Python value (the table's rows, then fixed keys)."""
    out: dict[str, object] = {
        **{k: v for k, v in table.FIXED.items() if not k.startswith("trainer.")},
        "data.train_files": train_files,
        "data.val_files": val_files,
        f"{table.ARO}.model.path": model_path,
    }
    out.update(table.write_sections(sections_of(cfg)))
    positions = positions_override(cfg)
    if positions is not None:  # the plan's sequences need more positions than the checkpoint's config.json says
        out[f"+{table.ARO}.model.override_config.max_position_embeddings"] = positions
    out.update({k: v for k, v in table.FIXED.items() if k.startswith("trainer.")})
    out["trainer.experiment_name"] = f"{cfg.model.name}-{cfg.cluster.gpus}gpu"
    return out


def verl_overrides(
    cfg: RunConfig, *, model_path: str = "$MODEL_PATH", train_files: str = "$TRAIN_FILES", val_files: str = "$VAL_FILES"
) -> list[str]:
    """Hydra overrides for ``python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer``.

    Every plan field with a verl setting is written explicitly (frameworks/verl/table.py), defaults
    included, so that the launch runs the plan that was priced. The reference model gets the actor's
    degrees, written out. ``+`` marks keys that verl's schema does not declare.
    """
    return table.overrides(verl_values(cfg, model_path=model_path, train_files=train_files, val_files=val_files))


# Words a script may keep expandable: exactly these variables, nothing else.
_SCRIPT_VARS = {"$MODEL_PATH": "MODEL_PATH", "$TRAIN_FILES": "TRAIN_FILES", "$VAL_FILES": "VAL_FILES"}


def _quote_override(arg: str) -> str:
    """Shell-quote one override. Only the launch's own variables stay expandable (a value ending in one
    of them: ``key=$MODEL_PATH``); everything else is single-quoted, so bash passes it verbatim."""
    key, _, val = arg.partition("=")
    if val in _SCRIPT_VARS:
        return shlex.quote(key + "=") + f'"${{{_SCRIPT_VARS[val]}}}"'
    return shlex.quote(arg)


def verl_script(cfg: RunConfig) -> str:
    """A bash launch for verl 0.9.1. ``MODEL_PATH``, ``TRAIN_FILES`` and ``VAL_FILES`` may be set by
    the caller; extra overrides can be appended as arguments (``"$@"``). Every value from the plan is
    single-quoted (a model name or hf_id can never run as code). A colocated plan's launch: separate pools
    run the fully-async one (frameworks/verl/fully_async.py), which builds on this module."""
    if cfg.placement.separate:
        raise ConfigError("the colocated verl launch is for colocated plans", hint="set placement.mode: colocated")
    s, c, m = cfg.strategy, cfg.cluster, cfg.model
    for value, what in ((m.name, "model name"), (m.hf_id or "", "model hf_id"), (cfg.hardware.name, "hardware name")):
        check_name(value, what)
    plan = (
        f"{s.layout_text()} recompute={s.memory.recompute} "
        f"offload={','.join(s.memory.offload) or 'none'} "
        f"rollout_tp={s.rollout.rollout_tp} "
        f"gpu_memory_utilization={s.rollout.gpu_memory_utilization} max_tokens_per_gpu={s.batching.max_tokens_per_gpu} "
        f"cpu_optimizer={s.memory.cpu_optimizer}"
    )
    lines = [
        "#!/usr/bin/env bash",
        comment_safe(
            f"# GRPO for {m.name} on {c.gpus} x {cfg.hardware.name} ({c.nnodes} node(s) of "
            f"{c.ranks_per_node}), verl {VERL_VERSION} + Megatron."
        ),
        comment_safe(f"# Emitted by grpo-tune. Plan: {plan}"),
        *([comment_safe(f"# {s.precision.note()}")] if s.precision.note() else []),
        "# Check it before a run: grpo-tune diagnose THIS_FILE",
        "set -euo pipefail",
        "",
        # the default is a plain quoted assignment: a value with `}` or `$(...)` stays data
        f"DEFAULT_MODEL_PATH={shlex.quote(m.hf_id or m.name)}",
        "MODEL_PATH=${MODEL_PATH:-$DEFAULT_MODEL_PATH}",
    ]
    for k, v in ENV_DEFAULTS.items():
        lines.append(f"{k}=${{{k}:-{v}}}")
    lines += [
        "# Megatron overlaps TP communication only with one hardware queue (Megatron-LM README)",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        "",
        f"python3 -m verl.trainer.main_ppo --config-name={CONFIG_NAME} \\",
    ]
    for o in verl_overrides(cfg):
        lines.append(f"    {_quote_override(o)} \\")
    lines.append('    "$@"')
    return "\n".join(lines) + "\n"
