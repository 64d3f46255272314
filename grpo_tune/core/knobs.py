"""The knob table: every field of a plan, named once, with its concern, flag, pin rule and search role.

A plan (:class:`core.strategy.Strategy`) is composed of concerns, each a frozen dataclass: ``layout``
(degrees, stage split, VPP), ``memory`` (recompute, offload, optimizer placement), ``batching``
(micro-batches or token caps) and ``rollout`` (the rollout engine's knobs). Every field is a row of
:data:`KNOBS`, in the order a plan's ``strategy`` section has listed them since schema 1 (best.yaml,
``--json``). Everything that lists knobs reads this table: ``Strategy.of``/``replace`` (which concern a
name belongs to), the CLI's plan flags and their pins (autotune/options.py, cli/plan_options.py),
the search space's pass-through pins and grids (autotune/space.py) and ``tune`` (which fields it may
change). Adding a knob is one dataclass field plus one row here (and its verl keys in the verl table).

The table is pure data: no typer, no verl. The flag spelling, help text and panel are the words the
CLI shows; the pin rule says how a pinned value is checked; ``search`` and ``tune`` say what the
search and tune do with the knob.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from .choices import Engine, KvCacheDtype, Offload, Recompute, RolloutPrecision, TrainPrecision
from .errors import ConfigError
from .validation import FRACTION, NON_NEGATIVE, POSITIVE, Range

__all__ = ["CONCERNS", "KNOBS", "Knob", "Pin", "knob", "knobs", "names", "parse_offload"]

CONCERNS = ("layout", "memory", "batching", "rollout", "precision")
"""The concerns of a plan, as :class:`~core.strategy.Strategy` holds them (attribute names)."""

Concern = Literal["layout", "memory", "batching", "rollout", "precision"]
Search = Literal["space", "grid", "pinned", "fixed"]
"""What the search does with a knob: ``space`` - the search space generates it (degrees, micro-batches,
recompute, offload, the rollout TP and memory fraction) and applies its pin itself; ``grid`` - it tries
each of ``values`` unless pinned; ``pinned`` - never searched, a pin (or the default) passes through to
every plan; ``fixed`` - neither searched nor pinnable (derived, or a default the user edits in best.yaml)."""
Tune = Literal["search", "keep", "user", "reapply"]
"""What ``tune`` does with it: ``search`` - the search may change it and tune writes it back; ``keep`` -
pinned to the launch's value but written back (so that an unset value follows a new plan); ``user`` -
pinned to the launch's value and left as the launch has it; ``reapply`` - the search uses its own rule
(sequence parallel: on with TP), then each proposal gets the launch's value back, which tune leaves as is."""

P_PAR = "Parallel degrees (unset: default in estimate, tuned in search)"
P_MEM = "Memory options"
P_ROLL = "Rollout"
P_PREC = "Precision (docs/precision.md)"

SYNC_BUCKET_MB = 2048
"""verl 0.9.1's ``rollout.checkpoint_engine.update_weights_bucket_megabytes`` default
(verl/trainer/config/rollout/rollout.yaml): the default weight-sync bucket."""

OFFLOAD = Offload.values()
RECOMPUTE = Recompute.values()


def parse_offload(text: str) -> tuple[str, ...]:
    """``--offload`` (a comma list of param, grad, optimizer, or ``none``) as the plan's offload set."""
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    if items in ([], ["none"]):
        return ()
    bad = [i for i in items if i not in OFFLOAD]
    if bad:
        raise ConfigError(f"--offload: unknown {bad[0]!r}", hint=f"use a comma list of {', '.join(OFFLOAD)}, or none")
    if ("param" in items) != ("grad" in items):
        # verl 0.9.1's param_offload frees parameters and gradient buffers together and it has no
        # grad_offload (the verl table): a plan with only one of them would not be the plan that runs.
        raise ConfigError(
            f"--offload {text}: verl offloads parameters and gradients together, not one alone",
            hint="use --offload param,grad (optionally with ,optimizer) or --offload optimizer",
        )
    return tuple(o for o in OFFLOAD if o in items)


@dataclass(frozen=True)
class Pin:
    """How a flag's value is checked when the user pins it (a coded ``BAD_CONFIG`` error otherwise)."""

    range: Range | None = POSITIVE
    """Allowed numbers (None: not a number)."""
    error: str = "{flag} must be >= 1, got {v}"
    """The message, with ``{flag}`` (the option) and ``{v}`` (the value given)."""
    hint: str | None = "leave {flag} out to let search choose"
    choices: tuple[str, ...] = ()
    """Allowed strings (empty: any)."""
    zero_is_off: bool = False
    """0 pins the feature off: None in the plan."""
    implies: tuple[tuple[str, object], ...] = ()
    """Knobs set along with a non-zero pin (the CPU optimizer as verl's examples run it)."""
    parse: Callable[[str], object] | None = None
    """Turns the flag's text into the plan's value (``--offload``)."""
    auto: tuple[object, ...] = ()
    """The values the word ``auto`` searches (``--rollout-engine auto``: vllm and sglang); empty: no ``auto``."""


NO_PIN = Pin(range=None, error="", hint=None)


@dataclass(frozen=True)
class Knob:
    """One field of a plan."""

    name: str
    """Its name in a plan's ``strategy`` section, in ``Strategy.of``/``replace`` and in the pins."""
    concern: Concern
    """The Strategy attribute holding it."""
    attr: str = ""
    """Its field in the concern's dataclass when that differs from ``name``."""
    flag: str = ""
    """The CLI option (``--tp``; a bool as ``--x/--no-x``); empty: not a flag."""
    kind: type = int
    """The flag's value type."""
    help: str = ""
    panel: str = ""
    pin: Pin = NO_PIN
    search: Search = "pinned"
    values: tuple[object, ...] = ()
    """With ``search="grid"``: the values tried when unpinned."""
    tune: Tune | None = None
    """What tune does with it (None: tune neither pins nor writes it)."""

    @property
    def field(self) -> str:
        return self.attr or self.name

    @property
    def option(self) -> str:
        """The flag as a user types it (``--enforce-eager`` of ``--enforce-eager/--no-enforce-eager``)."""
        return self.flag.split("/")[0]


_POS = Pin()
_FIXED: Search = "fixed"

KNOBS: tuple[Knob, ...] = (
    # --- layout: the parallel degrees --------------------------------------------------------------
    Knob("tp", "layout", flag="--tp", help="Tensor parallel.", panel=P_PAR, pin=_POS, search="space", tune="search"),
    Knob("pp", "layout", flag="--pp", help="Pipeline parallel.", panel=P_PAR, pin=_POS, search="space", tune="search"),
    Knob(
        "vpp",
        "layout",
        flag="--vpp",
        help="Virtual pipeline chunks per stage.",
        panel=P_PAR,
        pin=_POS,
        search="space",
        tune="search",
    ),
    Knob("cp", "layout", flag="--cp", help="Context parallel.", panel=P_PAR, pin=_POS, search="space", tune="search"),
    Knob(
        "ep", "layout", flag="--ep", help="Expert parallel (MoE).", panel=P_PAR, pin=_POS, search="space", tune="search"
    ),
    Knob(
        "etp",
        "layout",
        flag="--etp",
        help="Expert tensor parallel (default: tp).",
        panel=P_PAR,
        pin=_POS,
        search="space",
        tune="search",
    ),
    Knob("dp", "layout", search=_FIXED),
    # --- batching ----------------------------------------------------------------------------------
    Knob(
        "mbs", "batching", flag="--mbs", help="Micro-batch size.", panel=P_PAR, pin=_POS, search="space", tune="search"
    ),
    Knob(
        "log_prob_mbs",
        "batching",
        flag="--log-prob-mbs",
        help="Micro-batch size of the old/ref log-prob passes"
        " (verl log_prob_micro_batch_size_per_gpu; default: --mbs).",
        panel=P_PAR,
        pin=_POS,
        tune="keep",
    ),
    Knob(
        "sequence_parallel",
        "layout",
        flag="--sequence-parallel/--no-sequence-parallel",
        kind=bool,
        help="Sequence parallel (default: on when tp>1).",
        panel=P_MEM,
        tune="reapply",
    ),
    # --- memory ------------------------------------------------------------------------------------
    Knob(
        "recompute",
        "memory",
        flag="--recompute",
        kind=str,
        help="none | selective | full.",
        panel=P_MEM,
        pin=Pin(
            range=None,
            error="{flag} must be one of " + ", ".join(RECOMPUTE) + ", got {v!r}",
            hint=None,
            choices=RECOMPUTE,
        ),
        search="space",
        tune="search",
    ),
    Knob("recompute_layers", "memory", search=_FIXED),
    Knob(
        "distributed_optimizer",
        "memory",
        flag="--distributed-optimizer/--no-distributed-optimizer",
        kind=bool,
        help="Shard optimizer state over DP (default: on).",
        panel=P_MEM,
        search="space",
        tune="search",
    ),
    Knob(
        "offload",
        "memory",
        flag="--offload",
        kind=str,
        help="Comma list of param,grad,optimizer ('none' for none); param and grad go together"
        " (verl's param_offload frees both), so param or grad alone is refused.",
        panel=P_MEM,
        pin=Pin(range=None, error="", hint=None, parse=parse_offload),
        search="space",
        tune="search",
    ),
    # --- layout: the pipeline split ----------------------------------------------------------------
    Knob(
        "first_stage_layers",
        "layout",
        flag="--first-stage-layers",
        help="Layers on the first pipeline stage (uneven PP).",
        panel=P_PAR,
        pin=_POS,
        search="space",
        tune="search",
    ),
    Knob(
        "last_stage_layers",
        "layout",
        flag="--last-stage-layers",
        help="Layers on the last pipeline stage (uneven PP).",
        panel=P_PAR,
        pin=_POS,
        search="space",
        tune="search",
    ),
    # --- rollout: TP and memory ----------------------------------------------------------------------
    Knob(
        "rollout_tp",
        "rollout",
        flag="--rollout-tp",
        help="Rollout engine tensor parallel.",
        panel=P_ROLL,
        pin=_POS,
        search="space",
        tune="search",
    ),
    Knob(
        "gpu_memory_utilization",
        "rollout",
        flag="--gpu-memory-utilization",
        kind=float,
        help="vLLM memory fraction (0-1].",
        panel=P_ROLL,
        pin=Pin(
            range=FRACTION,
            error="{flag} (vLLM gpu_memory_utilization) must be a fraction in (0, 1], got {v}",
            hint="vLLM's share of GPU memory for weights and KV cache, e.g. 0.6",
        ),
        search="space",
        tune="search",
    ),
    # --- batching: token caps ------------------------------------------------------------------------
    Knob(
        "max_tokens_per_gpu",
        "batching",
        flag="--max-tokens-per-gpu",
        help="Dynamic batching: token cap per micro-batch per GPU"
        " (verl use_dynamic_bsz + ppo_max_token_len_per_gpu); 0 = off. Unset in search: searched.",
        panel=P_MEM,
        pin=Pin(range=NON_NEGATIVE, error="{flag} must be >= 0 (0 = off), got {v}", hint=None, zero_is_off=True),
        search="space",
        tune="user",
    ),
    Knob("log_prob_max_tokens_per_gpu", "batching", tune="user"),
    # --- memory: the CPU optimizer -----------------------------------------------------------------
    Knob(
        "cpu_optimizer",
        "memory",
        flag="--cpu-optimizer",
        kind=float,
        help="Megatron's hybrid CPU optimizer: fraction of optimizer state and step on the host (0 = off)."
        " Unset in search: searched where memory needs it.",
        panel=P_MEM,
        pin=Pin(
            range=Range(lo=0, hi=1),
            error="{flag} must be a fraction in [0, 1] (0 = off), got {v}",
            hint=None,
            zero_is_off=True,
            # as verl's examples set it: overlap the copies, precision-aware Adam
            implies=(("overlap_cpu_optimizer", True), ("precision_aware_optimizer", True)),
        ),
        search="space",
        tune="user",
    ),
    Knob("overlap_cpu_optimizer", "memory", tune="user"),
    Knob(
        "precision_aware_optimizer",
        "memory",
        flag="--precision-aware-optimizer/--no-precision-aware-optimizer",
        kind=bool,
        help="Megatron's use_precision_aware_optimizer (TE FusedAdam keeps 10 B of state per parameter, "
        "no fp32 param copy beside the CPU optimizer). Default: on with --cpu-optimizer, as verl's examples.",
        panel=P_MEM,
        tune="user",
    ),
    # --- rollout: the engine -------------------------------------------------------------------------
    Knob(
        "max_num_seqs",
        "rollout",
        flag="--max-num-seqs",
        help="vLLM max_num_seqs per replica (verl default 256). Unset in search: searched.",
        panel=P_ROLL,
        pin=Pin(hint=None),
        search="grid",
        values=(256, 1024),  # verl's default and vLLM's own (V1, H100-class) default
        tune="user",
    ),
    Knob("max_num_batched_tokens", "rollout", tune="user"),
    Knob(
        "enforce_eager",
        "rollout",
        flag="--enforce-eager/--no-enforce-eager",
        kind=bool,
        help="vLLM without CUDA graphs (default: graphs). Unset in search: searched.",
        panel=P_ROLL,
        search="grid",
        values=(False, True),  # CUDA graphs cost memory, eager costs time per step
        tune="user",
    ),
    Knob("chunked_prefill", "rollout", tune="user"),
    Knob("free_cache_engine", "rollout", tune="user"),
    Knob(
        "sync_bucket_mb",
        "rollout",
        flag="--sync-bucket-mb",
        help="Weight-sync bucket in MiB"
        " (verl rollout.checkpoint_engine.update_weights_bucket_megabytes; default 2048).",
        panel=P_ROLL,
        pin=Pin(hint=f"leave {{flag}} out for verl's default ({SYNC_BUCKET_MB} MiB)"),
        tune="keep",
    ),
    # --- memory: the logits path (the plan's last field since it was added) ------------------------
    Knob("fused_kernels", "memory", search=_FIXED),
    # --- rollout: which engine (engines/) --------------------------------------------------------------
    Knob(
        "engine",
        "rollout",
        flag="--rollout-engine",
        kind=str,
        help="vllm | sglang | auto (search both). Default: vllm, verl's and NeMo-RL's default.",
        panel=P_ROLL,
        pin=Pin(
            range=None,
            error="{flag} must be one of " + ", ".join((*Engine.values(), "auto")) + ", got {v!r}",
            hint=None,
            choices=(*Engine.values(), "auto"),
            auto=Engine.values(),
        ),
        search="grid",
        values=("vllm",),  # searched only when asked (auto): the default plan is the frameworks' default engine
        tune="user",
    ),
    # --- precision: number formats (docs/precision.md) -------------------------------------------------
    Knob(
        "precision",
        "precision",
        flag="--precision",
        kind=str,
        help="Training GEMMs: bf16 | fp8 (Megatron/TE e4m3, blockwise recipe).",
        panel=P_PREC,
        pin=Pin(
            range=None, error="{flag} must be one of bf16, fp8, got {v!r}", hint=None, choices=TrainPrecision.values()
        ),
        tune="user",
    ),
    Knob(
        "rollout_precision",
        "precision",
        flag="--rollout-precision",
        kind=str,
        help="Rollout weights: bf16 | fp8 (block-wise FP8; with bf16 training the importance-sampling "
        "correction is emitted).",
        panel=P_PREC,
        pin=Pin(
            range=None, error="{flag} must be one of bf16, fp8, got {v!r}", hint=None, choices=RolloutPrecision.values()
        ),
        tune="user",
    ),
    Knob(
        "kv_cache_dtype",
        "precision",
        flag="--kv-cache-dtype",
        kind=str,
        help="Rollout KV cache: auto (bf16) | fp8.",
        panel=P_PREC,
        pin=Pin(
            range=None, error="{flag} must be one of auto, fp8, got {v!r}", hint=None, choices=KvCacheDtype.values()
        ),
        tune="user",
    ),
)


def knobs(
    *, concern: str | None = None, search: str | None = None, tune: str | None = None, flag: bool | None = None
) -> Iterator[Knob]:
    """The rows of :data:`KNOBS` (read at call time, so a test may extend the table) that match every filter given."""
    for k in KNOBS:
        if concern is not None and k.concern != concern:
            continue
        if search is not None and k.search != search:
            continue
        if tune is not None and k.tune != tune:
            continue
        if flag is not None and bool(k.flag) != flag:
            continue
        yield k


def knob(name: str) -> Knob:
    """The row named ``name`` (KeyError when there is none)."""
    for k in KNOBS:
        if k.name == name:
            return k
    raise KeyError(name)


_NAMES: dict[tuple[object, ...], tuple[str, ...]] = {}
_NAMES_OF: tuple[Knob, ...] | None = None


def names(*, search: tuple[str, ...] = (), tune: tuple[str, ...] = (), flag: bool | None = None) -> tuple[str, ...]:
    """The names of the rows whose ``search`` is one of ``search`` and whose ``tune`` is one of ``tune``
    (empty: any), in table order; cached per table object (the search asks per plan; a test may extend
    the table)."""
    global _NAMES_OF
    if _NAMES_OF is not KNOBS:
        _NAMES.clear()
        _NAMES_OF = KNOBS
    key = (search, tune, flag)
    out = _NAMES.get(key)
    if out is None:
        out = _NAMES[key] = tuple(
            k.name
            for k in KNOBS
            if (not search or k.search in search)
            and (not tune or k.tune in tune)
            and (flag is None or bool(k.flag) == flag)
        )
    return out
