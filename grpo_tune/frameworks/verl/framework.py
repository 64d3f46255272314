"""verl behind the framework contract: its launch script for a run folder, its launches read back, and edited
for ``tune`` (tuned.sh), and its loggers' output read for ``calibrate --from-log`` and ``--lengths``."""

from __future__ import annotations

import stat
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import cast

from grpo_tune.core.config import RunConfig
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.strategy import Strategy
from grpo_tune.frameworks.base import Framework, LaunchFile
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.base.plan import LaunchPlan, ReadRequest
from grpo_tune.frameworks.base.runlog import RunLog
from grpo_tune.frameworks.verl import logs, read
from grpo_tune.frameworks.verl import fully_async as verl_async
from grpo_tune.frameworks.verl.diagnose.parse import DIAGNOSE_PY_FLAGS
from grpo_tune.frameworks.verl.export import verl_script
from grpo_tune.frameworks.verl.launch import Launch
from grpo_tune.frameworks.verl.snapshot import VERL_VERSION


class Verl(Framework):
    name = "verl"
    title = "verl"
    streams_within_step = True
    separate_memory = (
        0.5,
        "verl 0.9.1's rollout.gpu_memory_utilization (verl/workers/config/rollout.py); the fully-async trainer's "
        "standalone_gpu_memory_utilization is null and falls back to it (fully_async_rollouter.py)",
    )
    """verl 0.9.1's fully-async trainer at ``staleness_threshold=0`` fetches ``require_batches`` mini-batches at a
    time while the rollouter generates the rest of the parameter version (docs/placement.md)."""
    release = VERL_VERSION
    absent_diagnose_flags = DIAGNOSE_PY_FLAGS
    absent_diagnose_note = "verl's own scripts/diagnose.py only checks the environment"

    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        text = verl_async.script(cfg) if cfg.placement.separate else verl_script(cfg)
        return [LaunchFile("verl", "verl.sh", f"verl {self.release} launch", text, executable=True)]

    def cluster_files(self, cfg: RunConfig, run_dir: Path, names: Sequence[str]) -> list[LaunchFile]:
        """verl.sbatch (Ray on the Slurm allocation, then the launch on its head, after verl's
        examples/slurm/ray_on_slurm.slurm) and verl.rayjob.yaml (KubeRay); they run tune's tuned.sh when the run
        folder has one, else verl.sh. None for a CPU plan."""
        import shlex

        from grpo_tune.frameworks.base import cluster

        if cluster.is_cpu(cfg):
            return []
        launch = "tuned.sh" if "tuned.sh" in names else "verl.sh"
        title = f"verl {self.release}"
        needs = f"{title} and Ray (verl requires ray[default]>=2.41.0) on every node"
        sbatch = cluster.ray_slurm_script(cfg, run_dir, name="verl.sbatch", launch=launch, framework=title, needs=needs)
        entry = shlex.join(["bash", str(Path(run_dir).resolve() / launch)])
        job = cluster.rayjob_yaml(
            cfg, run_dir, framework=title, key="verl", entrypoint=entry, image="replace-with-your-verl-0.9.1-image"
        )
        return [
            LaunchFile(
                "verl_slurm",
                "verl.sbatch",
                f"Slurm batch script: Ray on the plan's nodes, then {launch}",
                sbatch,
                executable=True,
                use=(f"sbatch verl.sbatch                    # Ray on Slurm, then {launch} on its head node",),
            ),
            LaunchFile(
                "verl_rayjob",
                "verl.rayjob.yaml",
                f"KubeRay RayJob running {launch}",
                job,
                use=("kubectl apply -f verl.rayjob.yaml     # the same on Kubernetes (KubeRay)",),
            ),
        ]

    def detect(self, path: Path, text: str) -> bool:
        """A verl launch script, or a YAML/JSON config with verl's top section (``actor_rollout_ref``). The
        registry asks verl first, so another framework's detector never sees a verl config; plain override lists
        and grpo-tune's run configs come to verl as the default framework."""
        from grpo_tune.core.errors import GrpoTuneError
        from grpo_tune.frameworks.base.inputs import load_yaml
        from grpo_tune.frameworks.verl.diagnose import looks_like_script
        from grpo_tune.frameworks.verl.table import ARO

        if path.suffix not in (".yaml", ".yml", ".json"):
            return looks_like_script(text)
        try:
            data, _ = load_yaml(text, str(path))
        except GrpoTuneError:
            return False
        return isinstance(data, dict) and ARO in data

    def key_findings(self, plan: LaunchPlan) -> object | None:
        """The launch's keys verl 0.9.1 refuses or renames (:class:`~.launch.Launch`), None without any."""
        from grpo_tune.frameworks.verl.launch import Launch

        return plan.launch if isinstance(plan.launch, Launch) and plan.launch.key_findings else None

    def knob_defaults(self) -> Mapping[str, object]:
        """Strategy fields as verl sets them when a launch leaves every key at its default (its config snapshot
        read through the Strategy<->verl table)."""
        return _defaults()

    log_folds = {logs.FORMAT_JSONL: logs.FOLD, logs.FORMAT_CONSOLE: logs.FOLD}

    def read_log(self, path: Path, text: str | None) -> RunLog | None:
        """verl's file-logger JSONL or its console output (a text file: ``text`` None is never verl's)."""
        return None if text is None else logs.read(path, text)

    def claims_log_record(self, obj: Mapping[str, object]) -> bool:
        return logs.is_record(obj)

    def log_lengths(self, line: str, obj: Mapping[str, object] | None) -> dict[str, float] | None:
        return logs.lengths(line, obj)

    def diagnose(self, path: Path, overrides: Sequence[str], *, hardware: str | None, model: str | None) -> Report:
        from grpo_tune.frameworks.verl.diagnose import diagnose_path

        return diagnose_path(path, hardware=hardware, model=model, overrides=list(overrides))

    def read_plan(self, req: ReadRequest) -> LaunchPlan | None:
        """A verl launch's plan; None for a YAML file that no other framework claims (a grpo-tune run config)."""
        path = req.path
        if req.overrides:
            raise ConfigError(
                f"{path}: extra overrides apply to a NeMo-RL recipe only", hint="put them into the verl launch itself"
            )
        if path.suffix in (".yaml", ".yml") and path.is_file():
            return None
        return read.read_plan(
            path,
            model=req.model,
            hardware=req.hardware,
            prompt_len_mean=req.prompt_len_mean,
            response_len_mean=req.response_len_mean,
            stack=req.stack,
        )

    tunes_separate = True
    separate_label = "verl fully-async launch"
    separate_written = "tuned.sh is your launch with the keys that change"

    def separate_tuned_file(
        self, plan: LaunchPlan, best: RunConfig, run_parent: Path
    ) -> tuple[str, str, int, dict[str, tuple[object, object]], list[str]]:
        """tuned.sh for a separate plan: the user's launch with the priced keys edited in place (the trainer switched
        to fully-async when the launch's cannot run the plan; frameworks/verl/retune.py)."""
        from grpo_tune.frameworks.verl.retune import edited_launch, separate_edit
        from grpo_tune.frameworks.verl.script import runtime_notes

        launch = cast(Launch, plan.launch)
        edit = separate_edit(launch, best, plan.model)
        mode = stat.S_IMODE(launch.path.stat().st_mode) | stat.S_IRUSR | stat.S_IWUSR
        notes = edit.notes + runtime_notes(launch, edit.changes)
        return "tuned.sh", edited_launch(launch, edit), mode, edit.changes, notes

    def separate_label_of(self, plan: LaunchPlan) -> str:
        return "verl one-step-off launch" if cast(Launch, plan.launch).one_step else self.separate_label

    def tune_keys(self, plan: LaunchPlan, strategy: Strategy) -> dict[str, object]:
        launch = cast(Launch, plan.launch)
        return read.overrides_for(strategy, plan.model, launch.get, set(launch.values))

    def tune_reread(self, plan: LaunchPlan, keys: Mapping[str, object]) -> Strategy:
        return read.strategy_from(read.Edited(cast(Launch, plan.launch), dict(keys)).get, plan.model)

    def tuned_file(
        self, plan: LaunchPlan, changes: Mapping[str, tuple[object, object]], run_parent: Path
    ) -> tuple[str, str, int]:
        """tuned.sh: the launch with the changed overrides edited in place, with the launch's own mode."""
        from grpo_tune.frameworks.verl.script import key_fixes, tuned_text

        launch = cast(Launch, plan.launch)
        mode = stat.S_IMODE(launch.path.stat().st_mode) | stat.S_IRUSR | stat.S_IWUSR
        return "tuned.sh", tuned_text(launch, dict(changes), key_fixes(launch)), mode

    def tune_notes(self, plan: LaunchPlan, changes: Mapping[str, tuple[object, object]]) -> list[str]:
        from grpo_tune.frameworks.verl.script import runtime_notes

        return runtime_notes(cast(Launch, plan.launch), dict(changes))


@lru_cache(maxsize=1)
def _defaults() -> dict[str, object]:
    from grpo_tune.frameworks.verl import snapshot, table

    return table.read_fields(snapshot.default, "strategy")
