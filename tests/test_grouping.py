"""search's top table: one row per layout, its best variant, and how many variants are within the model's error."""

from __future__ import annotations

import json

from grpo_tune.autotune.search.grouping import group_by_layout, layout_key
from grpo_tune.autotune.search.driver import search
from grpo_tune.costmodel.results import step_s
from grpo_tune.cli.main import main
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Workload


def test_rows_are_distinct_layouts_with_their_best_variant():
    res = search(load_model("7b"), load_hardware("h100"), Cluster(gpus=8, gpus_per_node=8), Workload(), top=10)
    rows = group_by_layout(res.ranked, rel_error=0.05)
    keys = [layout_key(r.best.strategy) for r in rows]
    assert len(keys) == len(set(keys)) > 1
    assert rows[0].best is res.ranked[0]
    for r in rows:
        same = [e for e in res.ranked if layout_key(e.strategy) == layout_key(r.best.strategy)]
        assert r.variants == len(same) and same[0] is r.best  # the layout's first in search's order
        assert 1 <= r.within_error <= r.variants
        assert r.within_error == sum(step_s(e) <= step_s(r.best) * 1.05 for e in same)
    # the full list's top 10 is (nearly) one layout; the grouped table is not
    assert len({layout_key(e.strategy) for e in res.ranked[:10]}) < len(rows[:10])


def test_cli_groups_by_default_and_all_keeps_the_list(capsys):
    assert main(["search", "--model", "7b", "--gpus", "8", "--top", "5", "--no-emit", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lays = [tuple(sorted(r["layout"].items())) for r in out["layouts"]]
    assert len(lays) == len(set(lays)) and len(out["top"]) == 5
    assert main(["search", "--model", "7b", "--gpus", "8", "--top", "5", "--no-emit"]) == 0
    text = capsys.readouterr().out
    assert "one row per layout" in text and "--all" in " ".join(text.split())
    assert main(["search", "--model", "7b", "--gpus", "8", "--top", "5", "--no-emit", "--all"]) == 0
    text = capsys.readouterr().out
    assert "Top plans" in text and "one row per layout" not in text
