"""verl behind the framework contract: its launch script for a run folder, and its launches read back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base import Framework, LaunchFile
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.verl import fully_async as verl_async
from grpo_tune.frameworks.verl.export import verl_script
from grpo_tune.frameworks.verl.snapshot import VERL_VERSION


class Verl(Framework):
    name = "verl"
    release = VERL_VERSION

    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        text = verl_async.script(cfg) if cfg.placement.separate else verl_script(cfg)
        return [LaunchFile("verl", "verl.sh", f"verl {self.release} launch", text, executable=True)]

    def detect(self, path: Path, text: str) -> bool:
        """A verl launch script (YAML configs and override lists verl reads as the default framework)."""
        from grpo_tune.frameworks.verl.diagnose import looks_like_script

        return path.suffix not in (".yaml", ".yml", ".json") and looks_like_script(text)

    def diagnose(self, path: Path, overrides: Sequence[str], *, hardware: str | None, model: str | None) -> Report:
        from grpo_tune.frameworks.verl.diagnose import diagnose_path

        return diagnose_path(path, hardware=hardware, model=model, overrides=list(overrides))
