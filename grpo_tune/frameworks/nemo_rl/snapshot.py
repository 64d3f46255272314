"""NeMo-RL's config key tree at the pinned release, shipped as data (``data/nemo-rl-<release>-keys.json``).

NeMo-RL is not a dependency. Its GRPO recipes are YAML files that inherit, through ``defaults:``, from
``examples/configs/grpo_math_1B.yaml`` (every ``recipes/llm/performance/*.yaml`` does), and its schema is a
set of TypedDicts (``nemo_rl/models/policy/__init__.py``, ``nemo_rl/models/generation/{interfaces,vllm/config}.py``,
``nemo_rl/algorithms/grpo.py``, ``nemo_rl/distributed/virtual_cluster.py``). The snapshot holds:

- ``keys``: the base config flattened, dotted key -> its default as the file writes it (interpolations such
  as ``${policy.max_total_sequence_length}`` kept as text, so that the base can be rebuilt and resolved the
  way NeMo-RL resolves it);
- ``declared``: every key the TypedDicts declare for the sections grpo-tune writes (``NotRequired`` ones
  included: ``policy.megatron_cfg.moe_grouped_gemm`` is declared but absent from the base file);
- ``open``: sections NeMo-RL forwards as free-form mappings (``policy.generation.vllm_kwargs`` goes to
  ``vllm.LLM(**kwargs)``).

``python -m grpo_tune.frameworks.nemo_rl.snapshot --write CHECKOUT`` rebuilds it from a NeMo-RL checkout of the
release (``git archive`` of the tag is enough).
"""

from __future__ import annotations

import ast
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import TypedDict

RELEASE = "0.7.0"
TAG = f"v{RELEASE}"
COMMIT = "81aa43dda4765b0429cf31dab44441e4e4383911"
"""The commit NVIDIA-NeMo/RL's tag v0.7.0 points at (released 2026-07-29)."""
REPO = "NVIDIA-NeMo/RL"
BASE_CONFIG = "examples/configs/grpo_math_1B.yaml"
DATA_DIR = Path(__file__).resolve().parent / "data"
SNAPSHOT = DATA_DIR / f"nemo-rl-{RELEASE}-keys.json"

# dotted section -> (source file, TypedDict class) whose fields are declared keys of that section
SCHEMA: dict[str, tuple[str, str]] = {
    "grpo": ("nemo_rl/algorithms/grpo.py", "GRPOConfig"),
    "grpo.async_grpo": ("nemo_rl/algorithms/grpo.py", "AsyncGRPOConfig"),
    "policy": ("nemo_rl/models/policy/__init__.py", "PolicyConfig"),
    "policy.megatron_cfg": ("nemo_rl/models/policy/__init__.py", "MegatronConfig"),
    "policy.megatron_cfg.optimizer": ("nemo_rl/models/policy/__init__.py", "MegatronOptimizerConfig"),
    "policy.megatron_cfg.scheduler": ("nemo_rl/models/policy/__init__.py", "MegatronSchedulerConfig"),
    "policy.megatron_cfg.distributed_data_parallel_config": ("nemo_rl/models/policy/__init__.py", "MegatronDDPConfig"),
    "policy.megatron_cfg.fp8_cfg": ("nemo_rl/models/policy/__init__.py", "Fp8Config"),
    "policy.sequence_packing": ("nemo_rl/models/policy/__init__.py", "SequencePackingConfig"),
    "policy.dynamic_batching": ("nemo_rl/models/policy/__init__.py", "DynamicBatchingConfig"),
    "policy.generation": ("nemo_rl/models/generation/interfaces.py", "GenerationConfig"),
    "policy.generation.colocated": ("nemo_rl/models/generation/interfaces.py", "ColocationConfig"),
    "policy.generation.colocated.resources": ("nemo_rl/models/generation/interfaces.py", "OptionalResourcesConfig"),
    "policy.generation.vllm_cfg": ("nemo_rl/models/generation/vllm/config.py", "VllmSpecificArgs"),
    "cluster": ("nemo_rl/distributed/virtual_cluster.py", "ClusterConfig"),
}
EXTRA_FIELDS: dict[str, tuple[str, str, str]] = {
    # VllmConfig(GenerationConfig) adds these to policy.generation
    "policy.generation": ("nemo_rl/models/generation/vllm/config.py", "VllmConfig", ""),
}
READ_BY_CODE: dict[str, str] = {
    # keys NeMo-RL's code reads with .get() that no TypedDict declares (checked in the file at build time)
    "policy.sequence_packing.fuse_loss": "nemo_rl/models/megatron/train.py",
}
OPEN = (
    "policy.generation.vllm_kwargs",
    "policy.megatron_cfg.env_vars",
    "policy.hf_config_overrides",
    "logger",
    "data",
    "env",
    "checkpointing",
)


def _typed_fields(source: str, cls: str) -> list[str]:
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    raise KeyError(f"no class {cls}")


class Snapshot(TypedDict):
    """The shipped snapshot file: the base config's dotted keys and the TypedDict fields NeMo-RL declares."""

    source: str
    release: str
    commit: str
    base_config: str
    keys: dict[str, object]
    declared: dict[str, list[str]]
    open: list[str]


def flatten(tree: object, prefix: str = "") -> dict[str, object]:
    """Dotted key -> leaf. Empty mappings stay leaves (``{}``); lists are leaves."""
    out: dict[str, object] = {}
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = tree
    return out


def unflatten(flat: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, v in flat.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            assert isinstance(child, dict), f"{key}: {p} is a value, not a section"
            node = child
        node[parts[-1]] = v
    return out


def build(checkout: Path) -> Snapshot:
    from omegaconf import OmegaConf

    # OmegaConf's YAML reading, as NeMo-RL's load_config reads it (1e-8 is a float there, not a string)
    base = OmegaConf.to_container(OmegaConf.load(checkout / BASE_CONFIG), resolve=False)
    declared: dict[str, list[str]] = {}
    for section, (src, cls) in SCHEMA.items():
        declared[section] = _typed_fields((checkout / src).read_text(), cls)
    for section, (src, cls, _) in EXTRA_FIELDS.items():
        declared[section] += [f for f in _typed_fields((checkout / src).read_text(), cls) if f not in declared[section]]
    for key, src in READ_BY_CODE.items():
        if f'"{key.rsplit(".", 1)[-1]}"' not in (checkout / src).read_text():
            raise KeyError(f"{src} no longer reads {key}")
        sec, _, name = key.rpartition(".")
        declared.setdefault(sec, []).append(name)
    return {
        "source": f"{REPO}@{TAG} ({COMMIT}): {BASE_CONFIG} flattened (values as written, interpolations kept); "
        "TypedDict fields of " + ", ".join(sorted({f"{s}:{c}" for s, c in SCHEMA.values()})),
        "release": RELEASE,
        "commit": COMMIT,
        "base_config": BASE_CONFIG,
        "keys": flatten(base),
        "declared": {k: sorted(v) for k, v in declared.items()},
        "open": list(OPEN),
    }


@lru_cache(maxsize=1)
def data() -> Snapshot:
    loaded: Snapshot = json.loads(SNAPSHOT.read_text())
    return loaded


def keys() -> dict[str, object]:
    """The base config's dotted keys -> default as written."""
    return data()["keys"]


def base_tree() -> dict[str, object]:
    """The base config (grpo_math_1B.yaml) rebuilt from the snapshot: the mapping NeMo-RL's ``defaults:`` loads."""
    return unflatten(keys())


@lru_cache(maxsize=1)
def _declared() -> frozenset[str]:
    d = data()["declared"]
    return frozenset(f"{sec}.{f}" for sec, fields in d.items() for f in fields)


@lru_cache(maxsize=1)
def _parents() -> frozenset[str]:
    names = set(keys()) | _declared()
    return frozenset(k.rsplit(".", i)[0] for k in names for i in range(1, k.count(".") + 1))


def key_status(key: str) -> str:
    """``base`` (in the base config), ``declared`` (a TypedDict field), ``open`` (under a free-form section),
    ``parent`` (a section name) or ``unknown``."""
    if key in keys():
        return "base"
    if key in _declared():
        return "declared"
    if any(key == p or key.startswith(p + ".") for p in data()["open"]):
        return "open"
    if key in _parents():
        return "parent"
    return "unknown"


def leaf_names() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k in sorted(set(keys()) | _declared()):
        out.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--write":
        print("usage: python -m grpo_tune.frameworks.nemo_rl.snapshot --write NEMO_RL_CHECKOUT", file=sys.stderr)
        return 2
    doc = build(Path(argv[1]))
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    print(SNAPSHOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
