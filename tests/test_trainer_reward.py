"""The built-in math reward and custom rewards by dotted path."""

from __future__ import annotations

import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.trainer.reward import extract_answer, load_reward, math_format_reward, math_reward


@pytest.mark.parametrize(
    "response,answer,want",
    [
        ("so 3 + 4 = 7", "7", 1.0),
        ("first 7 then 12", "7", 0.0),  # the last number counts
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),
        ("#### 72 (and 80 was wrong)", "72", 1.0),  # text after #### wins over a later number
        ("The answer is $\\boxed{18}$.", "18", 1.0),
        ("\\boxed{\\frac{1}{2}} then 7", "0.5", 1.0),  # \boxed wins; fractions compare as numbers
        ("\\boxed{x^{2}+1}", "x^{2}+1", 1.0),  # non-numeric boxed: text match
        ("it costs $1,000.", "1000", 1.0),
        ("3.50", "3.5", 1.0),
        ("-4", "-4", 1.0),
        ("4", "-4", 0.0),
        ("no number here", "5", 0.0),
        ("", "0", 0.0),
        ("9", "She had 3 apples ... #### 9", 1.0),  # GSM8K gold solutions are parsed too
        ("9", "so \\boxed{9}", 1.0),
    ],
)
def test_math_reward_cases(response, answer, want):
    assert math_reward(response, answer) == want


def test_extract_answer():
    assert extract_answer("a \\boxed{3} b \\boxed{4}") == "4"
    assert extract_answer("\\boxed{1") == "1"  # unbalanced box: fall back to the last number
    assert extract_answer("nothing") is None
    assert extract_answer("x=2, y=10") == "10"


def test_math_format_gives_partial_credit_only_for_a_stated_wrong_number():
    assert math_format_reward("7", "7") == 1.0
    assert math_format_reward("8", "7") == pytest.approx(0.1)
    assert math_format_reward("no", "7") == 0.0
    assert load_reward("math_format")("8", "7") == pytest.approx(0.1)


@settings(max_examples=80, deadline=None)
@given(st.integers(-(10**9), 10**9), st.text(alphabet="abc xyz=+?!\n", max_size=20))
def test_any_integer_after_digit_free_text_is_found(n, prefix):
    assert math_reward(prefix + " " + str(n), str(n)) == 1.0
    assert math_reward(prefix + " " + str(n + 1), str(n)) == 0.0


def test_custom_reward_by_dotted_path_and_file(tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text(
        textwrap.dedent("""
        def length(response, answer):
            return len(response) / 10
        def bad(response, answer):
            return "yes"
        NOT_CALLABLE = 3
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("myrewards", None)
    assert load_reward("myrewards:length")("abcde", "x") == 0.5
    assert load_reward(f"{tmp_path / 'myrewards.py'}:length")("ab", "x") == 0.2
    with pytest.raises(GrpoTuneError, match="not a number"):
        load_reward("myrewards:bad")("a", "b")
    for spec in (
        "myrewards:NOT_CALLABLE",
        "myrewards:missing",
        "no_such_module_xyz:f",
        f"{tmp_path / 'nope.py'}:f",
        "mathh",
    ):
        with pytest.raises(GrpoTuneError) as e:
            load_reward(spec)
        assert e.value.code == "BAD_CONFIG"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40), st.text(max_size=12))
def test_math_reward_never_raises_and_is_binary(response, answer):
    assert math_reward(response, answer) in (0.0, 1.0)
    assert math_format_reward(response, answer) in (0.0, 0.1, 1.0)
