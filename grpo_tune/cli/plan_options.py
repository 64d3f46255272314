"""The plan flags that ``estimate``, ``search`` and ``compare`` share (and ``tune`` some of), declared once.

Typer builds a command's options from its function's signature, so :func:`plan_options` rewrites
``__signature__``: it puts the shared degree/memory/rollout flags and the workload flags (and the
model and GPU count) in the same places they stood when each command listed them, and typer hands
their values to the command's ``**plan``. :func:`flags_after` does the same for any group of flags
(tune's pins, search's --refine flags). ``--help`` stays as it was (tests/test_cli_surface.py pins it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from grpo_tune.cli import options as O
from grpo_tune.core.knobs import knobs

_WD = O.WORKLOAD_DEFAULTS


def knob_flags() -> tuple[tuple[str, Any, Any], ...]:
    """Every plan knob with a flag, from the knob table (core/knobs.py), in its order (each panel of --help
    lists its flags in that order)."""
    return tuple((k.name, O.knob_option(k), None) for k in knobs() if k.flag)


# (name, Annotated type, default), in --help order: the cluster's node size and software stack, then the plan knobs.
DEGREE_FLAGS: tuple[tuple[str, Any, Any], ...] = (
    ("gpus_per_node", O.GpusPerNode, None),
    ("stack", O.Stack, None),
    *knob_flags(),
)
WORKLOAD_FLAGS: tuple[tuple[str, Any, Any], ...] = (
    ("workload", O.WorkloadKind, _WD["workload"]),
    ("prompts", O.Prompts, _WD["prompts"]),
    ("n", O.GroupN, _WD["n"]),
    ("prompt_len", O.PromptLen, _WD["prompt_len"]),
    ("response_len", O.ResponseLen, _WD["response_len"]),
    ("prompt_len_mean", O.PromptLenMean, None),
    ("response_len_mean", O.ResponseLenMean, None),
    ("lengths", O.Lengths, None),
    ("mini_batch", O.MiniBatch, _WD["mini_batch"]),
    ("ppo_epochs", O.PpoEpochs, _WD["ppo_epochs"]),
    ("kl", O.Kl, _WD["kl"]),
    ("seq_len", O.SeqLen, _WD["seq_len"]),
    ("gbs", O.Gbs, _WD["gbs"]),
)
DEFAULTS: dict[str, Any] = {name: default for name, _, default in DEGREE_FLAGS + WORKLOAD_FLAGS}
# What the plan is for (search and compare: required, first): the model and the GPU count.
TARGET_FLAGS: tuple[tuple[str, Any, Any], ...] = (
    ("model", O.Model, inspect.Parameter.empty),
    ("gpus", O.Gpus, inspect.Parameter.empty),
)

F = TypeVar("F", bound=Callable[..., Any])


def _params(flags: tuple[tuple[str, Any, Any], ...]) -> list[inspect.Parameter]:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return [inspect.Parameter(name, kind, default=default, annotation=ann) for name, ann, default in flags]


def plan_options(*, degrees_after: str, workload_before: str, target: bool = False) -> Callable[[F], F]:
    """Add the shared flags to a command taking ``**plan``: the degree flags after its parameter
    ``degrees_after``, the workload flags before its parameter ``workload_before``, and with ``target``
    the model and GPU count (:data:`TARGET_FLAGS`) before its own parameters."""

    def wrap(func: F) -> F:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = [p.name for p in own]
        i, j = names.index(degrees_after) + 1, names.index(workload_before)
        head = _params(TARGET_FLAGS) if target else []
        params = head + own[:i] + _params(DEGREE_FLAGS) + own[i:j] + _params(WORKLOAD_FLAGS) + own[j:]
        func.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return func

    return wrap


def pin_options(*names: str) -> Callable[[F], F]:
    """Add the degree flags ``names`` (in DEGREE_FLAGS' order) after the own parameters of a command taking
    ``**pins`` (tune: the plan fields a user may pin, spelled as estimate spells them)."""
    flags = tuple(f for f in DEGREE_FLAGS if f[0] in names)
    assert len(flags) == len(names), names
    return flags_after(None, flags)


def flags_after(name: str | None, flags: tuple[tuple[str, Any, Any], ...]) -> Callable[[F], F]:
    """Add ``flags`` (a group a command takes in its ``**`` parameter) after its parameter ``name``
    (None: after all of its own parameters)."""

    def wrap(func: F) -> F:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        i = len(own) if name is None else [p.name for p in own].index(name) + 1
        func.__signature__ = sig.replace(parameters=own[:i] + _params(flags) + own[i:])  # type: ignore[attr-defined]
        return func

    return wrap


def plan_flags(plan: dict[str, Any], **own: Any) -> dict[str, Any]:
    """The shared flags' values (defaults filled in for a direct Python call) plus the command's own."""
    return {**DEFAULTS, **plan, **own}
