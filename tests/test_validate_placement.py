"""validate --grpo's separate-pool pairs (validate/placement.py): the published speed-ups of verl's
one-step-off and fully-async runs against the cost model's, printed per pair."""

from __future__ import annotations

import pytest

from grpo_tune.validate.grpo import load_grpo_rows
from grpo_tune.validate.placement import TOLERANCE_PCT, _steps, load_pairs, score_pairs
from grpo_tune.core.errors import ConfigError


def test_every_pair_names_a_colocated_and_a_separate_row():
    rows = {r.id: r for r in load_grpo_rows()}
    pairs = load_pairs()
    assert {p["id"] for p in pairs} == {"verl_onestep_7b_mcore", "verl_fullyasync_30ba3b_mcore"}
    for p in pairs:
        assert rows[p["colocated"]].raw["placement"] == "colocated"
        assert rows[p["separate"]].raw["placement"] == "separate"
        # the published speed-up is the ratio of the two rows' published steps
        pub = rows[p["colocated"]].published["step_s"] / rows[p["separate"]].published["step_s"]
        assert float(p["published_speedup"]) == pytest.approx(pub, rel=2e-3)


def test_scores_are_the_ratio_of_the_two_priced_steps():
    rows = {r.id: r for r in load_grpo_rows()}
    rep = score_pairs()
    for r, p in zip(rep["pairs"], load_pairs()):
        c, e = _steps(
            rows[p["colocated"]], rows[p["separate"]], p["partial_rollout"] == "true", int(p["response_len_mean"])
        )
        assert r["predicted_speedup"] == pytest.approx(c.step_s / e.step_s, rel=1e-12)
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_speedup"] / r["published_speedup"] - 1))
        assert r["range"][0] <= r["range"][1]
        assert r["pools"]["rollout_gpus"] + r["pools"]["train_gpus"] == e.cluster.gpus
    assert rep["worst_error_pct"] == max(abs(r["error_pct"]) for r in rep["pairs"])
    assert rep["passed"] is (rep["worst_error_pct"] <= TOLERANCE_PCT)


def test_one_step_off_megatron_pair_within_tolerance():
    # verl docs/advance/one_step_off.md, VLLM+Megatron: 699 s colocated vs 566 s on 4 + 12 H20 (1.235x)
    r = next(p for p in score_pairs()["pairs"] if p["id"] == "verl_onestep_7b_mcore")
    assert abs(r["error_pct"]) <= TOLERANCE_PCT, r


def test_a_pair_of_two_colocated_rows_is_refused(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text(
        "id,colocated,separate,partial_rollout,published_speedup,basis,response_len_mean,mean_low,mean_high,source,note\n"
        "bad,verl_onestep_qwen25math7b_mcore_colocate,verl_dpsk671b_96,false,1.2,step,2048,,,x,\n"
    )
    with pytest.raises(ConfigError, match="not a separate-pool row"):
        score_pairs(path)
