"""One row per distinct layout for search's top table: its best variant, and how many variants are as good
within the cost model's error.

Without it the top 10 for 7B on 8 x H100 are one `tp1 pp1 dp8` layout with the vLLM memory fraction or the
micro-batch varied, all within a fraction of a percent: the table says nothing the first row does not.
Grouping works on the exactly evaluated plans the search returns (its ranked list), so a layout appears
when at least one of its variants was evaluated exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from grpo_tune.core.strategy import layout_key
from grpo_tune.core.strategy import layout_of as layout
from grpo_tune.costmodel.results import Estimate

MODEL_REL_ERROR = 0.05
"""The cost model's relative error on step time: `grpo-tune validate` gives a 4.4% MAPE on published
Megatron-LM runs (README, "Measured figures"); plans closer than this cannot be told apart."""


@dataclass(frozen=True)
class LayoutRow:
    layout: dict[str, int | None]
    """The row's layout (:func:`layout` of its plans' strategies)."""
    variants: int
    """Plans of this layout among those ranked."""
    within_error: int
    """Of those, how many are within ``rel_error`` of the layout's best step time (the best included)."""
    best: Estimate
    """The layout's best plan."""

    def to_dict(self) -> dict[str, object]:
        """The fields in order, the best plan as its own dict."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "best": self.best.to_dict()}


def group_by_layout(ranked: Sequence[Estimate], rel_error: float = MODEL_REL_ERROR) -> list[LayoutRow]:
    """``ranked`` (best first) grouped by layout, in the order of each layout's best plan."""
    from grpo_tune.costmodel.results import step_s

    groups: dict[tuple[int | None, ...], list[Estimate]] = {}
    for est in ranked:
        groups.setdefault(layout_key(est.strategy), []).append(est)
    rows = []
    for plans in groups.values():
        best = plans[0]
        limit = step_s(best) * (1.0 + rel_error)
        within = sum(1 for e in plans if step_s(e) <= limit)
        rows.append(LayoutRow(layout=layout(best.strategy), best=best, variants=len(plans), within_error=within))
    return rows


def caption(rows: Sequence[LayoutRow], rel_error: float = MODEL_REL_ERROR) -> str:
    """One line: variants within the model's error per row."""
    parts = [f"#{i + 1} {r.within_error}/{r.variants}" for i, r in enumerate(rows)]
    return (
        f"variants within {rel_error:.0%} of each layout's best (of those evaluated exactly): "
        + ", ".join(parts)
        + "; --all lists every plan"
    )
