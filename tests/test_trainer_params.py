"""The real per-rank parameter count of the megatron model equals the cost model's prediction.

Each rank reports the numel of the parameters it holds (all its virtual-pipeline chunks);
costmodel.params.per_stage_params gives the per-rank count of each pipeline stage.
"""

import dataclasses

import pytest

from grpo_tune.costmodel.params import per_stage_params, total_params
from grpo_tune.core.specs import load_model
from grpo_tune.core.strategy import Strategy, validate
from test_trainer_parity import BASE, FOUR, TWO, run_layouts

pytestmark = pytest.mark.slow


def _check(nproc, layouts):
    res = run_layouts(nproc, layouts)  # the parity launch: the counts belong to the runs that trained
    assert len(res) == len(layouts)
    for r in res:
        m = dataclasses.replace(load_model(r["model"]), **(r.get("overrides") or {}))
        s = validate(m, Strategy.from_dict(r["strategy"]), nproc)
        stages = per_stage_params(m, s)
        for count, coord in zip(r["param_counts"], r["coords"]):
            assert count == stages[coord["pp_rank"]].total, (
                r["model"],
                r["strategy"],
                coord,
                count,
                [p.total for p in stages],
            )
        if s.layout.pp == 1 and s.layout.tp == 1 and s.layout.ep == 1:
            assert r["param_counts"][0] == total_params(m)


def test_param_counts_two_processes():
    _check(2, TWO)


def test_param_counts_four_processes():
    _check(4, FOUR)


def test_param_counts_single_process():
    _check(1, BASE)
