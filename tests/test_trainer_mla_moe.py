"""MLA + DeepSeek-style MoE (tiny-mla-moe: low-rank query, shared expert, one dense first layer,
sigmoid routing with an expert bias, group-limited top-k) under TP2, PP2 and EP2: the same losses,
log-probs, grad norms and sampled tokens as one process (real torchrun, CPU, fp32, 1e-5), and
each rank's parameter count equal to ``costmodel.params.per_stage_params``.

The router's expert bias counts as a parameter on both sides (megatron keeps it as a buffer; it
is a tensor of the HF checkpoint, which the cost model counts)."""
import math

import pytest

from core.specs import load_model
from core.strategy import Strategy, validate
from costmodel.params import per_stage_params, total_params
from trainer_harness import torchrun_json

pytestmark = pytest.mark.slow

STEPS, TOL = 3, 1e-5
MODEL = "tiny-mla-moe"
TWO = [{"model": MODEL, "strategy": {"tp": 2}}, {"model": MODEL, "strategy": {"pp": 2}},
       {"model": MODEL, "strategy": {"ep": 2}}]


def _run(nproc, layouts):
    return torchrun_json("layouts", nproc=nproc, spec={"layouts": layouts, "steps": STEPS, "generate": 6},
                         timeout=400)["results"]


@pytest.fixture(scope="module")
def reference():
    return _run(1, [{"model": MODEL, "strategy": {}}])[0]


def test_reference_learns_and_counts(reference):
    assert reference["losses"][-1] < reference["losses"][0] - 0.1, reference["losses"]
    assert reference["param_counts"] == [total_params(load_model(MODEL))]


def test_mla_moe_parity_and_param_counts_two_processes(reference):
    m = load_model(MODEL)
    for r in _run(2, TWO):
        for a, b in zip(reference["losses"], r["losses"]):
            assert math.isfinite(b) and abs(a - b) < TOL, (r["strategy"], reference["losses"], r["losses"])
        assert abs(reference["logprob_sum"] - r["logprob_sum"]) < TOL * abs(reference["logprob_sum"])
        assert r["responses"] == reference["responses"], r["strategy"]
        for a, b in zip(reference["grad_norms"], r["grad_norms"]):
            assert abs(a - b) < 1e-4 * a, (r["strategy"], reference["grad_norms"], r["grad_norms"])
        stages = per_stage_params(m, validate(m, Strategy.from_dict(r["strategy"]), 2))
        for count, coord in zip(r["param_counts"], r["coords"]):
            assert count == stages[coord["pp_rank"]].total, (r["strategy"], coord, count, [p.total for p in stages])
