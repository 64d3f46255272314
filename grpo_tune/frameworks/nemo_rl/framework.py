"""NeMo-RL behind the framework contract: its recipe for a run folder, and the plan fields it fixes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base import Framework, LaunchFile
from grpo_tune.frameworks.nemo_rl import recipe
from grpo_tune.frameworks.nemo_rl.snapshot import RELEASE
from grpo_tune.frameworks.nemo_rl.table import SEARCH_PINS


class NemoRL(Framework):
    name = "nemo-rl"
    release = RELEASE

    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        run_id = run_dir.name
        use = (
            "grpo-tune diagnose nemo_rl.yaml       # check the NeMo-RL recipe",
            f"{recipe.launch_line(run_dir, run_id)}   # NeMo-RL {self.release}, from its checkout",
        )
        text = recipe.recipe_text(cfg, run_id=run_id)
        return [LaunchFile("nemo_rl", "nemo_rl.yaml", f"NeMo-RL {self.release} recipe", text, use=use)]

    def constraints(self) -> Mapping[str, object]:
        return SEARCH_PINS
