"""The batched sampler, driven by fake next-token-logits functions (no Megatron)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.trainer.rollout import SamplingParams, get_rollout_engine, register_rollout_engine
from grpo_tune.trainer.rollout.sampling import pack, sample, sample_next

V, PAD, EOS = 16, 0, 3


def successor(calls=None):
    """Greedy model: the next token is (last token + 1) mod V, read at position lengths-1."""

    def fn(tokens, lengths):
        if calls is not None:
            calls.append((tuple(tokens.shape), lengths.tolist()))
        last = tokens[torch.arange(tokens.shape[0]), lengths - 1]
        return torch.nn.functional.one_hot((last + 1) % V, V).float() * 10

    return fn


def test_greedy_follows_each_rows_own_prefix_and_stops_at_eos():
    calls = []
    out = sample(
        successor(calls), [[1], [7, 8], [14]], SamplingParams(temperature=0, max_tokens=5), pad_id=PAD, eos_id=EOS
    )
    assert out == [[2, 3], [9, 10, 11, 12, 13], [15, 0, 1, 2, 3]]  # EOS kept as the last id
    # every step calls the model once with all rows (collective safety) and true lengths
    assert len(calls) == 5 and all(shape[0] == 3 for shape, _ in calls)
    assert calls[0] == ((3, 2), [1, 2, 1])
    assert calls[1][1] == [2, 3, 2]
    assert calls[3][1] == [3, 5, 4]  # row 0 ended with EOS at step 2: its length stays 3


def test_stop_tokens_and_max_seq_len():
    out = sample(
        successor(),
        [[4], [9]],
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(6,)),
        pad_id=PAD,
        eos_id=EOS,
    )
    assert out == [[5, 6], [10, 11, 12, 13, 14, 15, 0, 1]]
    out = sample(
        successor(),
        [[4, 4, 4], [9]],
        SamplingParams(temperature=0, max_tokens=8),
        pad_id=PAD,
        eos_id=EOS,
        max_seq_len=5,
    )
    assert out == [[5, 6], [10, 11, 12, 13]]
    assert sample(successor(), [[1] * 5], SamplingParams(max_tokens=3), pad_id=PAD, eos_id=EOS, max_seq_len=5) == [[]]
    assert sample(successor(), [], SamplingParams(), pad_id=PAD, eos_id=EOS) == []


def _freq(logits, n=40000, **kw):
    g = torch.Generator().manual_seed(0)
    draws = sample_next(logits.expand(n, -1), generator=g, **kw)
    return torch.bincount(draws, minlength=logits.shape[-1]).double() / n


def _close(freq, probs, n=40000):
    # each frequency within 5 binomial standard deviations
    for f, p in zip(freq.tolist(), probs):
        assert abs(f - p) <= 5 * math.sqrt(max(p * (1 - p), 1e-12) / n) + 1e-12, (freq, probs)


def test_temperature_scales_log_probabilities():
    z = torch.tensor([[0.0, math.log(3)]])  # p = (1/4, 3/4)
    _close(_freq(z, temperature=1.0, top_p=1.0), [0.25, 0.75])
    _close(_freq(z, temperature=0.5, top_p=1.0), [0.1, 0.9])  # p ~ (1, 9)
    assert _freq(z, temperature=0.0, top_p=1.0)[1].item() == 1.0


def test_top_p_keeps_the_smallest_nucleus():
    z = torch.tensor([[0.5, 0.3, 0.2]]).log()
    _close(_freq(z, temperature=1.0, top_p=0.6), [0.5 / 0.8, 0.3 / 0.8, 0.0])
    _close(_freq(z, temperature=1.0, top_p=0.5), [1.0, 0.0, 0.0])  # 0.5 alone already reaches 0.5
    _close(_freq(z, temperature=1.0, top_p=0.81), [0.5, 0.3, 0.2])


def test_seed_reproduces_and_generator_is_used():
    fn = lambda t, l: torch.zeros(t.shape[0], V)  # noqa: E731
    p = [[1, 2]] * 8
    a = sample(fn, p, SamplingParams(max_tokens=6, seed=7), pad_id=PAD, eos_id=EOS)
    b = sample(fn, p, SamplingParams(max_tokens=6, seed=7), pad_id=PAD, eos_id=EOS)
    c = sample(fn, p, SamplingParams(max_tokens=6, seed=8), pad_id=PAD, eos_id=EOS)
    d = sample(fn, p, SamplingParams(max_tokens=6), pad_id=PAD, eos_id=EOS, generator=torch.Generator().manual_seed(7))
    assert a == b == d and a != c


def test_sampling_params_validation():
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(max_tokens=0)):
        with pytest.raises(GrpoTuneError):
            SamplingParams(**bad)


def test_pack_aligns_mask_with_next_token_logprobs():
    b = pack([[2, 50, 61], [2, 55]], [[7, 3], [8, 9, 3]], pad_id=PAD, width=7)
    assert b["tokens"].tolist() == [[2, 50, 61, 7, 3, 0, 0], [2, 55, 8, 9, 3, 0, 0]]
    # mask[t] = 1 where tokens[t + 1] is a response token
    assert b["response_mask"].tolist() == [[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0]]
    assert b["response_lengths"].tolist() == [2, 3] and b["prompt_lengths"].tolist() == [3, 2]
    with pytest.raises(ValueError):
        pack([[1, 2, 3]], [[4, 5]], pad_id=PAD, width=4)


def test_registry_errors_and_lazy_engines():
    with pytest.raises(GrpoTuneError) as e:
        get_rollout_engine("vlm")
    assert "vllm" in e.value.hint
    # by the name this module was imported under (a test that changed the working directory leaves no "tests")
    register_rollout_engine("fake-test", f"{__name__}:_FakeEngine")
    eng = get_rollout_engine("fake-test", reply=[9])
    assert eng.generate([[1], [2]], SamplingParams()) == [[9], [9]]


class _FakeEngine:
    def __init__(self, reply):
        self.reply = reply

    def generate(self, prompt_ids, params):
        return [list(self.reply) for _ in prompt_ids]

    def update_weights(self, named_tensors):
        pass

    def release(self):
        pass

    def resume(self):
        pass


def test_a_batch_sampled_in_parts_draws_the_whole_batchs_tokens():
    # rows=(offset, total): each part draws its rows' share of the whole batch's uniforms, so a rollout pool that
    # streams a step one mini-batch at a time (trainer/separate.py) samples the colocated step's responses
    w = torch.randn(V, V, generator=torch.Generator().manual_seed(3)) * 2

    def fn(tokens, lengths):  # a row's next-token logits depend on its own last token only
        return w[tokens[torch.arange(tokens.shape[0]), lengths - 1]]

    def step(chunk, start):  # the same model as a KV-cache step function
        return w[chunk[:, -1]]

    g = torch.Generator().manual_seed(5)
    prompts = [[int(t) for t in torch.randint(4, V, (1 + i % 3,), generator=g)] for i in range(12)]
    params = SamplingParams(max_tokens=7, seed=11, top_p=0.9)
    for cached, logits_fn in ((False, fn), (True, step)):
        whole = sample(logits_fn, prompts, params, pad_id=PAD, eos_id=EOS, cached=cached)
        parts = [
            r
            for o in range(0, 12, 4)
            for r in sample(logits_fn, prompts[o : o + 4], params, pad_id=PAD, eos_id=EOS, cached=cached, rows=(o, 12))
        ]
        assert parts == whole
        assert len({len(r) for r in whole}) > 1  # some rows stop at EOS early: the draws are not in lockstep
        # without the whole batch's draws, the parts sample other tokens
        apart = [
            r
            for o in range(0, 12, 4)
            for r in sample(logits_fn, prompts[o : o + 4], params, pad_id=PAD, eos_id=EOS, cached=cached)
        ]
        assert apart != whole
    # the cached and uncached samplers agree on the parts too
    assert sample(step, prompts[4:8], params, pad_id=PAD, eos_id=EOS, cached=True, rows=(4, 12)) == sample(
        fn, prompts[4:8], params, pad_id=PAD, eos_id=EOS, rows=(4, 12)
    )
