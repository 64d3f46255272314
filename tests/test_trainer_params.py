"""The real per-rank parameter count of the megatron model equals the cost model's prediction.

Each rank reports the numel of the parameters it holds (all its virtual-pipeline chunks);
costmodel.params.per_stage_params gives the per-rank count of each pipeline stage.
"""
import pytest

from costmodel.params import per_stage_params, total_params
from costmodel.specs import load_model
from costmodel.strategy import Strategy, validate
from trainer_harness import torchrun_json

pytestmark = pytest.mark.slow

TWO = [
    {"model": "tiny", "strategy": {}},
    {"model": "tiny", "strategy": {"tp": 2}},
    {"model": "tiny", "strategy": {"pp": 2}},
    {"model": "tiny", "strategy": {"pp": 2, "vpp": 2}},
    {"model": "tiny", "strategy": {"pp": 2, "first_stage_layers": 1}},
    {"model": "tiny-moe", "strategy": {"ep": 2}},
    {"model": "tiny-moe", "strategy": {"pp": 2}},
]
FOUR = [
    {"model": "tiny", "strategy": {"tp": 2, "pp": 2}},
    {"model": "tiny", "strategy": {"pp": 4}},
    {"model": "tiny", "strategy": {"tp": 2}},  # with dp=2
    {"model": "tiny-moe", "strategy": {"tp": 2, "ep": 2}},
    {"model": "tiny-moe", "strategy": {"ep": 4, "etp": 1}},
]


def _check(nproc, layouts):
    res = torchrun_json("layouts", nproc=nproc, spec={"layouts": layouts, "steps": 0}, timeout=240)["results"]
    assert len(res) == len(layouts)
    for r in res:
        m = load_model(r["model"])
        s = validate(m, Strategy.from_dict(r["strategy"]), nproc)
        stages = per_stage_params(m, s)
        for count, coord in zip(r["param_counts"], r["coords"]):
            assert count == stages[coord["pp_rank"]].total, (r["model"], r["strategy"], coord, count,
                                                              [p.total for p in stages])
        if s.pp == 1 and s.tp == 1 and s.ep == 1:
            assert r["param_counts"][0] == total_params(m)


def test_param_counts_two_processes():
    _check(2, TWO)


def test_param_counts_four_processes():
    _check(4, FOUR)
