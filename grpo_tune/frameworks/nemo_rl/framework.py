"""NeMo-RL behind the framework contract: its recipe for a run folder, the plan fields it fixes, its recipes
read back (detect, diagnose, plan) and its run logs (TensorBoard event files, the console timing table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from grpo_tune.core.config import RunConfig
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.strategy import Strategy, Workload
from grpo_tune.frameworks.base import Framework, LaunchFile
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.base.plan import LaunchPlan, ReadRequest
from grpo_tune.frameworks.base.runlog import RunLog
from grpo_tune.frameworks.nemo_rl import logs, recipe
from grpo_tune.frameworks.nemo_rl.read import STACK
from grpo_tune.frameworks.nemo_rl.snapshot import RELEASE
from grpo_tune.frameworks.nemo_rl.table import CONSTRAINTS, SEARCH_PINS


class NemoRL(Framework):
    name = "nemo-rl"
    title = "NeMo-RL"
    release = RELEASE
    separate_memory = (
        0.8,
        "NeMo-RL 0.7.0's async performance recipes with a separate generation pool "
        "(examples/configs/recipes/llm/performance/*-async-*off.yaml: vllm_cfg.gpu_memory_utilization 0.8 in 8 of "
        "the 11 that set it; its base config's 0.6 is the colocated one)",
    )

    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        run_id = run_dir.name
        use = (
            "grpo-tune diagnose nemo_rl.yaml       # check the NeMo-RL recipe",
            f"{recipe.launch_line(run_dir, run_id)}   # NeMo-RL {self.release}, from its checkout",
        )
        text = recipe.recipe_text(cfg, run_id=run_id)
        return [LaunchFile("nemo_rl", "nemo_rl.yaml", f"NeMo-RL {self.release} recipe", text, use=use)]

    def cluster_files(self, cfg: RunConfig, run_dir: Path, names: Sequence[str]) -> list[LaunchFile]:
        """nemo_rl.ray_sub.sh (NeMo-RL's own ray.sub submitted with the plan's nodes) and nemo_rl.rayjob.yaml
        (KubeRay); they run tune's tuned.yaml when the run folder has one (:mod:`.cluster`)."""
        from grpo_tune.frameworks.nemo_rl import cluster

        use = {
            "nemo_rl_slurm": "CONTAINER=IMAGE bash nemo_rl.ray_sub.sh -A ACCOUNT -p PARTITION  # in a NeMo-RL checkout",
            "nemo_rl_rayjob": "kubectl apply -f nemo_rl.rayjob.yaml  # the same on Kubernetes (KubeRay)",
        }
        return [
            LaunchFile(key, name, label, text, executable=exe, use=(use[key],))
            for key, name, label, text, exe in cluster.files(cfg, run_dir, names, self.release)
        ]

    def constraints(self) -> Mapping[str, object]:
        return SEARCH_PINS

    stack_profile = STACK

    def refuse_search_pins(self, pins: Mapping[str, object]) -> None:
        if pins.get("engine") not in (None, "vllm", "megatron"):  # megatron: the cpu default, not NeMo-RL's
            raise ConfigError(
                f"--rollout-engine {pins['engine']}: NeMo-RL 0.7.0's generation is vLLM here (its base config has no "
                "SGLang section)",
                hint="plan for verl (--framework verl) to search SGLang, or leave --rollout-engine out",
            )
        if pins.get("cpu_optimizer") is not None:
            raise ConfigError(
                f"--cpu-optimizer {pins['cpu_optimizer']}: the search prices Megatron's CPU optimizer with its copies "
                "overlapped, which NeMo-RL 0.7.0 cannot set (and it takes only the whole state, fraction 1.0)",
                hint="plan for verl (--framework verl), or price a NeMo-RL recipe with the CPU optimizer through "
                "`grpo-tune tune RECIPE`",
            )

    def separate_pins(self, pins: dict[str, object]) -> dict[str, object]:
        # NeMo-RL offloads the policy only to make room for colocated generation: a training pool keeps it
        return {**pins, "offload": ()}

    def plan_pins(self, pins: dict[str, object]) -> dict[str, object]:
        """NeMo-RL's CPU optimizer is the whole state, without overlapped copies; the rest of CONSTRAINTS fixed."""
        cpu = pins.get("cpu_optimizer")
        if cpu not in (None, 1.0):
            raise ConfigError(
                f"--cpu-optimizer {cpu}: NeMo-RL's CPU optimizer takes the whole state "
                "(optimizer_offload_fraction 1.0)",
                hint="give --cpu-optimizer 1.0, or price it for verl",
            )
        pins = {**pins, "overlap_cpu_optimizer": False}
        fixed = {k: v for k, v in CONSTRAINTS.items() if k != "overlap_cpu_optimizer"}
        for k, v in fixed.items():
            have = pins.get(k)
            if k in pins and have is not None and _norm(have) != _norm(v):
                raise ConfigError(
                    f"--{k.replace('_', '-')} {have!r}: NeMo-RL cannot run it (it fixes {k}={v!r})",
                    hint="drop the flag, or price it for verl (--framework verl)",
                )
        return {**pins, **fixed}

    def detect(self, path: Path, text: str) -> bool:
        """A NeMo-RL recipe: a YAML mapping shaped like one (not a grpo-tune run config)."""
        return recipe.is_recipe_text(path, text)

    def diagnose(self, path: Path, overrides: Sequence[str], *, hardware: str | None, model: str | None) -> Report:
        from grpo_tune.frameworks.nemo_rl.diagnose import diagnose_recipe

        return diagnose_recipe(path, list(overrides), hardware=hardware, model=model)

    def read_plan(self, req: ReadRequest) -> LaunchPlan | None:
        from grpo_tune.frameworks.nemo_rl import read

        return read.read_plan(
            req.path,
            req.overrides,
            model=req.model,
            hardware=req.hardware,
            prompt_len_mean=req.prompt_len_mean,
            response_len_mean=req.response_len_mean,
            stack=req.stack,
        )

    log_folds = {logs.FORMAT_TB: logs.FOLD, logs.FORMAT_CONSOLE: logs.FOLD}

    def read_log(self, path: Path, text: str | None) -> RunLog | None:
        """NeMo-RL's TensorBoard event files (a file or its folder), or its console output with the timing table."""
        if text is None:
            return logs.read_tensorboard(path) if logs.is_tensorboard(path) else None
        return logs.read_console(text, str(path)) if logs.looks_like_console(text) else None

    round_trips = True

    def round_trip(self, cfg: RunConfig, *, run_id: str) -> tuple[Strategy, Workload]:
        """``nemo_rl.yaml`` for ``cfg``, loaded as NeMo-RL loads it, read back."""
        import tempfile

        from grpo_tune.frameworks.nemo_rl import read

        with tempfile.TemporaryDirectory(prefix="grpo-tune-nemo-rl-") as d:
            f = Path(d) / "nemo_rl.yaml"
            f.write_text(recipe.recipe_text(cfg, run_id=run_id))
            r = recipe.load(f)
        c = read.train_cluster(r, read.cluster_of(r))  # with a generation pool of its own: the training pool
        wl = cfg.workload
        s_back = read.strategy_of(r, cfg.model, c.gpus, c.gpus_per_node)
        wl_back = read.workload_of(
            r, prompt_len_mean=wl.prompt_len_mean, response_len_mean=wl.response_len_mean, assume=False
        )
        return s_back, wl_back

    tune_label = " (NeMo-RL recipe)"
    separate_label = "NeMo-RL recipe with a separate generation pool"
    separate_written = "tuned.yaml is your recipe (its defaults) with the keys that change"

    def separate_tuned_file(
        self, plan: LaunchPlan, best: RunConfig, run_parent: Path
    ) -> tuple[str, str, int, dict[str, tuple[object, object]], list[str]]:
        """tuned.yaml for a separate plan: ``defaults:`` naming the user's recipe, then the priced keys that change
        (the policy's plan, the generation pool and the staleness, with what NeMo-RL's async GRPO asserts)."""
        from grpo_tune.frameworks.nemo_rl import table, tune

        r = cast(recipe.Recipe, plan.launch)
        new = {**tune.keys_for(best.strategy, plan.model), **table.write_placement(best.placement, best.cluster)}
        changes = {k: (r.get(k), v) for k, v in new.items() if not _same(r.get(k), v)}
        text = tune.tuned_text(r, changes, run_parent / "run")
        return "tuned.yaml", text, 0o644, changes, []

    def tune_constraints(self) -> Mapping[str, object]:
        return CONSTRAINTS

    def tune_keys(self, plan: LaunchPlan, strategy: Strategy) -> dict[str, object]:
        from grpo_tune.frameworks.nemo_rl import tune

        return tune.keys_for(strategy, plan.model)

    def tune_reread(self, plan: LaunchPlan, keys: Mapping[str, object]) -> Strategy:
        from grpo_tune.frameworks.nemo_rl import read, tune

        r = cast(recipe.Recipe, plan.launch)
        edited = tune.Edited(r, dict(keys))
        return read.strategy_of(edited, plan.model, plan.cluster.gpus, plan.cluster.gpus_per_node)  # type: ignore[arg-type]

    def tuned_file(
        self, plan: LaunchPlan, changes: Mapping[str, tuple[object, object]], run_parent: Path
    ) -> tuple[str, str, int]:
        """tuned.yaml: ``defaults:`` naming the recipe (relative to the run folder), the user's CLI overrides, the
        changed keys."""
        from grpo_tune.frameworks.nemo_rl import tune

        # any run folder directly below run_parent names the recipe by the same relative path
        text = tune.tuned_text(cast(recipe.Recipe, plan.launch), dict(changes), run_parent / "run")
        return "tuned.yaml", text, 0o644


def _same(a: object, b: object) -> bool:
    """Equal values (numbers to a relative 1e-9: a YAML float and the plan's)."""
    import math

    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _norm(v: object) -> object:
    return tuple(v) if isinstance(v, (list, tuple)) else v
