"""Framework integrations behind one small contract (:mod:`.base`): each writes a plan as that framework's
launch files, reads its launches back, and names what it cannot express (the search's pins when planning for it).

:data:`REGISTRY` lists them (by :data:`core.stacks.FRAMEWORKS`, the one list of names), in the order a run
folder's files are written: ``verl`` (the default,
:mod:`.verl`), ``nemo-rl`` (:mod:`.nemo_rl`) and ``megatron-lm`` (:mod:`.megatron_lm`, written into every run).
:data:`NAMES` is what ``--framework`` accepts (``all`` = every one). A new framework is one sub-package with a
:class:`~.base.Framework` subclass, its name in core/stacks.py's FRAMEWORKS and its class here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Sequence

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.stacks import FRAMEWORKS, TRAINER
from grpo_tune.frameworks.base import Framework
from grpo_tune.frameworks.base.findings import Report
from grpo_tune.frameworks.base.plan import LaunchPlan, ReadRequest
from grpo_tune.frameworks.base.runlog import RunLog
from grpo_tune.frameworks.megatron_lm.framework import MegatronLM
from grpo_tune.frameworks.nemo_rl.framework import NemoRL
from grpo_tune.frameworks.verl.framework import Verl

_INTEGRATIONS: dict[str, type[Framework]] = {c.name: c for c in (Verl, NemoRL, MegatronLM)}
REGISTRY: tuple[Framework, ...] = tuple(_INTEGRATIONS[n]() for n in FRAMEWORKS if n != TRAINER)
"""One integration per name of :data:`core.stacks.FRAMEWORKS` (the one list of framework names), in its order."""
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


def claims_log_record(obj: Mapping[str, object]) -> bool:
    """Whether a registered framework takes this JSON object for a step record of its log
    (:meth:`~.base.Framework.claims_log_record`)."""
    return any(f.claims_log_record(obj) for f in REGISTRY)


def log_lengths(line: str, obj: Mapping[str, object] | None) -> dict[str, float] | None:
    """The mean lengths a line of a registered framework's run log states (:meth:`~.base.Framework.log_lengths`);
    None: no framework's step."""
    return next((got for f in REGISTRY if (got := f.log_lengths(line, obj)) is not None), None)


def log_fold(fmt: str) -> dict[str, str] | None:
    """How the timers of the framework that writes log format ``fmt`` hold our phases; None: no framework states
    one (grpo-tune's metrics.jsonl)."""
    return next((f.log_folds[fmt] for f in REGISTRY if fmt in f.log_folds), None)


def named(name: str) -> Framework:
    """The registered framework called ``name`` (as ``--framework`` and :attr:`LaunchPlan.framework` spell it)."""
    return next(f for f in REGISTRY if f.name == name)


DOCUMENTS = {
    ".md": "Markdown",
    ".markdown": "Markdown",
    ".rst": "reStructuredText",
    ".html": "HTML",
    ".pdf": "PDF",
    ".ipynb": "Jupyter notebook",
    ".png": "PNG image",
    ".txt": "text",
}


def check_launch_path(path: str | Path) -> None:
    """A folder or a document given where a launch is expected: said as such (exit 2), before any framework tries
    to read it as a script or an override list."""
    p = Path(path)
    hint = "pass one file: a verl launch script, a file of Hydra overrides, a NeMo-RL recipe or a best.yaml"
    if p.is_dir():
        try:
            found = sorted(q.name for q in p.iterdir() if q.suffix in (".sh", ".yaml", ".yml") and q.is_file())
        except OSError:
            found = []
        if found:
            more = f" (it holds {', '.join(found[:3])}{', ...' if len(found) > 3 else ''})"
            hint = f"pass one file of the folder{more}"
        raise ConfigError(f"{p} is a folder, not a launch", hint=hint)
    kind = DOCUMENTS.get(p.suffix.lower())
    if kind is not None and p.is_file():
        if kind == "text" and _override_list_like(p):
            return
        raise ConfigError(f"{p} is a {kind} document, not a launch", hint=hint)


def _override_list_like(p: Path) -> bool:
    """A .txt file of Hydra overrides (one key=value a line) is a launch; prose is not."""
    try:
        with p.open("rb") as f:
            head = f.read(65536).decode("utf-8", "replace")
    except OSError:
        return True  # the reader says why
    lines = [ln.strip() for ln in head.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return bool(lines) and sum(1 for ln in lines if "=" in ln and " " not in ln.split("=", 1)[0]) * 2 >= len(lines)


def read_plan(req: ReadRequest | str | Path, **fields: object) -> LaunchPlan:
    """Model, hardware, GPUs, workload and plan of a framework's launch, config or recipe (with trailing
    ``key=value`` overrides, for the frameworks that take them), read by the framework that reads it, or of a
    grpo-tune run config (best.yaml); the hardware priced under ``req.stack`` (None: the framework's or the
    config's). A path with keywords is ``ReadRequest(path, **fields)`` (``read_plan(launch, hardware="h100")``)."""
    if not isinstance(req, ReadRequest):
        req = ReadRequest(Path(req), **fields)  # type: ignore[arg-type]  # ReadRequest checks the names
    elif fields:
        req = dataclasses.replace(req, **fields)  # type: ignore[arg-type]
    req = dataclasses.replace(req, path=Path(req.path), overrides=list(req.overrides))
    check_launch_path(req.path)
    read = reader_for(req.path).read_plan(req)
    if read is not None:
        return read
    from grpo_tune.core.hardware import with_stack

    plan = _read_run_config(
        req.path, hardware=req.hardware, prompt_len_mean=req.prompt_len_mean, response_len_mean=req.response_len_mean
    )
    return dataclasses.replace(plan, hardware=with_stack(plan.hardware, req.stack)) if req.stack else plan


def _read_run_config(
    p: Path, *, hardware: str | None, prompt_len_mean: int | None, response_len_mean: int | None
) -> LaunchPlan:
    from grpo_tune.core.config import load as load_run_config
    from grpo_tune.core.specs import load_hardware

    cfg = load_run_config(p)
    wl = cfg.workload
    lens = {k: v for k, v in (("prompt_len_mean", prompt_len_mean), ("response_len_mean", response_len_mean)) if v}
    hw = load_hardware(hardware) if hardware else cfg.hardware
    return LaunchPlan(
        launch=None,
        model=cfg.model,
        model_note=f"run config {p}",
        hardware=hw,
        cluster=cfg.cluster,
        strategy=cfg.strategy,
        workload=wl.replace(**lens) if lens else wl,
        placement=cfg.placement if cfg.placement.separate else None,  # the strategy is the training pool's
    )


def diagnose_path(
    path: str | Path, *, hardware: str | None = None, model: str | None = None, overrides: Sequence[str] = ()
) -> Report:
    """``grpo-tune diagnose PATH [overrides]``: the file's findings (a ``Report``), from the framework that reads it."""
    p = Path(path)
    check_launch_path(p)
    return reader_for(p).diagnose(p, list(overrides), hardware=hardware, model=model)


def select(value: str | None) -> tuple[str, ...]:
    """``--framework`` -> the frameworks to write (``all``: every registered one)."""
    v = (value or DEFAULT).strip().lower()
    if v == "all":
        return NAMES
    if v.replace("_", "-") in NAMES:
        return (v.replace("_", "-"),)
    raise ConfigError(
        f"--framework {value!r}: not a framework grpo-tune writes", hint=f"choose {', '.join(NAMES)} or all"
    )


def constraints(names: Sequence[str]) -> dict[str, object]:
    """Strategy fields the chosen frameworks fix (the search's pins): a plan must run in every one of them."""
    out: dict[str, object] = {}
    for f in REGISTRY:
        if f.name in names:
            out.update(f.constraints())
    return out


def check_pins(names: Sequence[str], pins: dict[str, object]) -> dict[str, object]:
    """The user's pins plus the frameworks' fixed fields; a user pin that a framework cannot express is an error."""
    fixed = constraints(names)
    chosen = [f for f in REGISTRY if f.name in names]
    for f in chosen:
        f.refuse_search_pins(pins)
    for f in chosen:
        for k, v in f.constraints().items():
            if k in pins and pins[k] is not None and _norm(pins[k]) != _norm(v):
                raise ConfigError(
                    f"--{k.replace('_', '-')} {pins[k]!r}: {f.title} cannot run it (it fixes {k}={v!r})",
                    hint=f"drop the flag, or plan for {DEFAULT} only (--framework {DEFAULT})",
                )
    return {**pins, **fixed}


def plan_pins(names: Sequence[str], pins: dict[str, object]) -> dict[str, object]:
    """``estimate --framework``: the user's plan with what the chosen frameworks fix
    (:meth:`~.base.Framework.plan_pins`)."""
    for f in REGISTRY:
        if f.name in names:
            pins = f.plan_pins(pins)
    return pins


def separate_pins(names: Sequence[str], pins: dict[str, object]) -> dict[str, object]:
    """The search's pins for separate pools: what each chosen framework changes there
    (:meth:`~.base.Framework.separate_pins`)."""
    for f in REGISTRY:
        if f.name in names:
            pins = f.separate_pins(pins)
    return pins


def can_stream(names: Sequence[str]) -> bool:
    """Every chosen framework that runs separate pools can stream a staleness-0 step
    (:attr:`~.base.Framework.streams_within_step`; docs/placement.md says which release does)."""
    chosen = [f for f in REGISTRY if f.name in names]
    return bool(chosen) and all(f.streams_within_step for f in chosen)


def search_defaults(names: Sequence[str]) -> tuple[str, Mapping[str, object]]:
    """(title, defaults) of the framework whose defaults the search keeps within the model's noise
    (:meth:`~.base.Framework.knob_defaults`): the first chosen one that states them, else the default framework
    (verl: NeMo-RL states none of its own yet, so a plan for it keeps verl's)."""
    for f in REGISTRY:
        if f.name in names and (d := f.knob_defaults()):
            return f.title, d
    default = named(DEFAULT)
    return default.title, default.knob_defaults()


def separate_memory(names: Sequence[str]) -> tuple[float, str]:
    """A separate rollout pool's memory fraction where the plan sets none, and its source: the first chosen
    framework's own for that mode (:attr:`~.base.Framework.separate_memory`), else the default framework's (verl)."""
    for f in REGISTRY:
        if f.name in names and f.separate_memory is not None:
            return f.separate_memory
    d = named(DEFAULT).separate_memory
    assert d is not None
    return d


def default_stack(names: Sequence[str], stack: str | None) -> str | None:
    """The stack profile to price under: the user's ``--stack``, else the framework's own when planning for one
    framework only (:attr:`~.base.Framework.stack_profile`: NeMo-RL's bf16 gradient reduction and host costs),
    else None (the hardware's default, verl's)."""
    if stack or len(names) != 1:
        return stack
    return named(names[0]).stack_profile


def _norm(v: object) -> object:
    return tuple(v) if isinstance(v, (list, tuple)) else v
