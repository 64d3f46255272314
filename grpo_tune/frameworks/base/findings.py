"""What diagnose reports, for every framework: a :class:`Severity`, coded :class:`Finding` s, the :class:`Report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from collections.abc import Mapping
from typing import NotRequired, TypedDict

from grpo_tune.core.errors import CODES


class Severity(StrEnum):
    """An error stops the launch (exit 1); a warning and an info do not."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


SEVERITIES = tuple(s.value for s in Severity)
_ORDER = {s: i for i, s in enumerate(Severity)}


@dataclass
class Finding:
    severity: Severity
    code: str
    message: str
    hint: str = ""
    key: str | None = None
    phase: str | None = None
    bytes: int | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        try:
            self.severity = Severity(self.severity)
        except ValueError:
            raise ValueError(f"bad severity {self.severity!r}") from None
        if self.code not in CODES:
            raise ValueError(f"unregistered code {self.code!r}")

    def to_dict(self) -> dict[str, object]:
        return {k: (str(v) if k == "severity" else v) for k, v in self.__dict__.items() if v is not None and v != ""}


class RolloutRole(TypedDict, total=False):
    """The rollout engine's degrees and settings as the file sets them (None: not usable)."""

    tp: int | None
    pp: int | None
    replicas: int | None
    gpu_memory_utilization: object
    name: object


class Roles(TypedDict, total=False):
    """Each role's degrees: the actor's and the reference's by degree name (``tp pp vpp cp ep etp``, and ``dp``
    once known; None: not usable), and the rollout engine's."""

    actor: dict[str, int | None]
    ref: dict[str, int | None]
    rollout: RolloutRole


class MemorySummary(TypedDict):
    """The cost model's bytes per rank for the file's plan."""

    capacity_bytes: int
    peak_phase: str
    peak_bytes: int
    phases: dict[str, int]
    step_s: NotRequired[float | None]


class Summary(TypedDict, total=False):
    """What a report says of the file's plan besides its findings (what the reader could tell)."""

    model: str | None
    model_note: str
    hardware: str | None
    rollout_hardware: str
    """A separate plan's rollout pool profile, where it differs from ``hardware`` (a run config states it)."""
    world_size: int | None
    nnodes: int | None
    gpus_per_node: int | None
    dp: int | None
    roles: Roles
    batch: Mapping[str, object]
    """The framework's batch keys -> values."""
    memory: MemorySummary | None
    framework: str
    defaults: list[str]
    placement: Mapping[str, object]
    """Separate pools: the framework's pools and schedule as read."""
    train_gpus: int | None
    strategy: object
    """A run config that cannot run: its sections as written."""
    cluster: object


@dataclass
class Report:
    source: str
    kind: str
    """``run_config``, ``verl_script``, ``overrides`` or ``verl_yaml``."""
    findings: list[Finding] = field(default_factory=list)
    summary: Summary = field(default_factory=lambda: Summary())

    def count(self, severity: str) -> int:
        return sum(f.severity == severity for f in self.findings)

    @property
    def has_errors(self) -> bool:
        return self.count(Severity.ERROR) > 0

    @property
    def exit_code(self) -> int:
        return 1 if self.has_errors else 0

    def codes(self, severity: str | None = None) -> set[str]:
        return {f.code for f in self.findings if severity is None or f.severity == severity}

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: _ORDER[f.severity])

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "kind": self.kind,
            "summary": self.summary,
            "errors": self.count(Severity.ERROR),
            "warnings": self.count(Severity.WARNING),
            "findings": [f.to_dict() for f in self.sorted_findings()],
        }
