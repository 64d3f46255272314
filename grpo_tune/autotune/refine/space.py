"""The refinement's plan space: which plans a study may measure, in what order, and how alike they are."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from grpo_tune.core.config import TrainerOptions
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import OFFLOAD, Cluster, Strategy, Workload
from grpo_tune.costmodel.estimate import Estimate
from grpo_tune.costmodel.estimate import estimate as cost_estimate

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

MAX_SPACE = 20000
"""Beyond this many candidates only search's ranked list is used."""
SAME_PREDICTION = 0.03
"""Plans predicted within 3% of each other are ones the cost model cannot tell apart."""
RECOMPUTE_LEVEL = {"none": 0.0, "selective": 0.5, "full": 1.0}


def plan_key(s: Strategy) -> str:
    """A stable, readable key for a resolved strategy (stored on each trial; duplicates compare it)."""
    d = s.to_dict()
    d["offload"] = "+".join(s.memory.offload) or "none"
    return ",".join(f"{k}={d[k]}" for k in sorted(d))


INT_KNOBS = ("tp", "pp", "vpp", "cp", "ep", "mbs", "max_tokens_per_gpu", "rollout_tp")
"""The plan's integer knobs as the study's parameters (``max_tokens_per_gpu`` 0: fixed micro-batches of mbs)."""


def knob_params(s: Strategy) -> dict[str, int | float | str]:
    """A plan's real knobs as Optuna parameters, so optuna-dashboard's importance, slice and contour
    views read tp, pp, ... rather than a position in a list (the plan's rank is a user attribute)."""
    out: dict[str, int | float | str] = {k: int(cast(int | None, s.knob(k)) or 0) for k in INT_KNOBS}
    out["recompute"] = s.memory.recompute
    out["offload"] = ",".join(o for o in OFFLOAD if o in s.memory.offload) or "none"  # one spelling per set
    out["gpu_memory_utilization"] = float(s.rollout.gpu_memory_utilization)
    return out


def _offload_choices() -> tuple[str, ...]:
    import itertools

    subsets = (c for n in range(1, len(OFFLOAD) + 1) for c in itertools.combinations(OFFLOAD, n))
    return ("none", *(",".join(c) for c in subsets))


def knob_distributions(space: Sequence[Estimate]) -> dict[str, BaseDistribution]:
    """The parameters' distributions: integer ranges spanning the space, and the fixed vocabularies of
    recompute and offload (a categorical's choices may never change within a study)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from grpo_tune.core.strategy import RECOMPUTE

    vals = [knob_params(e.strategy) for e in space]
    ints = [{k: int(v[k]) for k in INT_KNOBS} for v in vals]
    d: dict[str, BaseDistribution] = {
        k: IntDistribution(min(v[k] for v in ints), max(v[k] for v in ints)) for k in INT_KNOBS
    }
    d["recompute"] = CategoricalDistribution(tuple(RECOMPUTE))
    d["offload"] = CategoricalDistribution(_offload_choices())
    mem = [float(v["gpu_memory_utilization"]) for v in vals]
    d["gpu_memory_utilization"] = FloatDistribution(min(mem), max(mem))
    return d


def knob_tuple(params: Mapping[str, object]) -> tuple[object, ...]:
    return tuple(params.get(k) for k in sorted(knob_params(Strategy())))


def build_space(
    ranked: Sequence[Estimate],
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    workload: Workload,
    *,
    calibration: dict[str, float] | None = None,
    pins: Mapping[str, object] | None = None,
    allow_cross_node_tp: bool = False,
) -> list[Estimate]:
    """Fitting plans, one per key, fastest predicted first.

    Every valid plan of search's space (the user's pins applied, the rollout memory fraction fixed
    to the best plan's) plus search's ranked list; with more than ``MAX_SPACE`` candidates only
    the ranked list.
    """
    from grpo_tune.autotune.search.candidates import Space
    from grpo_tune.costmodel.results import step_s

    pool: list[Estimate] = list(ranked)
    pins = dict(pins or {})
    if ranked and "gpu_memory_utilization" not in pins:
        pins["gpu_memory_utilization"] = ranked[0].strategy.rollout.gpu_memory_utilization
    space = Space(model, hardware, cluster, workload, pins, allow_cross_node_tp)
    if space.candidate_count() <= MAX_SPACE:
        for s in space.candidates():
            try:
                pool.append(
                    cost_estimate(
                        model=model,
                        hardware=hardware,
                        cluster=cluster,
                        strategy=s,
                        workload=workload,
                        calibration=calibration,
                    )
                )
            except GrpoTuneError:
                continue
    out: dict[str, Estimate] = {}
    for e in pool:
        if e.fits:  # one memory fraction per plan: the best-ranked one
            out.setdefault(plan_key(e.strategy.replace(gpu_memory_utilization=1.0)), e)
    # stable: equal predictions keep search's order (ranked first)
    return sorted(out.values(), key=lambda e: round(step_s(e), 9))


def runnable(space: list[Estimate], trainer: TrainerOptions) -> tuple[list[Estimate], list[str]]:
    """Plans the trainer accepts: core.support's rules, which the trainer's preflight applies too.

    The trainer options (``trainer``: dataset, reward, rollout engine) are the same for every plan;
    the profile command's preflight checks them, so a bad option fails each trial with its code."""
    from grpo_tune.core.support import check_supported

    keep, why = [], []
    for e in space:
        found = check_supported(e.model, e.strategy, e.hardware, workload=e.workload)
        if found:
            why.append(f"[{found[0].code}] {found[0].message}")
            continue
        keep.append(e)
    return keep, why


def predicted(e: Estimate) -> tuple[float | None, float | None]:
    """(step seconds, tokens/s of the whole cluster) the cost model predicts for ``e``."""
    step = e.step_s
    tps = None
    if e.throughput is not None:
        tps = float(e.throughput.tokens_per_s_per_gpu) * e.cluster.gpus
    return (None if step is None else float(step)), tps


def close(a: Estimate, b: Estimate) -> bool:
    pa, pb = predicted(a)[0], predicted(b)[0]
    return pa is not None and pb is not None and abs(pa - pb) <= SAME_PREDICTION * min(pa, pb)


def distinct(space: Sequence[Estimate], k: int) -> list[int]:
    """Indices of the cost model's top-k plans with distinct predictions (the TPE study's seeds).

    Measuring two plans the model predicts alike teaches it nothing about its ranking; the sampler
    can still reach the near-ties later.
    """
    out: list[int] = []
    for i, e in enumerate(space):
        if len(out) >= k:
            break
        if all(not close(e, space[j]) for j in out):
            out.append(i)
    return out


def features(s: Strategy) -> list[float]:
    """A plan as numbers for the similarity kernel: one unit per doubling of a degree or size."""
    lg = lambda x: math.log2(x) if x else 0.0
    return [
        lg(s.layout.tp),
        lg(s.layout.pp),
        lg(s.layout.dp),
        lg(s.layout.vpp),
        lg(s.layout.cp),
        lg(s.layout.ep),
        lg(s.batching.mbs),
        RECOMPUTE_LEVEL.get(s.memory.recompute, 0.5),
        float(bool(s.layout.sequence_parallel)),  # None (auto) counts as off, as before for False
        float(s.memory.distributed_optimizer),
        len(s.memory.offload) / 3,
        lg(s.rollout.rollout_tp),
        2.0 * s.rollout.gpu_memory_utilization,
        lg(s.batching.max_tokens_per_gpu or 0) / 4,
        float(s.memory.cpu_optimizer or 0.0),
    ]


def space_id(keys: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()[:12]


def default_study_name(model: ModelSpec, hardware: HardwareSpec, cluster: Cluster, workload: Workload) -> str:
    """Deterministic from the inputs, so that re-running the same command resumes the same study."""
    blob = json.dumps(
        [
            model.name,
            hardware.name,
            hardware.peak_flops_per_s(),
            cluster.gpus,
            cluster.gpus_per_node,
            workload.to_dict(),
        ],
        sort_keys=True,
        default=str,
    )
    return f"grpo-tune-{model.name}-{cluster.gpus}x{hardware.name}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"
