"""Which plan to measure next: the cost model as a prior, corrected by every measurement so far.

The log of a plan's step time is modelled as ``log(predicted) + g(plan)``: the cost model's
prediction is the prior mean, and its error ``g`` is a Gaussian process over the plan's features
(:func:`autotune.refine.space.features`, one unit per doubling of a degree or size). The kernel
has a constant part (the model's error shared by every plan: a global re-calibration) and a
squared-exponential part (errors shared by similar plans). Each measurement updates the
posterior of every untried plan, so the ranking is re-calibrated after every trial.

Next plan: the untried plan with the largest expected improvement over the best measured plan.
Noise-aware stop: when no untried plan has more than a ``P_STOP`` chance of beating the best by
more than the noise, exploring ends; remaining trials re-measure the best plan and the plans
within noise of it (each at most ``MAX_REPEATS`` times), which also measures the noise. The
noise is the spread of repeated trials once there are any, else the assumed ``noise`` option.

The hyperparameters below are a priori choices (not fitted to any benchmark): the cost model's
absolute error on a new machine can be ~50% (``OFFSET_SD``), errors between similar plans differ
by ~25% (``LOCAL_SD``), and a plan one doubling away in one feature shares ~80% of the error.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.estimate import Estimate

from .space import features, predicted

OFFSET_SD = 0.5
LOCAL_SD = 0.25
LENGTH = 1.5
P_STOP = 0.05
MAX_REPEATS = 3
MIN_NOISE = 0.01


@dataclass(frozen=True)
class Pick:
    index: int
    why: str
    repeat: bool = False


def spread(samples: Sequence[float]) -> float:
    """(max - min) / median of repeated measurements of one plan (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    return (max(samples) - min(samples)) / statistics.median(samples)


def measured_noise(by_plan: dict[int, list[float]]) -> float | None:
    """The largest spread among plans measured more than once; None when no plan was."""
    s = [spread(v) for v in by_plan.values() if len(v) >= 2]
    return max(s) if s else None


def _ncdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _npdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


class ModelGuided:
    """The model-guided chooser over a fixed space (indices into ``space``)."""

    def __init__(self, space: Sequence[Estimate], *, noise: float = 0.05):
        import numpy as np

        self.n = len(space)
        self.prior = np.array([math.log(predicted(e)[0] or 1.0) for e in space])
        x = np.array([features(e.strategy) for e in space], dtype=float)
        d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
        self.k = OFFSET_SD ** 2 + LOCAL_SD ** 2 * np.exp(-d2 / (2 * LENGTH ** 2))
        self.assumed_noise = noise

    def noise(self, by_plan: dict[int, list[float]]) -> float:
        m = measured_noise(by_plan)
        return max(MIN_NOISE, self.assumed_noise if m is None else m)

    def posterior(self, obs: Sequence[tuple[int, float]], noise: float):
        """Mean and sd of every plan's log step time given ``(index, step_s)`` observations."""
        import numpy as np

        if not obs:
            return self.prior.copy(), np.sqrt(np.diag(self.k))
        idx = np.array([i for i, _ in obs])
        y = np.log([s for _, s in obs]) - self.prior[idx]
        sn = max(MIN_NOISE, math.log1p(noise) / 2)  # a range of ~3 draws spans ~2 sd
        kk = self.k[np.ix_(idx, idx)] + sn ** 2 * np.eye(len(idx))
        ks = self.k[:, idx]
        sol = np.linalg.solve(kk, np.column_stack([y, ks.T]))
        mu = self.prior + ks @ sol[:, 0]
        var = np.diag(self.k) - np.einsum("ij,ji->i", ks, sol[:, 1:])
        return mu, np.sqrt(np.maximum(var, 1e-12))

    def choose(self, obs: Sequence[tuple[int, float]], busy: set[int] = frozenset()) -> Pick | None:
        """The next plan to measure, or None when nothing is worth a trial."""
        by_plan: dict[int, list[float]] = {}
        for i, s in obs:
            by_plan.setdefault(i, []).append(s)
        free = [i for i in range(self.n) if i not in by_plan and i not in busy]
        by_plan = {i: v for i, v in by_plan.items() if i < self.n}
        if not by_plan:
            return Pick(min(free, key=lambda i: self.prior[i]), "cost model's best") if free else None
        noise = self.noise(by_plan)
        mu, sd = self.posterior(obs, noise)
        med = {i: math.log(statistics.median(v)) for i, v in by_plan.items()}
        best = min(med.values())
        margin = math.log1p(noise)
        if free:
            p_beat = {i: _ncdf((best - margin - mu[i]) / sd[i]) for i in free}
            if max(p_beat.values()) > P_STOP:
                ei = {i: (best - mu[i]) * _ncdf((best - mu[i]) / sd[i]) + sd[i] * _npdf((best - mu[i]) / sd[i])
                      for i in free}
                i = max(free, key=lambda j: (ei[j], -mu[j]))
                return Pick(i, f"expected improvement {math.expm1(ei[i]):.1%}, "
                               f"P(beats best by > noise) {p_beat[i]:.0%}")
        # Exploring is done: re-measure the best and plans within noise of it (fewest repeats first).
        near = [i for i, m in med.items() if m - best <= margin and len(by_plan[i]) < MAX_REPEATS and i not in busy]
        if not near or (len(near) == 1 and measured_noise(by_plan) is not None):
            return None
        i = min(near, key=lambda j: (len(by_plan[j]), med[j]))
        return Pick(i, "repeat: within noise of the best" if med[i] > best else "repeat: the best, to measure noise",
                    repeat=True)
