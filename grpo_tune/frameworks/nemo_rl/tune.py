"""``grpo-tune tune`` on a NeMo-RL recipe: price it, search the same workload for plans NeMo-RL runs, re-read
each candidate from the edited recipe and price it again, and hand back only the keys that change.

The search, the pins and the choice are tune's (:mod:`grpo_tune.autotune.tune`, through the framework contract);
this module supplies what is NeMo-RL's: the keys a strategy writes (:mod:`.table`), the edited recipe as NeMo-RL
would read it, and ``tuned.yaml``: ``defaults:`` naming the user's recipe (NeMo-RL's own inheritance), the CLI
overrides the user gave, and the changed keys, nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Mapping

import yaml

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import ModelSpec
from grpo_tune.core.strategy import Strategy
from grpo_tune.frameworks.base.plan import SEARCHED
from grpo_tune.frameworks.base.sections import Sections

from . import recipe as R
from . import snapshot as snap
from . import table as T

SEARCHED_EXTRA = ("recompute_layers",)


def keys_for(s: Strategy, model: ModelSpec) -> dict[str, object]:
    """NeMo-RL key -> value that makes the recipe run ``s``, for the fields tune changes."""
    sections: Sections = {"strategy": s}
    out: dict[str, object] = {}
    for row in T.rows(T.S):
        if row.write is None or row.field not in (*SEARCHED, *SEARCHED_EXTRA):
            continue
        if row.field == "etp" and not model.is_moe:
            continue
        out.update(row.write(sections))
    return out


class Edited:
    """The recipe's resolved values with ``new`` applied (what NeMo-RL reads from tuned.yaml)."""

    def __init__(self, r: R.Recipe, new: dict[str, object]):
        self.r, self.new = r, new
        self.values = r.own
        self.path = r.path

    def get(self, key: str) -> object:
        if key in self.new:
            return self.new[key]
        if key == f"{T.P}.make_sequence_length_divisible_by" and f"{T.MEG}.tensor_model_parallel_size" in self.new:
            return self.new[f"{T.MEG}.tensor_model_parallel_size"]
        return self.r.get(key)


def tuned_text(r: R.Recipe, changes: Mapping[str, tuple[object, object]], out_dir: str | os.PathLike) -> str:
    """``tuned.yaml`` for ``out_dir``: the user's recipe as ``defaults``, their CLI overrides, the changed keys."""
    src, here = Path(r.path).resolve(), Path(out_dir).resolve()
    # relative when both share a folder below the root (the pair can move together), else absolute
    rel = str(src) if os.path.commonpath([src, here]) == os.sep else os.path.relpath(src, here)
    values: dict[str, object] = {}
    for o in r.overrides:
        tok = o.strip()
        if tok.startswith("~"):
            raise ConfigError(
                f"override {o!r} deletes a key: tuned.yaml inherits from the recipe and cannot delete",
                hint="delete the key in the recipe itself",
            )
        key, _, _ = tok.lstrip("+").partition("=")
        values[key] = r.own.get(key)
    values.update({k: new for k, (_old, new) in changes.items()})
    head = [
        f"# grpo-tune tune: {Path(r.path).name} with the keys that change (NeMo-RL {snap.RELEASE} inheritance:",
        "# defaults names the recipe, relative to this file). Check it: grpo-tune diagnose THIS_FILE",
    ]
    tree = snap.unflatten(values)
    return "\n".join(head) + "\n" + yaml.safe_dump({"defaults": rel, **tree}, sort_keys=False, width=1000)


def priced_keys() -> frozenset[str]:
    """Every NeMo-RL key tune may change: the keys the table writes for the searched plan fields, and the
    placement's (the generation pool, the staleness, what async GRPO asserts). Any other key of the user's
    recipe is left as is (tests/test_tune_contract.py)."""
    keys = {k.lstrip("+") for r in T.rows(T.S) if r.field in (*SEARCHED, *SEARCHED_EXTRA) for k in r.keys}
    return frozenset(keys | set(T.PLACEMENT_KEYS))
