"""Scores of a prediction against measurements: MAPE and Spearman rank correlation.

Shared by the calibration fit and the refinement's report, so that neither imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mape(pred: Sequence[float], meas: Sequence[float]) -> float:
    """Mean absolute percentage error of predictions against measurements, in percent."""
    return 100.0 * sum(abs(p - m) / m for p, m in zip(pred, meas)) / len(meas)


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (scipy.stats.spearmanr); None below 3 points or for constant input."""
    if len(x) < 3:
        return None
    from scipy.stats import spearmanr

    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    r = spearmanr(x, y).statistic
    return None if math.isnan(r) else float(r)
