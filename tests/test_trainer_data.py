"""Prompt datasets, the synthetic task (including its chance reward) and the resumable stream."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.trainer.data import Example, PromptStream, load_dataset, synthetic_examples, write_synthetic
from grpo_tune.trainer.reward import math_reward
from grpo_tune.trainer.rollout import SamplingParams
from grpo_tune.trainer.rollout.sampling import sample
from grpo_tune.trainer.tokenizer import CharTokenizer


def test_synthetic_tasks_are_correct_seeded_and_balanced():
    copy = synthetic_examples(2000, seed=5)
    assert copy == synthetic_examples(2000, seed=5) != synthetic_examples(2000, seed=6)
    assert all(e.prompt == f"{e.answer}=" for e in copy)
    sums = synthetic_examples(2000, seed=5, task="sum")
    for e in sums:
        a, b = e.prompt.rstrip("=").split("+")
        assert int(a) + int(b) == int(e.answer) <= 9
    for exs in (copy, sums):  # every answer 0..9, none much above 10%
        counts = Counter(e.answer for e in exs)
        assert set(counts) == set("0123456789") and max(counts.values()) / len(exs) < 0.13
    with pytest.raises(GrpoTuneError):
        synthetic_examples(3, task="mul")
    assert load_dataset("synthetic", n=50, seed=1) == synthetic_examples(50, 1)
    assert load_dataset("synthetic:sum", n=50, seed=1) == synthetic_examples(50, 1, task="sum")


def _exact_chance(answer: str, max_tokens: int) -> float:
    """P(math_reward = 1) for responses of i.i.d. uniform ids over the 128-id ASCII vocabulary.

    Ids are grouped into classes that the tokenizer and the reward treat alike and every class
    sequence is enumerated: the answer digit; 0 (``07`` and ``7.0`` equal 7); the 8 other digits
    (any of them in the final number makes it wrong); the characters the number and ``####``
    parsers look at; EOS, which ends the response; ids that decode to nothing; everything else.
    """
    tok = CharTokenizer()
    invisible = [i for i in range(128) if not tok.decode([i]) and i != tok.eos_id]
    special = "-.,#"
    other = next(d for d in "123456789" if d != answer)
    digits = [(answer, 1), (other, 9)] if answer == "0" else [(answer, 1), ("0", 1), (other, 8)]
    classes = digits + [(c, 1) for c in special] + [("", len(invisible))]
    classes.append(("x", 128 - 10 - len(special) - 1 - len(invisible)))
    total = 0.0

    def walk(text, prob, left):
        nonlocal total
        if left == 0:
            total += prob * math_reward(text, answer)
            return
        total += prob / 128 * math_reward(text, answer)  # EOS now
        for s, w in classes:
            walk(text + s, prob * w / 128, left - 1)

    walk("", 1.0, max_tokens)
    return total


def test_untrained_policy_earns_the_documented_chance_reward():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra threads only contend on a shared machine
    try:
        _check_chance()
    finally:
        torch.set_num_threads(threads)


def _check_chance():
    # the nonzero digits are alike; 0 pays more often ("00" and "0.0" are 0 too)
    p7, p0 = _exact_chance("7", 4), _exact_chance("0", 4)
    assert 0.02 < p7 < p0 < 0.03
    tok = CharTokenizer()
    exs = synthetic_examples(20000, seed=3)
    zeros = sum(e.answer == "0" for e in exs) / len(exs)
    exact = zeros * p0 + (1 - zeros) * p7
    assert 0.02 < exact < 0.03  # the module doc says "about 2.5% of 4-token responses"
    uniform = lambda t, lengths: torch.zeros(t.shape[0], 128)  # noqa: E731  (an untrained model)
    for max_tokens, lo, hi in ((4, None, None), (8, 0.035, 0.05)):
        resp = sample(
            uniform,
            [tok.encode_prompt(e.prompt) for e in exs],
            SamplingParams(max_tokens=max_tokens, seed=0),
            pad_id=tok.pad_id,
            eos_id=tok.eos_id,
        )
        mean = sum(math_reward(tok.decode(r), e.answer) for r, e in zip(resp, exs)) / len(exs)
        if lo is None:  # sampler + tokenizer + reward agree with the enumeration within 5 sigma
            assert abs(mean - exact) < 5 * math.sqrt(exact * (1 - exact) / len(exs)), (mean, exact)
        else:
            assert lo < mean < hi, mean
    # a group of 8 holds a rewarded response with probability 1 - (1 - p)^8: ~18% at p = 2.5%
    assert 1 - (1 - exact) ** 8 > 0.15


def test_jsonl_and_chat_and_verl_fields(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [
        {"prompt": "1+1=", "answer": 2},
        {
            "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
            "reward_model": {"ground_truth": "4", "style": "rule"},
        },
        {"question": "q?", "ground_truth": "x"},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_dataset(str(p)) == [Example("1+1=", "2"), Example("be brief\n2+2?", "4"), Example("q?", "x")]
    p2 = tmp_path / "k.jsonl"
    p2.write_text(json.dumps({"q": "a", "sol": "b"}) + "\n")
    assert load_dataset(str(p2), prompt_key="q", answer_key="sol") == [Example("a", "b")]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["3=", "4="], "answer": ["3", "4"], "extra": [1, 2]}), p)
    assert load_dataset(str(p)) == [Example("3=", "3"), Example("4=", "4")]


def test_write_synthetic_round_trips(tmp_path):
    p = write_synthetic(tmp_path / "sub" / "s.jsonl", 30, seed=2, task="sum")
    assert load_dataset(str(p)) == synthetic_examples(30, 2, task="sum")


@pytest.mark.parametrize(
    "content,match",
    [
        ('{"prompt": "a", "answer": "b"}\n{"prompt": "c", "answer": \n', ":2:"),
        ('{"prompt": "a"}\n', "'answer'"),
        ("[1, 2]\n", "not an object"),
        ("\n\n", "empty"),
    ],
)
def test_bad_files_give_coded_errors(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(GrpoTuneError, match=match) as e:
        load_dataset(str(p))
    assert e.value.code == "BAD_CONFIG"


def test_missing_dataset_and_unknown_suffix(tmp_path):
    with pytest.raises(GrpoTuneError) as e:
        load_dataset(str(tmp_path / "nope.jsonl"))
    assert e.value.code == "MISSING_DATASET"
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    with pytest.raises(GrpoTuneError, match="unknown file type"):
        load_dataset(str(tmp_path / "d.csv"))


def test_prompt_stream_covers_epochs_and_resumes_exactly():
    exs = synthetic_examples(10, seed=0, task="sum")
    s = PromptStream(exs, batch_size=4, seed=9)
    first = [s.next_batch() for _ in range(5)]  # 20 prompts: two full epochs
    flat = [e for b in first for e in b]
    assert Counter(flat[:10]) == Counter(exs) == Counter(flat[10:])
    assert flat[:10] != flat[10:]  # a fresh shuffle each epoch
    s2 = PromptStream(exs, batch_size=4, seed=9)
    s2.next_batch(), s2.next_batch(), s2.next_batch()
    state = json.loads(json.dumps(s2.state_dict()))  # survives a checkpoint's JSON
    s3 = PromptStream(exs, batch_size=4, seed=9)
    s3.load_state_dict(state)
    assert [s3.next_batch() for _ in range(2)] == first[3:]


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(["prompt", "answer", "question", "reward_model", "ground_truth", "x"]), c, max_size=4
        )
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(_json_values.map(json.dumps), st.text(max_size=20)), max_size=5))
def test_any_file_gives_examples_or_a_coded_error(tmp_path, lines):
    p = tmp_path / "h.jsonl"
    p.write_text("\n".join(x.replace("\n", " ") for x in lines))
    try:
        out = load_dataset(str(p))
    except GrpoTuneError as e:
        assert e.code == "BAD_CONFIG"
    else:
        assert out and all(isinstance(e.prompt, str) and isinstance(e.answer, str) for e in out)
