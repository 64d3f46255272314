"""Rewards: ``fn(response: str, answer: str) -> float``.

Built in:

* ``math``: 1.0 when the response's final answer equals the reference, else 0.0 (verl's GSM8K
  scorer with ``format_score=0``).
* ``math_format``: as ``math``, but 0.1 for a response that states a final number that is wrong.
  This is partial credit for *format*, not for being close: reward can rise under it while
  accuracy does not, so read accuracy (``math``) when judging learning.

The final answer of a response is, in this order: the content of the last ``\\boxed{...}``; the
text after the last ``####``; else the last number in the text. The reference ``answer`` is read
the same way when it contains ``\\boxed`` or ``####`` (GSM8K stores whole solutions), else taken
whole. Two answers match when both parse as numbers and are equal (``1,000`` = ``1000.0``), or
else when their texts are equal after trimming spaces, ``$`` and a trailing period.

Custom rewards: ``load_reward("package.module:function")`` or ``load_reward("path/to/file.py:function")``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Callable

from grpo_tune.core.errors import ConfigError

RewardFn = Callable[[str, str], float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*(.*)")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with nested braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None  # unbalanced: no answer


def extract_answer(text: str) -> str | None:
    """The final answer stated in ``text`` (see module doc), or None."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(text)
    if hashes:
        tail = hashes[-1].strip()
        nums = _NUMBER.findall(tail)
        return nums[0] if nums else (tail or None)
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def _gold(answer: str) -> str:
    if "\\boxed" in answer or "\\fbox" in answer or "####" in answer:
        got = extract_answer(answer)
        if got is not None:
            return got
    return answer.strip()


def _as_number(s: str) -> Fraction | None:
    t = s.strip().strip("$").strip().rstrip(".").replace(",", "").replace(" ", "")
    frac = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", t)
    try:
        if frac:
            return Fraction(int(frac.group(1)), int(frac.group(2)))
        if re.fullmatch(r"-?\d+/\d+", t):
            return Fraction(t)
        if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)(e-?\d+)?", t, flags=re.I):
            f = float(t)
            return Fraction(t) if math.isfinite(f) else None
    except (ValueError, ZeroDivisionError):
        return None
    return None


def answers_match(pred: str, gold: str) -> bool:
    a, b = _as_number(pred), _as_number(gold)
    if a is not None and b is not None:
        return a == b
    norm = lambda s: s.strip().strip("$").strip().rstrip(".").replace(" ", "")  # noqa: E731
    return norm(pred) == norm(gold)


def math_reward(response: str, answer: str) -> float:
    """1.0 when the response's final answer matches ``answer``, else 0.0."""
    pred = extract_answer(response)
    return 1.0 if pred is not None and answers_match(pred, _gold(answer)) else 0.0


def math_format_reward(response: str, answer: str, *, format_score: float = 0.1) -> float:
    """1.0 if correct, ``format_score`` if a final answer is stated but wrong, 0.0 if none is."""
    pred = extract_answer(response)
    if pred is None:
        return 0.0
    return 1.0 if answers_match(pred, _gold(answer)) else format_score


BUILTIN: dict[str, RewardFn] = {"math": math_reward, "math_format": math_format_reward}


def load_reward(spec: str) -> RewardFn:
    """A built-in name, ``package.module:function`` or ``path/to/file.py:function``.

    The returned callable always gives a float and raises a coded error naming the function when
    the custom function returns something else.
    """
    if spec in BUILTIN:
        return BUILTIN[spec]
    if ":" not in spec:
        raise ConfigError(
            f"unknown reward {spec!r}",
            hint=f"use one of {', '.join(BUILTIN)} or a dotted path 'package.module:function'",
        )
    mod_name, _, fn_name = spec.rpartition(":")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_file():
                raise ConfigError(f"reward file {path} does not exist")
            s = importlib.util.spec_from_file_location(f"_grpo_tune_reward_{path.stem}", path)
            module = importlib.util.module_from_spec(s)
            s.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except ConfigError:
        raise
    except Exception as exc:  # a user's module failing to import is a config problem
        raise ConfigError(
            f"cannot import reward module {mod_name!r}: {type(exc).__name__}: {exc}",
            hint="check the module is on PYTHONPATH (every process needs it)",
        ) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"reward {spec!r}: {mod_name} has no function {fn_name!r}")

    def reward(response: str, answer: str) -> float:
        value = fn(response, answer)
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"reward {spec} returned {type(value).__name__}, not a number") from None
        if not math.isfinite(out):
            raise ConfigError(f"reward {spec} returned {out}")
        return out

    reward.__name__ = fn_name
    return reward
