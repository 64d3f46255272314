"""Option types shared by the commands that take a model, a cluster, degrees and a workload.

``estimate`` and ``search`` take the same flags: in ``estimate`` an unset degree means its default,
in ``search`` it means "tune it". :func:`plan_inputs` turns the flags into typed specs.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.rules import check_lengths
from grpo_tune.core.specs import HardwareSpec, ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import DEGREES, OFFLOAD, RECOMPUTE, SYNC_BUCKET_MB, Cluster, Workload

P_MODEL = "Model"
P_PAR = "Parallel degrees (unset: default in estimate, tuned in search)"
P_MEM = "Memory options"
P_ROLL = "Rollout"
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
Tp = Annotated[Optional[int], typer.Option("--tp", help="Tensor parallel.", rich_help_panel=P_PAR)]
Pp = Annotated[Optional[int], typer.Option("--pp", help="Pipeline parallel.", rich_help_panel=P_PAR)]
Vpp = Annotated[Optional[int], typer.Option("--vpp", help="Virtual pipeline chunks per stage.", rich_help_panel=P_PAR)]
Cp = Annotated[Optional[int], typer.Option("--cp", help="Context parallel.", rich_help_panel=P_PAR)]
Ep = Annotated[Optional[int], typer.Option("--ep", help="Expert parallel (MoE).", rich_help_panel=P_PAR)]
Etp = Annotated[
    Optional[int], typer.Option("--etp", help="Expert tensor parallel (default: tp).", rich_help_panel=P_PAR)
]
Mbs = Annotated[Optional[int], typer.Option("--mbs", help="Micro-batch size.", rich_help_panel=P_PAR)]
LogProbMbs = Annotated[
    Optional[int],
    typer.Option(
        "--log-prob-mbs",
        help="Micro-batch size of the old/ref log-prob passes (verl log_prob_micro_batch_size_per_gpu; default: --mbs).",
        rich_help_panel=P_PAR,
    ),
]
FirstStage = Annotated[
    Optional[int],
    typer.Option("--first-stage-layers", help="Layers on the first pipeline stage (uneven PP).", rich_help_panel=P_PAR),
]
LastStage = Annotated[
    Optional[int],
    typer.Option("--last-stage-layers", help="Layers on the last pipeline stage (uneven PP).", rich_help_panel=P_PAR),
]
Recompute = Annotated[
    Optional[str], typer.Option("--recompute", help="none | selective | full.", rich_help_panel=P_MEM)
]
SeqPar = Annotated[
    Optional[bool],
    typer.Option(
        "--sequence-parallel/--no-sequence-parallel",
        help="Sequence parallel (default: on when tp>1).",
        rich_help_panel=P_MEM,
    ),
]
DistOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--distributed-optimizer/--no-distributed-optimizer",
        help="Shard optimizer state over DP (default: on).",
        rich_help_panel=P_MEM,
    ),
]
Offload = Annotated[
    Optional[str],
    typer.Option(
        "--offload",
        help="Comma list of param,grad,optimizer ('none' for none); param and grad go together (verl's param_offload frees both), so param or grad alone is refused.",
        rich_help_panel=P_MEM,
    ),
]
RolloutTp = Annotated[
    Optional[int], typer.Option("--rollout-tp", help="Rollout engine tensor parallel.", rich_help_panel=P_ROLL)
]
GpuMemUtil = Annotated[
    Optional[float],
    typer.Option("--gpu-memory-utilization", help="vLLM memory fraction (0-1].", rich_help_panel=P_ROLL),
]
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
MaxTokensPerGpu = Annotated[
    Optional[int],
    typer.Option(
        "--max-tokens-per-gpu",
        help="Dynamic batching: token cap per micro-batch per GPU (verl use_dynamic_bsz + ppo_max_token_len_per_gpu); 0 = off. Unset in search: searched.",
        rich_help_panel=P_MEM,
    ),
]
CpuOptimizer = Annotated[
    Optional[float],
    typer.Option(
        "--cpu-optimizer",
        help="Megatron's hybrid CPU optimizer: fraction of optimizer state and step on the host (0 = off). Unset in search: searched where memory needs it.",
        rich_help_panel=P_MEM,
    ),
]
MaxNumSeqs = Annotated[
    Optional[int],
    typer.Option(
        "--max-num-seqs",
        help="vLLM max_num_seqs per replica (verl default 256). Unset in search: searched.",
        rich_help_panel=P_ROLL,
    ),
]
PrecisionAware = Annotated[
    Optional[bool],
    typer.Option(
        "--precision-aware-optimizer/--no-precision-aware-optimizer",
        help="Megatron's use_precision_aware_optimizer (TE FusedAdam keeps 10 B of state per parameter, "
        "no fp32 param copy beside the CPU optimizer). Default: on with --cpu-optimizer, as verl's examples.",
        rich_help_panel=P_MEM,
    ),
]
EnforceEager = Annotated[
    Optional[bool],
    typer.Option(
        "--enforce-eager/--no-enforce-eager",
        help="vLLM without CUDA graphs (default: graphs). Unset in search: searched.",
        rich_help_panel=P_ROLL,
    ),
]
SyncBucketMb = Annotated[
    Optional[int],
    typer.Option(
        "--sync-bucket-mb",
        help="Weight-sync bucket in MiB (verl rollout.checkpoint_engine.update_weights_bucket_megabytes; default 2048).",
        rich_help_panel=P_ROLL,
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
P_PLACE = "Placement (separate rollout and training pools)"
PlacementOpt = Annotated[
    str,
    typer.Option(
        "--placement",
        help="colocated (every GPU runs every phase) | separate (a rollout pool and a training pool); "
        "search also takes auto (the better of the two). Default colocated.",
        rich_help_panel=P_PLACE,
    ),
]
RolloutGpus = Annotated[
    Optional[int],
    typer.Option(
        "--rollout-gpus",
        help="GPUs of the rollout pool (the training pool is the rest of --gpus): whole nodes, or the same "
        "GPUs on every node. Unset in search: searched.",
        rich_help_panel=P_PLACE,
    ),
]
RolloutHardware = Annotated[
    Optional[str],
    typer.Option(
        "--rollout-hardware",
        help="Hardware profile of the rollout pool (default: --hardware).",
        rich_help_panel=P_PLACE,
    ),
]
Staleness = Annotated[
    int,
    typer.Option(
        "--staleness",
        help="Policy versions a sample may lag (0 = on-policy, the default; search tries 0..K).",
        rich_help_panel=P_PLACE,
    ),
]
PartialRollout = Annotated[
    bool,
    typer.Option(
        "--partial-rollout/--no-partial-rollout",
        help="Resume unfinished responses under the new weights after a sync (needs --staleness >= 1). Default off.",
        rich_help_panel=P_PLACE,
    ),
]
# (name, Annotated type, default) in --help order: the placement flags of estimate, search, compare and tune.
PLACEMENT_FLAGS = (
    ("placement", PlacementOpt, "colocated"),
    ("rollout_gpus", RolloutGpus, None),
    ("rollout_hardware", RolloutHardware, None),
    ("staleness", Staleness, 0),
    ("partial_rollout", PartialRollout, False),
)


def placement_flags(plan: dict) -> dict:
    """Pop the placement flags out of a command's ``**plan`` (defaults filled in)."""
    return {name: plan.pop(name, default) for name, _, default in PLACEMENT_FLAGS}


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
    if ("param" in items) != ("grad" in items):
        # verl 0.9.1's param_offload frees parameters and gradient buffers together and it has no
        # grad_offload (frameworks/verl/table.py): a plan with only one of them would not be the plan that runs.
        raise ConfigError(
            f"--offload {text}: verl offloads parameters and gradients together, not one alone",
            hint="use --offload param,grad (optionally with ,optimizer) or --offload optimizer",
        )
    return tuple(o for o in OFFLOAD if o in items)


def _check_scalar_pins(recompute, max_tokens_per_gpu, cpu_optimizer, max_num_seqs) -> None:
    """The non-degree flags with a range (coded errors, in the order strategy_pins checked them)."""
    if recompute is not None and recompute not in RECOMPUTE:
        raise ConfigError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    if max_tokens_per_gpu is not None and max_tokens_per_gpu < 0:
        raise ConfigError(f"--max-tokens-per-gpu must be >= 0 (0 = off), got {max_tokens_per_gpu}")
    if cpu_optimizer is not None and not (0.0 <= cpu_optimizer <= 1.0):
        raise ConfigError(f"--cpu-optimizer must be a fraction in [0, 1] (0 = off), got {cpu_optimizer}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs must be >= 1, got {max_num_seqs}")


def _check_gpu_memory_utilization(gpu_memory_utilization) -> None:
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(
            f"--gpu-memory-utilization (vLLM gpu_memory_utilization) must be a fraction in (0, 1], "
            f"got {gpu_memory_utilization}",
            hint="vLLM's share of GPU memory for weights and KV cache, e.g. 0.6",
        )


# Pins that must be >= 1 when given: a zero degree would divide by zero in search.
_POSITIVE_PINS = (
    *DEGREES,
    "mbs",
    "log_prob_mbs",
    "rollout_tp",
    "first_stage_layers",
    "last_stage_layers",
    "sync_bucket_mb",
)
# Pins whose 0 turns the feature off (a None value in the pins).
_ZERO_IS_OFF = ("max_tokens_per_gpu", "cpu_optimizer")


def strategy_pins(**flags: Any) -> dict[str, Any]:
    """The strategy fields the user set (``flags`` named as in :data:`PIN_FLAGS`; unset ones None or
    left out); the rest are left out. ``--max-tokens-per-gpu 0`` and ``--cpu-optimizer 0`` pin the
    feature off (a None value in the pins)."""
    unknown = sorted(set(flags) - set(PIN_FLAGS))
    if unknown:
        raise TypeError(f"strategy_pins() got unknown flag(s) {', '.join(unknown)}")
    f = {k: flags.get(k) for k in PIN_FLAGS}
    _check_scalar_pins(f["recompute"], f["max_tokens_per_gpu"], f["cpu_optimizer"], f["max_num_seqs"])
    for name in _POSITIVE_PINS:
        v = f[name]
        if v is not None and v < 1:
            flag = name.replace("_", "-")
            unset = f"for verl's default ({SYNC_BUCKET_MB} MiB)" if name == "sync_bucket_mb" else "to let search choose"
            raise ConfigError(f"--{flag} must be >= 1, got {v}", hint=f"leave --{flag} out {unset}")
    _check_gpu_memory_utilization(f["gpu_memory_utilization"])  # 0/1.5/nan memory fractions fit nothing
    f["offload"] = parse_offload(f["offload"])
    out = {k: v for k, v in f.items() if v is not None and k not in _ZERO_IS_OFF}
    tokens, cpu = f["max_tokens_per_gpu"], f["cpu_optimizer"]
    if tokens is not None:
        out["max_tokens_per_gpu"] = tokens or None
    if cpu is not None:
        out["cpu_optimizer"] = cpu or None
        if cpu:  # as verl's examples set it: overlap the copies, precision-aware Adam (unless pinned off)
            out["overlap_cpu_optimizer"] = True
            out.setdefault("precision_aware_optimizer", True)
    return out


def fit_default_lengths(m: ModelSpec, prompt_len: int, response_len: int) -> tuple[int, int, str | None]:
    """The default lengths (1024 + 1024) scaled to a model with fewer positions (``tiny`` has 256), and
    the sentence that says so; lengths the user chose are returned as given (a too-long choice stays an
    error). ``(prompt_len, response_len, note or None)``."""
    dp, dr = Workload().prompt_len, Workload().response_len
    if (prompt_len, response_len) != (dp, dr) or dp + dr <= m.max_seq_len:
        return prompt_len, response_len, None
    p = max(1, m.max_seq_len * dp // (dp + dr))
    r = max(1, m.max_seq_len - p)
    note = (
        f"default lengths {dp} + {dr} exceed {m.name}'s {m.max_seq_len} positions: using {p} + {r} "
        "(give --prompt-len / --response-len to choose)"
    )
    return p, r, note


def plan_inputs(
    *,
    model: str,
    hardware: str,
    gpus: int,
    gpus_per_node: int | None,
    workload: str,
    prompts: int,
    n: int,
    prompt_len: int,
    response_len: int,
    mini_batch: int,
    ppo_epochs: int,
    kl: bool,
    seq_len: int,
    gbs: int,
    prompt_len_mean: int | None = None,
    response_len_mean: int | None = None,
    lengths: str | None = None,
    stack: str | None = None,
) -> tuple[ModelSpec, HardwareSpec, Cluster, Workload]:
    m = load_model(model)
    hw = load_hardware(hardware, stack=stack)
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}")
    if gpus_per_node is not None and gpus_per_node < 1:  # 0 used to mean "the default"
        raise ConfigError(
            f"--gpus-per-node must be >= 1, got {gpus_per_node}", hint="leave it out to use the hardware profile's"
        )
    if mini_batch > prompts:  # it used to shrink silently to --prompts
        raise ConfigError(
            f"--mini-batch {mini_batch} exceeds --prompts {prompts}",
            hint="verl requires ppo_mini_batch_size <= data.train_batch_size",
        )
    cluster = Cluster(gpus=gpus, gpus_per_node=gpus_per_node or min(hw.gpus_per_node, gpus))
    if cluster.gpus_per_node < 1:
        raise ConfigError("--gpus-per-node must be >= 1")
    prompt_len, response_len, fitted = fit_default_lengths(m, prompt_len, response_len)
    stats: dict[str, Any] = {}
    if lengths:
        from grpo_tune.autotune.calibrate.lengths import read_lengths

        stats = read_lengths(lengths, model=m, prompt_len=prompt_len, response_len=response_len)
    if fitted:  # stated where the lengths are (search header, report.md, best.yaml)
        stats["lengths_source"] = "; ".join(filter(None, [fitted, stats.get("lengths_source")]))
    if prompt_len_mean is not None:
        stats["prompt_len_mean"] = prompt_len_mean
    if response_len_mean is not None:
        stats["response_len_mean"] = response_len_mean
        if lengths:  # an explicit mean replaces the file's histogram
            stats.pop("response_len_quantiles", None)
    if workload == "grpo":  # no mean given: a stated, typical distribution, not the worst case
        from grpo_tune.autotune.calibrate.lengths import assumed_means

        stats = assumed_means(stats, prompt_len=prompt_len, response_len=response_len)
    wl = Workload.from_dict(
        dict(
            kind=workload,
            prompts=prompts,
            n=n,
            prompt_len=prompt_len,
            response_len=response_len,
            mini_batch=min(mini_batch, prompts),
            ppo_epochs=ppo_epochs,
            kl=kl,
            seq_len=seq_len,
            gbs=gbs,
            **stats,
        ),
        where="workload",
    )
    for f in check_lengths(m, wl):  # train refuses it; refuse it here before any search or estimate
        raise f.to_error()
    return m, hw, cluster, wl


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
PIN_FLAGS = (
    *DEGREES,
    "mbs",
    "log_prob_mbs",
    "recompute",
    "sequence_parallel",
    "distributed_optimizer",
    "offload",
    "rollout_tp",
    "gpu_memory_utilization",
    "first_stage_layers",
    "last_stage_layers",
    "max_tokens_per_gpu",
    "cpu_optimizer",
    "max_num_seqs",
    "enforce_eager",
    "sync_bucket_mb",
    "precision_aware_optimizer",
)


def workload_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The workload flags of a command's parameters (its ``locals()``)."""
    return {k: flags.get(k) for k in WORKLOAD_FLAGS}


def pins_from_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The strategy fields a command's degree/memory/rollout flags pinned."""
    return strategy_pins(**{k: flags.get(k) for k in PIN_FLAGS})


def inputs_from_flags(flags: dict[str, Any]) -> tuple[ModelSpec, HardwareSpec, Cluster, Workload, dict[str, Any]]:
    """Model, hardware, cluster, workload and pins from the flags that estimate and search share."""
    m, hw, cluster, wl = plan_inputs(
        model=flags["model"],
        hardware=flags["hardware"],
        gpus=flags["gpus"],
        gpus_per_node=flags["gpus_per_node"],
        stack=flags.get("stack"),
        **workload_flags(flags),
    )
    return m, hw, cluster, wl, pins_from_flags(flags)


# The flags' defaults are Workload's (core/strategy.py, which says where they come from).
_W = Workload()
_WL_FIELD_FLAGS = ("prompts", "n", "prompt_len", "response_len", "mini_batch", "ppo_epochs", "kl", "seq_len", "gbs")
WORKLOAD_DEFAULTS = {"workload": _W.kind, **{k: getattr(_W, k) for k in _WL_FIELD_FLAGS}}
