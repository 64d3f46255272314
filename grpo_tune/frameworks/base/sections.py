"""What a framework's two-way table writes and reads: a run config's :class:`Sections`, one :class:`Row` a field.

A table (``frameworks/verl/table.py``, ``frameworks/nemo_rl/table.py``) maps each field of a run config's
sections (the strategy, the workload, the trainer options, the cluster) to the framework's keys: written on
export (sections -> keys), read back through a key lookup (:data:`Get`) on diagnose and tune (keys ->
sections). The vocabulary, the row type and the helpers that do not depend on the framework live here; the
keys and the coded rows live in each framework's table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Callable, Final, TypedDict

from grpo_tune.core.config import RunConfig, TrainerOptions
from grpo_tune.core.strategy import Cluster, Strategy, Workload

S: Final = "strategy"
W: Final = "workload"
T: Final = "trainer"
C: Final = "cluster"
SECTIONS = {S: Strategy, W: Workload, T: TrainerOptions, C: Cluster}


class Sections(TypedDict, total=False):
    """A run config's sections as a table writes and reads them (a writer of one section's rows needs only that
    one)."""

    strategy: Strategy
    workload: Workload
    trainer: TrainerOptions
    cluster: Cluster


Get = Callable[[str], object]
"""Key -> value as the framework would see it (the file's, else the framework's default)."""


@dataclass(frozen=True)
class Row:
    section: str
    """``strategy``, ``workload``, ``trainer`` or ``cluster``."""
    field: str
    keys: tuple[str, ...]
    """Every framework key this field writes; ``+`` marks keys the framework's schema does not declare."""
    write: Callable[[Sections], dict[str, object]] | None
    """sections -> {key: value}; None when the framework has no setting for the field."""
    read: Callable[[Get], object] | None
    """key lookup -> the field's value as the framework has it (the section's ``from_dict`` checks it)."""
    why: str = ""
    """For a row without keys: why the framework has none."""


def sections_of(cfg: RunConfig) -> Sections:
    """The sections of a run config that a table writes."""
    return {"strategy": cfg.strategy, "workload": cfg.workload, "trainer": cfg.trainer, "cluster": cfg.cluster}


def section_value(sections: Sections, section: str, name: str) -> object:
    """One field of one section: a strategy's knob by its flat name (core/knobs.py), another section's attribute."""
    parts: Mapping[str, object] = sections
    part = parts[section]
    return part.knob(name) if isinstance(part, Strategy) else getattr(part, name)


def none(section: str, name: str, why: str) -> Row:
    """A field the framework has no setting for, and why."""
    return Row(section, name, (), None, None, why)


def write_rows(rows: Iterable[Row], sections: Sections) -> dict[str, object]:
    """sections -> ordered {key: Python value}, row by row."""
    out: dict[str, object] = {}
    for r in rows:
        if r.write is not None:
            out.update(r.write(sections))
    return out


def read_rows(rows: Iterable[Row], get: Get, section: str) -> dict[str, object]:
    """The section's fields that the framework's keys determine, read through ``get``."""
    return {r.field: r.read(get) for r in rows if r.section == section and r.read is not None}
