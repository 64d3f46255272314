"""Placement: where the rollout and the training run, and how stale the samples they exchange may be.

``colocated`` (one pool: vLLM sleeps while Megatron trains on the same GPUs, verl's hybrid engine) or
``separate`` (a rollout pool of ``rollout_gpus`` GPUs, possibly of another hardware profile, and a
training pool of the rest), with the staleness bound (0 = on-policy: a sample is produced by the
weights it trains; k = at most k policy versions old), partial rollout (an unfinished response is
carried into the next step instead of holding the batch) and the weight-sync interval in steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from .choices import PlacementMode
from .errors import ConfigError, InvalidDegreesError
from .hardware import HardwareSpec
from .specs import load_hardware
from .strategy import Cluster, Strategy
from .validation import NON_NEGATIVE, Schema, check_keys, from_mapping, to_mapping

__all__ = [
    "PLACEMENT_KNOBS",
    "Placement",
    "PlacementAsk",
    "PlacementKnob",
    "Pools",
    "check",
    "pools",
    "rollout_strategy",
    "split_candidates",
    "train_strategy",
]


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where each role runs. The default is verl's hybrid engine: one colocated, synchronous pool."""

    mode: str = "colocated"
    """``colocated`` (rollout and training share every GPU) or ``separate`` (two pools)."""
    rollout_gpus: int = 0
    """GPUs of the rollout pool (``separate`` only; the training pool is the rest of the cluster)."""
    rollout_hardware: str | None = None
    """Hardware profile of the rollout pool when it differs from the training pool's (``separate`` only)."""
    staleness: int = 0
    """Policy versions a sample may lag the weights it trains (0 = on-policy)."""
    partial_rollout: bool = False
    """Unfinished responses carry over to the next step (needs ``staleness >= 1``)."""
    sync_interval: int = 1
    """Optimizer steps between weight syncs to the rollout pool."""
    recompute_logprobs: bool = True
    """The training pool recomputes the old (proximal) log-probs of each batch and corrects the gap to the
    rollout's own log-probs by importance sampling (decoupled PPO; verl's ``rollout_correction.bypass_mode``
    off). ``False``: the rollout's log-probs are the old ones and there is no old log-prob pass (verl
    fully-async's default, ``bypass_mode=True``). ``separate`` only: colocated runs always recompute."""
    stream: bool = False
    """Staleness 0 with separate pools: the training pool takes each mini-batch of finished prompt groups as it
    arrives while the rollout pool generates the rest (verl fully-async's on-policy pipeline); the samples are
    still all from the step's weights. False: generation, then training, in sequence. ``separate`` only."""

    @property
    def separate(self) -> bool:
        return self.mode == "separate"

    def rollout_profile(self) -> HardwareSpec | None:
        """The rollout pool's hardware profile, loaded, when it names its own (None: the training pool's)."""
        return load_hardware(self.rollout_hardware) if self.rollout_hardware else None

    def to_dict(self) -> dict[str, object]:
        return to_mapping(self)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "placement") -> "Placement":
        data = check_keys(cls, data, where)
        return check(from_mapping(cls, data, where, _PLACEMENT_SCHEMA), where)


_PLACEMENT_SCHEMA = Schema(
    ranges={"rollout_gpus": NON_NEGATIVE, "staleness": NON_NEGATIVE},
    choices={"mode": PlacementMode},
)


def check(p: Placement, where: str = "placement", *, gpus: int | None = None) -> Placement:
    """The rules between a placement's fields, and (given the cluster's ``gpus``) against the cluster."""
    if p.staleness < 0:
        raise ConfigError(f"{where}: staleness must be >= 0, got {p.staleness}", hint="0 is on-policy")
    if not p.separate:
        if p.rollout_gpus or p.rollout_hardware is not None or p.staleness or p.partial_rollout:
            raise ConfigError(
                f"{where}: rollout_gpus, rollout_hardware, staleness and partial_rollout need mode 'separate'",
                hint="colocated rollout shares every GPU with training and is on-policy",
            )
        if p.stream:
            raise ConfigError(f"{where}: stream needs mode 'separate'", hint="a colocated step runs its phases in turn")
        if p.recompute_logprobs is not True:
            raise ConfigError(
                f"{where}: recompute_logprobs false needs mode 'separate'",
                hint="a colocated step recomputes the old log-probs with the weights that sampled them",
            )
        return p
    if p.rollout_gpus < 1:
        raise ConfigError(f"{where}: a separate placement needs rollout_gpus >= 1", hint="e.g. --rollout-gpus 8")
    if gpus is not None and p.rollout_gpus >= gpus:
        raise ConfigError(
            f"{where}: rollout_gpus ({p.rollout_gpus}) leaves no GPU of {gpus} for training",
            hint="the training pool is the cluster's GPUs minus the rollout pool's",
        )
    if p.partial_rollout and p.staleness < 1:
        raise ConfigError(
            f"{where}: partial_rollout needs staleness >= 1",
            hint="a response carried into the next step is produced by older weights",
        )
    return p


P_PLACE = "Placement (separate rollout and training pools)"


@dataclass(frozen=True)
class PlacementKnob:
    """One placement option of ``estimate``, ``search``, ``compare`` and ``tune``: its flag, its value type
    and default, and whether giving it asks for separate pools. The CLI builds its options from
    :data:`PLACEMENT_KNOBS` (as the plan knobs' from ``core.knobs.KNOBS``), and :class:`PlacementAsk` has a
    field per row: adding a placement option is one :class:`Placement` field plus one row here."""

    name: str
    """The option's name in :class:`PlacementAsk` (and the command's parameter)."""
    flag: str
    """The CLI option (a bool as ``--x/--no-x``)."""
    kind: type
    default: object
    help: str
    pool: bool = True
    """Giving it (a non-default value) asks for separate pools: an error with ``--placement colocated``."""


PLACEMENT_KNOBS: tuple[PlacementKnob, ...] = (
    PlacementKnob(
        "placement",
        "--placement",
        str,
        "colocated",
        "colocated (every GPU runs every phase) | separate (a rollout pool and a training pool); "
        "search also takes auto (the better of the two). Default colocated.",
        pool=False,
    ),
    PlacementKnob(
        "rollout_gpus",
        "--rollout-gpus",
        int,
        None,
        "GPUs of the rollout pool (the training pool is the rest of --gpus): whole nodes, or the same "
        "GPUs on every node. Unset in search: searched.",
    ),
    PlacementKnob(
        "rollout_hardware",
        "--rollout-hardware",
        str,
        None,
        "Hardware profile of the rollout pool (default: --hardware).",
    ),
    PlacementKnob(
        "staleness",
        "--staleness",
        int,
        0,
        "Policy versions a sample may lag (0 = on-policy, the default; search tries 0..K).",
    ),
    PlacementKnob(
        "partial_rollout",
        "--partial-rollout/--no-partial-rollout",
        bool,
        False,
        "Resume unfinished responses under the new weights after a sync (needs --staleness >= 1). Default off.",
    ),
    PlacementKnob(
        "stream",
        "--stream/--no-stream",
        bool,
        None,
        "Separate pools at staleness 0: train each mini-batch of finished groups while the rest generate "
        "(on-policy). --stream forces it, --no-stream forbids it; unset: each plan takes the cheaper of streamed "
        "and in sequence, where every chosen framework streams (verl's fully-async trainer; not NeMo-RL).",
        pool=False,
    ),
)


@dataclass(frozen=True)
class PlacementAsk:
    """What the placement options asked for: the mode (``auto`` in search: the better of both), and the
    pool, staleness and partial-rollout bounds, unset ones at their defaults (an unset ``rollout_gpus``
    is searched)."""

    placement: str = "colocated"
    rollout_gpus: int | None = None
    rollout_hardware: str | None = None
    staleness: int = 0
    partial_rollout: bool = False
    stream: bool | None = None
    """True: every staleness-0 split streams; False: none does; None: each takes the cheaper of the two."""

    def __post_init__(self) -> None:
        # every command that takes these options (estimate, search, compare, tune) refuses the same values
        if isinstance(self.staleness, bool) or not isinstance(self.staleness, int) or self.staleness < 0:
            raise ConfigError(
                f"--staleness must be an integer >= 0, got {self.staleness!r}",
                hint="0 is on-policy; k lets a sample lag the weights it trains by at most k versions",
            )
        if self.rollout_gpus is not None and self.rollout_gpus < 1:
            raise ConfigError(
                f"--rollout-gpus must be >= 1, got {self.rollout_gpus}",
                hint="the rollout pool's GPUs; the training pool is the rest of --gpus",
            )

    @classmethod
    def of(cls, values: Mapping[str, object]) -> "PlacementAsk":
        """From a command's option values (named as the rows of :data:`PLACEMENT_KNOBS`; missing: default)."""
        got = {k.name: values.get(k.name, k.default) for k in PLACEMENT_KNOBS}
        return cls(**{k: (v if v is not None else _DEFAULTS[k]) for k, v in got.items()})  # type: ignore[arg-type]

    @property
    def pool_options(self) -> bool:
        """An option that only separate pools use was given (a rollout pool, staleness, partial rollout)."""
        return any(k.pool and getattr(self, k.name) for k in PLACEMENT_KNOBS)

    @property
    def allows_split(self) -> bool:
        """The user allows separate pools: a mode other than colocated, a rollout pool or a staleness bound
        (partial rollout alone allows nothing: it needs a staleness)."""
        return self.placement != "colocated" or bool(self.rollout_gpus or self.rollout_hardware or self.staleness)

    def stream_for(self, can_stream: bool) -> bool | None:
        """The stream asked for where the chosen frameworks ``can_stream`` (False where they cannot: a plan no
        framework runs is never priced)."""
        return self.stream if can_stream else False

    def rollout_profile(self) -> HardwareSpec | None:
        """The rollout pool's hardware profile, loaded, when ``--rollout-hardware`` named one (None: the
        training pool's)."""
        return load_hardware(self.rollout_hardware) if self.rollout_hardware else None

    def require_separate(self) -> str:
        """The separate mode asked for (``separate`` or ``auto``); a coded error for pool options given with
        ``--placement colocated``."""
        if self.placement == "colocated":
            raise ConfigError(
                "--rollout-gpus, --rollout-hardware, --staleness and --partial-rollout need separate pools",
                hint="add --placement separate or --placement auto",
            )
        return self.placement


_DEFAULTS: dict[str, object] = {k.name: k.default for k in PLACEMENT_KNOBS}
assert [k.name for k in PLACEMENT_KNOBS] == [f.name for f in fields(PlacementAsk)], "one PlacementAsk field per row"


# ---------------------------------------------------------------------------------------------
# The pools of a separate placement: the cluster split, and what each pool runs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pools:
    """The two pools of a separate plan as clusters, and whether they share nodes."""

    rollout: Cluster
    train: Cluster
    shared_nodes: bool
    """Pools on the same nodes (GPUs within a node): the sync runs over NVLink."""


def pools(cluster: Cluster, rollout_gpus: int) -> Pools:
    """Split ``cluster`` as verl's separate trainers can (one GPU count per node per pool):

    - whole nodes: ``rollout_gpus`` a multiple of the node size (``rollout.nnodes`` nodes roll out);
    - GPUs within a node: on one node, or the same ``rollout_gpus / nodes`` GPUs on every node
      (verl's ``trainer.nnodes = rollout.nnodes``, the two ``n_gpus_per_node`` summing to the node).
    """
    gpn, n = cluster.gpus_per_node, cluster.gpus
    nodes = cluster.nnodes
    if not 1 <= rollout_gpus < n:
        raise InvalidDegreesError(
            f"rollout_gpus {rollout_gpus} must leave the training pool at least one of the {n} GPUs",
            f"give --rollout-gpus between 1 and {n - 1}",
        )
    if n % gpn and nodes > 1:
        raise InvalidDegreesError(
            f"{n} GPUs are not whole nodes of {gpn}: separate pools need whole nodes", "give a multiple of the node"
        )
    if rollout_gpus % gpn == 0:
        return Pools(
            Cluster(gpus=rollout_gpus, gpus_per_node=gpn), Cluster(gpus=n - rollout_gpus, gpus_per_node=gpn), False
        )
    if nodes == 1:
        return Pools(
            Cluster(gpus=rollout_gpus, gpus_per_node=rollout_gpus),
            Cluster(gpus=n - rollout_gpus, gpus_per_node=n - rollout_gpus),
            True,
        )
    if rollout_gpus % nodes == 0 and rollout_gpus // nodes < gpn:
        per = rollout_gpus // nodes
        return Pools(
            Cluster(gpus=rollout_gpus, gpus_per_node=per), Cluster(gpus=n - rollout_gpus, gpus_per_node=gpn - per), True
        )
    raise InvalidDegreesError(
        f"rollout_gpus {rollout_gpus} on {nodes} nodes of {gpn} is neither whole nodes nor the same GPUs on every node",
        f"give a multiple of {gpn} (whole nodes) or of {nodes} below {gpn * nodes} (GPUs on every node)",
    )


def split_candidates(cluster: Cluster) -> list[int]:
    """Every rollout pool size :func:`pools` accepts, smallest first."""
    out = []
    for r in range(1, cluster.gpus):
        try:
            pools(cluster, r)
        except InvalidDegreesError:
            continue
        out.append(r)
    return out


def rollout_strategy(s: Strategy) -> Strategy:
    """The rollout pool's engine: vLLM stays awake (verl's separate trainers need free_cache_engine off)."""
    return s.replace(free_cache_engine=False)


def train_strategy(s: Strategy) -> Strategy:
    """The training pool's plan: no vLLM on its GPUs (no resident engine, no captured graphs)."""
    return s.replace(free_cache_engine=True, enforce_eager=True, rollout_tp=1)
