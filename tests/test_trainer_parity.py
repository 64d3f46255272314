"""Parity: the same seed and data give the same losses under every layout (real torchrun, CPU).

Weights start from a layout-free init (each full tensor drawn from its own seed, then sharded),
so the single-process run is the reference. Tolerance: 1e-5 absolute on losses of ~4.9 in fp32
(issue 5's bar); measured differences are ~1e-7 (reduction order only).
"""
import math

import pytest

from trainer_harness import torchrun_json

pytestmark = pytest.mark.slow

STEPS = 3
TOL = 1e-5

BASE = [{"model": "tiny", "strategy": {}}, {"model": "tiny-moe", "strategy": {}}]
TWO = [
    {"model": "tiny", "strategy": {"tp": 2}},
    {"model": "tiny", "strategy": {"pp": 2}},
    {"model": "tiny", "strategy": {}},  # dp=2
    {"model": "tiny", "strategy": {"pp": 2, "vpp": 2}},
    {"model": "tiny-moe", "strategy": {"ep": 2}},
]
FOUR = [
    {"model": "tiny", "strategy": {"tp": 2, "pp": 2}},
    {"model": "tiny-moe", "strategy": {"tp": 2, "ep": 2}},  # expert TP 2 + sequence parallel
]


def _run(nproc, layouts):
    return torchrun_json("layouts", nproc=nproc, spec={"layouts": layouts, "steps": STEPS, "generate": 6}, timeout=240)["results"]


@pytest.fixture(scope="module")
def reference():
    res = _run(1, BASE)
    return {r["model"]: r for r in res}


def _check(ref, r):
    assert len(r["losses"]) == STEPS
    for a, b in zip(ref["losses"], r["losses"]):
        assert math.isfinite(b)
        assert abs(a - b) < TOL, (r["strategy"], ref["losses"], r["losses"])
    assert abs(ref["logprob_sum"] - r["logprob_sum"]) < TOL * abs(ref["logprob_sum"])
    # the native megatron sampler draws the same tokens under every layout (same seed)
    assert r["responses"] == ref["responses"], (r["strategy"], ref["responses"], r["responses"])
    for a, b in zip(ref["grad_norms"], r["grad_norms"]):
        assert abs(a - b) < 1e-4 * a, (r["strategy"], ref["grad_norms"], r["grad_norms"])


def test_reference_learns(reference):
    # The reference itself must be a real run: the loss falls over the steps on fixed data.
    for r in reference.values():
        assert r["losses"][-1] < r["losses"][0] - 0.1, r["losses"]
        assert len(r["responses"]) == 5 and all(1 <= len(x) <= 6 for x in r["responses"])


def test_parity_two_processes(reference):
    """TP2, PP2, DP2, PP2xVPP2 (tiny) and EP2 (tiny-moe) against the single-process run."""
    for r in _run(2, TWO):
        _check(reference[r["model"]], r)


def test_parity_four_processes(reference):
    """TP2xPP2 (tiny) and TP2xEP2 with expert TP and SP (tiny-moe)."""
    for r in _run(4, FOUR):
        _check(reference[r["model"]], r)
