"""Refine a ranked search with real profiling runs: an Optuna study over the cost model's plans.

``refine(ranked, model, hardware, cluster, workload, out_dir, RefineOptions(...))`` is the one
entry point; ``grpo-tune search ... --refine`` calls it lazily. The parts:

- :mod:`.space`: the plan space. Every valid plan of search's space (pins applied) plus search's
  ranked list, kept to plans predicted to fit that the trainer's torch-free preflight accepts, one
  per stable key (``tp=2,pp=1,...``), fastest predicted first. The study's parameters are each
  plan's real knobs (tp, pp, vpp, cp, ep, mbs, max_tokens_per_gpu, recompute, offload, rollout_tp,
  gpu_memory_utilization; ``space.knob_params``), so optuna-dashboard's importance, slice and
  contour views read them; the position in that order is the user attribute ``plan_rank``, and
  trials also store the key, so duplicates are found by key even when a new calibration re-ranks
  the space.
- :mod:`.policy`: which plan next (policy ``model``, the default). The cost model's prediction is
  the prior; a Gaussian process on its log error is updated after every trial (a re-calibration
  that re-ranks the untried plans); the next plan has the largest expected improvement; exploring
  stops when no untried plan is likely to beat the best by more than the noise, and the remaining
  trials re-measure the best and its ties. Policy ``tpe`` is the first version: the model's top-k
  distinct plans, then Optuna's TPE, skipping plans predicted ``slower_than`` x the best's.
- :mod:`.runner`: one ``grpo-tune profile --config X --steps K --json out.json`` in its own
  process group, killed on timeout. OOM -> PRUNED, crash / bad JSON / timeout -> FAIL, each with
  its reason in ``user_attrs["reason"]``; the study never dies from a trial.
- :mod:`.study`: the Optuna study (public API only). Re-running the same command resumes: finished
  trials are kept, a trial left RUNNING by a dead worker on this host is failed with reason
  ``interrupted`` and its plan re-enqueued; on other hosts a stale ``heartbeat_utc`` does the same.
  Several processes (or machines, with a shared SQLAlchemy URL) may work on one study at once.
- :mod:`.loop`: :class:`RefineOptions`, :func:`run_trials` (the plan-choosing loop over any
  measuring function: real profiling runs, or the benchmark's cached measurements) and
  :func:`refine`.
- :mod:`.results`, :mod:`.report` and :mod:`.markdown`: winner (best median over its trials), the measured
  noise (spread of repeated trials; smaller differences are ties), rank correlation, calibration,
  console summary, report.md section and PNGs.

Storage defaults to ``sqlite:///<out_dir>/study.db``; open it with
``optuna-dashboard sqlite:///<out_dir>/study.db`` (``pip install optuna-dashboard``).
"""

from grpo_tune.autotune.refine.loop import (
    POLICIES,
    Measure,
    PlanIndex,
    RefineOptions,
    plan_space,
    refine,
    run_trials,
    seed_study,
)
from grpo_tune.autotune.refine.policy import ModelGuided, Pick, measured_noise, spread
from grpo_tune.autotune.refine.results import RefineResult, best_plan, by_plan, differ
from grpo_tune.autotune.refine.runner import PROFILE_CMD, ProfileOutcome, run_profile
from grpo_tune.autotune.refine.space import (
    build_space,
    default_study_name,
    distinct,
    features,
    plan_key,
    predicted,
    runnable,
)
from grpo_tune.autotune.refine.study import StudyHandle, TrialRecord, memory_study, open_study, recover

__all__ = [
    "POLICIES",
    "PROFILE_CMD",
    "Measure",
    "ModelGuided",
    "Pick",
    "PlanIndex",
    "ProfileOutcome",
    "RefineOptions",
    "RefineResult",
    "StudyHandle",
    "TrialRecord",
    "best_plan",
    "build_space",
    "by_plan",
    "default_study_name",
    "differ",
    "distinct",
    "features",
    "measured_noise",
    "memory_study",
    "open_study",
    "plan_key",
    "plan_space",
    "predicted",
    "recover",
    "refine",
    "run_profile",
    "run_trials",
    "runnable",
    "seed_study",
    "spread",
]
