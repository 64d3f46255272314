"""Response-length distributions: what decode's shrinking batch and its tail are priced on.

Assumed distribution (no histogram given): a share p (:data:`CLIP_FRACTION`) of the responses is
truncated at the cap, and the rest follow x = L / max ~ Beta(1, b) on [0, max], with b set so the
whole keeps the given mean (body mean (mean - p max) / (1 - p), b = max / body mean - 1). The body is
the one-parameter family fixed by its mean and the cap: below max/2 the density falls from short
responses to a tail towards the cap (typical of math/RL responses early in training); above max/2 it
piles up at the cap (many responses truncated, as in NeMo-RL's Qwen3 rows with mean 3.2k of a 4k cap).
Its survival is closed form, S(x) = p + (1 - p)(1 - x)^b below the cap, and so is the expected longest
of N responses: the cap when one of them is truncated (probability 1 - (1 - p)^N), else the body's
quantile N/(N+1). A histogram from ``--lengths`` (``Workload.response_len_quantiles``) replaces it by
its empirical quantiles, which hold their own truncated share.

A launch or a recipe states only the maxima: :func:`assumed_means` sets the means every reader assumes
(:data:`ASSUMED_MEAN_FRACTION` of the max) unless ``--lengths`` or the mean flags give them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from grpo_tune.core.strategy import Workload

ASSUMED_MEAN_FRACTION = 0.2
"""Mean / max of prompt and response lengths when the user gives neither ``--lengths`` nor a mean.

Responses: the median mean/max of the published math GRPO runs on Megatron in
``profiles/data/published_grpo.csv`` (NeMo-RL v0.3 blog: Llama-3.1-8B 795/3840, Llama-3.1-70B 398/3840,
Qwen3-32B 3283/3840, Qwen3-30B-A3B 3251/3840, Llama-3.1-70B 16K 749/16384; verl docs/perf/dpsk.md:
DeepSeek-V3 1960/9632), 0.205; ``tests/test_lengths.py`` recomputes it from the CSV. Prompts: verl's
GSM8K quick start logs ``prompt_length/mean`` 104.9 and 102.4 of ``max_prompt_length=512``
(docs/start/quickstart.rst), 0.20. The spread is wide (0.05 to 0.86): a mean equal to the max (the
old default) is the worst case, which prices a different plan."""
ASSUMED_LENGTHS_NOTE = (
    "mean = {pct}% of the max for {what}, the median of published math GRPO runs (NeMo-RL v0.3, verl docs); "
    "replace it with --lengths FILE or --prompt-len-mean / --response-len-mean"
)


def assumed_means(stats: Mapping[str, object], *, prompt_len: int, response_len: int) -> dict[str, object]:
    """``stats`` (what ``--lengths`` and the mean flags gave) with each missing mean set to
    :data:`ASSUMED_MEAN_FRACTION` of its maximum, and ``lengths_source`` saying so and how to replace it.
    A histogram (``response_len_quantiles``) counts as a given response distribution."""
    out = dict(stats)
    what = []
    if out.get("prompt_len_mean") is None:
        out["prompt_len_mean"] = max(1, round(ASSUMED_MEAN_FRACTION * prompt_len))
        what.append("prompts")
    if out.get("response_len_mean") is None and not out.get("response_len_quantiles"):
        out["response_len_mean"] = max(1, round(ASSUMED_MEAN_FRACTION * response_len))
        what.append("responses")
    if what:
        note = "assumed " + ASSUMED_LENGTHS_NOTE.format(pct=round(100 * ASSUMED_MEAN_FRACTION), what=" and ".join(what))
        src = out.get("lengths_source")
        out["lengths_source"] = f"{src}; {note}" if src else note
    return out


CLIP_FRACTION = 0.01
"""Share of responses the assumed distribution truncates at the cap (1%, capped at half the mean / max).

Math RL batches routinely hold responses cut at ``max_response_length``: verl issue #7412 logs a batch with
``response_length/mean`` 1,267 and ``response_length/max`` 3,072, the run's cap; the Rethinking-OPD authors
(github.com/Thinking-Space/Rethinking-OPD, issue #7) report truncated shares of about 7.5% for a non-thinking
Qwen3-1.7B and about 60% for DeepSeek-R1-Distill-Qwen-1.5B. A Beta(1, b) with b > 1 alone has no mass near
the cap, so it put the longest of a 768-8,192-response batch at 60-80% of the cap and priced the drain of the
batch (where a launch-bound eager decode spends most of its time) short. 1% is the low end of those figures;
on the shipped rows ``validate --grpo`` moves by under 0.3 points of leave-one-out step MAPE anywhere from
0.2% to 7.5% (docs/calibration.md), because any share at or above 1/N puts the longest of N at the cap."""

QUANTILE_POINTS = 20
"""Quantiles a histogram is summarised by: the midpoints (k + 0.5)/20 of 20 equal-mass bins."""


@dataclass(frozen=True)
class LengthDist:
    max_len: float
    mean_len: float
    quantiles: tuple[float, ...] = ()
    """Empirical lengths at probabilities (k + 0.5)/len, ascending; empty = the Beta(1, b) model."""
    b: float = 1.0
    """The Beta(1, b) shape of the responses below the cap (set by :func:`dist`)."""
    clip: float = 0.0
    """Fraction of responses truncated at the cap (the assumed model only; a histogram holds its own)."""

    def quantile(self, q: float) -> float:
        """Length at probability ``q`` (0..1)."""
        q = min(max(q, 0.0), 1.0)
        if self.quantiles:
            qs = self.quantiles
            k = len(qs)
            pos = q * k - 0.5
            if pos <= 0:
                return qs[0] * max(0.0, q * k / 0.5) if q < 0.5 / k else qs[0]
            if pos >= k - 1:  # between the last midpoint and the cap
                top = (q - (k - 0.5) / k) / (0.5 / k)
                return qs[-1] + (self.max_len - qs[-1]) * min(1.0, top)
            i = int(pos)
            f = pos - i
            return float(qs[i] + f * (qs[i + 1] - qs[i]))
        if q >= 1.0 - self.clip:
            return self.max_len
        return float(self.max_len * (1.0 - (1.0 - q / (1.0 - self.clip)) ** (1.0 / self.b)))

    def survival(self, length: float) -> float:
        """Fraction of responses longer than ``length``."""
        x = length / self.max_len
        if x >= 1.0:
            return 0.0
        if x <= 0.0:
            return 1.0
        if self.quantiles:
            qs = self.quantiles
            k = len(qs)
            if length <= qs[0]:
                return 1.0 - 0.5 / k * length / max(qs[0], 1e-9)
            if length >= qs[-1]:
                return 0.5 / k * (self.max_len - length) / max(self.max_len - qs[-1], 1e-9)
            for i in range(k - 1):
                if length <= qs[i + 1]:
                    f = (length - qs[i]) / max(qs[i + 1] - qs[i], 1e-9)
                    return 1.0 - (i + 0.5 + f) / k
            return 0.0
        return float(self.clip + (1.0 - self.clip) * (1.0 - x) ** self.b)

    def resident_len(self) -> float:
        """Mean length a response has reached while it is resident in a server that refills every slot as a
        sequence ends (the steady state of continuous batching): a resident sequence is picked in proportion to its
        length (the long ones stay longer) and is on average halfway through it, ``E[L^2] / (2 E[L])`` (the
        length-biased residual). For an exponential distribution it is the mean; a tail towards the cap raises it.
        Closed form for the assumed model (``E[x^2] = 2 / ((b + 1)(b + 2))`` for Beta(1, b), and the truncated
        share at the cap); for a histogram, its quantiles squared, averaged."""
        if self.mean_len <= 0:
            return 0.0
        if self.quantiles:
            pts = 200
            second = sum(self.quantile((i + 0.5) / pts) ** 2 for i in range(pts)) / pts
        else:
            body = 2.0 / ((self.b + 1.0) * (self.b + 2.0)) * self.max_len**2
            second = self.clip * self.max_len**2 + (1.0 - self.clip) * body
        return min(self.max_len, second / (2.0 * self.mean_len))

    def expected_max(self, n: float) -> float:
        """Expected longest of ``n`` responses (the quantile n/(n+1), capped at the maximum)."""
        if n <= 1:
            return self.mean_len
        if self.quantiles or not self.clip:
            return min(self.max_len, max(self.mean_len, self.quantile(n / (n + 1.0))))
        # some of the n hit the cap with probability 1 - (1 - clip)^n; else the body's own longest
        hit = 1.0 - float((1.0 - self.clip) ** n)
        body = self.max_len * (1.0 - float((1.0 / (n + 1.0)) ** (1.0 / self.b)))
        return min(self.max_len, max(self.mean_len, hit * self.max_len + (1.0 - hit) * body))


@lru_cache(maxsize=4096)
def dist(max_len: float, mean_len: float, quantiles: tuple[float, ...] = ()) -> LengthDist:
    mean = float(min(mean_len, max_len))
    mu = min(max(mean / max(max_len, 1e-9), 1e-6), 1.0)
    if quantiles:
        return LengthDist(float(max_len), mean, tuple(float(q) for q in quantiles), max(1.0 / mu - 1.0, 1e-6))
    p = min(CLIP_FRACTION, mu / 2)
    body = (mu - p) / (1.0 - p)  # the body's mean / max, so that the whole keeps the given mean
    return LengthDist(float(max_len), mean, (), max(1.0 / body - 1.0, 1e-6), p)


def quantiles_from_samples(lengths: list[float], points: int = QUANTILE_POINTS) -> tuple[int, ...]:
    """Summarise measured lengths by the ``points`` equal-mass bin midpoints."""
    xs = sorted(float(v) for v in lengths)
    if not xs:
        return ()
    out = []
    for k in range(points):
        pos = (k + 0.5) / points * (len(xs) - 1)
        i = int(pos)
        f = pos - i
        out.append(int(round(xs[i] + f * (xs[min(i + 1, len(xs) - 1)] - xs[i]))))
    return tuple(out)


def lengths_note(w: Workload) -> str:
    """Where a GRPO workload's mean lengths come from, for the search header, report.md and tune:
    the assumption and how to replace it, the file they were read from, or the flags."""
    if w.lengths_source:
        return " ".join(str(w.lengths_source).split())
    if w.response_len_mean is None and not w.response_len_quantiles:
        return "mean = max (the worst case); give --lengths FILE or --response-len-mean for a typical one"
    return "means from --prompt-len-mean / --response-len-mean"


def workload_line(w: Workload) -> str:
    """``1024 prompts x n=5, prompt <= 1024 (mean 205) + response <= 1024 (mean 205) tokens``."""
    return (
        f"{w.prompts} prompts x n={w.n}, prompt <= {w.prompt_len} (mean {w.mean_prompt_len:,.0f}) + "
        f"response <= {w.response_len} (mean {w.mean_response_len:,.0f}) tokens"
    )
