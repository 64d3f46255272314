"""Learning: GRPO on the shipped synthetic task (``a+b=`` -> the digit of the sum) raises the reward.

A real `grpo-tune train` run (torchrun, one CPU process, megatron-core model, native sampler),
80 steps of 16 prompts x 8 responses of at most 4 tokens, lr 3e-3, no KL. Measured on this machine
(2 cores): the mean reward of steps 1-20 was 0.038 and of steps 61-80 was 0.191 (the policy first
learns to answer with one digit, then which one); each step takes about 0.25 s. The test asserts
the last 20 steps' mean reward exceeds the first 20's by at least 0.05 and by a factor of 2.
"""

from __future__ import annotations

import pytest

from trainer_harness import learning_run

STEPS, WINDOW = 80, 20
MIN_GAIN, MIN_RATIO = 0.05, 2.0


@pytest.mark.slow
def test_mean_reward_rises_on_the_synthetic_task(tmp_path):
    rows = learning_run(tmp_path, "tiny", STEPS)
    assert [x["step"] for x in rows] == list(range(1, STEPS + 1))
    before = sum(x["reward_mean"] for x in rows[:WINDOW]) / WINDOW
    after = sum(x["reward_mean"] for x in rows[-WINDOW:]) / WINDOW
    print(f"mean reward: steps 1-{WINDOW} {before:.3f} -> steps {STEPS - WINDOW + 1}-{STEPS} {after:.3f}")
    assert after >= before + MIN_GAIN and after >= MIN_RATIO * before, (before, after)
    assert rows[-1]["entropy"] < rows[0]["entropy"]  # the policy sharpened
