"""Option types shared by the commands that take a model, a cluster, degrees and a workload.

``estimate`` and ``search`` take the same flags: in ``estimate`` an unset degree means its default,
in ``search`` it means "tune it". :func:`inputs_from_flags` turns the flags into typed specs
(:func:`grpo_tune.jobs.inputs.plan_inputs`).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from grpo_tune.core.errors import ConfigError
from grpo_tune.core import knobs as K
from grpo_tune.core.knobs import P_MEM, Knob
from grpo_tune.core.placement import P_PLACE, PLACEMENT_KNOBS, PlacementAsk, PlacementKnob
from grpo_tune.core.knobs import parse_offload as _parse_offload
from grpo_tune.core.strategy import Workload
from grpo_tune.core.target import Target
from grpo_tune.jobs.inputs import plan_inputs

P_MODEL = "Model"
P_WL = "Workload"

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Preset or alias (7b, qwen3-30b-a3b, ...), a model .toml, or a HF config.json.",
        rich_help_panel=P_MODEL,
    ),
]
Hardware = Annotated[
    str,
    typer.Option(
        "--hardware",
        help="Hardware profile name/alias (h100, h200, a100, ...) or a profile .toml.",
        rich_help_panel=P_MODEL,
    ),
]
Gpus = Annotated[int, typer.Option("--gpus", "-g", help="Total GPUs.", rich_help_panel=P_MODEL)]
Stack = Annotated[
    Optional[str],
    typer.Option(
        "--stack",
        help="Software stack profile (profiles/stacks: verl-0.9.1, nemo-rl-v0.3, ...) whose host and engine "
        "costs are priced (default: verl-0.9.1, the release grpo-tune exports to).",
        rich_help_panel=P_MODEL,
    ),
]
Framework = Annotated[
    str,
    typer.Option(
        "--framework",
        help="Price the plan as this framework runs it: verl (default) or nemo-rl (its stack profile, bf16 "
        "gradient reduction, colocated offload, no virtual pipeline).",
        rich_help_panel=P_MODEL,
    ),
]
GpusPerNode = Annotated[
    Optional[int],
    typer.Option("--gpus-per-node", help="GPUs per node (default: the profile's).", rich_help_panel=P_MODEL),
]


def knob_option(k: Knob) -> Any:
    """The typer option of a plan knob, from its row of the knob table (core/knobs.py): unset means the
    default in estimate and "search it" in search."""
    return Annotated[Optional[k.kind], typer.Option(k.flag, help=k.help, rich_help_panel=k.panel)]


WorkloadKind = Annotated[str, typer.Option("--workload", help="grpo | pretrain.", rich_help_panel=P_WL)]
Prompts = Annotated[
    int, typer.Option("--prompts", help="Prompts per step (data.train_batch_size).", rich_help_panel=P_WL)
]
GroupN = Annotated[int, typer.Option("--n", help="Responses per prompt (rollout.n).", rich_help_panel=P_WL)]
PromptLen = Annotated[int, typer.Option("--prompt-len", help="Max prompt tokens.", rich_help_panel=P_WL)]
ResponseLen = Annotated[int, typer.Option("--response-len", help="Max response tokens.", rich_help_panel=P_WL)]
PromptLenMean = Annotated[
    Optional[int],
    typer.Option(
        "--prompt-len-mean",
        help="Mean prompt tokens (default: --lengths, else 20% of the max, typical of math GRPO).",
        rich_help_panel=P_WL,
    ),
]
ResponseLenMean = Annotated[
    Optional[int],
    typer.Option(
        "--response-len-mean",
        help="Mean response tokens (default: --lengths, else 20% of the max, typical of math GRPO); the max sets the decode tail.",
        rich_help_panel=P_WL,
    ),
]
Lengths = Annotated[
    Optional[str],
    typer.Option(
        "--lengths",
        help="Length statistics from a JSONL/Parquet dataset of prompts, or from an earlier run's metrics (our metrics.jsonl, verl's JSONL or console log).",
        rich_help_panel=P_WL,
    ),
]
MiniBatch = Annotated[int, typer.Option("--mini-batch", help="Prompts per PPO mini-batch.", rich_help_panel=P_WL)]
PpoEpochs = Annotated[int, typer.Option("--ppo-epochs", help="PPO epochs per step.", rich_help_panel=P_WL)]
Kl = Annotated[bool, typer.Option("--kl/--no-kl", help="KL loss against a reference model.", rich_help_panel=P_WL)]
SeqLen = Annotated[int, typer.Option("--seq-len", help="Pretrain sequence length.", rich_help_panel=P_WL)]
Gbs = Annotated[int, typer.Option("--gbs", help="Pretrain global batch (sequences).", rich_help_panel=P_WL)]
MinHeadroom = Annotated[
    float,
    typer.Option(
        "--min-headroom",
        help="Fraction of GPU memory every phase must leave free (allocator fragmentation, "
        "model error); 0 packs plans to the limit.",
        rich_help_panel=P_MEM,
    ),
]
MIN_HEADROOM_DEFAULT = 0.05


def placement_option(k: PlacementKnob) -> Any:
    """The typer option of a placement knob, from its row of core/placement.py's table."""
    kind = k.kind if k.default is not None else Optional[k.kind]
    return Annotated[kind, typer.Option(k.flag, help=k.help, rich_help_panel=P_PLACE)]


# (name, Annotated type, default) in --help order: the placement flags of estimate, search, compare and tune.
PLACEMENT_FLAGS = tuple((k.name, placement_option(k), k.default) for k in PLACEMENT_KNOBS)


def placement_flags(plan: dict[str, Any]) -> PlacementAsk:
    """Pop the placement flags out of a command's ``**plan``: what they ask for (defaults filled in)."""
    return PlacementAsk.of({k.name: plan.pop(k.name, k.default) for k in PLACEMENT_KNOBS})


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


def parse_offload(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else _parse_offload(text)


def strategy_pins(**flags: Any) -> dict[str, Any]:
    """The plan knobs the user set (``flags`` named as in :func:`pin_flags`; unset ones None or left out),
    each checked by its row's pin rule (core/knobs.py); the rest are left out. A knob whose 0 turns it off
    (``--max-tokens-per-gpu 0``, ``--cpu-optimizer 0``) pins the feature off (a None value in the pins); a
    non-zero one sets what its rule implies unless that is pinned too (the CPU optimizer as verl's examples
    run it: the copies overlapped, precision-aware Adam)."""
    rows = [k for k in K.knobs() if k.flag]
    unknown = sorted(set(flags) - {k.name for k in rows})
    if unknown:
        raise TypeError(f"strategy_pins() got unknown flag(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    implied: dict[str, Any] = {}
    for k in rows:
        v: Any = flags.get(k.name)
        if v is None:
            continue
        pin = k.pin
        if pin.parse is not None:
            v = pin.parse(v)
        bad = (pin.choices and v not in pin.choices) or (pin.range is not None and not pin.range.contains(v))
        if bad:
            hint = pin.hint.format(flag=k.option) if pin.hint else ""
            raise ConfigError(pin.error.format(flag=k.option, v=v), hint=hint)
        if pin.zero_is_off:
            out[k.name] = v or None
            if v:
                implied.update(pin.implies)
        else:
            out[k.name] = v
    return out | {k: v for k, v in implied.items() if k not in out}


WORKLOAD_FLAGS = (
    "workload",
    "prompts",
    "n",
    "prompt_len",
    "response_len",
    "mini_batch",
    "ppo_epochs",
    "kl",
    "seq_len",
    "gbs",
    "prompt_len_mean",
    "response_len_mean",
    "lengths",
)


def pin_flags() -> tuple[str, ...]:
    """The plan knobs that are flags (the knob table's rows with a flag), in table order."""
    return K.names(flag=True)


def workload_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The workload flags of a command's parameters (its ``locals()``)."""
    return {k: flags.get(k) for k in WORKLOAD_FLAGS}


def pins_from_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The strategy fields a command's degree/memory/rollout flags pinned."""
    return strategy_pins(**{k: flags.get(k) for k in pin_flags()})


def target_line(model: Any, hw: Any, cluster: Any, rollout_hw: Any = None) -> str:
    """What a command prices, as its first line: the model, the GPUs, where the hardware profile comes from and
    the software stack (console markup: the model in bold); ``rollout_hw``: a rollout pool's other profile."""
    other = (
        f"; rollout pool on {rollout_hw.name}, profile {rollout_hw.provenance}"
        if rollout_hw is not None and rollout_hw.name != hw.name
        else ""
    )
    return (
        f"[bold]{model.name}[/] on {cluster.gpus} x {hw.name} ({cluster.gpus_per_node}/node; profile "
        f"{hw.provenance}, stack {hw.stack or 'none'}{other})"
    )


def inputs_from_flags(flags: dict[str, Any]) -> tuple[Target, dict[str, Any]]:
    """The target (model, hardware, cluster, workload) and the pins, from the flags that estimate and search share.
    The plan's engine is pinned here where the platform has one default (``cpu``: the trainer's own sampler, left
    out or ``auto``); ``--rollout-engine vllm`` there prices vLLM's CPU build with its stack's costs
    (core.hardware.with_rollout_engine)."""
    from grpo_tune.core.hardware import NATIVE_ENGINE, plan_engine, with_rollout_engine

    target = plan_inputs(
        model=flags["model"],
        hardware=flags["hardware"],
        gpus=flags["gpus"],
        gpus_per_node=flags["gpus_per_node"],
        stack=flags.get("stack"),
        **workload_flags(flags),
    )
    pins = pins_from_flags(flags)
    if target.hardware.default_engine == NATIVE_ENGINE:
        pins["engine"] = engine = plan_engine(pins, target.hardware)
        target = target._replace(hardware=with_rollout_engine(target.hardware, engine, flags.get("stack")))
    return target, pins


# The flags' defaults are Workload's (core/strategy.py, which says where they come from).
_W = Workload()
_WL_FIELD_FLAGS = ("prompts", "n", "prompt_len", "response_len", "mini_batch", "ppo_epochs", "kl", "seq_len", "gbs")
WORKLOAD_DEFAULTS = {"workload": _W.kind, **{k: getattr(_W, k) for k in _WL_FIELD_FLAGS}}
