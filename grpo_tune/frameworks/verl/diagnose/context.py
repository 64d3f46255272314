"""The state the rules share: the overrides (the last one wins, as in Hydra), typed look-ups with
verl's defaults, the findings so far, and what earlier rules worked out (roles, world size, model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.core.specs import HardwareSpec, ModelSpec

from grpo_tune.frameworks.base.findings import Finding, MemorySummary, Roles, Severity
from grpo_tune.frameworks.base.inputs import Override


class _Unset:
    """The default of :meth:`Ctx.int_`'s ``inherit``: nothing to inherit."""


_NO = _Unset()


class Batches(TypedDict, total=False):
    """The launch's batch sizes as the batch rules read them (None: not usable); the fully-async trainer's train
    batch is one parameter version's mini-batches."""

    train_batch_size: int | None
    n: int | None
    ppo_mini_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool | None


class SeparatePools(TypedDict, total=False):
    """A separate-pool launch's pools and schedule as read (verl's values where grpo-tune has no use for them)."""

    mode: str
    rollout_gpus: int | None
    train_gpus: int | None
    rollout_gpus_per_node: int | None
    shared_nodes: bool
    staleness: object
    """verl's staleness_threshold: an int when it is a whole number, else as written."""
    partial_rollout: object
    trigger_parameter_sync_step: int | None
    recompute_logprobs: bool
    priced_staleness: int
    """The staleness the memory estimate prices (a threshold that is not a whole number: its ceiling, with the pool
    that fraction of a batch ahead)."""
    trainer: str
    """verl's trainer: ``fully-async`` or ``one-step-off`` (staleness 1, a sync per step)."""


@dataclass
class Ctx:
    items: dict[str, Override]
    findings: list[Finding]
    model: ModelSpec | None = None
    model_note: str = ""
    hardware: HardwareSpec | None = None
    rollout_hardware: HardwareSpec | None = None
    """The rollout pool's profile where it differs (a run config says it; a verl launch cannot)."""
    config_name: str | None = None
    world: int | None = None
    gpn: int | None = None
    nnodes: int | None = None
    roles: Roles = field(default_factory=lambda: Roles())
    sound: bool = False
    """The degrees are sound enough for a memory estimate."""
    dp: int | None = None
    batches: Batches = field(default_factory=lambda: Batches())
    memory: MemorySummary | None = None
    placement: SeparatePools | None = None
    """Separate pools (verl's fully-async launch): the rollout pool, staleness, partial rollout."""
    _reported: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, overrides: list[Override], findings: list[Finding], *, config_name: str | None = None) -> "Ctx":
        return cls({ov.key: ov for ov in overrides}, findings, config_name=config_name)

    def add(
        self,
        severity: Severity | str,
        code: str,
        message: str,
        hint: str = "",
        key: str | None = None,
        *,
        phase: str | None = None,
        bytes: int | None = None,
    ) -> None:
        line = self.items[key].line if key in self.items else None
        self.findings.append(
            Finding(Severity(severity), code, message, hint, key=key, phase=phase, bytes=bytes, line=line)
        )

    @property
    def separate(self) -> bool:
        """A launch of one of verl's separate-pool trainers (fully-async or one-step-off)."""
        from grpo_tune.frameworks.verl.pool_trainers import trainer_of

        return trainer_of(self.config_name) is not None

    @property
    def one_step(self) -> bool:
        """A launch of verl's one-step-off trainer (staleness exactly 1; frameworks/verl/one_step_off.py)."""
        from grpo_tune.frameworks.verl import one_step_off

        return self.config_name == one_step_off.CONFIG_NAME

    def raw(self, key: str) -> object:
        if key in self.items:
            return self.items[key].value
        from grpo_tune.frameworks.verl.pool_trainers import trainer_of

        t = trainer_of(self.config_name)
        return t.default(key) if t is not None else verl.default(key)

    def set(self, key: str) -> bool:
        return key in self.items

    def known(self, key: str) -> bool:
        """False (and said once) when the value comes from a variable or construct we cannot evaluate."""
        ov = self.items.get(key)
        if ov is None or not (ov.unresolved or ov.unevaluable):
            return True
        if key not in self._reported:
            self._reported.add(key)
            if ov.unevaluable:
                self.add(
                    Severity.INFO,
                    "BAD_CONFIG",
                    f"{key}={ov.raw}: could not evaluate {ov.unevaluable}; checks that need it are skipped",
                    "write the value, or a variable with a literal value",
                    key=key,
                )
            else:
                self.add(
                    Severity.WARNING,
                    "BAD_CONFIG",
                    f"{key}={ov.raw} comes from a variable the script does not set; checks that need it are skipped",
                    "give the variable a default: ${VAR:-4}",
                    key=key,
                )
        return False

    def int_(self, key: str, *, allow_none: bool = False, inherit: int | None | _Unset = _NO) -> int | None:
        """A positive int, or None (reported) when the value cannot be used."""
        if key not in self.items and not isinstance(inherit, _Unset):
            return inherit
        if not self.known(key):
            return None
        v = self.raw(key)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            self.add(Severity.ERROR, "BAD_CONFIG", f"{key}={v!r} must be a positive integer", key=key)
            return None
        return v

    def bool_(self, key: str) -> bool | None:
        if not self.known(key):
            return None
        v = self.raw(key)
        if isinstance(v, bool) or v is None:
            return v
        self.add(Severity.ERROR, "BAD_CONFIG", f"{key}={v!r} must be true or false", key=key)
        return None
