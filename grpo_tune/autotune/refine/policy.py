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
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from grpo_tune.costmodel.estimate import Estimate

from grpo_tune.autotune.refine.space import features, predicted

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
        self.x = np.array([features(e.strategy) for e in space], dtype=float)
        self.prior_var = OFFSET_SD**2 + LOCAL_SD**2
        self.assumed_noise = noise

    def kernel(self, idx):
        """Kernel columns k(every plan, plans ``idx``): n x len(idx), never the full n x n (spaces reach 10^4+)."""
        import numpy as np

        d2 = ((self.x[:, None, :] - self.x[None, idx, :]) ** 2).sum(-1)
        return OFFSET_SD**2 + LOCAL_SD**2 * np.exp(-d2 / (2 * LENGTH**2))

    def noise(self, by_plan: dict[int, list[float]]) -> float:
        """The relative difference that counts as noise: the largest measured spread, else the assumed one."""
        m = measured_noise(by_plan)
        return max(MIN_NOISE, self.assumed_noise if m is None else m)

    def noise_sd(self, by_plan: dict[int, list[float]]) -> float:
        """Sd of one measurement's log: pooled over repeated plans, else from the assumed noise."""
        groups = [[math.log(x) for x in v] for v in by_plan.values() if len(v) >= 2]
        dof = sum(len(g) - 1 for g in groups)
        if not dof:
            return max(MIN_NOISE, math.log1p(self.assumed_noise) / 2)  # a range of ~3 draws spans ~2 sd
        ss = sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g)
        return max(MIN_NOISE, math.sqrt(ss / dof))

    def posterior(self, obs: Sequence[tuple[int, float]], noise_sd: float):
        """Mean and sd of every plan's log step time given ``(index, step_s)`` observations."""
        import numpy as np

        if not obs:
            return self.prior.copy(), np.full(self.n, math.sqrt(self.prior_var))
        idx = np.array([i for i, _ in obs])
        y = np.log([s for _, s in obs]) - self.prior[idx]
        ks = self.kernel(idx)
        kk = ks[idx] + noise_sd**2 * np.eye(len(idx))
        sol = np.linalg.solve(kk, np.column_stack([y, ks.T]))
        mu = self.prior + ks @ sol[:, 0]
        var = self.prior_var - np.einsum("ij,ji->i", ks, sol[:, 1:])
        return mu, np.sqrt(np.maximum(var, 1e-12))

    @staticmethod
    def _group(obs: Sequence[tuple[int, float]], n: int) -> dict[int, list[float]]:
        by_plan: dict[int, list[float]] = {}
        for i, s in obs:
            if 0 <= i < n:
                by_plan.setdefault(i, []).append(s)
        return by_plan

    def recommend(self, obs: Sequence[tuple[int, float]]) -> int | None:
        """The measured plan with the fastest posterior mean: measurements weighed against their noise
        and the model, so one lucky run of a plan does not outvote the rest."""
        by_plan = self._group(obs, self.n)
        if not by_plan:
            return None
        mu, _ = self.posterior(obs, self.noise_sd(by_plan))
        return min(by_plan, key=lambda i: (mu[i], statistics.median(by_plan[i])))

    def choose(self, obs: Sequence[tuple[int, float]], busy: AbstractSet[int] = frozenset()) -> Pick | None:
        """The next plan to measure, or None when nothing is worth a trial.

        Order: the model's best first; once two plans are measured and none twice, the incumbent
        again (the noise must be known before measurements are compared); then the largest expected
        improvement while an untried plan may beat the incumbent by more than the noise; then
        repeats of the incumbent and plans within noise of it.
        """
        by_plan = self._group(obs, self.n)
        free = [i for i in range(self.n) if i not in by_plan and i not in busy]
        if not by_plan:
            return Pick(min(free, key=lambda i: self.prior[i]), "cost model's best") if free else None
        mu, sd = self.posterior(obs, self.noise_sd(by_plan))
        inc = min(by_plan, key=lambda i: (mu[i], statistics.median(by_plan[i])))
        if len(by_plan) >= 2 and measured_noise(by_plan) is None and inc not in busy:
            return Pick(inc, "repeat: the incumbent, to measure the noise", repeat=True)
        best, margin = mu[inc], math.log1p(self.noise(by_plan))
        if free:
            p_beat = {i: _ncdf((best - margin - mu[i]) / sd[i]) for i in free}
            if max(p_beat.values()) > P_STOP:
                ei = {
                    i: (best - mu[i]) * _ncdf((best - mu[i]) / sd[i]) + sd[i] * _npdf((best - mu[i]) / sd[i])
                    for i in free
                }
                i = max(free, key=lambda j: (ei[j], -mu[j]))
                return Pick(
                    i,
                    f"expected improvement {math.expm1(ei[i]):.1%}, P(beats the incumbent by > noise) {p_beat[i]:.0%}",
                )
        # Exploring is done: re-measure the incumbent and plans within noise of it (fewest repeats first).
        near = [i for i in by_plan if mu[i] - best <= margin and len(by_plan[i]) < MAX_REPEATS and i not in busy]
        if not near or near == [inc] and len(by_plan[inc]) >= 2:
            return None
        i = min(near, key=lambda j: (len(by_plan[j]), mu[j]))
        return Pick(i, "repeat: within noise of the incumbent" if i != inc else "repeat: the incumbent", repeat=True)
