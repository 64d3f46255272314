"""NeMo-RL behind the framework contract: its recipe for a run folder, the plan fields it fixes, its recipes
read back (detect, diagnose, plan) and its run logs (TensorBoard event files, the console timing table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base import Framework, LaunchFile
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.base.plan import LaunchPlan
from grpo_tune.frameworks.base.runlog import RunLog
from grpo_tune.frameworks.nemo_rl import logs, recipe
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

    def detect(self, path: Path, text: str) -> bool:
        """A NeMo-RL recipe: a YAML mapping shaped like one (not a grpo-tune run config)."""
        return recipe.is_recipe_text(path, text)

    def diagnose(self, path: Path, overrides: Sequence[str], *, hardware: str | None, model: str | None) -> Report:
        from grpo_tune.frameworks.nemo_rl.diagnose import diagnose_recipe

        return diagnose_recipe(path, list(overrides), hardware=hardware, model=model)

    def read_plan(
        self,
        path: Path,
        *,
        model: str | None = None,
        hardware: str | None = None,
        prompt_len_mean: int | None = None,
        response_len_mean: int | None = None,
    ) -> LaunchPlan | None:
        from grpo_tune.frameworks.nemo_rl import read

        return read.plan_of(
            path, model=model, hardware=hardware, prompt_len_mean=prompt_len_mean, response_len_mean=response_len_mean
        )

    log_folds = {logs.FORMAT_TB: logs.FOLD, logs.FORMAT_CONSOLE: logs.FOLD}

    def read_log(self, path: Path, text: str | None) -> RunLog | None:
        """NeMo-RL's TensorBoard event files (a file or its folder), or its console output with the timing table."""
        if text is None:
            return logs.read_tensorboard(path) if logs.is_tensorboard(path) else None
        return logs.read_console(text, str(path)) if logs.looks_like_console(text) else None
