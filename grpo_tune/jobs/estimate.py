"""``grpo-tune estimate``'s work: the cost model's figures for one plan, colocated or on separate pools.

:func:`run_estimate` takes an :class:`EstimateRequest` and returns the :class:`Estimate`; ``cli/estimate.py``
prints it.
"""

from __future__ import annotations


import dataclasses
from dataclasses import dataclass

from grpo_tune.core.placement import Placement, PlacementAsk
from grpo_tune.core.target import Target
from grpo_tune.costmodel.estimate import Estimate, estimate
from grpo_tune.jobs.setup import Setup


@dataclass(frozen=True)
class EstimateRequest:
    """What ``estimate`` was asked: the target, the plan's knobs, the placement."""

    target: Target
    pins: dict[str, object]
    setup: Setup = Setup()
    place: PlacementAsk = PlacementAsk()


def run_estimate(req: EstimateRequest) -> Estimate:
    """The plan the pins describe (the framework's fixed fields added), priced colocated or on the pools asked."""
    from grpo_tune import frameworks as F
    from grpo_tune.core.strategy import Strategy

    from grpo_tune.core.hardware import NATIVE_ENGINE, plan_engine, with_rollout_engine

    hw0 = req.target.hardware
    if hw0.default_engine == NATIVE_ENGINE and req.pins.get("engine") != (e := plan_engine(req.pins, hw0)):
        # a platform with one default engine (cpu): the plan's engine pinned, the hardware priced for it
        t = req.target._replace(hardware=with_rollout_engine(hw0, e))
        return run_estimate(dataclasses.replace(req, target=t, pins={**req.pins, "engine": e}))
    if req.pins.get("engine") == "auto":  # --rollout-engine auto: the plan on each engine, the faster one
        from grpo_tune.core.choices import Engine
        from grpo_tune.costmodel.results import step_s

        each = [run_estimate(dataclasses.replace(req, pins={**req.pins, "engine": e})) for e in Engine.values()]
        return min(each, key=step_s)
    m, hw, cluster, wl = req.target
    pins = F.plan_pins(req.setup.frameworks, separate_memory_pins(req))
    strategy = Strategy.from_dict(pins, where="options")
    cal = req.setup.load_calibration(hw.name)
    place = req.place
    if place.stream is not False and not F.can_stream(req.setup.frameworks):
        place = dataclasses.replace(place, stream=False)  # a plan no chosen framework runs is not priced
    if place.placement == "colocated" and not place.pool_options:
        return estimate(model=m, hardware=hw, cluster=cluster, strategy=strategy, workload=wl, calibration=cal)
    return _estimate_separate(m, hw, cluster, strategy, wl, cal, place)


def separate_memory_note(req: EstimateRequest) -> str | None:
    """What the rollout pool's memory fraction is when separate pools are priced without one: the framework's own
    for that mode (frameworks.separate_memory), said in the output. None: colocated, or the user set it."""
    from grpo_tune import frameworks as F

    if req.place.placement != "separate" or req.pins.get("gpu_memory_utilization") is not None:
        return None
    v, why = F.separate_memory(req.setup.frameworks or (F.DEFAULT,))
    return f"rollout pool gpu_memory_utilization {v}: the framework's default for a separate pool ({why})"


def separate_memory_pins(req: EstimateRequest) -> dict[str, object]:
    """``req.pins`` with the separate rollout pool's default memory fraction where the user set none."""
    from grpo_tune import frameworks as F

    if separate_memory_note(req) is None:
        return req.pins
    return {**req.pins, "gpu_memory_utilization": F.separate_memory(req.setup.frameworks or (F.DEFAULT,))[0]}


def placement_of(place: PlacementAsk, gpus: int) -> Placement:
    """The Placement the placement flags ask for (a coded error for a bad combination)."""
    from grpo_tune.core.choices import PlacementMode
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.costmodel.pools import check_fields

    mode = place.placement
    if mode not in PlacementMode.values():
        raise ConfigError(
            f"--placement must be colocated or separate here, got {mode!r}", hint="auto is for search: it searches both"
        )
    if mode == "separate" and place.rollout_gpus is None:
        raise ConfigError(
            "--placement separate needs --rollout-gpus N", hint=f"e.g. --rollout-gpus {max(1, gpus // 4)}"
        )
    p = Placement(
        mode=mode,
        rollout_gpus=place.rollout_gpus or 0,
        rollout_hardware=place.rollout_hardware,
        staleness=place.staleness,
        partial_rollout=place.partial_rollout,
        stream=place.stream is not False and mode == "separate" and place.staleness == 0,
    )
    check_fields(p, where="options")
    return p


def _estimate_separate(m, hw, cluster, strategy, wl, cal, place):
    from grpo_tune.costmodel.pools import estimate_separate
    from grpo_tune.costmodel.streaming import cheaper_stream

    p = placement_of(place, cluster.gpus)
    hw_r = p.rollout_profile()

    def price(stream: bool) -> Estimate:
        return estimate_separate(
            model=m,
            hardware=hw,
            cluster=cluster,
            strategy=strategy,
            workload=wl,
            placement=dataclasses.replace(p, stream=stream),
            rollout_hardware=hw_r,
            calibration=cal,
        )

    if place.stream is None and p.stream:  # neither --stream nor --no-stream: the cheaper of the two
        return cheaper_stream(price)
    return price(p.stream)
