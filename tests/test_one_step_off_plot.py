"""What verl's one-step-off doc publishes for its Megatron pair, read off the doc's own plot of the two runs
(benchmarks/digitize_one_step_off_plot.py -> benchmarks/results/one_step_off_megatron_plot.csv): the per-step
series agree with the table's total times, and they show that the table's step column is one late step, not the
runs' steady state, which is why validate --grpo scores the pair on the totals (docs/placement.md)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

PLOT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "one_step_off_megatron_plot.csv"
H = 3600


def _series() -> dict[tuple[str, str], dict[int, float]]:
    out: dict[tuple[str, str], dict[int, float]] = {}
    with PLOT.open() as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            out.setdefault((r["panel"], r["run"]), {})[int(r["step"])] = float(r["seconds"])
    return out


def _steady(v: dict[int, float]) -> list[float]:
    """Steps 31..89 less the validation steps (test_freq=10: every tenth step runs validation too): after the
    early fall and rise of the response lengths (steps 1-30) and before the one-step-off run's last ten steps."""
    return [v[k] for k in range(31, 90) if k % 10]


def test_the_plot_has_every_step_of_both_runs():
    s = _series()
    assert set(s) == {(p, r) for p in ("step", "generate_sequences") for r in ("colocate", "one_step_off_4_12")}
    assert all(sorted(v) == list(range(1, 101)) for v in s.values())


def test_the_plotted_steps_sum_to_the_tables_total_times():
    # one_step_off.md: total time 18h21m (colocate sync) and 13h06m (one-step-overlap async); the totals also hold
    # start-up, which the steps do not, and one pixel is 2.35 s: within 3%
    s = _series()
    assert sum(s[("step", "colocate")].values()) == pytest.approx(18 * H + 21 * 60, rel=0.03)
    assert sum(s[("step", "one_step_off_4_12")].values()) == pytest.approx(13 * H + 6 * 60, rel=0.03)


def test_the_tables_step_column_is_a_late_step_not_the_steady_state():
    s = _series()
    osm = _steady(s[("step", "one_step_off_4_12")])
    gen = _steady(s[("generate_sequences", "one_step_off_4_12")])
    # the table's 566 s step and 501 s generation are above every steady step of the run
    assert max(osm) < 566 and max(gen) < 501
    # ... and within its last ten steps, where the generation rose (from ~430 s to 500-600 s)
    last = [s[("generate_sequences", "one_step_off_4_12")][k] for k in range(92, 100)]
    assert min(last) > 480 and statistics.mean(gen) < 440
    # the steady-state speed-up lies between the totals' (1.40x) and the model's (about 1.51x), far above the
    # table's 1.235x
    ratio = statistics.mean(_steady(s[("step", "colocate")])) / statistics.mean(osm)
    assert 1.40 < ratio < 1.50, ratio
