"""The refine study in optuna-dashboard: every trial carries the plan's real knobs as its parameters
(tp, pp, vpp, cp, ep, mbs, max_tokens_per_gpu, recompute, offload, rollout_tp, gpu_memory_utilization),
equal to the strategy it ran, so importance, slice and contour views mean something; the plan's
position in the space is the user attribute ``plan_rank``, not a parameter. Both policies, an
in-memory study and a measuring function of the degrees (no processes).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def space():
    from _inputs import grpo_inputs

    from grpo_tune.autotune.refine import build_space, runnable
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.core.config import TrainerOptions

    m, hw, cl, wl = grpo_inputs(
        "tiny", "cpu", 4, prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8, seq_len=64, gbs=8
    )
    sp, _ = runnable(build_space(search(m, hw, cl, wl).ranked, m, hw, cl, wl), TrainerOptions())
    return sp


@pytest.mark.parametrize("policy", ["model", "tpe"])
def test_trials_carry_the_plans_knobs_as_parameters(space, policy):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from grpo_tune.autotune.refine import PlanIndex, ProfileOutcome, RefineOptions, memory_study, run_trials, seed_study

    opts = RefineOptions(trials=6, policy=policy, seed=3, progress=False, emit=False, calibrate=False)
    plans = PlanIndex.of(space, opts)
    h = memory_study(opts.seed)
    seed_study(h, plans, opts)

    def measure(_h, _n, est):
        s = est.strategy
        step = 0.1 * s.layout.pp + 0.05 * s.layout.tp + 0.01 * s.batching.mbs
        return ProfileOutcome("ok", None, {"step_s": step, "tokens_per_s": 1000 / step, "phases_s": {}}, 0.0)

    run_trials(h, plans, opts, measure, host="test")
    ran = [t for t in h.study.trials if t.user_attrs.get("ran")]
    assert len(ran) == 6
    knobs = {"tp", "pp", "vpp", "cp", "ep", "mbs", "max_tokens_per_gpu", "recompute", "offload", "rollout_tp"}
    for t in ran:
        assert set(t.params) == knobs | {"gpu_memory_utilization"}, t.params
        s = t.user_attrs["strategy"]
        for k in ("tp", "pp", "vpp", "cp", "ep", "mbs", "rollout_tp", "recompute"):
            assert t.params[k] == s[k], k
        assert t.params["max_tokens_per_gpu"] == (s["max_tokens_per_gpu"] or 0)
        assert t.params["offload"] == (",".join(s["offload"]) or "none")
        assert t.params["gpu_memory_utilization"] == s["gpu_memory_utilization"]
        assert "plan_rank" not in t.params and plans.keys[t.user_attrs["plan_rank"]] == t.user_attrs["plan"]
        assert isinstance(t.distributions["tp"], IntDistribution)
        assert isinstance(t.distributions["recompute"], CategoricalDistribution)
        assert isinstance(t.distributions["gpu_memory_utilization"], FloatDistribution)
    # the knobs vary over the trials: a dashboard's importance has something to weigh
    assert len({(t.params["tp"], t.params["pp"], t.params["mbs"]) for t in ran}) > 1


def test_a_resumed_refine_prints_no_empty_wrote_line(tmp_path):
    """On resume the run folder exists, nothing is written before the refinement ends: no `wrote .../ ()`."""
    from _inputs import grpo_inputs
    from rich.console import Console

    from grpo_tune.autotune.search.driver import search
    from grpo_tune.cli.search import _print_result

    m, hw, cl, wl = grpo_inputs(
        "tiny", "cpu", 2, prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8, seq_len=64, gbs=8
    )
    result = search(m, hw, cl, wl)
    for files, want in (({}, "resuming in"), ({"best": tmp_path / "best.yaml"}, "wrote")):
        c = Console(record=True, width=100)
        _print_result(result, wl, c, top=2, all_plans=False, run_dir=tmp_path, files=files)
        text = c.export_text()
        assert want in text and "()" not in text
