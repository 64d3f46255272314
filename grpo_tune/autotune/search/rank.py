"""Ranking of the search's plans: step time, throughput, the rank key and the Pareto front."""

from __future__ import annotations

import math

import numpy as np

from grpo_tune.costmodel.estimate import Estimate
from grpo_tune.costmodel.results import step_s


def rank_key(est: Estimate) -> tuple[float, float]:
    """Faster first; step times equal to 3 significant figures are ties (the cost model is not
    more precise than that: `grpo-tune validate`'s error is a few %), and among ties more memory
    headroom comes first."""
    t = step_s(est)
    return (float(f"{t:.3g}") if math.isfinite(t) else math.inf, -est.headroom_bytes)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated in (throughput: higher better, peak: lower better),
    sorted by throughput, highest first."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], points[i][1]))
    front, best_peak = [], math.inf
    for i in order:
        if points[i][1] < best_peak:
            front.append(i)
            best_peak = points[i][1]
    return front


def _pareto_arrays(thr: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """:func:`pareto_front` for arrays: sort by throughput (desc) then peak (asc) and keep each
    point whose peak is below every peak before it."""
    order = np.lexsort((peak, -thr))
    p = peak[order]
    prev = np.minimum.accumulate(np.concatenate(([np.inf], p[:-1])))
    return order[p < prev]
