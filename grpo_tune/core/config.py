"""The run config: one versioned schema that autotune writes and the trainer reads.

A YAML file with the top-level sections ``schema_version, model, hardware, cluster, strategy,
workload, trainer`` and optional ``predicted``/``measured`` figures. Loading validates every
section and rejects unknown keys and impossible values with a coded error; saving is atomic
(write to a temporary file in the same folder, fsync, rename).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import yaml

from grpo_tune.core.errors import ConfigError, GrpoTuneError
from grpo_tune.core.choices import KlType, LossAgg, TrainerRolloutEngine
from grpo_tune.core.hardware import NATIVE_ENGINE, OLD_ROLLOUT_ENGINES, ROLLOUT_ENGINES, with_rollout_engine
from grpo_tune.core.specs import HardwareSpec, ModelSpec, load_hardware, load_model
from grpo_tune.core.placement import Placement
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate
from grpo_tune.core.validation import FRACTION, NON_NEGATIVE, Schema, check_names, from_mapping

SCHEMA_VERSION = 1


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types here
    """SafeLoader that reads ``3e-3`` as a float, as YAML 1.2 does (1.1 wants ``3.0e-3``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"""),
    list("-+0123456789"),
)


MAX_YAML_DEPTH = 64
_FLOW = re.compile(r"""[\[\]{}]|"(?:[^"\\]|\\.)*"|'[^']*'|#[^\n]*""")


def flow_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting outside strings and comments: one regex pass, run before PyYAML
    (whose scanner crawls, and whose composer recurses, on thousands of open brackets)."""
    depth = best = 0
    for m in _FLOW.finditer(text):
        c = m.group(0)
        if c in "[{":
            depth += 1
            best = max(best, depth)
        elif c in "]}":
            depth = max(0, depth - 1)
    return best


def yaml_load(text: str) -> object:
    """YAML with the safe loader; nesting deeper than MAX_YAML_DEPTH is a coded error, not a hang or a crash."""
    if flow_depth(text) > MAX_YAML_DEPTH:
        raise ConfigError(f"the YAML nests deeper than {MAX_YAML_DEPTH} levels", hint="a config nests a few levels")
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ConfigError("the YAML nests too deeply to read", hint="a config nests a few levels") from None


SYNTHETIC_DATASET = "synthetic"
"""The shipped synthetic task (``synthetic`` = ``synthetic:copy``, or ``synthetic:<task>``): no file to read."""


def is_synthetic(dataset: str) -> bool:
    return dataset.split(":")[0] == SYNTHETIC_DATASET


@dataclass(frozen=True, kw_only=True)
class TrainerOptions:
    """Options only the trainer reads. Defaults follow verl's GRPO example."""

    # --- what runs --------------------------------------------------------------------------------
    steps: int = 100
    """GRPO steps (rollout + update) to run."""
    seed: int = 1234
    """Seeds the random init, the data order and the sampler; a resumed run continues the same streams."""
    dataset: str = SYNTHETIC_DATASET
    """A JSONL or Parquet file with ``prompt`` and ``answer`` fields, or ``synthetic``."""
    reward: str = "math"
    """``math`` (final-number match) or a dotted path ``package.module:function``."""
    hf_checkpoint: str | None = None
    """A Hugging Face checkpoint folder (safetensors + config.json + tokenizer.json); None = random init."""
    out_dir: str = "runs/train"
    """Checkpoints and metrics.jsonl go here."""
    checkpoint_every: int = 10
    """Steps between atomic sharded checkpoints (a crash resumes from the last one)."""
    log_every: int = 1
    """Steps between metrics.jsonl lines."""
    tensorboard: bool = True
    """TensorBoard events under ``<out_dir>/tensorboard`` with verl's metric names (``actor/pg_loss``, ...)."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project (needs ``pip install wandb``); None: no wandb."""
    # --- rollout ----------------------------------------------------------------------------------
    rollout_engine: str = "auto"
    """``auto`` (vllm on GPU, megatron on CPU), ``vllm`` or ``megatron``."""
    temperature: float = 1.0
    """Sampling temperature of the rollout; the log-prob passes divide the logits by it too, as verl does."""
    top_p: float = 1.0
    """Nucleus sampling: draw from the smallest set of tokens holding this much probability (1 = all)."""
    # --- optimizer (megatron-core) ----------------------------------------------------------------
    lr: float = 1e-6
    """Adam learning rate, constant over the run (megatron-core's OptimizerConfig ``lr`` = ``min_lr``)."""
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    """Global gradient-norm clip (megatron-core's ``clip_grad``)."""
    # --- GRPO loss (verl's names) -----------------------------------------------------------------
    clip_ratio: float = 0.2
    """PPO's clip range epsilon on the probability ratio."""
    clip_ratio_high: float | None = None
    """Clip-higher (DAPO); None means the same as ``clip_ratio``."""
    loss_agg_mode: str = "token-mean"
    """How token losses become one number (core.choices.LossAgg, verl's ``actor.loss_agg_mode``)."""
    kl_coef: float = 0.001
    """Weight of the KL loss to the reference model (applied when ``workload.kl`` is on)."""
    kl_type: str = "low_var_kl"
    """The KL estimator (core.choices.KlType, verl's ``kl_loss_type``)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight: ``loss = pg + kl_coef * kl - entropy_coef * entropy``."""
    norm_adv_by_std: bool = True
    """Divide group-relative advantages by the group's std (GRPO); False keeps only the mean (Dr. GRPO)."""
    # --- MoE router -------------------------------------------------------------------------------
    moe_aux_loss_coeff: float = 0.0
    """MoE load-balancing auxiliary loss coefficient (Megatron's and verl's ``moe_aux_loss_coeff``)."""
    moe_router_load_balancing_type: str = "aux_loss"
    """Megatron's ``moe_router_load_balancing_type``: ``aux_loss``, ``seq_aux_loss`` or ``none``."""


_SECTIONS = (
    "schema_version",
    "model",
    "hardware",
    "cluster",
    "strategy",
    "workload",
    "trainer",
    "placement",
    "predicted",
    "measured",
    "meta",
)


INPUT_FIELDS = ("model", "hardware", "cluster", "strategy", "workload")
"""What a plan is priced from: ``costmodel.estimate``'s inputs, and the head of a RunConfig (core/target.py)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: ModelSpec
    hardware: HardwareSpec
    cluster: Cluster
    strategy: Strategy
    workload: Workload = field(default_factory=Workload)
    trainer: TrainerOptions = field(default_factory=TrainerOptions)
    placement: Placement = field(default_factory=Placement)
    """Colocated (default) or separate pools; with separate pools the strategy's degrees are the
    training pool's (``cluster.gpus - placement.rollout_gpus`` GPUs) and its rollout knobs the rollout pool's."""
    predicted: dict[str, object] | None = None
    """The cost model's figures when the config was emitted."""
    measured: dict[str, object] | None = None
    """Figures measured by a profiling run (autotune --refine)."""
    meta: dict[str, object] | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        # On a platform without GPU engines (cpu) grpo-tune's own trainer samples with what trainer.rollout_engine
        # names (auto there: its own sampler): the plan's engine follows it, so that what is priced is what runs
        # (a config built in code with Strategy()'s vllm and the trainer's megatron is the native sampler's plan).
        if self.hardware.default_engine == NATIVE_ENGINE and self.strategy.rollout.engine in ROLLOUT_ENGINES:
            want = "vllm" if self.trainer.rollout_engine == "vllm" else NATIVE_ENGINE
            if self.strategy.rollout.engine != want:
                object.__setattr__(self, "strategy", self.strategy.replace(engine=want))

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "schema_version": self.schema_version,
            "model": self.model.to_dict(),
            "hardware": self.hardware.to_dict(),
            "cluster": dataclasses.asdict(self.cluster),
            "strategy": self._strategy_dict(),
            "workload": self.workload.to_dict(),
            "trainer": dataclasses.asdict(self.trainer),
        }
        if self.placement.separate:  # a colocated config reads and writes as it always did
            d["placement"] = self.placement.to_dict()
        for k in ("predicted", "measured", "meta"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    def _strategy_dict(self) -> dict[str, object]:
        """The strategy section; its engine written out where it is not the platform's default (a cpu plan on vLLM:
        read back without it, the plan would be the platform's own sampler's)."""
        d = self.strategy.to_dict()
        if "engine" not in d and self.strategy.rollout.engine != self.hardware.default_engine:
            d["engine"] = self.strategy.rollout.engine
        return d

    @classmethod
    def from_dict(cls, data: object, *, where: str = "config") -> "RunConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping at the top level, got {type(data).__name__}")
        check_names(data, _SECTIONS, where, noun="section")
        ver = data.get("schema_version")
        if ver != SCHEMA_VERSION:
            raise ConfigError(
                f"{where}: schema_version {ver!r} is not supported (this grpo-tune reads {SCHEMA_VERSION})",
                hint="re-emit the config with this grpo-tune version",
            )
        for k in ("model", "hardware", "cluster", "strategy"):
            if k not in data:
                raise ConfigError(f"{where}: missing section {k!r}")
        model = _model(data["model"], where)
        hw_data, st_data = _engine_moved(data["hardware"], data["strategy"] or {})
        hw = _hardware(hw_data, where)
        if isinstance(st_data, dict) and "engine" not in st_data and hw.default_engine != "vllm":
            st_data = {**st_data, "engine": hw.default_engine}  # the platform's default engine (cpu: its own sampler)
        cluster = from_mapping(Cluster, data["cluster"], f"{where}.cluster", _CLUSTER_SCHEMA)
        strategy = Strategy.from_dict(st_data, where=f"{where}.strategy")
        hw = with_rollout_engine(hw, strategy.rollout.engine)  # the plan's engine's stack costs (cpu + vllm)
        workload = Workload.from_dict(data.get("workload") or {}, where=f"{where}.workload")
        trainer = from_mapping(TrainerOptions, data.get("trainer") or {}, f"{where}.trainer", _TRAINER_SCHEMA)
        placement = Placement.from_dict(data.get("placement") or {}, where=f"{where}.placement")
        train_gpus, train_gpn = cluster.gpus, cluster.gpus_per_node
        if placement.separate:
            from grpo_tune.core.placement import check

            check(placement, f"{where}.placement", gpus=cluster.gpus)
            train_gpus = cluster.gpus - placement.rollout_gpus
            train_gpn = min(train_gpn, train_gpus)
        strategy = validate(model, strategy, train_gpus, gpus_per_node=train_gpn, allow_cross_node_tp=True)
        extras: dict[str, dict[str, object] | None] = {}
        for k in ("predicted", "measured", "meta"):
            v = data.get(k)
            if v is not None and not isinstance(v, dict):
                raise ConfigError(f"{where}.{k} must be a mapping")
            extras[k] = v
        return cls(
            model=model,
            hardware=hw,
            cluster=cluster,
            strategy=strategy,
            workload=workload,
            trainer=trainer,
            placement=placement,
            predicted=extras["predicted"],
            measured=extras["measured"],
            meta=extras["meta"],
        )

    def replace(self, **kw: object) -> "RunConfig":
        return dataclasses.replace(self, **kw)  # type: ignore[arg-type]


_SpecT = TypeVar("_SpecT")


def _spec(v: object, load: Callable[[str], _SpecT], from_dict: Callable[..., _SpecT], where: str) -> _SpecT:
    """A profile given by name (``tiny``, ``{name: tiny}``) is loaded; a full mapping is read as is."""
    if isinstance(v, str):
        return load(v)
    if isinstance(v, dict) and set(v) == {"name"}:
        return load(v["name"])
    return from_dict(v, where=where)


def _model(v: object, where: str) -> ModelSpec:
    return _spec(v, load_model, ModelSpec.from_dict, f"{where}.model")


def _engine_moved(hw: object, strategy: object) -> tuple[object, object]:
    """A run config written while the engine was the hardware profile's (``hardware.rollout_engine``): the key
    moves to the plan (``strategy.engine``, unless the strategy names one), read as the plan it priced."""
    if not (isinstance(hw, dict) and "rollout_engine" in hw):
        return hw, strategy
    hw = dict(hw)
    raw = hw.pop("rollout_engine")
    engine = OLD_ROLLOUT_ENGINES.get(str(raw), raw)
    if isinstance(strategy, dict) and "engine" not in strategy:
        strategy = {**strategy, "engine": engine}
    return hw, strategy


def _hardware(v: object, where: str) -> HardwareSpec:
    return _spec(v, load_hardware, HardwareSpec.from_dict, f"{where}.hardware")


# ints are positive, floats >= 0 (not NaN); top_p is a fraction; the named choices come from core/choices.py.
_CLUSTER_SCHEMA = Schema()
_TRAINER_SCHEMA = Schema(
    # a seed of 0 is a seed (verl's and Megatron's configs accept it)
    ranges={"top_p": FRACTION, "seed": NON_NEGATIVE},
    choices={"rollout_engine": TrainerRolloutEngine, "loss_agg_mode": LossAgg, "kl_type": KlType},
)


def trainer_options(data: object, where: str = "trainer") -> TrainerOptions:
    """:class:`TrainerOptions` from a mapping (a framework's config read back), each value checked as a run
    config's ``trainer`` section is: a coded BAD_CONFIG error otherwise."""
    return from_mapping(TrainerOptions, data, where, _TRAINER_SCHEMA)


def cluster_of(data: object, where: str = "cluster") -> Cluster:
    """:class:`~.strategy.Cluster` from a mapping, checked as a run config's ``cluster`` section is."""
    return from_mapping(Cluster, data, where, _CLUSTER_SCHEMA)


def _override_value(text: str) -> object:
    """A ``--set`` value: YAML's reading of it (numbers, true/false, null, [lists]), with ``3e-3`` a
    number (YAML 1.1 reads an exponent without a dot as a string). Quote a string that looks numeric."""
    try:
        v = yaml_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(v, str) and v == text.strip():
        try:
            f = float(v)
        except ValueError:
            return v
        return f if math.isfinite(f) else v
    return v


def apply_overrides(data: object, overrides: Sequence[str], where: str) -> object:
    """``data`` (a parsed run config) with each ``section.key=value`` of ``overrides`` set. A malformed
    override, an unknown section, or a section that is not a mapping is a coded error here; the keys and
    values are then validated with the file's own rules (:meth:`RunConfig.from_dict`)."""
    if not overrides:
        return data
    if not isinstance(data, dict):
        return data  # from_dict says what is wrong with the file itself
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for item in overrides:
        key, eq, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not eq or len(parts) < 2 or not all(parts):
            raise ConfigError(
                f"--set {item!r}: expected SECTION.KEY=VALUE",
                hint="e.g. --set trainer.lr=3e-3 --set trainer.dataset=data/train.jsonl",
            )
        check_names(
            {parts[0]: None}, [s for s in _SECTIONS if s != "schema_version"], f"{where}: --set {key}", "section"
        )
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif isinstance(child, dict):
                child = node[part] = dict(child)
            else:
                raise ConfigError(
                    f"{where}: --set {key}: {'.'.join(parts[: i + 1])} is {child!r}, not a mapping",
                    hint=f"set it whole: --set {'.'.join(parts[: i + 1])}=VALUE",
                )
            node = child
        node[parts[-1]] = _override_value(text)
    return out


def load(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> RunConfig:
    """Read and validate a run config, with ``section.key=value`` ``overrides`` applied first (``train
    --set``); every failure is a coded :class:`GrpoTuneError`."""
    from grpo_tune.core.specfiles import read_spec_bytes

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no config file at {p}", hint="run `grpo-tune search` to emit one")
    try:  # a regular file under a size cap: a FIFO or /dev/zero is refused unread
        text = read_spec_bytes(p, "run config").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {p}: {exc}", hint="a run config is UTF-8 YAML") from None
    if p.suffix in (".sh", ".bash") or text.startswith("#!"):
        raise ConfigError(
            f"{p} is a shell script (a launch), not a run config (a best.yaml)",
            hint="pass the best.yaml of a run folder (runs/<id>/best.yaml); `grpo-tune tune SCRIPT` prices and "
            "edits a verl launch, and writes its run folder",
        )
    try:
        data = yaml_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if text.startswith(EMITTED_HEADER) and isinstance(data, dict):
        # grpo-tune writes every section; one written by it and missing some was cut short (a full disk, a kill,
        # a partial copy), and running it with defaults for the rest would run another plan
        cut = [k for k in ("model", "hardware", "cluster", "strategy", "workload", "trainer") if k not in data]
        if cut:
            raise ConfigError(
                f"{p} was written by grpo-tune but ends before its {', '.join(repr(k) for k in cut)} section(s): "
                "the file is cut short",
                hint="emit it again (grpo-tune search) or restore it from a copy",
            )
    data = apply_overrides(data, overrides, str(p))
    try:
        return RunConfig.from_dict(data, where=str(p))
    except GrpoTuneError as exc:
        if overrides:  # say which config was refused: the file as --set changed it
            raise type(exc)(f"{exc.message} (after --set {' '.join(overrides)})", exc.hint, code=exc.code) from None
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # last line of defence: never a traceback
        raise ConfigError(f"{p}: {exc}") from None


EMITTED_HEADER = "# grpo-tune run config (schema_version"


def dumps(cfg: RunConfig) -> str:
    header = f"{EMITTED_HEADER} {SCHEMA_VERSION}). `grpo-tune train --config THIS` runs it.\n"
    src = cfg.workload.lengths_source if cfg.workload.kind == "grpo" else None
    if src:  # the length statistics priced, stated where the user reads first (workload.lengths_source)
        header += "# lengths: " + " ".join(str(src).split()) + "\n"
    return header + str(yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False))


def atomic_write(path: str | os.PathLike[str], text: str | bytes) -> Path:
    """Write a file so that readers see the old or the new content, never a torn one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:  # a full disk in write()/fsync() names no file
            raise OSError(exc.errno, exc.strerror or str(exc), str(p)) from exc
        raise
    return p


def save(cfg: RunConfig, path: str | os.PathLike[str]) -> Path:
    return atomic_write(path, dumps(cfg))
