"""``grpo-tune tune`` on a NeMo-RL recipe: price it, search the same workload for plans NeMo-RL runs, re-read
each candidate from the edited recipe and price it again, and hand back only the keys that change.

The search, the pins and the choice are tune's (:mod:`grpo_tune.autotune.tune`); this module supplies what is
NeMo-RL's: the keys a strategy writes (:mod:`.table`), the edited recipe as NeMo-RL would read it, and
``tuned.yaml``: ``defaults:`` naming the user's recipe (NeMo-RL's own inheritance), the CLI overrides the
user gave, and the changed keys, nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import yaml

from grpo_tune.core.knobs import names
from grpo_tune.core.errors import ConfigError, GrpoTuneError
from grpo_tune.core.strategy import Strategy

from . import read
from . import recipe as R
from . import snapshot as snap
from . import table as T

SEARCHED_EXTRA = ("recompute_layers",)


def keys_for(s: Strategy, model) -> dict[str, Any]:
    """NeMo-RL key -> value that makes the recipe run ``s``, for the fields tune changes."""
    from grpo_tune.autotune.tune import SEARCHED

    plan = {"strategy": s}
    out: dict[str, Any] = {}
    for row in T.rows(T.S):
        if row.write is None or row.field not in (*SEARCHED, *SEARCHED_EXTRA):
            continue
        if row.field == "etp" and not model.is_moe:
            continue
        out.update(row.write(plan))
    return out


class Edited:
    """The recipe's resolved values with ``new`` applied (what NeMo-RL reads from tuned.yaml)."""

    def __init__(self, r: R.Recipe, new: dict[str, Any]):
        self.r, self.new = r, new
        self.values = r.own
        self.path = r.path

    def get(self, key: str) -> Any:
        if key in self.new:
            return self.new[key]
        if key == f"{T.P}.make_sequence_length_divisible_by" and f"{T.MEG}.tensor_model_parallel_size" in self.new:
            return self.new[f"{T.MEG}.tensor_model_parallel_size"]
        return self.r.get(key)


def tune_recipe(
    plan,
    *,
    keep: Sequence[str] = (),
    calibration: dict[str, float] | None = None,
    min_headroom: float = 0.05,
    top: int = 10,
    pins: dict[str, Any] | None = None,
):
    """tune()'s result for a NeMo-RL recipe (``plan.launch`` is the :class:`~.recipe.Recipe`)."""
    from grpo_tune.autotune import tune as TU
    from grpo_tune.autotune.search.rank import rank_key
    from grpo_tune.costmodel.estimate import estimate

    def price(s: Strategy):
        return estimate(
            model=plan.model,
            hardware=plan.hardware,
            cluster=plan.cluster,
            strategy=s,
            workload=plan.workload,
            calibration=calibration,
        )

    r: R.Recipe = plan.launch
    cur = price(plan.strategy)
    all_pins, extra = TU._tune_pins(plan, keep, pins)
    all_pins.update({k: v for k, v in T.CONSTRAINTS.items()})
    ranked, stats = TU._tune_search(plan, all_pins, top, calibration, min_headroom)
    user = {k: plan.strategy.knob(k) for k in names(tune=("user", "reapply"))}
    candidates = []
    for est in ranked:
        new = keys_for(est.strategy.replace(**user), plan.model)
        edited = Edited(r, new)
        try:
            s_new = read.strategy_of(edited, plan.model, plan.cluster.gpus, plan.cluster.gpus_per_node)  # type: ignore[arg-type]
            e = price(s_new)
        except GrpoTuneError:
            continue
        if TU._fits(e) and TU._headroom_ok(e, min_headroom):
            candidates.append((e, new))
    candidates.sort(key=lambda t: rank_key(t[0]))
    best, changes = TU._choose(plan, r, cur, candidates, extra)  # type: ignore[arg-type]
    nearest = _nearest(keys_for(plan.strategy, plan.model), candidates) if not TU._fits(cur) else []
    return TU.TuneResult(
        plan=plan,
        current=cur,
        best=best,
        changes=changes,
        ranked=[e for e, _ in candidates[:top]],
        nearest_fit=nearest,
        search_stats=stats,
        pins=all_pins,
    )


def _nearest(cur_keys: dict[str, Any], candidates: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
    """Plans that fit, nearest to the current one: fewest changed keys, then fastest (at most 3)."""
    from grpo_tune.autotune.search.rank import step_s
    from grpo_tune.autotune.tune import _same

    scored = [(sum(not _same(cur_keys.get(k), v) for k, v in new.items()), step_s(e), e) for e, new in candidates]
    out: list[Any] = []
    seen: set[str] = set()
    for _, _, e in sorted(scored, key=lambda t: (t[0], t[1])):
        key = repr(sorted(e.strategy.to_dict().items()))
        if key not in seen and len(out) < 3:
            seen.add(key)
            out.append(e)
    return out


def tuned_text(r: R.Recipe, changes: dict[str, tuple[Any, Any]], out_dir: str | os.PathLike) -> str:
    """``tuned.yaml`` for ``out_dir``: the user's recipe as ``defaults``, their CLI overrides, the changed keys."""
    src, here = Path(r.path).resolve(), Path(out_dir).resolve()
    # relative when both share a folder below the root (the pair can move together), else absolute
    rel = str(src) if os.path.commonpath([src, here]) == os.sep else os.path.relpath(src, here)
    values: dict[str, Any] = {}
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
