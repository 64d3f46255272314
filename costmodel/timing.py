"""Time model (in progress): until it lands, estimates carry no time (null in --json)."""
from __future__ import annotations


def step_time(model, hardware, cluster, strategy, workload, *, calibration=None):
    return None, None
