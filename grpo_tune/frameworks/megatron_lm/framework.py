"""Megatron-LM behind the framework contract: the training side as ``pretrain_gpt.py`` flags, in every run."""

from __future__ import annotations

from pathlib import Path

from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base import Framework, LaunchFile
from grpo_tune.frameworks.megatron_lm.args import megatron_args_text


class MegatronLM(Framework):
    name = "megatron-lm"
    title = "Megatron-LM"
    streams_within_step = True
    """It emits the training pool's flags only: how the pools meet is the orchestrator's (verl's) choice."""
    release = "000c4ac"  # the Megatron-LM commit its flag list (data/) was read from
    always = True

    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        return [LaunchFile("megatron_args", "megatron_args.txt", "Megatron-LM flags", megatron_args_text(cfg))]
