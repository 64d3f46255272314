"""verl behind the framework contract: its launch script for a run folder."""

from __future__ import annotations

from pathlib import Path

from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base import Framework, LaunchFile
from grpo_tune.frameworks.verl.export import verl_script
from grpo_tune.frameworks.verl.snapshot import VERL_VERSION


class Verl(Framework):
    name = "verl"
    release = VERL_VERSION

    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        text = verl_script(cfg)
        return [LaunchFile("verl", "verl.sh", f"verl {self.release} launch", text, executable=True)]
