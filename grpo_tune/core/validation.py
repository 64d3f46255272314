"""One validator for every config dataclass: keys, types (from the real type hints), ranges and choices.

``from_mapping(cls, data, where, schema)`` builds ``cls`` from a YAML/TOML/JSON mapping or raises a
coded error: not a mapping or a wrong value is ``BAD_CONFIG``, an unknown key ``UNKNOWN_KEY``
(with the closest field as the hint). Each dataclass states its rules once, as a :class:`Schema`
next to its definition: the range its ints and floats default to, per-field ranges, and the
fields whose value must be one of an enum's (core/choices.py).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from typing import TYPE_CHECKING, Mapping, Sequence, TypeVar

from .errors import ConfigError, UnknownKeyError, close_matches

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


@dataclass(frozen=True)
class Range:
    """Allowed numbers: ``lo <= v`` (``lo < v`` when ``lo_open``), ``v <= hi``; ``finite`` also rejects inf."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    finite: bool = False

    def contains(self, v: float) -> bool:
        if v != v or (self.finite and math.isinf(v)):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or v <= self.hi

    def describe(self, integer: bool) -> str:
        if integer and self.lo == 1 and not self.lo_open and self.hi is None:
            return "a positive integer"
        kind = "an integer" if integer else ("a finite number" if self.finite else "a number")
        if self.lo is not None and self.hi is not None:
            return f"{kind} in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"
        if self.lo is not None:
            return f"{kind} {'>' if self.lo_open else '>='} {self.lo:g}"
        return kind


POSITIVE = Range(lo=1)
NON_NEGATIVE = Range(lo=0)
FINITE_NON_NEGATIVE = Range(lo=0, finite=True)
FINITE_POSITIVE = Range(lo=0, lo_open=True, finite=True)
FRACTION = Range(lo=0, hi=1, lo_open=True)


@dataclass(frozen=True)
class Schema:
    """How :func:`from_mapping` checks one dataclass."""

    ints: Range = POSITIVE
    """Range of every ``int`` field without its own entry in ``ranges``."""
    floats: Range = NON_NEGATIVE
    """Range of every ``float`` field without its own entry in ``ranges``."""
    ranges: Mapping[str, Range] = field(default_factory=dict)
    choices: Mapping[str, type[Enum]] = field(default_factory=dict)
    """Fields whose value (or, for a tuple, each element) must be one of the enum's values."""


def check_keys(cls: type, data: object, where: str) -> dict[str, object]:
    """``data`` as a dict whose keys are all fields of the dataclass ``cls``.

    Not a mapping is BAD_CONFIG; an unknown key is UNKNOWN_KEY with the closest field as the hint.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table/mapping, got {type(data).__name__}")
    check_names(data, [f.name for f in dataclasses.fields(cls)], where)
    return dict(data)


def check_names(data: Mapping[object, object], names: Sequence[str], where: str, noun: str = "key") -> None:
    """UNKNOWN_KEY for the first key of ``data`` not in ``names``, with the closest name as the hint."""
    for k in data:
        if k not in names:
            near = close_matches(str(k), names)
            raise UnknownKeyError(
                f"{where}: unknown {noun} {k!r}",
                hint=f"did you mean {near[0]!r}?" if near else f"valid {noun}s: {', '.join(sorted(names))}",
            )


@lru_cache(maxsize=None)
def hints(cls: type) -> dict[str, object]:
    """The resolved type hints of a dataclass's fields (cached: a class is hashable)."""
    return typing.get_type_hints(cls)


def unwrap(hint: object) -> tuple[object, bool]:
    """``(base type, None allowed)`` for ``X`` or ``X | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else hint), len(args) < len(typing.get_args(hint))
    return hint, False


def check_value(where: str, name: str, hint: object, v: object, schema: Schema) -> None:
    """Raise BAD_CONFIG unless ``v`` has the type ``hint`` and lies in the schema's range/choices."""
    base, optional = unwrap(hint)
    if v is None:
        if optional:
            return
        raise ConfigError(f"{where}.{name} must be set, got None")
    key = f"{where}.{name}"
    if base is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{key} must be true or false, got {v!r}")
    elif base is int or base is float:
        rng = schema.ranges.get(name, schema.ints if base is int else schema.floats)
        kinds = (int,) if base is int else (int, float)
        if not isinstance(v, kinds) or isinstance(v, bool) or not rng.contains(v):
            raise ConfigError(f"{key} must be {rng.describe(base is int)}, got {v!r}")
    elif base is str:
        if not isinstance(v, str):
            raise ConfigError(f"{key} must be a string, got {v!r}")
        allowed = schema.choices.get(name)
        if allowed is not None and v not in {c.value for c in allowed}:
            raise ConfigError(f"{key} must be one of {', '.join(c.value for c in allowed)}, got {v!r}")
    elif typing.get_origin(base) is tuple:
        if not isinstance(v, (tuple, list)) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"{key} must be a list of names, got {v!r}")
        allowed = schema.choices.get(name)
        bad = [x for x in v if allowed is not None and x not in {c.value for c in allowed}]
        if bad and allowed is not None:
            raise ConfigError(f"{key}: unknown {bad[0]!r}", hint=f"choose from {', '.join(c.value for c in allowed)}")
    elif typing.get_origin(base) is dict:
        if not isinstance(v, dict):
            raise ConfigError(f"{key} must be a table/mapping, got {v!r}")


def to_mapping(obj: DataclassInstance) -> dict[str, object]:
    """``dataclasses.asdict`` with tuple fields as lists (what YAML and JSON write and read back)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(obj).items()}


def from_mapping(cls: type[T], data: object, where: str, schema: Schema = Schema()) -> T:
    """Build the dataclass ``cls`` from ``data``; every failure is a coded :class:`ConfigError`."""
    data = check_keys(cls, data, where)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {', '.join(missing)}")
    types_ = hints(cls)  # type: ignore[arg-type]  # a class is hashable
    for k, v in data.items():
        check_value(where, k, types_[k], v, schema)
    return cls(**data)
