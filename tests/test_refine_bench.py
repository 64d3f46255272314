"""benchmarks/bench_refine.py's arithmetic and cache format (the benchmark itself is not a test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_refine", ROOT / "benchmarks" / "bench_refine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cache(bench, runs: dict[str, list[float | None]]) -> dict:
    plans = {
        k: {
            "strategy": {},
            "predicted_step_s": 1.0,
            "runs": [
                {"status": "ok" if s else "error", "step_s": s, "tokens_per_s": 100 / s if s else None} for s in v
            ],
        }
        for k, v in runs.items()
    }
    return {"version": bench.CACHE_VERSION, "meta": {"steps": 6, "repeats": 3}, "plans": plans}


def test_regret_and_summary_by_hand(bench):
    assert bench.regret(1.05, 1.0) == pytest.approx(1.05)
    # seeds choose plans with regret 1.0, 1.04, 1.05 (exactly 5%: within) and 1.2
    s = bench.summarize([1.0, 1.04, 1.05, 1.2])
    assert s["mean"] == pytest.approx((1.0 + 1.04 + 1.05 + 1.2) / 4)
    assert s["median"] == pytest.approx(1.045)
    assert s["p_within"] == pytest.approx(3 / 4)
    assert s["n"] == 4


def test_truth_is_the_median_of_ok_runs_with_its_spread(bench):
    c = _cache(bench, {"a": [1.0, 1.2, 1.1], "b": [0.5, None, 0.6], "c": [None]})
    tr = bench.truth(c)
    assert set(tr) == {"a", "b"}  # a plan without an ok run has no truth
    assert tr["a"]["median_s"] == pytest.approx(1.1) and tr["a"]["spread"] == pytest.approx(0.2 / 1.1)
    assert tr["b"]["median_s"] == pytest.approx(0.55) and tr["b"]["n"] == 2
    assert tr["a"]["true_s"] == tr["a"]["median_s"]  # the default truth is the median
    nz = bench.noise_summary(c)
    assert nz["runs"] == 5 and nz["spread_max"] == pytest.approx(0.1 / 0.55)


def test_truth_min_is_the_fastest_repeat(bench):
    c = _cache(bench, {"a": [1.0, 1.2, 1.1], "b": [0.5, None, 0.6]})
    tr = bench.truth(c, "min")
    assert tr["a"]["true_s"] == pytest.approx(1.0) and tr["b"]["true_s"] == pytest.approx(0.5)
    assert tr["a"]["median_s"] == pytest.approx(1.1)  # the median is still reported


def test_cache_round_trip_and_resume_order(bench, tmp_path):
    c = _cache(bench, {"a": [1.0], "b": []})
    p = tmp_path / "cache.json"
    bench.save_cache(p, c)
    assert bench.load_cache(p) == c
    doc = json.loads(p.read_text())
    assert doc["version"] == bench.CACHE_VERSION and set(doc["plans"]["a"]["runs"][0]) >= {"status", "step_s"}
    # round-robin: every plan once before any plan twice; a partly filled cache skips what it holds
    order = bench.schedule(["a", "b"], 2)
    assert sorted(order[:2]) == [(0, "a"), (0, "b")] and sorted(order[2:]) == [(1, "a"), (1, "b")]
    todo = [(r, k) for r, k in order if len(c["plans"][k]["runs"]) <= r]
    assert sorted(todo) == [(0, "b"), (1, "a"), (1, "b")]
    p.write_text(json.dumps({"version": 99, "plans": {}}))
    with pytest.raises(SystemExit):
        bench.load_cache(p)


def test_draws_are_common_to_strategies_and_cycle_through_repeats(bench):
    c = _cache(bench, {"a": [1.0, 1.1, 1.2]})
    d1, d2 = bench.Draws(c, seed=3), bench.Draws(c, seed=3)
    seq1 = [d1.run("a")["step_s"] for _ in range(6)]
    seq2 = [d2.run("a")["step_s"] for _ in range(3)]
    assert seq1[:3] == seq2 and sorted(seq1[:3]) == [1.0, 1.1, 1.2] and seq1[3:] == seq1[:3]
