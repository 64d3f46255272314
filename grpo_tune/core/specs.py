"""Model and hardware specs: the data the cost model reads (ModelSpec here, HardwareSpec in
``core.hardware``), and loading both by name, path or Hugging Face id.

Both are frozen, keyword-only dataclasses. Presets live as TOML files in ``profiles/``;
a user adds one by dropping a file in ``profiles/{models,hardware}/``, in a folder named by
``GRPO_TUNE_PROFILES`` (``$DIR/models``, ``$DIR/hardware``), or by passing a path. A model can
also come from a Hugging Face ``config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Mapping, NoReturn, TypeVar

from .errors import ConfigError, GrpoTuneError, UnknownHardwareError, UnknownModelError, close_matches
from .efficiency import Efficiency as Efficiency  # re-exported: callers import the specs from core.specs
from .efficiency import OLD_STACK_KEYS, STACK_KEYS
from .hardware import HardwareSpec as HardwareSpec
from .hardware import with_stack
from .specfiles import _read_toml, read_spec_bytes
from .validation import FINITE_NON_NEGATIVE, Range, Schema, from_mapping
from .validation import check_keys as check_keys  # re-exported: older callers import it from here

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, exact enough to count every parameter."""

    name: str
    """Canonical preset name, e.g. ``qwen2.5-7b``."""
    family: str
    """``llama``, ``qwen2``, ``qwen3``, ``qwen3_moe``, ``deepseek_v3``."""
    layers: int
    hidden: int
    ffn_hidden: int
    """SwiGLU intermediate size of the dense MLP (dense models and DeepSeek's first dense layers)."""
    heads: int
    kv_heads: int
    """Key/value heads (GQA); equal to ``heads`` for MHA."""
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    """Biases on the Q, K and V projections (Qwen2/2.5)."""
    qk_norm: bool = False
    """RMSNorm over each head's query and key (Qwen3)."""
    gated_mlp: bool = True
    """SwiGLU (gate, up, down) MLP; False for a plain two-matrix GeLU MLP (GPT-3 style)."""
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_seq_len: int = 4096
    # --- mixture of experts -------------------------------------------------------------
    experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    top_k: int = 0
    expert_ffn_hidden: int = 0
    shared_experts: int = 0
    """Number of shared experts; together they form one MLP of ``shared_experts * expert_ffn_hidden``."""
    dense_layers: int = 0
    """Leading layers with a dense MLP instead of MoE (DeepSeek's ``first_k_dense_replace``)."""
    router_bias: bool = False
    """DeepSeek's ``e_score_correction_bias`` (one value per routed expert, aux-loss-free balancing)."""
    router_groups: int = 0
    """DeepSeek's ``n_group``: routed experts split into this many groups (0 = no group limit)."""
    router_group_topk: int = 0
    """DeepSeek's ``topk_group``: top-k picks experts only from this many best groups."""
    routed_scaling: float = 1.0
    """DeepSeek's ``routed_scaling_factor``: the routed experts' weights are scaled by it."""
    # --- multi-head latent attention (DeepSeek) -----------------------------------------
    q_lora_rank: int = 0
    """0 means queries are projected directly (no low-rank query)."""
    kv_lora_rank: int = 0
    """Non-zero means MLA."""
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0
    """Multi-token-prediction layers shipped in the checkpoint; not counted as model parameters."""
    hf_id: str = ""
    source: str = ""

    def __hash__(self) -> int:
        # The cost model's caches key on the spec thousands of times per search; hashing ~30 fields
        # each time dominated. Computed once, and never pickled (str hashes differ per process).
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "model") -> "ModelSpec":
        return _check_model(where, from_mapping(cls, data, where, _MODEL_SCHEMA))


ARCH_FIELDS = (
    "layers",
    "hidden",
    "ffn_hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "tied_embeddings",
    "qkv_bias",
    "qk_norm",
    "experts",
    "top_k",
    "expert_ffn_hidden",
    "shared_experts",
    "dense_layers",
    "router_bias",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
"""The ModelSpec fields that fix the weights' names and shapes: a checkpoint must match the configured model on
all of them, and a model read from a HF config.json equals its preset on them."""


# ints and floats >= 0 and finite; the sizes a model or a GPU cannot do without, > 0.
# Sanity ceilings, far above any published model (Llama-3.1-405B: 126 layers, hidden 16384; DeepSeek-V3:
# 256 experts; vocabularies ~256k): the parameter count loops over the layers, so 10**23 of them was a hang.
MAX_MODEL_LAYERS = 4096
MAX_MODEL_SIZE = 2**30
_SIZE = Range(lo=0, hi=MAX_MODEL_SIZE)
_MODEL_SCHEMA = Schema(
    ints=_SIZE,
    floats=FINITE_NON_NEGATIVE,
    ranges={
        **{k: Range(lo=1, hi=MAX_MODEL_SIZE) for k in ("hidden", "heads", "kv_heads", "head_dim", "vocab")},
        "layers": Range(lo=1, hi=MAX_MODEL_LAYERS),
        "dense_layers": Range(lo=0, hi=MAX_MODEL_LAYERS),
        "mtp_layers": Range(lo=0, hi=MAX_MODEL_LAYERS),
    },
)


def _check_model(where: str, obj: ModelSpec) -> ModelSpec:
    """The rules between fields of a model (each field's own range is in ``_MODEL_SCHEMA``)."""
    if obj.heads % obj.kv_heads:
        raise ConfigError(f"{where}: heads ({obj.heads}) must be a multiple of kv_heads ({obj.kv_heads})")
    if obj.is_moe and not (0 < obj.top_k <= obj.experts and obj.expert_ffn_hidden > 0):
        raise ConfigError(f"{where}: MoE needs 0 < top_k <= experts and expert_ffn_hidden > 0")
    if obj.dense_layers > obj.layers:
        raise ConfigError(f"{where}: dense_layers exceeds layers")
    if not obj.is_moe and obj.ffn_hidden <= 0:
        raise ConfigError(f"{where}.ffn_hidden must be positive for a dense model")
    return obj


# ---------------------------------------------------------------------------------------------
# Loading presets
# ---------------------------------------------------------------------------------------------


def _search_dirs(kind: str) -> list[Path]:
    dirs = [PROFILES_DIR / kind]
    extra = os.environ.get("GRPO_TUNE_PROFILES")
    if extra:
        for d in extra.split(os.pathsep):
            dirs.append(Path(d) / kind)
    return dirs


_SKIPPED: dict[str, str] = {}
"""Profile files that could not be read while listing a folder: path -> why (each said once on stderr)."""


def _listed(p: Path, kind: str) -> dict[str, object] | None:
    """A listed profile's data, or None for a file that cannot be read: one bad file in a profiles folder
    must not break every command, only a command that asks for that profile (it is still found by its stem)."""
    try:
        return _read_toml(p, kind)
    except GrpoTuneError as exc:
        if str(p) not in _SKIPPED:
            _SKIPPED[str(p)] = exc.message
            print(f"warning: skipped {p}: {exc.message}", file=sys.stderr)
        return None


@lru_cache(maxsize=None)
def _catalog(kind: str, env: str | None) -> dict[str, Path]:
    """name/alias (lower-case) -> file, later folders overriding earlier ones."""
    out: dict[str, Path] = {}
    for d in _search_dirs(kind):
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.toml")):
            data = _listed(p, kind)
            if data is None:
                out[p.stem.lower()] = p  # asking for it by name gives its own coded error
                continue
            aliases = data.get("aliases", [])
            names = [data.get("name", p.stem), p.stem, *(aliases if isinstance(aliases, list) else [])]
            for n in names:
                out[str(n).lower()] = p
    return out


def catalog(kind: str) -> dict[str, Path]:
    return _catalog(kind, os.environ.get("GRPO_TUNE_PROFILES"))


def _names(kind: str) -> list[str]:
    """The profiles of a kind that load; one that does not (bad TOML, an unknown key) is skipped and said."""
    load: Callable[[str], object] = _load_model_file if kind == "models" else _load_hardware_file
    names = set()
    for p in set(catalog(kind).values()):
        data = _listed(p, kind)
        if data is None:
            continue
        try:
            load(str(p))
        except GrpoTuneError as exc:
            if str(p) not in _SKIPPED:
                _SKIPPED[str(p)] = exc.message
                print(f"warning: skipped {p}: {exc.message}", file=sys.stderr)
            continue
        names.add(str(data.get("name", p.stem)))
    return sorted(names)


def list_models() -> list[str]:
    return _names("models")


def list_hardware() -> list[str]:
    return _names("hardware")


@lru_cache(maxsize=256)
def _load_model_file(path: str) -> ModelSpec:
    data = _read_toml(Path(path), "model")
    data.pop("aliases", None)
    return ModelSpec.from_dict(data, where=f"model file {path}")


# Suffixes of Hugging Face repo names whose weights differ from the base model's but whose architecture
# (config.json shapes) is the same: Qwen/Qwen2.5-7B-Instruct has Qwen/Qwen2.5-7B's shapes, and so on.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-base", "-it", "-hf")


@lru_cache(maxsize=8)
def _hf_index(env: str | None) -> dict[str, Path]:
    """HF id (lower-case, ``org/name`` and bare ``name``) -> preset file."""
    out: dict[str, Path] = {}
    for p in set(catalog("models").values()):
        hf = str((_listed(p, "models") or {}).get("hf_id") or "").strip().lower()
        if hf:
            out.setdefault(hf, p)
            out.setdefault(hf.rsplit("/", 1)[-1], p)
    return out


def resolve_hf_id(name: str) -> Path | None:
    """The preset holding HF id ``name`` (``Qwen/Qwen2.5-7B-Instruct``), or one of its instruct/base variants
    that share the architecture (the suffixes in ``_VARIANT_SUFFIXES``); None when no preset holds it."""
    idx = _hf_index(os.environ.get("GRPO_TUNE_PROFILES"))
    for c in name_variants(name, _VARIANT_SUFFIXES):
        if c in idx:
            return idx[c]
    return None


def name_variants(name: str, suffixes: tuple[str, ...]) -> list[str]:
    """The keys an HF id is looked up by: ``name`` lower-cased, its last path part, and each without one
    of ``suffixes`` (``qwen/qwen2.5-7b-instruct``, ``qwen2.5-7b-instruct``, ``qwen/qwen2.5-7b``, ...)."""
    key = name.strip().rstrip("/").lower()
    out = [key, key.rsplit("/", 1)[-1]]
    for c in list(out):
        out += [c[: -len(suf)] for suf in suffixes if c.endswith(suf)]
    return out


_T = TypeVar("_T")


def _toml_file(p: Path, name_or_path: str, noun: str, load: Callable[[str], _T], error: type[GrpoTuneError]) -> _T:
    if not p.exists():
        raise error(f"no {noun} file {name_or_path}")
    return load(str(p.resolve()))


def _unknown(error: type[GrpoTuneError], noun: str, name_or_path: str, near: list[str], how: str) -> GrpoTuneError:
    return error(f"unknown {noun} {name_or_path!r}", hint=(f"close matches: {', '.join(near)}; " if near else "") + how)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name or alias (``7b``, ``qwen2.5-7b``), a HF id (``Qwen/Qwen2.5-7B-Instruct``: the preset holding
    it, or its base/instruct twin), a model TOML, a HF ``config.json`` or a local checkpoint folder holding one."""
    p = Path(os.path.expanduser(name_or_path))
    if name_or_path.endswith(".json") or p.is_dir():
        cfg = p / "config.json" if p.is_dir() else p
        if not cfg.exists():
            raise UnknownModelError(
                f"no config.json at {name_or_path}", hint="pass a Hugging Face config.json or a preset name"
            )
        return from_hf_config(cfg)
    if name_or_path.endswith(".toml"):
        return _toml_file(p, name_or_path, "model", _load_model_file, UnknownModelError)
    cat = catalog("models")
    key = name_or_path.lower()
    found = cat.get(key) or resolve_hf_id(name_or_path)
    if found is None:
        how = "see `grpo-tune models`, or pass a config.json or a checkpoint folder"
        raise _unknown(UnknownModelError, "model", name_or_path, close_matches(key.rsplit("/", 1)[-1], cat), how)
    return _load_model_file(str(found))


@lru_cache(maxsize=64)
def _load_hardware_file(path: str) -> HardwareSpec:
    data = _read_toml(Path(path), "hardware")
    eff = data.get("efficiency")
    moved = sorted(set(eff) & (STACK_KEYS | set(OLD_STACK_KEYS))) if isinstance(eff, dict) else []
    if moved:
        raise ConfigError(
            f"hardware file {path}: [efficiency] sets {', '.join(moved)}, which belong to the software stack",
            hint="move them to a profiles/stacks/*.toml (its [params] table; the engine's sleep and wake: its [engine] "
            "table) and choose it with --stack",
        )
    return HardwareSpec.from_dict(data, where=f"hardware file {path}")


def load_hardware(name_or_path: str, stack: str | None = None) -> HardwareSpec:
    """A hardware profile by name, alias or .toml path, priced under ``stack`` (None: the profile's
    default stack, else core.stacks.DEFAULT_STACK)."""
    hw = _load_hardware(name_or_path)
    if stack:
        hw = with_stack(hw, stack)
    return hw


def _load_hardware(name_or_path: str) -> HardwareSpec:
    p = Path(name_or_path)
    if name_or_path.endswith(".toml") or p.suffix == ".toml":
        return _toml_file(p, name_or_path, "hardware", _load_hardware_file, UnknownHardwareError)
    cat = catalog("hardware")
    key = name_or_path.lower()
    if key not in cat:
        how = "see `grpo-tune hardware`, or pass a profile .toml"
        raise _unknown(UnknownHardwareError, "hardware", name_or_path, close_matches(key, cat), how)
    return _load_hardware_file(str(cat[key]))


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json
# ---------------------------------------------------------------------------------------------

_HF_FAMILIES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}


def from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face ``config.json`` of the Llama, Qwen2, Qwen3, Qwen3-MoE or DeepSeek-V3 family."""
    path = Path(path)
    data = read_spec_bytes(path, "config.json")

    def no_constant(c: str) -> NoReturn:
        raise ValueError(f"{c} is not a JSON number")

    try:
        cfg = json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError:
        raise UnknownModelError(f"{path} is not a text file", hint="pass a Hugging Face config.json") from None
    except RecursionError:
        raise UnknownModelError(f"{path}: the JSON nests too deeply", hint="pass a Hugging Face config.json") from None
    except ValueError as exc:  # json.JSONDecodeError included
        raise UnknownModelError(f"{path}: not valid JSON ({exc})", hint="pass a Hugging Face config.json") from None
    if not isinstance(cfg, dict):
        raise UnknownModelError(
            f"{path}: a config.json is a JSON object, got {type(cfg).__name__}", hint="pass a Hugging Face config.json"
        )
    return spec_from_hf_dict(cfg, name=name or path.parent.name or path.stem, source=str(path))


def _hf_int(cfg: Mapping[str, object], where: str, key: str, default: object = KeyError, *, minimum: int = 1) -> int:
    """An integer field of config.json: 2.7, true or "4" are refused, never rounded or coerced; null is unset."""
    v = cfg.get(key)
    v = default if v is None else v
    if v is KeyError:
        raise KeyError(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(
            f"{where}: {key} = {v!r} must be an integer >= {minimum}",
            hint="fix config.json (a Hugging Face config has integers here)",
        )
    return v


def _hf_bool(cfg: Mapping[str, object], where: str, key: str, default: bool) -> bool:
    """A true/false field of config.json: "false" or 1 are refused (bool("false") is True)."""
    v = cfg.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: {key} = {v!r} must be true or false", hint="fix config.json")
    return v


def _hf_float(v: object) -> float:
    """``float(v)`` of a config.json value: a number or a numeric string; else the TypeError ``float`` raises."""
    if isinstance(v, (int, float, str)):
        return float(v)
    raise TypeError(f"float() argument must be a string or a real number, not {type(v).__name__!r}")


def spec_from_hf_dict(cfg: Mapping[str, object], *, name: str, source: str = "") -> ModelSpec:
    archs = cfg.get("architectures") or []
    if not isinstance(archs, Iterable):
        raise TypeError(f"{type(archs).__name__!r} object is not iterable")
    family = next((_HF_FAMILIES[a] for a in archs if a in _HF_FAMILIES), None)
    if family is None:
        mt = cfg.get("model_type", "")
        by_type = {
            "llama": "llama",
            "qwen2": "qwen2",
            "qwen3": "qwen3",
            "qwen3_moe": "qwen3_moe",
            "deepseek_v3": "deepseek_v3",
            "kimi_k2": "deepseek_v3",
        }
        family = by_type.get(mt) if isinstance(mt, str) else None
    if family is None:
        raise UnknownModelError(
            f"{source or name}: unsupported architecture {archs or cfg.get('model_type')}",
            hint="supported: " + ", ".join(sorted(_HF_FAMILIES)),
        )
    where = source or name
    try:
        heads = _hf_int(cfg, where, "num_attention_heads")
        hidden = _hf_int(cfg, where, "hidden_size")
        kv_heads = heads if cfg.get("num_key_value_heads") is None else _hf_int(cfg, where, "num_key_value_heads")
        if cfg.get("head_dim") is None and hidden % heads:
            raise ConfigError(
                f"{source or name}: hidden_size {hidden} is not a multiple of the {heads} heads "
                "and config.json gives no head_dim",
                hint="add head_dim to config.json",
            )
        kw: dict[str, object] = dict(
            name=name,
            family=family,
            layers=_hf_int(cfg, where, "num_hidden_layers"),
            hidden=hidden,
            ffn_hidden=_hf_int(cfg, where, "intermediate_size", 0, minimum=0),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=hidden // heads if cfg.get("head_dim") is None else _hf_int(cfg, where, "head_dim"),
            vocab=_hf_int(cfg, where, "vocab_size"),
            tied_embeddings=_hf_bool(cfg, where, "tie_word_embeddings", False),
            qkv_bias=_hf_bool(cfg, where, "attention_bias", family == "qwen2"),
            qk_norm=family in ("qwen3", "qwen3_moe"),
            norm_eps=_hf_float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_hf_float(cfg.get("rope_theta", 10000.0)),
            max_seq_len=_hf_int(cfg, where, "max_position_embeddings", 4096),
            source=source,
        )
        if family == "qwen2":
            kw["qkv_bias"] = True  # Qwen2 always has q/k/v biases; config.json does not say so
        if family == "qwen3_moe":
            kw.update(
                experts=_hf_int(cfg, where, "num_experts"),
                top_k=_hf_int(cfg, where, "num_experts_per_tok"),
                expert_ffn_hidden=_hf_int(cfg, where, "moe_intermediate_size"),
            )
            if cfg.get("mlp_only_layers") or _hf_int(cfg, where, "decoder_sparse_step", 1) != 1:
                raise UnknownModelError(f"{name}: interleaved dense/MoE layers are not supported")
        if family == "deepseek_v3":
            kw.update(
                experts=_hf_int(cfg, where, "n_routed_experts"),
                top_k=_hf_int(cfg, where, "num_experts_per_tok"),
                expert_ffn_hidden=_hf_int(cfg, where, "moe_intermediate_size"),
                shared_experts=_hf_int(cfg, where, "n_shared_experts", 0, minimum=0),
                dense_layers=_hf_int(cfg, where, "first_k_dense_replace", 0, minimum=0),
                router_bias=cfg.get("topk_method", "noaux_tc") == "noaux_tc",
                router_groups=_hf_int(cfg, where, "n_group", 0, minimum=0),
                router_group_topk=_hf_int(cfg, where, "topk_group", 0, minimum=0),
                routed_scaling=_hf_float(cfg.get("routed_scaling_factor") or 1.0),
                q_lora_rank=_hf_int(cfg, where, "q_lora_rank", 0, minimum=0),
                kv_lora_rank=_hf_int(cfg, where, "kv_lora_rank"),
                qk_nope_head_dim=_hf_int(cfg, where, "qk_nope_head_dim"),
                qk_rope_head_dim=_hf_int(cfg, where, "qk_rope_head_dim"),
                v_head_dim=_hf_int(cfg, where, "v_head_dim"),
                mtp_layers=_hf_int(cfg, where, "num_nextn_predict_layers", 0, minimum=0),
                head_dim=_hf_int(cfg, where, "qk_nope_head_dim") + _hf_int(cfg, where, "qk_rope_head_dim"),
                kv_heads=heads,
            )
    except KeyError as exc:
        raise UnknownModelError(f"{source or name}: config.json lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise UnknownModelError(f"{source or name}: bad value in config.json ({exc})") from None
    return ModelSpec.from_dict(kw, where=f"model {name}")
