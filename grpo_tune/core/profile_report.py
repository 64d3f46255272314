"""The profile report: the JSON that ``grpo-tune profile`` writes and refine reads back.

One typed shape for both sides (trainer/profile.py writes it, autotune's refine reads it)::

    {"status": "ok"|"oom"|"error", "message": str|null, "config": str, "steps": int, "world_size": int,
     "step_s": float|null, "phases_s": {phase: float|null},
     "tokens_per_s": float|null, "tokens_per_s_per_gpu": float|null,
     "peak_memory_bytes": {"per_rank": [int], "max": int|null, "kind": str, "tensor_bytes_per_rank": [int]},
     "peak_bytes_by_phase": {phase: int} (optional),
     "loss": [float|null], "reward": [float], "response_len": [float]}

``step_s`` and each phase are medians over the steps after the first (the first pays one-off
costs: allocator warm-up, lazy initialisation). ``peak_memory_bytes.kind`` is
``cuda_max_allocated`` on a GPU, ``peak_rss`` on CPU.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Mapping, NotRequired, Sequence, TypedDict, TypeVar

from .errors import ConfigError
from .phases import MEASURED_PHASES, Phase

_T = TypeVar("_T")


class StepFigures(TypedDict):
    """One step of a profiling run as the trainer records it (the keys :meth:`ProfileReport.from_history`
    reads; a step record may hold more)."""

    step_s: float
    phases_s: Mapping[str, float]
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    reward_mean: float
    response_len: float
    loss: NotRequired[float | None]


class ProfileStatus(StrEnum):
    OK = "ok"
    OOM = "oom"
    ERROR = "error"


@dataclass(frozen=True, kw_only=True)
class PeakMemory:
    """The largest memory a rank held during the run."""

    per_rank: tuple[int, ...] = ()
    max: int | None = None
    kind: str | None = None
    """``cuda_max_allocated`` (GPU allocator peak) or ``peak_rss`` (CPU process peak)."""
    tensor_bytes_per_rank: tuple[int, ...] | None = None
    """On CPU: bytes of the actor's parameters and optimizer state per rank."""

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"per_rank": list(self.per_rank), "max": self.max}
        if self.kind is not None:
            d["kind"] = self.kind
        if self.tensor_bytes_per_rank is not None:
            d["tensor_bytes_per_rank"] = list(self.tensor_bytes_per_rank)
        return d


@dataclass(frozen=True, kw_only=True)
class ProfileReport:
    """One profiling run's figures (see the module docstring for the JSON)."""

    status: ProfileStatus
    message: str | None = None
    config: str = ""
    steps: int = 0
    world_size: int = 1
    step_s: float | None = None
    phases_s: Mapping[Phase, float | None] = field(default_factory=dict)
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    peak_memory: PeakMemory = field(default_factory=PeakMemory)
    peak_bytes_by_phase: Mapping[Phase, int] | None = None
    """Peak bytes on the most loaded rank during each phase, where the trainer measured it."""
    loss: tuple[float | None, ...] = ()
    reward: tuple[float, ...] = ()
    response_len: tuple[float, ...] = ()

    @property
    def ok(self) -> bool:
        """A finished run with usable figures (positive, finite throughput and step time)."""
        return self.status is ProfileStatus.OK and _positive(self.tokens_per_s) and _positive(self.step_s)

    @classmethod
    def from_history(
        cls,
        status: str,
        *,
        message: str | None,
        config: str,
        steps: int,
        world_size: int,
        history: Sequence[StepFigures] = (),
        peak: Mapping[str, object] | None = None,
        peak_bytes_by_phase: Mapping[str, int] | None = None,
    ) -> ProfileReport:
        """Medians over the steps after the first (all steps if there is one); a failed run has no history."""
        timed = list(history[1:]) or list(history)

        def med(xs: list[float]) -> float | None:
            return float(statistics.median(xs)) if timed else None

        return cls(
            status=ProfileStatus(status),
            message=message,
            config=str(config),
            steps=len(history) if history else steps,
            world_size=world_size,
            step_s=med([h["step_s"] for h in timed]),
            phases_s={p: med([h["phases_s"][p] for h in timed]) for p in MEASURED_PHASES},
            tokens_per_s=med([h["tokens_per_s"] for h in timed]),
            tokens_per_s_per_gpu=med([h["tokens_per_s_per_gpu"] for h in timed]),
            peak_memory=_peak(peak or {}, "peak_memory_bytes"),
            peak_bytes_by_phase=None if peak_bytes_by_phase is None else _phase_ints(peak_bytes_by_phase, "profile"),
            loss=tuple(h.get("loss") for h in history),
            reward=tuple(h["reward_mean"] for h in history),
            response_len=tuple(h["response_len"] for h in history),
        )

    def to_dict(self) -> dict[str, object]:
        """The JSON object (plain keys and types, in the order the contract lists them)."""
        d: dict[str, object] = {
            "status": self.status.value,
            "message": self.message,
            "config": self.config,
            "steps": self.steps,
            "world_size": self.world_size,
            "step_s": self.step_s,
            "phases_s": {Phase(p).value: v for p, v in self.phases_s.items()},
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_memory_bytes": self.peak_memory.to_dict(),
        }
        if self.peak_bytes_by_phase is not None:
            d["peak_bytes_by_phase"] = {Phase(p).value: int(v) for p, v in self.peak_bytes_by_phase.items()}
        d.update(loss=list(self.loss), reward=list(self.reward), response_len=list(self.response_len))
        return d

    @classmethod
    def from_dict(cls, data: object, *, where: str = "profile") -> ProfileReport:
        """Read a profile JSON object; a malformed one is a coded BAD_CONFIG error.

        Unknown phases and extra keys are ignored (a newer trainer may report more)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
        try:
            status = ProfileStatus(str(data.get("status")))
        except ValueError:
            raise ConfigError(f"{where}.status must be ok, oom or error, got {data.get('status')!r}") from None
        phases = data.get("phases_s") or {}
        if not isinstance(phases, dict):
            raise ConfigError(f"{where}.phases_s must be an object, got {phases!r}")
        known = {p.value for p in Phase}
        by_phase = data.get("peak_bytes_by_phase")
        return cls(
            status=status,
            message=_opt(data, "message", str, where),
            config=str(data.get("config") or ""),
            steps=int(_opt(data, "steps", int, where) or 0),
            world_size=int(_opt(data, "world_size", int, where) or 1),
            step_s=_number(data, "step_s", where),
            phases_s={Phase(k): _number(phases, k, f"{where}.phases_s") for k in phases if k in known},
            tokens_per_s=_number(data, "tokens_per_s", where),
            tokens_per_s_per_gpu=_number(data, "tokens_per_s_per_gpu", where),
            peak_memory=_peak(data.get("peak_memory_bytes") or {}, f"{where}.peak_memory_bytes"),
            peak_bytes_by_phase=None if by_phase is None else _phase_ints(by_phase, f"{where}.peak_bytes_by_phase"),
            loss=tuple(data.get("loss") or ()),
            reward=tuple(data.get("reward") or ()),
            response_len=tuple(data.get("response_len") or ()),
        )


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and math.isfinite(x)


def _opt(d: Mapping[str, object], key: str, typ: type[_T], where: str) -> _T | None:
    v = d.get(key)
    if v is not None and (not isinstance(v, typ) or isinstance(v, bool)):
        raise ConfigError(f"{where}.{key} must be {typ.__name__} or null, got {v!r}")
    return v


def _number(d: Mapping[str, object], key: str, where: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ConfigError(f"{where}.{key} must be a number or null, got {v!r}")
    return float(v)


def _ints(v: object, where: str) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{where} must be a list of byte counts, got {v!r}")
    return tuple(int(x) for x in v)


def _peak(d: object, where: str) -> PeakMemory:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where} must be an object, got {d!r}")
    mx = d.get("max")
    if mx is not None and (not isinstance(mx, (int, float)) or isinstance(mx, bool)):
        raise ConfigError(f"{where}.max must be a byte count or null, got {mx!r}")
    tb = d.get("tensor_bytes_per_rank")
    kind = d.get("kind")
    if kind is not None and not isinstance(kind, str):
        raise ConfigError(f"{where}.kind must be a string or null, got {kind!r}")
    return PeakMemory(
        per_rank=_ints(d.get("per_rank") or [], f"{where}.per_rank"),
        max=None if mx is None else int(mx),
        kind=kind,
        tensor_bytes_per_rank=None if tb is None else _ints(tb, f"{where}.tensor_bytes_per_rank"),
    )


def _phase_ints(d: object, where: str) -> dict[Phase, int]:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where} must be an object of phase -> bytes, got {d!r}")
    out: dict[Phase, int] = {}
    for k, v in d.items():
        try:
            p = Phase(k)
        except ValueError:
            raise ConfigError(
                f"{where}: unknown phase {k!r}", hint=f"phases: {', '.join(x.value for x in Phase)}"
            ) from None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"{where}.{k} must be a byte count >= 0, got {v!r}")
        out[p] = int(v)
    return out
