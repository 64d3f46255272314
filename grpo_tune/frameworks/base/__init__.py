"""The contract every framework integration meets, and the types it hands back.

A framework (verl, NeMo-RL, Megatron-LM) is one :class:`Framework` subclass in its own sub-package,
listed once in :data:`grpo_tune.frameworks.REGISTRY`. What a subclass states:

- ``name`` (as ``--framework`` spells it) and ``release`` (the pinned upstream release it is tested
  against: its key snapshot ships in the sub-package's ``data/``);
- :meth:`Framework.launch_files`: a run config written as that framework's launch or config files
  (``verl.sh``, ``nemo_rl.yaml``, ``megatron_args.txt``), as text, before anything is written, so that
  a plan the framework refuses leaves no half-written run folder;
- :meth:`Framework.cluster_files`: the files that start that launch on a cluster (a Slurm script that starts
  Ray, a KubeRay ``RayJob``; :mod:`.cluster` renders both), written into the run folder with it;
- :meth:`Framework.constraints`: the plan fields the framework fixes (the search's pins when planning
  for it), empty when it expresses every plan the search proposes.

The read side, which the generic commands reach through the registry rather than by naming a framework:

- :meth:`Framework.detect`: whether a file is this framework's launch, config or recipe (by its content);
  a file that no framework claims is read by the default one (verl, which also reads grpo-tune's run
  configs and plain override lists);
- :meth:`Framework.diagnose`: that file's coded findings (``grpo-tune diagnose``);
- :meth:`Framework.read_plan`: that file read back into a plan (what ``tune`` and ``calibrate`` price;
  :func:`grpo_tune.frameworks.read_plan` asks the reader, and reads grpo-tune's run configs itself);
- :meth:`Framework.round_trip`: a plan written as the framework's file and read back (``validate`` scores a
  published row of that framework on it);
- the edit side for ``tune`` (:meth:`Framework.tune_keys`, :meth:`Framework.tune_reread`,
  :meth:`Framework.tuned_file`, :meth:`Framework.tune_constraints`, :meth:`Framework.tune_notes`): the search
  and the choice are generic (:mod:`grpo_tune.autotune.tune`), the keys and the edited file the framework's;
- the pins a framework puts on the search and on ``estimate`` (:meth:`Framework.constraints`,
  :meth:`Framework.refuse_search_pins`, :meth:`Framework.plan_pins`), its stack profile
  (:attr:`Framework.stack_profile`) and its defaults, which the search keeps within the model's noise
  (:meth:`Framework.knob_defaults`);
- :meth:`Framework.read_log`, :meth:`Framework.claims_log_record` and :attr:`Framework.log_folds`: the
  framework's own run logs (``calibrate --from-log``) and how its timers hold our phases;
  :meth:`Framework.log_lengths`: the mean lengths a line of such a log states (``--lengths``). grpo-tune's own
  metrics.jsonl is read by :mod:`grpo_tune.autotune.calibrate.runlog`, which asks the registry for the rest.

Their implementations live beside the writer in each sub-package (verl: ``launch`` parses a launch, ``read``
reads it back into a plan and edits it for tune, ``diagnose`` holds its rules and its bash reader, ``logs`` reads
its loggers' output, ``snapshot`` the key tree; NeMo-RL: ``read``, ``tune``, ``diagnose``, ``logs``,
``snapshot``). The types they hand back live in this package: a diagnose :class:`~.findings.Report`, a
:class:`~.plan.LaunchPlan`, a :class:`~.runlog.RunLog`; so do the readers every framework shares (:mod:`.inputs`:
bounded files, YAML, overrides; :mod:`.models`: the model lookup; :mod:`.runlog`: a text log's lines, logged
numbers and the checks on timings).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from grpo_tune.core.config import RunConfig
from grpo_tune.core.strategy import Strategy, Workload
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.base.plan import LaunchPlan, ReadRequest
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
    title: ClassVar[str]
    """The name as its users write it in prose (``NeMo-RL``)."""
    streams_within_step: ClassVar[bool] = False
    """Its separate pools can stream a staleness-0 step: the trainer takes each mini-batch of finished prompt
    groups while the rest generate (costmodel.streaming). False: it waits for the whole step's batch."""
    separate_memory: ClassVar[tuple[float, str] | None] = None
    """A separate rollout pool's vLLM memory fraction when the plan does not set one: (fraction, where the framework
    sets it for that mode). None: the colocated default (core.strategy)."""
    release: ClassVar[str]
    always: ClassVar[bool] = False
    """Written into every run folder, whatever ``--framework`` selects (Megatron-LM's flags are)."""

    @abstractmethod
    def launch_files(self, cfg: RunConfig, run_dir: Path) -> list[LaunchFile]:
        """``cfg`` as this framework's files for the run folder ``run_dir`` (rendered, not written)."""

    def cluster_files(self, cfg: RunConfig, run_dir: Path, names: Sequence[str]) -> list[LaunchFile]:
        """The files that start this framework's launch on a cluster, rendered like :meth:`launch_files`: a Slurm
        script and a KubeRay ``RayJob`` (:mod:`.cluster`); ``names``: the run folder's other files (tune's edited
        launch, when there, runs instead of the emitted one). Empty: none (the default)."""
        return []

    def constraints(self) -> Mapping[str, object]:
        """Plan fields this framework fixes: ``{Strategy field: value}`` (the search's pins for it)."""
        return {}

    def knob_defaults(self) -> Mapping[str, object]:
        """Strategy fields as this framework sets them when its launch leaves every key at its default: the search
        keeps a knob there when its searched value wins by less than the model's noise (empty: none stated)."""
        return {}

    stack_profile: ClassVar[str | None] = None
    """The stack profile plans for this framework alone are priced under (None: the hardware's default)."""

    def refuse_search_pins(self, pins: Mapping[str, object]) -> None:
        """Raise a coded error for a user pin the search cannot plan for this framework (beyond
        :meth:`constraints`, which the registry checks)."""

    def separate_pins(self, pins: dict[str, object]) -> dict[str, object]:
        """The search's pins when it plans separate pools for this framework (:meth:`constraints` are colocated)."""
        return pins

    def plan_pins(self, pins: dict[str, object]) -> dict[str, object]:
        """``estimate --framework``: the user's plan with what this framework fixes (a pin it cannot run is a
        coded error)."""
        return pins

    def detect(self, path: Path, text: str) -> bool:
        """Whether the file ``path`` (its text, read bounded) is this framework's launch, config or recipe."""
        return False

    absent_diagnose_flags: ClassVar[tuple[str, ...]] = ()
    """Flags of a diagnose script that articles on this framework describe and the framework does not have: ``grpo-tune
    diagnose`` given one answers with a coded USAGE error and :attr:`absent_diagnose_note` (jobs/diagnose.py)."""
    absent_diagnose_note: ClassVar[str] = ""
    """What the framework's own script does instead (the USAGE error's hint)."""

    def diagnose(self, path: Path, overrides: Sequence[str], *, hardware: str | None, model: str | None) -> Report:
        """``grpo-tune diagnose`` on a file this framework detects (with trailing ``key=value`` overrides)."""
        raise NotImplementedError(f"{self.name} has no diagnose reader")

    def read_plan(self, req: ReadRequest) -> LaunchPlan | None:
        """A file this framework reads (``req.path``, with trailing ``key=value`` overrides) read back into a
        ``LaunchPlan``, its hardware priced under ``req.stack`` (None: the framework's own stack profile); None for
        a grpo-tune run config, which the registry reads (:func:`grpo_tune.frameworks.read_plan`)."""
        return None

    round_trips: ClassVar[bool] = False
    """:meth:`round_trip` is implemented: ``validate`` scores a published row through this framework's file."""

    def round_trip(self, cfg: RunConfig, *, run_id: str) -> tuple[Strategy, Workload]:
        """``cfg`` written as this framework's file and read back as the framework reads it: the plan and the
        workload that file runs (the length means kept: statistics of the data, not keys)."""
        raise NotImplementedError(f"{self.name} has no round trip")

    # The edit side, for ``tune``: the search, the pins and the choice are tune's (grpo_tune.autotune.tune); a
    # framework says which keys make its file run a plan, how it reads the edited file, and writes the result.
    tunes_separate: ClassVar[bool] = False
    """``tune`` may propose separate rollout and training pools for this framework's files."""
    separate_label: ClassVar[str] = "launch"
    """What tune calls this framework's file with separate pools (``verl fully-async launch``)."""
    separate_written: ClassVar[str] = ""
    """What tune says of the run folder it writes for separate pools (which file is the whole launch)."""

    def separate_label_of(self, plan: LaunchPlan) -> str:
        """:attr:`separate_label` for this file (a framework with several separate-pool trainers names its)."""
        return self.separate_label

    def separate_written_of(self, plan: LaunchPlan) -> str:
        """:attr:`separate_written` for this file."""
        return self.separate_written

    def separate_tuned_file(
        self, plan: LaunchPlan, best: RunConfig, run_parent: Path
    ) -> tuple[str, str, int, dict[str, tuple[object, object]], list[str]]:
        """``plan``'s file edited to run the separate plan ``best`` (its strategy, pools and schedule), for a run
        folder directly below ``run_parent``: (name, text, mode, changes key -> (old, new), notes). Only the keys tune
        prices change (docs/tune.md)."""
        raise NotImplementedError(f"{self.name} has no separate-pool editor")

    tune_label: ClassVar[str] = ""
    """Said after the file's path in tune's header (`` (NeMo-RL recipe)``)."""

    def tune_constraints(self) -> Mapping[str, object]:
        """Plan fields that every edit of this framework's file keeps (what it cannot express otherwise)."""
        return {}

    def tune_keys(self, plan: LaunchPlan, strategy: Strategy) -> dict[str, object]:
        """Key -> value that makes ``plan``'s file run ``strategy``, for the fields tune changes."""
        raise NotImplementedError(f"{self.name} has no tune editor")

    def tune_reread(self, plan: LaunchPlan, keys: Mapping[str, object]) -> Strategy:
        """The plan ``plan``'s file runs with ``keys`` applied, read as the framework reads the edited file."""
        raise NotImplementedError(f"{self.name} has no tune editor")

    def tuned_file(
        self, plan: LaunchPlan, changes: Mapping[str, tuple[object, object]], run_parent: Path
    ) -> tuple[str, str, int]:
        """(name, text, mode) of the edited file for a run folder directly below ``run_parent`` (``tuned.sh``,
        ``tuned.yaml``), from the keys that change (key -> (old, new))."""
        raise NotImplementedError(f"{self.name} has no tune editor")

    def tune_notes(self, plan: LaunchPlan, changes: Mapping[str, tuple[object, object]]) -> list[str]:
        """Notes tune prints about the edited file (values it leaves to the user)."""
        return []

    def change_lines(self, changes: Mapping[str, tuple[object, object]]) -> list[str]:
        """The keys tune changes as a diff, ``- key=old`` then ``+ key=new`` (values as Hydra's overrides spell
        them: ``null``, ``True``/``False``)."""

        def fmt(v: object) -> str:
            return "null" if v is None else ("True" if v else "False") if isinstance(v, bool) else str(v)

        return [line for k, (old, new) in changes.items() for line in (f"- {k}={fmt(old)}", f"+ {k}={fmt(new)}")]

    def key_findings(self, plan: LaunchPlan) -> object | None:
        """The launch's key findings (keys the release refuses or renames, as diagnose words them), read before any
        search; None when there are none (or the framework checks none). The object has ``key_findings``,
        ``refused()``, ``path`` and ``renames``."""
        return None

    log_folds: ClassVar[Mapping[str, dict[str, str]]] = {}
    """The log formats :meth:`read_log` returns -> how the framework's timers hold our phases (predicted phase ->
    the measured phase timing it; a format not listed, grpo-tune's metrics.jsonl, is compared with offload in
    update: :data:`grpo_tune.autotune.calibrate.runlog.FOLD`)."""

    def read_log(self, path: Path, text: str | None) -> RunLog | None:
        """This framework's run log at ``path``, None where it is not one. Asked first with ``text`` None, for the
        logs that are not one text file (a folder of TensorBoard event files); then, for a text file that is not
        grpo-tune's own metrics.jsonl, with its text (read bounded)."""
        return None

    def claims_log_record(self, obj: Mapping[str, object]) -> bool:
        """Whether a JSON object (a line of a JSON-lines log) is a step record of this framework's log: the first
        such line of a file decides between this framework's log and grpo-tune's metrics.jsonl."""
        return False

    def log_lengths(self, line: str, obj: Mapping[str, object] | None) -> dict[str, float] | None:
        """The mean lengths one line of this framework's run log states (``response_len_mean``,
        ``prompt_len_mean``: ``--lengths`` reads them), None where the line is no such step; ``obj``: the line
        parsed as a JSON object (None: not one)."""
        return None
