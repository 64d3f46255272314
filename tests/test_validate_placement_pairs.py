"""validate --grpo's separate-pool pairs (validate/placement_pairs.py): the published speed-ups of verl's
one-step-off and fully-async runs against the cost model's, printed per pair."""

from __future__ import annotations

import pytest

from grpo_tune.validate.grpo import load_grpo_rows
from grpo_tune.validate.placement_pairs import (
    TOLERANCE_PCT,
    _steps,
    load_pairs,
    pair_basis,
    pair_means,
    score_pairs,
    separate_step,
)
from grpo_tune.core.errors import ConfigError


def test_every_pair_names_a_colocated_and_a_separate_row():
    rows = {r.id: r for r in load_grpo_rows()}
    pairs = load_pairs()
    assert {p["id"] for p in pairs} == {"verl_onestep_7b_mcore", "verl_fullyasync_30ba3b_mcore"}
    for p in pairs:
        assert rows[p["colocated"]].raw["placement"] == "colocated"
        assert rows[p["separate"]].raw["placement"] == "separate"
        # the tables' step column: the ratio of the two rows' published steps (printed beside the score)
        pub = rows[p["colocated"]].published["step_s"] / rows[p["separate"]].published["step_s"]
        assert float(p["step_speedup"]) == pytest.approx(pub, rel=2e-3)
    # the scored speed-ups are the sources' headlines: total wall-clock over the same steps
    totals = {p["id"]: (p["basis"], int(p["steps"]), float(p["published_speedup"])) for p in pairs}
    h = 3600
    os_col, os_sep = 18 * h + 21 * 60, 13 * h + 6 * 60  # 18h21m and 13h06m over 100 steps
    assert totals["verl_onestep_7b_mcore"] == ("total", 100, pytest.approx(os_col / os_sep, abs=5e-4))
    fa_col = 2 * 24 * h + 11 * h + 39 * 60  # 2d 11h 39m over 400 steps
    fa_sep = 24 * h + 10 * h + 41 * 60  # 1d 10h 41m
    assert totals["verl_fullyasync_30ba3b_mcore"] == ("total", 400, pytest.approx(fa_col / fa_sep, abs=5e-4))


def test_scores_are_the_ratio_of_the_two_priced_steps():
    rows = {r.id: r for r in load_grpo_rows()}
    rep = score_pairs()
    for r, p in zip(rep["pairs"], load_pairs()):
        mean, _, _ = pair_means(p, rows[p["colocated"]])
        c, e = _steps(rows[p["colocated"]], rows[p["separate"]], p, mean)
        sync = e.placement["exposed_sync_s"] if p["step_excludes_sync"] == "true" else 0.0
        n = int(p["steps"])
        # total: n colocated steps over n separate steps (the sync included) plus the pipeline fill
        assert p["basis"] == "total" and e.placement["fill_s"] == pytest.approx(e.placement["gen_s"])
        assert r["predicted_speedup"] == pytest.approx(n * c.step_s / (n * e.step_s + e.placement["fill_s"]), rel=1e-12)
        assert r["step_reading"]["predicted"] == pytest.approx(c.step_s / (e.step_s - sync), rel=1e-12)
        assert r["step_reading"]["published"] == float(p["step_speedup"])
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_speedup"] / r["published_speedup"] - 1))
        assert r["range"][0] <= r["predicted_speedup"] <= r["range"][1]  # the range spans the point
        assert r["pools"]["rollout_gpus"] + r["pools"]["train_gpus"] == e.cluster.gpus
    assert rep["worst_error_pct"] == max(abs(r["error_pct"]) for r in rep["pairs"])
    assert rep["passed"] is (rep["worst_error_pct"] <= TOLERANCE_PCT)


def test_each_pair_is_priced_at_its_colocated_rows_solved_mean():
    """An empty response_len_mean is the colocated row's own (solved in published_grpo.csv from its old
    log-prob time), both rows priced at it; an empty range is half and twice it, capped at the row's max."""
    rows = {r.id: r for r in load_grpo_rows()}
    rep = {r["id"]: r for r in score_pairs()["pairs"]}
    for p in load_pairs():
        col = rows[p["colocated"]]
        assert p["response_len_mean"] == ""
        m = int(col.raw["response_len_mean"])
        assert pair_means(p, col) == (m, m // 2, min(int(col.raw["response_len"]), 2 * m))
        assert rep[p["id"]]["response_len_mean"] == m
    assert pair_means({"id": "x", "response_len_mean": "1000", "mean_low": "", "mean_high": "9000"}, col) == (
        1000,
        500,
        9000,
    )
    with pytest.raises(ConfigError, match="integer"):
        pair_means({"id": "x", "response_len_mean": "lots"}, col)


def test_a_fully_async_step_is_timed_without_the_sync():
    """verl's fully-async trainer times timing_s/step over the local updates of one parameter version and
    logs the sync apart (timing_s/param_sync): the scored separate step is the steady state less its exposed
    sync; the one-step-off pair's is the whole steady state."""
    rows = {r.id: r for r in load_grpo_rows()}
    pairs = {p["id"]: p for p in load_pairs()}
    rep = {r["id"]: r for r in score_pairs()["pairs"]}
    fa = pairs["verl_fullyasync_30ba3b_mcore"]
    assert fa["step_excludes_sync"] == "true" and pairs["verl_onestep_7b_mcore"]["step_excludes_sync"] == "false"
    mean, _, _ = pair_means(fa, rows[fa["colocated"]])
    _, e = _steps(rows[fa["colocated"]], rows[fa["separate"]], fa, mean)
    sync = e.placement["exposed_sync_s"]
    assert sync > 0 and separate_step(e, True) == pytest.approx(e.step_s - sync) and separate_step(e, False) == e.step_s
    assert rep["verl_fullyasync_30ba3b_mcore"]["predicted_step_s"]["separate"] == pytest.approx(e.step_s - sync)


def test_one_step_off_megatron_pair_within_tolerance():
    # verl docs/advance/one_step_off.md, VLLM+Megatron: 18h21m colocated vs 13h06m on 4 + 12 H20 over 100 steps
    # (1.40x, the doc's +40%). Scored on the tables' step column (699 s vs 566 s: 1.235x) it was +23.0%, a strict
    # xfail: that column is one late step (the doc's plot, tests/test_one_step_off_plot.py), and the reading is
    # still printed beside the score (docs/placement.md).
    r = next(p for p in score_pairs()["pairs"] if p["id"] == "verl_onestep_7b_mcore")
    assert abs(r["error_pct"]) <= TOLERANCE_PCT, r
    assert r["step_reading"]["error_pct"] > TOLERANCE_PCT  # the one-step reading, as printed: not what is scored


def test_a_pair_states_what_its_speedup_is_a_ratio_of():
    assert pair_basis({"id": "x", "basis": ""}) == ("step", 1)
    assert pair_basis({"id": "x", "basis": "total", "steps": "100"}) == ("total", 100)
    with pytest.raises(ConfigError, match="basis must be one of step, total"):
        pair_basis({"id": "x", "basis": "mean"})
    for bad in ("", "0", "ten"):
        with pytest.raises(ConfigError, match="number of steps"):
            pair_basis({"id": "x", "basis": "total", "steps": bad})


def test_a_pair_of_two_colocated_rows_is_refused(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text(
        "id,colocated,separate,partial_rollout,published_speedup,basis,response_len_mean,mean_low,mean_high,source,note\n"
        "bad,verl_onestep_qwen25math7b_mcore_colocate,verl_dpsk671b_96,false,1.2,step,2048,,,x,\n"
    )
    with pytest.raises(ConfigError, match="not a separate-pool row"):
        score_pairs(path)


def test_the_fully_async_pair_runs_no_old_logprob_pass():
    # the 96:32 script sets async_training.use_rollout_log_probs=True (0.9.1's fully-async config defaults
    # rollout_correction.bypass_mode to true): its training pool computes no old log-probs, and its table
    # publishes none ("\\"); the one-step-off run recomputes them (old_log_prob 120 s on 12 GPUs)
    rows = {r.id: r for r in load_grpo_rows()}
    pairs = {p["id"]: p for p in load_pairs()}
    fa, os_ = pairs["verl_fullyasync_30ba3b_mcore"], pairs["verl_onestep_7b_mcore"]
    assert fa["recompute_logprobs"] == "false" and os_["recompute_logprobs"] == "true"
    _, e = _steps(rows[fa["colocated"]], rows[fa["separate"]], fa, 2048)
    assert "old_logprob" not in e.time.phases and e.placement["recompute_logprobs"] is False
    # the same plan recomputing them: the training pool's time is longer by exactly the old log-prob pass
    _, e2 = _steps(rows[fa["colocated"]], rows[fa["separate"]], {**fa, "recompute_logprobs": "true"}, 2048)
    assert e2.placement["train_s"] - e.placement["train_s"] == pytest.approx(e2.time.phases["old_logprob"], rel=1e-9)
    assert e.step_s < e2.step_s
    _, e3 = _steps(rows[os_["colocated"]], rows[os_["separate"]], os_, 2048)
    assert e3.time.phases["old_logprob"] > 0


def test_per_pool_phases_are_printed_next_to_the_published_ones():
    rep = {r["id"]: r for r in score_pairs()["pairs"]}
    fa = {(x["side"], x["phase"]): x for x in rep["verl_fullyasync_30ba3b_mcore"]["per_pool"]}
    # the 96:32 table: step 282.75, Ref 50.05, Update Actor 206.63 (its Gen 22.06 is the trainer's wait: not a
    # generation time, so the row leaves it out); the colocated one publishes every phase
    assert {k for k in fa if k[0] == "separate"} == {
        ("separate", "step"),
        ("separate", "ref_logprob"),
        ("separate", "update"),
    }
    assert fa[("separate", "update")]["published_s"] == pytest.approx(206.63)
    assert fa[("colocated", "rollout")]["published_s"] == pytest.approx(348.05)
    assert all(x["predicted_s"] is not None and x["predicted_s"] > 0 for x in fa.values())


def test_fully_async_pair_within_tolerance():
    # verl docs/advance/fully_async.md, 30B-A3B: 2d 11h 39m colocated on 128 H20 vs 1d 10h 41m on 96 + 32 over 400
    # steps (1.72x; its step column, 497.89 s vs 282.75 s, 1.76x, is printed beside the score).
    # Was -32.6% (a strict xfail) until the single controller's batch moves were priced (docs/placement.md): the
    # same padded batch crosses the driver whatever the pool's GPU count, a fixed cost the 4x fewer GPUs do not
    # multiply, so the 32-GPU pool's Ref and update grow by less than 4x (published: 2.40x both).
    r = next(p for p in score_pairs()["pairs"] if p["id"] == "verl_fullyasync_30ba3b_mcore")
    assert abs(r["error_pct"]) <= TOLERANCE_PCT, r
    pool = {(x["side"], x["phase"]): x["predicted_s"] for x in r["per_pool"]}
    ratio = pool[("separate", "update")] / pool[("colocated", "update")]
    assert 2.4 < ratio < 3.6, ratio  # 3.64x without the controller's cost; the source's 2.40x


def test_fsdp_rows_are_rollout_side_ratio_checks():
    # the FSDP2 rows of verl's docs serve as ratio checks of the rollout side only: each check prices both
    # generation times by the rollout side alone, and the ratio is reported (not in validate's pass/fail)
    from grpo_tune.validate.placement_pairs import score_rollout_ratios

    rep = {r["id"]: r for r in score_rollout_ratios()["checks"]}
    assert {r["backend"] for r in rep.values()} >= {"fsdp2", "megatron"}
    fs = rep["onestep_fsdp2_4_12"]
    assert fs["published_ratio"] == pytest.approx(458 / 247)
    pa, pb = fs["predicted_s"]
    assert fs["predicted_ratio"] == pytest.approx(pa / pb) and pa > pb > 0  # 3,072 sequences per replica over 768
    # the Megatron pair's rollout side: 3.09x published for 3x the sequences per replica; the model amortises the
    # drain (docs/placement.md: what is left of the one-step-off pair)
    mc = rep["onestep_megatron_4_12"]
    assert mc["published_ratio"] == pytest.approx(501 / 162) and 1.0 < mc["predicted_ratio"] < mc["published_ratio"]


def test_a_staleness_zero_fully_async_pair_is_priced_streamed():
    # verl's fully-async trainer at staleness_threshold 0 with require_batches 1 trains each mini-batch as it
    # arrives (the on-policy stream, issue 40); a whole-batch fetch, the one-step-off trainer, or a rollouter ahead
    # by any fraction is not priced streamed. The scored pairs (K = 1, threshold 0.5) do not stream.
    import dataclasses

    rows = {r.id: r for r in load_grpo_rows()}
    fa = next(p for p in load_pairs() if p["id"] == "verl_fullyasync_30ba3b_mcore")
    col, sep = rows[fa["colocated"]], rows[fa["separate"]]
    sep0 = dataclasses.replace(sep, raw={**sep.raw, "staleness": "0"})
    mean = pair_means(fa, col)[0]
    on = {**fa, "staleness_threshold": "0", "require_batches": "1", "partial_rollout": "false"}
    _, streamed = _steps(col, sep0, on, mean)
    whole = {**on, "require_batches": str(streamed.workload.prompts // streamed.workload.mini_batch)}
    _, serial = _steps(col, sep0, whole, mean)
    f, g = streamed.placement, serial.placement
    assert f["stream_units"] == streamed.workload.prompts // streamed.workload.mini_batch > 1
    assert g["stream_units"] == 0 and f["unstreamed_step_s"] == pytest.approx(serial.step_s)
    # the stream lies between the slower pool alone and the sequential sum
    assert max(f["gen_s"], f["train_s"]) <= streamed.step_s - f["sync_s"] < serial.step_s - g["sync_s"]
    for row, p in ((sep, fa), (sep0, {**on, "one_step_off": "true"}), (sep0, {**on, "staleness_threshold": "0.5"})):
        assert _steps(col, row, p, mean)[1].placement["stream_units"] == 0
    assert all(r["pools"]["stream_units"] == 0 for r in score_pairs()["pairs"])
