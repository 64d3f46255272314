"""Issue 36 item 8: the side-by-side output of `search --placement auto --staleness K` says each pool's
concurrency and busy share, why the split won, and why its staleness did (the same split at the other K)."""

from __future__ import annotations

from types import SimpleNamespace

from grpo_tune.cli.search import pool_lines

PLACEMENT = {
    "concurrency_bound": "max_num_seqs",
    "decode_concurrency": 1024.0,
    "rollout_ahead": 1.0,
    "rollout_tokens_per_s": 178164.0,
    "drain_s": 7.9,
    "rollout_busy": 0.72,
    "train_busy": 0.79,
    "first_wait_s": 0.0,
    "staleness": 1,
    "gen_s": 14.0,
    "train_s": 15.3,
    "exposed_sync_s": 4.1,
    "sync_s": 4.1,
    "rollout_gpus": 32,
    "train_gpus": 32,
}


def _splits(k2: float) -> list[dict[str, float]]:
    return [
        {"rollout_gpus": 32, "staleness": 0, "step_s": 23.1},
        {"rollout_gpus": 32, "staleness": 1, "step_s": 19.4},
        {"rollout_gpus": 32, "staleness": 2, "step_s": k2},
        {"rollout_gpus": 24, "staleness": 1, "step_s": 20.0},
    ]


def test_pools_split_and_staleness_are_explained():
    lines = pool_lines(SimpleNamespace(placement=PLACEMENT), _splits(19.35))
    text = " ".join(lines)
    assert "1,024 resident sequences per replica (bound by max_num_seqs; fed 1 batch(es) ahead)" in text
    assert "busy 72%" in text and "training busy 79%" in text
    assert "why 32+32: its step is the training pool (15.3 s) + the exposed sync (4.1 s)" in text
    assert "next split searched at K 1: 24 rollout GPUs at ~20.0 s" in text
    assert "why K 1: at 32+32, K 0 ~23.1 s, K 2 ~19.4 s (K 2 within 0.5%: the smaller staleness is kept)" in text


def test_a_faster_larger_staleness_is_not_called_a_tie():
    text = " ".join(pool_lines(SimpleNamespace(placement=PLACEMENT), _splits(17.0)))
    assert "why K 1: at 32+32, K 0 ~23.1 s, K 2 ~17.0 s" in text and "within 0.5%" not in text


def test_another_staleness_is_quoted_at_its_exact_composition():
    # the search ranks splits by an estimate (a proxy sync) and composes the kept ones exactly: where it composed
    # one, the line quotes that (Qwen3-235B-A22B on 256 H100, 128 + 128: the estimate said K 0 ~53.4 s, which read
    # as faster than the winner's 54.6 s; its exact composition is 67.2 s)
    exact = [
        SimpleNamespace(step_s=26.2, placement={"rollout_gpus": 32, "staleness": 0}),
        SimpleNamespace(step_s=30.0, placement={"rollout_gpus": 32, "staleness": 0}),  # a worse plan of that split
        SimpleNamespace(step_s=21.0, placement={"rollout_gpus": 24, "staleness": 1}),
    ]
    own = SimpleNamespace(placement=PLACEMENT, step_s=19.4)
    text = " ".join(pool_lines(own, _splits(19.35), exact))
    assert "why K 1: at 32+32, K 0 26.2 s, K 2 ~19.4 s (K 2 within 0.5%: the smaller staleness is kept)" in text
    assert "next split searched at K 1: 24 rollout GPUs at 21.0 s" in text
