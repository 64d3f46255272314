"""The model-guided policy (autotune.refine.policy) on a real plan space with hand-made measurements."""

from __future__ import annotations

import math

import pytest

from grpo_tune.autotune.refine import ModelGuided, features, measured_noise, predicted, spread


def _tiny_inputs():
    """tiny on 4 CPU ranks, a small GRPO workload: the plan space both tests below build."""
    from _inputs import grpo_inputs

    return grpo_inputs(
        "tiny", "cpu", 4, prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8, seq_len=64, gbs=8
    )


@pytest.fixture(scope="module")
def space():
    from grpo_tune.autotune.refine import build_space, runnable
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.core.config import TrainerOptions

    m, hw, cl, wl = _tiny_inputs()
    sp, _ = runnable(build_space(search(m, hw, cl, wl).ranked, m, hw, cl, wl), TrainerOptions())
    seen, uniq = set(), []
    for e in sp:  # one plan per feature vector: plans alike in every feature are one plan to the kernel
        f = tuple(features(e.strategy))
        if f not in seen:
            seen.add(f)
            uniq.append(e)
    keep = uniq[:20] + uniq[-10:]  # the model's best and its slowest
    assert len(keep) >= 12
    return keep


def test_spread_and_noise_by_hand():
    assert spread([1.0]) == 0.0
    assert spread([1.0, 1.2, 1.1]) == pytest.approx(0.2 / 1.1)
    assert measured_noise({0: [1.0], 1: [2.0]}) is None
    assert measured_noise({0: [1.0, 1.1], 1: [2.0, 2.4, 2.2]}) == pytest.approx(max(0.1 / 1.05, 0.4 / 2.2))


def test_first_pick_is_the_models_best(space):
    pol = ModelGuided(space)
    pick = pol.choose([])
    assert pick.index == 0 and not pick.repeat


def test_a_measurement_recalibrates_every_plan(space):
    pol = ModelGuided(space)
    p0 = predicted(space[0])[0]
    mu, sd = pol.posterior([(0, 0.5 * p0)], 0.05)
    # the measured plan is pulled to its measurement, every other plan moves the same way (shared error)
    assert math.exp(mu[0]) == pytest.approx(0.5 * p0, rel=0.02)
    assert all(mu[i] < pol.prior[i] for i in range(len(space)))
    assert sd[0] < sd[1:].min()


def test_never_picks_a_busy_or_measured_plan(space):
    pol = ModelGuided(space)
    obs = [(0, predicted(space[0])[0])]
    pick = pol.choose(obs, busy={1, 2})
    assert pick.index not in (0, 1, 2)


def test_stops_exploring_when_nothing_can_beat_the_best_by_more_than_noise(space):
    pol = ModelGuided(space, noise=0.05)
    # every plan measured exactly as predicted except the best, measured 3x faster: nothing left to find
    obs = [(i, predicted(e)[0]) for i, e in enumerate(space)]
    obs[0] = (0, predicted(space[0])[0] / 3)
    pick = pol.choose(obs[:1] + obs[1:])
    assert pick is not None and pick.repeat and pick.index == 0  # one repeat of the best measures the noise
    pick = pol.choose(obs + [(0, predicted(space[0])[0] / 3 * 1.01)])
    assert pick is None  # noise measured, no contender within it


def test_noise_is_measured_before_measurements_are_compared(space):
    pol = ModelGuided(space, noise=0.05)
    p = [predicted(e)[0] for e in space]
    pick = pol.choose([(0, p[0]), (5, p[5])])
    assert pick.repeat and pick.index == 0  # the incumbent again: how noisy is a run here?


def test_one_lucky_run_does_not_outvote_the_model_under_large_noise(space):
    pol = ModelGuided(space, noise=0.05)
    p = [predicted(e)[0] for e in space]
    far = max(range(len(space)), key=lambda i: p[i])  # the model's slowest plan
    assert p[far] > 1.2 * p[0]
    # plan 0 measured three times with a 40% spread; the model's slowest plan once, 5% under plan 0's median
    obs = [(0, p[0]), (0, 1.2 * p[0]), (0, 0.85 * p[0]), (far, 0.95 * p[0])]
    assert pol.recommend(obs) == 0
    # with a 0.1% spread the same single run wins
    assert pol.recommend([(0, p[0]), (0, 1.001 * p[0]), (far, 0.95 * p[0])]) == far


def test_a_space_of_ten_thousand_plans_needs_no_n_by_n_matrix():
    # 12,000 plans: an n x n x features kernel would take 17 GB; columns for the measured plans only
    from grpo_tune.autotune.refine import build_space
    from grpo_tune.autotune.search.driver import search

    m, hw, cl, wl = _tiny_inputs()
    sp = build_space(search(m, hw, cl, wl).ranked, m, hw, cl, wl)
    big = (sp * (12000 // len(sp) + 1))[:12000]
    pol = ModelGuided(big)
    obs = [(0, predicted(big[0])[0]), (7, 0.8 * predicted(big[7])[0]), (0, 1.1 * predicted(big[0])[0])]
    pick = pol.choose(obs)
    assert pick is not None and 0 <= pick.index < len(big)
