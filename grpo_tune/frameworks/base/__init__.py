"""The contract every framework integration meets, and the types it hands back.

A framework (verl, NeMo-RL, Megatron-LM) is one :class:`Framework` subclass in its own sub-package,
listed once in :data:`grpo_tune.frameworks.REGISTRY`. What a subclass states:

- ``name`` (as ``--framework`` spells it) and ``release`` (the pinned upstream release it is tested
  against: its key snapshot ships in the sub-package's ``data/``);
- :meth:`Framework.launch_files`: a run config written as that framework's launch or config files
  (``verl.sh``, ``nemo_rl.yaml``, ``megatron_args.txt``), as text, before anything is written, so that
  a plan the framework refuses leaves no half-written run folder;
- :meth:`Framework.constraints`: the plan fields the framework fixes (the search's pins when planning
  for it), empty when it expresses every plan the search proposes.

The read side, which the generic commands reach through the registry rather than by naming a framework:

- :meth:`Framework.detect`: whether a file is this framework's launch, config or recipe (by its content);
  a file that no framework claims is read by the default one (verl, which also reads grpo-tune's run
  configs and plain override lists);
- :meth:`Framework.diagnose`: that file's coded findings (``grpo-tune diagnose``);
- :meth:`Framework.read_plan`: that file read back into a plan (what ``tune`` and ``calibrate`` price),
  None where the generic launch reader of :mod:`grpo_tune.autotune.tune` reads it (verl's launches);
- :meth:`Framework.read_log` and :attr:`Framework.log_folds`: the framework's own run logs (``calibrate
  --from-log``) and how its timers hold our phases; verl's loggers and grpo-tune's metrics.jsonl are the
  default readers' (:mod:`grpo_tune.autotune.calibrate.runlog`).

Their implementations live beside the writer in each sub-package (verl: ``launch`` reads a launch back into
a plan, ``diagnose`` holds its rules and its bash reader, ``snapshot`` the key tree; NeMo-RL: ``read``,
``diagnose``, ``logs``, ``snapshot``). The types they hand back live in this package: a diagnose
:class:`~.findings.Report`, a :class:`~.plan.LaunchPlan`, a :class:`~.runlog.RunLog`; so do the readers every
framework shares (:mod:`.inputs`: bounded files, YAML, overrides; :mod:`.models`: the model lookup).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.base.plan import LaunchPlan
from grpo_tune.frameworks.base.runlog import RunLog


@dataclass(frozen=True)
class LaunchFile:
    """One file of a run folder that a framework writes.

    ``key`` names it in the paths that :func:`grpo_tune.rundir.emit.emit` returns, ``name`` is its file name,
    ``label`` its line in report.md's file list, ``use`` the report's lines on how to run it."""

    key: str
    name: str
    label: str
    text: str
    executable: bool = False
    use: tuple[str, ...] = ()


class Framework(ABC):
    """A framework integration: how a plan is written as that framework's files (see the module doc)."""

    name: ClassVar[str]
    release: ClassVar[str]
    always: ClassVar[bool] = False
    """Written into every run folder, whatever ``--framework`` selects (Megatron-LM's flags are)."""

    @abstractmethod
    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        """``cfg`` as this framework's files for the run folder ``run_dir`` (rendered, not written)."""

    def constraints(self) -> Mapping[str, object]:
        """Plan fields this framework fixes: ``{Strategy field: value}`` (the search's pins for it)."""
        return {}

    def detect(self, path: Path, text: str) -> bool:
        """Whether the file ``path`` (its text, read bounded) is this framework's launch, config or recipe."""
        return False

    def diagnose(self, path: Path, overrides: Sequence[str], *, hardware: str | None, model: str | None) -> Report:
        """``grpo-tune diagnose`` on a file this framework detects (with trailing ``key=value`` overrides)."""
        raise NotImplementedError(f"{self.name} has no diagnose reader")

    def read_plan(
        self,
        path: Path,
        *,
        model: str | None = None,
        hardware: str | None = None,
        prompt_len_mean: int | None = None,
        response_len_mean: int | None = None,
    ) -> LaunchPlan | None:
        """A file this framework detects read back into a ``LaunchPlan``; None where the generic launch reader
        reads it."""
        return None

    log_folds: ClassVar[Mapping[str, dict[str, str]]] = {}
    """The log formats :meth:`read_log` returns -> how the framework's timers hold our phases (predicted phase ->
    the measured phase timing it; a format not listed is timed as verl times it)."""

    def read_log(self, path: Path, text: str | None) -> RunLog | None:
        """This framework's run log at ``path``, None where it is not one. Asked first with ``text`` None, for the
        logs that are not one text file (a folder of TensorBoard event files); then, for a text file that the
        default readers (verl's loggers, grpo-tune's metrics.jsonl) do not recognise, with its text (read
        bounded)."""
        return None
