"""Option types shared by the commands that take a model, a cluster, degrees and a workload.

``estimate`` and ``search`` take the same flags: in ``estimate`` an unset degree means its default,
in ``search`` it means "tune it". :func:`plan_inputs` turns the flags into typed specs.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from core.errors import ConfigError
from core.specs import HardwareSpec, ModelSpec, load_hardware, load_model
from core.strategy import OFFLOAD, RECOMPUTE, Cluster, Workload

P_MODEL = "Model"
P_PAR = "Parallel degrees (unset: default in estimate, tuned in search)"
P_MEM = "Memory options"
P_ROLL = "Rollout"
P_WL = "Workload"

Model = Annotated[str, typer.Option("--model", "-m", help="Preset or alias (7b, qwen3-30b-a3b, ...), a model .toml, or a HF config.json.", rich_help_panel=P_MODEL)]
Hardware = Annotated[str, typer.Option("--hardware", help="Hardware profile name/alias (h100, h200, a100, ...) or a profile .toml.", rich_help_panel=P_MODEL)]
Gpus = Annotated[int, typer.Option("--gpus", "-g", help="Total GPUs.", rich_help_panel=P_MODEL)]
GpusPerNode = Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs per node (default: the profile's).", rich_help_panel=P_MODEL)]
Tp = Annotated[Optional[int], typer.Option("--tp", help="Tensor parallel.", rich_help_panel=P_PAR)]
Pp = Annotated[Optional[int], typer.Option("--pp", help="Pipeline parallel.", rich_help_panel=P_PAR)]
Vpp = Annotated[Optional[int], typer.Option("--vpp", help="Virtual pipeline chunks per stage.", rich_help_panel=P_PAR)]
Cp = Annotated[Optional[int], typer.Option("--cp", help="Context parallel.", rich_help_panel=P_PAR)]
Ep = Annotated[Optional[int], typer.Option("--ep", help="Expert parallel (MoE).", rich_help_panel=P_PAR)]
Etp = Annotated[Optional[int], typer.Option("--etp", help="Expert tensor parallel (default: tp).", rich_help_panel=P_PAR)]
Mbs = Annotated[Optional[int], typer.Option("--mbs", help="Micro-batch size.", rich_help_panel=P_PAR)]
FirstStage = Annotated[Optional[int], typer.Option("--first-stage-layers", help="Layers on the first pipeline stage (uneven PP).", rich_help_panel=P_PAR)]
LastStage = Annotated[Optional[int], typer.Option("--last-stage-layers", help="Layers on the last pipeline stage (uneven PP).", rich_help_panel=P_PAR)]
Recompute = Annotated[Optional[str], typer.Option("--recompute", help="none | selective | full.", rich_help_panel=P_MEM)]
SeqPar = Annotated[Optional[bool], typer.Option("--sequence-parallel/--no-sequence-parallel", help="Sequence parallel (default: on when tp>1).", rich_help_panel=P_MEM)]
DistOpt = Annotated[Optional[bool], typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Shard optimizer state over DP (default: on).", rich_help_panel=P_MEM)]
Offload = Annotated[Optional[str], typer.Option("--offload", help="Comma list of param,grad,optimizer ('none' for none).", rich_help_panel=P_MEM)]
RolloutTp = Annotated[Optional[int], typer.Option("--rollout-tp", help="Rollout engine tensor parallel.", rich_help_panel=P_ROLL)]
GpuMemUtil = Annotated[Optional[float], typer.Option("--gpu-memory-utilization", help="vLLM memory fraction (0-1].", rich_help_panel=P_ROLL)]
WorkloadKind = Annotated[str, typer.Option("--workload", help="grpo | pretrain.", rich_help_panel=P_WL)]
Prompts = Annotated[int, typer.Option("--prompts", help="Prompts per step (data.train_batch_size).", rich_help_panel=P_WL)]
GroupN = Annotated[int, typer.Option("--n", help="Responses per prompt (rollout.n).", rich_help_panel=P_WL)]
PromptLen = Annotated[int, typer.Option("--prompt-len", help="Max prompt tokens.", rich_help_panel=P_WL)]
ResponseLen = Annotated[int, typer.Option("--response-len", help="Max response tokens.", rich_help_panel=P_WL)]
MiniBatch = Annotated[int, typer.Option("--mini-batch", help="Prompts per PPO mini-batch.", rich_help_panel=P_WL)]
PpoEpochs = Annotated[int, typer.Option("--ppo-epochs", help="PPO epochs per step.", rich_help_panel=P_WL)]
Kl = Annotated[bool, typer.Option("--kl/--no-kl", help="KL loss against a reference model.", rich_help_panel=P_WL)]
SeqLen = Annotated[int, typer.Option("--seq-len", help="Pretrain sequence length.", rich_help_panel=P_WL)]
Gbs = Annotated[int, typer.Option("--gbs", help="Pretrain global batch (sequences).", rich_help_panel=P_WL)]
MinHeadroom = Annotated[float, typer.Option(
    "--min-headroom", help="Fraction of GPU memory every phase must leave free (allocator fragmentation, "
    "model error); 0 packs plans to the limit.", rich_help_panel=P_MEM)]
MIN_HEADROOM_DEFAULT = 0.05
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


def parse_offload(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if items in ([], ["none"]):
        return ()
    bad = [i for i in items if i not in OFFLOAD]
    if bad:
        raise ConfigError(f"--offload: unknown {bad[0]!r}", hint=f"use a comma list of {', '.join(OFFLOAD)}, or none")
    return tuple(o for o in OFFLOAD if o in items)


def strategy_pins(*, tp=None, pp=None, vpp=None, cp=None, ep=None, etp=None, mbs=None, recompute=None,
                  sequence_parallel=None, distributed_optimizer=None, offload=None, rollout_tp=None,
                  gpu_memory_utilization=None, first_stage_layers=None, last_stage_layers=None) -> dict[str, Any]:
    """The strategy fields the user set; the rest are left out."""
    if recompute is not None and recompute not in RECOMPUTE:
        raise ConfigError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    raw = dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, recompute=recompute,
               sequence_parallel=sequence_parallel, distributed_optimizer=distributed_optimizer,
               offload=parse_offload(offload), rollout_tp=rollout_tp, gpu_memory_utilization=gpu_memory_utilization,
               first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers)
    return {k: v for k, v in raw.items() if v is not None}


def plan_inputs(*, model: str, hardware: str, gpus: int, gpus_per_node: int | None, workload: str,
                prompts: int, n: int, prompt_len: int, response_len: int, mini_batch: int, ppo_epochs: int,
                kl: bool, seq_len: int, gbs: int) -> tuple[ModelSpec, HardwareSpec, Cluster, Workload]:
    m = load_model(model)
    hw = load_hardware(hardware)
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}")
    cluster = Cluster(gpus=gpus, gpus_per_node=gpus_per_node or min(hw.gpus_per_node, gpus))
    if cluster.gpus_per_node < 1:
        raise ConfigError("--gpus-per-node must be >= 1")
    wl = Workload.from_dict(dict(kind=workload, prompts=prompts, n=n, prompt_len=prompt_len, response_len=response_len,
                                 mini_batch=min(mini_batch, prompts), ppo_epochs=ppo_epochs, kl=kl, seq_len=seq_len,
                                 gbs=gbs), where="workload")
    return m, hw, cluster, wl


WORKLOAD_FLAGS = ("workload", "prompts", "n", "prompt_len", "response_len", "mini_batch", "ppo_epochs", "kl",
                  "seq_len", "gbs")
PIN_FLAGS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "recompute", "sequence_parallel", "distributed_optimizer",
             "offload", "rollout_tp", "gpu_memory_utilization", "first_stage_layers", "last_stage_layers")


def workload_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The workload flags of a command's parameters (its ``locals()``)."""
    return {k: flags[k] for k in WORKLOAD_FLAGS}


def pins_from_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The strategy fields a command's degree/memory/rollout flags pinned."""
    return strategy_pins(**{k: flags[k] for k in PIN_FLAGS})


def inputs_from_flags(flags: dict[str, Any]) -> tuple[ModelSpec, HardwareSpec, Cluster, Workload, dict[str, Any]]:
    """Model, hardware, cluster, workload and pins from the flags that estimate and search share."""
    m, hw, cluster, wl = plan_inputs(model=flags["model"], hardware=flags["hardware"], gpus=flags["gpus"],
                                     gpus_per_node=flags["gpus_per_node"], **workload_flags(flags))
    return m, hw, cluster, wl, pins_from_flags(flags)


# The flags' defaults are Workload's (core/strategy.py, which says where they come from).
_W = Workload()
WORKLOAD_DEFAULTS = dict(workload=_W.kind, prompts=_W.prompts, n=_W.n, prompt_len=_W.prompt_len,
                         response_len=_W.response_len, mini_batch=_W.mini_batch, ppo_epochs=_W.ppo_epochs, kl=_W.kl,
                         seq_len=_W.seq_len, gbs=_W.gbs)
