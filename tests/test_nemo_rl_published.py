"""The NeMo-RL blog rows of profiles/data/published_grpo.csv are priced through the exported recipe: the row's
plan is written as nemo_rl.yaml, read back as NeMo-RL reads it, and that plan is what validate --grpo scores."""

from __future__ import annotations

import pytest

from grpo_tune.validate import grpo as V
from grpo_tune.core.strategy import validate
from grpo_tune.costmodel.estimate import estimate
from grpo_tune.frameworks.nemo_rl import table

ROWS = [
    r
    for r in V.load_grpo_rows()
    if r.raw["framework"] == "nemo-rl" and r.raw["backend"] == "megatron" and not V._separate(r)
]
"""The colocated rows (the separate-pool refit rows are read back on their training pool:
tests/test_reshard_refit.py)."""


def test_there_are_nemo_rl_rows_scored():
    assert sum(V._scored(r) for r in ROWS) >= 4


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_row_is_scored_on_its_recipe_read_back(row, monkeypatch):
    m, hw, c, via, wl_via = V.plan(row)
    monkeypatch.setattr(V, "_via_framework", lambda rid, fw, m, c, s, wl, place=None: (s, wl))
    _, _, _, direct, wl = V.plan(row)
    direct = validate(m, direct, c.gpus, gpus_per_node=c.gpus_per_node, allow_cross_node_tp=True)
    # what NeMo-RL's colocated recipe can say is what is scored
    fixed = table.canonical({"strategy": direct, "workload": wl, "trainer": _t(), "cluster": c})["strategy"]
    assert via.replace(etp=via.layout.etp_) == fixed  # a dense model's expert TP is its TP
    assert wl_via == wl
    if V._scored(row):
        # the blog rows already price NeMo-RL's colocated offload: the recipe changes none of their numbers
        assert via.replace(etp=via.layout.etp_) == direct.replace(etp=direct.layout.etp_)
        a = estimate(model=m, hardware=hw, cluster=c, strategy=via, workload=wl_via).time.step_s
        b = estimate(model=m, hardware=hw, cluster=c, strategy=direct, workload=wl).time.step_s
        assert a == b


def _t():
    from grpo_tune.core.config import TrainerOptions

    return TrainerOptions()
