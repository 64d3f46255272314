"""Framework integrations behind one small contract (:mod:`.base`): each writes a plan as that framework's
launch files, reads its launches back, and names what it cannot express (the search's pins when planning for it).

:data:`REGISTRY` lists them, in the order a run folder's files are written: ``verl`` (the default,
:mod:`.verl`), ``nemo-rl`` (:mod:`.nemo_rl`) and ``megatron-lm`` (:mod:`.megatron_lm`, written into every run).
:data:`NAMES` is what ``--framework`` accepts (``all`` = every one). A new framework is one sub-package with a
:class:`~.base.Framework` subclass, and one line here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from grpo_tune.core.errors import ConfigError
from grpo_tune.frameworks.base import Framework
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.base.runlog import RunLog
from grpo_tune.frameworks.megatron_lm.framework import MegatronLM
from grpo_tune.frameworks.nemo_rl.framework import NemoRL
from grpo_tune.frameworks.verl.framework import Verl

REGISTRY: tuple[Framework, ...] = (Verl(), NemoRL(), MegatronLM())
NAMES = tuple(f.name for f in REGISTRY if not f.always)
DEFAULT = "verl"


def for_run(names: Sequence[str]) -> list[Framework]:
    """The frameworks whose files a run folder gets: the selected ones, and those written always."""
    return [f for f in REGISTRY if f.always or f.name in names]


def reader_for(path: str | Path) -> Framework:
    """The framework that reads the file ``path`` back: the first registered one whose ``detect`` claims it, else
    the default (verl, which also reads grpo-tune's run configs and plain override lists). An unreadable file goes
    to the default, whose reader reports why."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.frameworks.base.inputs import read_text

    p = Path(path)
    default = next(f for f in REGISTRY if f.name == DEFAULT)
    if not p.is_file():
        return default
    try:
        text = read_text(p, what="launch, config or recipe")
    except GrpoTuneError:
        return default
    return next((f for f in REGISTRY if f.detect(p, text)), default)


def read_log(path: Path, text: str | None) -> RunLog | None:
    """The run log at ``path`` as the first registered framework that reads it hands it back (see
    :meth:`~.base.Framework.read_log`: ``text`` None for the logs that are not one text file); None: no framework's."""
    return next((log for f in REGISTRY if (log := f.read_log(path, text)) is not None), None)


def log_fold(fmt: str) -> dict[str, str] | None:
    """How the timers of the framework that writes log format ``fmt`` hold our phases; None: as verl's do."""
    return next((f.log_folds[fmt] for f in REGISTRY if fmt in f.log_folds), None)


def diagnose_path(
    path: str | Path, *, hardware: str | None = None, model: str | None = None, overrides: Sequence[str] = ()
) -> Report:
    """``grpo-tune diagnose PATH [overrides]``: the file's findings (a ``Report``), from the framework that reads it."""
    p = Path(path)
    return reader_for(p).diagnose(p, list(overrides), hardware=hardware, model=model)


def select(value: str | None) -> tuple[str, ...]:
    """``--framework`` -> the frameworks to write (``all``: every registered one)."""
    v = (value or DEFAULT).strip().lower()
    if v == "all":
        return NAMES
    if v.replace("_", "-") in NAMES:
        return (v.replace("_", "-"),)
    raise ConfigError(f"--framework {value!r}: not a framework grpo-tune writes", hint="choose verl, nemo-rl or all")


def constraints(names: Sequence[str]) -> dict[str, Any]:
    """Strategy fields the chosen frameworks fix (the search's pins): a plan must run in every one of them."""
    out: dict[str, Any] = {}
    for f in REGISTRY:
        if f.name in names:
            out.update(f.constraints())
    return out


def check_pins(names: Sequence[str], pins: dict[str, Any]) -> dict[str, Any]:
    """The user's pins plus the frameworks' fixed fields; a user pin that a framework cannot express is an error."""
    fixed = constraints(names)
    if "nemo-rl" in names and pins.get("cpu_optimizer") is not None:
        raise ConfigError(
            f"--cpu-optimizer {pins['cpu_optimizer']}: the search prices Megatron's CPU optimizer with its copies "
            "overlapped, which NeMo-RL 0.7.0 cannot set (and it takes only the whole state, fraction 1.0)",
            hint="plan for verl (--framework verl), or price a NeMo-RL recipe with the CPU optimizer through "
            "`grpo-tune tune RECIPE`",
        )
    for k, v in fixed.items():
        if k in pins and pins[k] is not None and _norm(pins[k]) != _norm(v):
            raise ConfigError(
                f"--{k.replace('_', '-')} {pins[k]!r}: NeMo-RL cannot run it (it fixes {k}={v!r})",
                hint="drop the flag, or plan for verl only (--framework verl)",
            )
    return {**pins, **fixed}


def plan_pins(names: Sequence[str], pins: dict[str, Any]) -> dict[str, Any]:
    """``estimate --framework``: the user's plan with what the framework fixes (NeMo-RL's CPU optimizer is the
    whole state, without overlapped copies)."""
    if "nemo-rl" not in names:
        return pins
    cpu = pins.get("cpu_optimizer")
    if cpu not in (None, 1.0):
        raise ConfigError(
            f"--cpu-optimizer {cpu}: NeMo-RL's CPU optimizer takes the whole state (optimizer_offload_fraction 1.0)",
            hint="give --cpu-optimizer 1.0, or price it for verl",
        )
    pins = {**pins, "overlap_cpu_optimizer": False}
    from grpo_tune.frameworks.nemo_rl.table import CONSTRAINTS

    fixed = {k: v for k, v in CONSTRAINTS.items() if k != "overlap_cpu_optimizer"}
    for k, v in fixed.items():
        if k in pins and pins[k] is not None and _norm(pins[k]) != _norm(v):
            raise ConfigError(
                f"--{k.replace('_', '-')} {pins[k]!r}: NeMo-RL cannot run it (it fixes {k}={v!r})",
                hint="drop the flag, or price it for verl (--framework verl)",
            )
    return {**pins, **fixed}


def default_stack(names: Sequence[str], stack: str | None) -> str | None:
    """The stack profile to price under: the user's ``--stack``, else NeMo-RL's when planning for NeMo-RL only
    (its bf16 gradient reduction and host costs), else None (the hardware's default, verl's)."""
    if stack or tuple(names) != ("nemo-rl",):
        return stack
    from grpo_tune.frameworks.nemo_rl.read import STACK

    return STACK


def _norm(v: Any) -> Any:
    return tuple(v) if isinstance(v, (list, tuple)) else v
