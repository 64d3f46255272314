"""Ranking: the factored search finds what an exhaustive pass finds; the winner fits; pins hold;
the Pareto front is non-dominated; NO_FEASIBLE_PLAN names the tightest phase."""

from __future__ import annotations

import dataclasses

import math

import pytest
from hypothesis import given, settings, strategies as st

from grpo_tune.autotune.search.candidates import Space
from grpo_tune.autotune.search.rank import pareto_front, rank_key
from grpo_tune.costmodel.results import step_s, tokens_per_s_per_gpu
from grpo_tune.autotune.search.driver import search
from grpo_tune.core.errors import GrpoTuneError, NoFeasiblePlanError
from grpo_tune.costmodel.estimate import PhaseTimes, estimate
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Workload

H100 = load_hardware("h100")
CPU = load_hardware("cpu")
SMALL = Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8)


def _exhaustive(sp: Space):
    best = None
    for s in sp.candidates():
        e = estimate(model=sp.model, hardware=sp.hardware, cluster=sp.cluster, strategy=s, workload=sp.workload)
        if e.fits and (best is None or rank_key(e) < rank_key(best)):
            best = e
    return best


@pytest.mark.parametrize(
    "model,gpus,hw,wl,pins",
    [
        ("tiny", 4, CPU, SMALL, {"gpu_memory_utilization": 0.5}),
        ("7b", 8, H100, Workload(), {"tp": 2, "recompute": "selective"}),
        ("qwen3-30b-a3b", 16, H100, Workload(), {"tp": 2, "pp": 1, "cp": 1, "mbs": 4, "recompute": "selective"}),
    ],
)
def test_factored_search_matches_exhaustive(model, gpus, hw, wl, pins):
    m = load_model(model)
    cl = Cluster(gpus=gpus, gpus_per_node=min(8, gpus))
    sp = Space(m, hw, cl, wl, pins)
    want = _exhaustive(sp)
    got = search(m, hw, cl, wl, pins=pins)
    assert want is not None
    # The search adds Megatron's CPU optimizer when some layout needs it to fit (issue 9): a larger
    # space, so its winner is at least as good as the exhaustive one over the plain space.
    wide = dataclasses.replace(sp, cpu_grid=(None, 1.0))
    assert got.candidates in (sp.candidate_count(), wide.candidate_count())
    assert got.evaluated < got.candidates or got.candidates < 2000
    if got.candidates == sp.candidate_count():
        assert rank_key(got.best)[0] == rank_key(want)[0]  # same step time to 3 significant figures (a tie class)
    else:
        assert rank_key(got.best)[0] <= rank_key(want)[0]


def _check_result(res, pins=None):
    assert res.ranked and all(e.fits for e in res.ranked)
    keys = [rank_key(e) for e in res.ranked]
    assert keys == sorted(keys)
    assert res.best.fits and res.best.peak_bytes <= res.best.capacity_bytes
    for k, v in (pins or {}).items():
        assert all(e.strategy.knob(k) == v for e in res.ranked), k
    # Pareto: nothing evaluated dominates a front point; the fastest plan is on the front.
    for p in res.pareto:
        for e in res.ranked:
            assert not (tokens_per_s_per_gpu(e) > tokens_per_s_per_gpu(p) and e.peak_bytes < p.peak_bytes)
    fastest = max(tokens_per_s_per_gpu(e) for e in res.ranked)
    assert max(tokens_per_s_per_gpu(p) for p in res.pareto) == pytest.approx(fastest)
    # the winner is the roomiest of the plans tied with the fastest (equal to 3 significant figures)
    assert rank_key(res.best)[0] == min(k[0] for k in keys)


def test_7b_on_8_h100_winner_fits():
    res = search(load_model("7b"), H100, Cluster(gpus=8), Workload())
    _check_result(res)
    assert res.candidates > 50_000 and res.combined > 50_000
    assert res.best.time is not None and math.isfinite(step_s(res.best))
    # 2k-token sequences: no context parallelism (the trainer runs the winner as emitted)
    assert all(e.strategy.layout.cp == 1 for e in res.ranked)
    assert (
        res.best.strategy.layout.tp
        * res.best.strategy.layout.pp
        * res.best.strategy.layout.cp
        * res.best.strategy.layout.dp
        == 8
    )


@pytest.mark.parametrize(
    "pins",
    [
        {"tp": 2},
        {"offload": ("optimizer",)},
        {"rollout_tp": 4},
        {"tp": 1, "pp": 2, "recompute": "full", "gpu_memory_utilization": 0.5},
    ],
)
def test_pins_honoured_in_ranking(pins):
    res = search(load_model("7b"), H100, Cluster(gpus=8), Workload(), pins=pins)
    _check_result(res, pins)


def test_moe_uneven_pipeline_search():
    m = load_model("deepseek-v3")
    res = search(m, H100, Cluster(gpus=256), Workload(), top=5)
    _check_result(res)
    assert res.pruned_layouts > 0  # the 671B model cannot fit most layouts


def test_no_feasible_plan_names_tightest_phase():
    with pytest.raises(NoFeasiblePlanError) as ei:
        search(load_model("llama-3.1-405b"), H100, Cluster(gpus=1, gpus_per_node=1), Workload())
    err = ei.value
    assert err.code == "NO_FEASIBLE_PLAN"
    assert "tightest phase" in err.message and "GiB" in err.message
    assert "--gpus" in err.hint and "response-len" in err.hint


def test_no_feasible_rollout_suggests_shorter_responses():
    pins = {"offload": (), "gpu_memory_utilization": 0.9, "recompute": "none"}
    with pytest.raises(NoFeasiblePlanError) as ei:
        search(load_model("7b"), H100, Cluster(gpus=8), Workload(response_len=8192), pins=pins)
    assert "offload" in ei.value.hint and "--response-len" in ei.value.hint


def test_invalid_pin_is_a_coded_error():
    with pytest.raises(GrpoTuneError) as ei:
        search(load_model("7b"), H100, Cluster(gpus=8), Workload(), pins={"tp": 3})
    assert ei.value.code == "INVALID_DEGREES"


def test_search_is_deterministic():
    a = search(load_model("7b"), H100, Cluster(gpus=8), Workload(), top=5)
    b = search(load_model("7b"), H100, Cluster(gpus=8), Workload(), top=5)
    assert [e.strategy for e in a.ranked] == [e.strategy for e in b.ranked]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=30))
def test_pareto_front_brute_force(points):
    front = set(pareto_front(points))
    for i, (t, m) in enumerate(points):
        dominated = any((t2 >= t and m2 <= m) and (t2 > t or m2 < m) for t2, m2 in points)
        if dominated:
            assert i not in front
    # every non-dominated value pair is represented
    kept = {points[i] for i in front}
    for t, m in points:
        if not any((t2 >= t and m2 <= m) and (t2 > t or m2 < m) for t2, m2 in points):
            assert (t, m) in kept


_MOE_GAP = pytest.mark.xfail(
    strict=True,
    reason="re-priced MoE plans (fixed host costs, bounded MoE overhead) put the exact pass on plans where the "
    "update phase's peak switches between forward-backward and the optimizer step across batch and CPU-optimizer "
    "options (a max inside a phase, not additive): 2.4% of peak memory; the search widens its exact pass as designed",
)


@pytest.mark.parametrize("model,gpus", [("7b", 8), pytest.param("qwen3-30b-a3b", 32, marks=_MOE_GAP)])
def test_combined_figures_equal_exact_estimates(model, gpus):
    """The factored combination (grid + offload deltas + rollout deltas) reproduces the exact
    estimate of every plan evaluated exactly, and of each layout's far-corner probe, within 1%
    (the exact pass widens above that). The only gap today is the worst pipeline stage changing
    between variants when the stages are uneven (~0.1% of peak memory)."""
    res = search(load_model(model), H100, Cluster(gpus=gpus), Workload())
    assert res.combination_error < 0.01


def test_screening_keeps_the_optimum():
    """Screening layouts down to 24 finds the same winner as the full grid over all its layouts
    (8k-token sequences: context parallelism would qualify, but the search keeps only plans the
    trainer runs, so no CP). The default keeps 48; since host costs became fixed seconds and the MoE
    and decode terms were re-priced, 16 is too few here (4% slower winner; 8: more), which is why the
    default is not lower."""
    m = load_model("llama-3.1-70b")
    wl = Workload(prompt_len=4096, response_len=4096)
    full = search(m, H100, Cluster(gpus=32), wl, keep_layouts=10_000)
    screened = search(m, H100, Cluster(gpus=32), wl, keep_layouts=24)
    assert full.layouts > 60 and screened.evaluated < 0.6 * full.evaluated  # 24 of 76 layouts: ~0.55 of the calls
    assert all(e.strategy.layout.cp == 1 for e in full.ranked)
    # Within 0.5%: with dynamic-batching caps and vLLM knobs in the space (issue 9) the screened
    # winner can be a neighbour of the full grid's that differs below the model's accuracy.
    assert rank_key(screened.best)[0] <= 1.005 * rank_key(full.best)[0]
    assert rank_key(search(m, H100, Cluster(gpus=32), wl).best)[0] <= 1.005 * rank_key(full.best)[0]


def test_calibration_reaches_the_ranking(tmp_path):
    """--calibration FILE is applied: halving compute efficiency slows the predicted winner."""
    from grpo_tune.autotune.calibrate.fit import load as load_cal, save as save_cal

    path = save_cal(tmp_path / "cal.json", params={"compute_efficiency_scale": 0.5}, hardware=H100.name)
    cal = load_cal(path, hardware=H100.name)
    base = search(load_model("7b"), H100, Cluster(gpus=8), Workload(), top=1)
    slow = search(load_model("7b"), H100, Cluster(gpus=8), Workload(), top=1, calibration=cal)
    assert step_s(slow.best) > 1.2 * step_s(base.best)
    assert slow.best.time["update"] > 1.8 * base.best.time["update"]


def test_pretrain_has_no_rollout_axis():
    wl = Workload(kind="pretrain", seq_len=4096, gbs=512)
    sp = Space(load_model("7b"), H100, Cluster(gpus=8), wl)
    assert len(sp.rollout_options()) == 1
    res = search(load_model("7b"), H100, Cluster(gpus=8), wl, top=3)
    _check_result(res)
    assert set(res.best.memory) == {"update"}


def test_pretrain_plans_keep_the_interleaving_rule():
    """megatron-core's interleaved schedule needs >= pp micro-batches (a multiple of pp) in a pretraining step
    too: with a global batch of 3 on tp4 pp2 (dp1), mbs 3 makes one micro-batch, which vpp > 1 cannot run."""
    from grpo_tune.core.rules import check_batches
    from grpo_tune.core.strategy import Strategy
    from grpo_tune.core.support import check_plan

    wl = Workload(kind="pretrain", seq_len=4096, gbs=3)
    m = load_model("7b")
    bad = Strategy.of(tp=4, pp=2, vpp=14, dp=1, mbs=3)
    assert [f.code for f in check_plan(m, bad, workload=wl)] == ["BATCH_DIVISIBILITY"]
    assert check_plan(m, Strategy.of(tp=4, pp=2, vpp=1, dp=1, mbs=3), workload=wl) == []
    res = search(m, H100, Cluster(gpus=8), wl, top=50)
    assert res.ranked
    for e in res.ranked:
        lay = e.strategy.layout
        assert not check_batches(wl, dp=lay.dp, mbs=e.strategy.batching.mbs, pp=lay.pp, vpp=lay.vpp), lay


@settings(max_examples=25, deadline=None)
@given(
    gpus=st.sampled_from([1, 2, 3, 4, 6, 8]),
    prompts=st.sampled_from([1, 2, 4, 6, 8, 16]),
    n=st.integers(1, 6),
    mini=st.sampled_from([1, 2, 3, 4, 8]),
    plen=st.sampled_from([8, 15, 16, 32]),
    rlen=st.sampled_from([8, 16, 24]),
    pins=st.dictionaries(
        st.sampled_from(["tp", "pp", "cp", "mbs", "rollout_tp", "vpp"]), st.sampled_from([1, 2, 3, 4]), max_size=3
    ),
)
def test_random_inputs_give_valid_fitting_plans_or_coded_errors(gpus, prompts, n, mini, plen, rlen, pins):
    from grpo_tune.core.strategy import validate

    try:
        wl = Workload.from_dict(dict(prompts=prompts, n=n, mini_batch=mini, prompt_len=plen, response_len=rlen))
        res = search(load_model("tiny"), CPU, Cluster(gpus=gpus, gpus_per_node=min(4, gpus)), wl, pins=pins, top=3)
    except GrpoTuneError as exc:
        allowed = ("BAD_CONFIG", "INVALID_DEGREES", "NO_FEASIBLE_PLAN")
        assert exc.code in allowed + (("TRAINER_UNSUPPORTED",) if pins.get("cp", 1) > 1 else ())
        return
    _check_result(res, pins)
    for e in res.ranked:
        s = e.strategy
        validate(e.model, s, gpus, gpus_per_node=min(4, gpus))
        assert (mini * n) % (s.layout.dp * s.batching.mbs) == 0


def test_progress_reports_up_to_total():
    seen = []
    search(load_model("llama-3.1-70b"), H100, Cluster(gpus=32), Workload(), progress=lambda d, t: seen.append((d, t)))
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1][0] == seen[-1][1] > 0


def test_non_additive_cost_model_widens_exact_pass(monkeypatch):
    """A cost model with an interaction the factoring cannot see (param+grad offload speeding up
    the update only at large micro-batches) is detected, and the wider exact pass still finds the best plan."""
    import grpo_tune.autotune.search.driver as S

    real = S.estimate

    def skewed(**kw):
        e = real(**kw)
        s = e.strategy
        if e.time and {"param", "grad"} <= set(s.memory.offload) and s.batching.mbs >= 8:
            ph = dict(e.time.phases)
            ph["update"] *= 0.5  # faster only in combination: not the sum of the two effects
            e = dataclasses.replace(e, time=PhaseTimes(step_s=sum(ph.values()), phases=ph))
        return e

    monkeypatch.setattr(S, "estimate", skewed)
    m = load_model("7b")
    # the pre-issue-9 space: no dynamic batching, verl's default vLLM knobs
    pins = {
        "tp": 2,
        "recompute": "selective",
        "gpu_memory_utilization": 0.6,
        "max_tokens_per_gpu": None,
        "max_num_seqs": 256,
        "enforce_eager": False,
        "cpu_optimizer": None,
    }
    sp = Space(m, H100, Cluster(gpus=8), Workload(), pins)
    best = None
    for s in sp.candidates():
        e = skewed(model=m, hardware=H100, cluster=sp.cluster, strategy=s, workload=sp.workload)
        if e.fits and (best is None or rank_key(e) < rank_key(best)):
            best = e
    # exact=20 (widened 8x to 160): with packed micro-batches (issue 9) mbs barely moves the step
    # time, so many plans tie ahead of the skewed one in the combined order and 5 x 8 misses it.
    res = search(m, H100, Cluster(gpus=8), Workload(), pins=pins, exact=20)
    assert res.combination_error > 0.01
    assert rank_key(res.best)[0] == rank_key(best)[0]


def test_min_headroom_keeps_every_phase_that_far_below_capacity():
    """A safety margin drops the plans packed to the limit; 0 gives them back; too much is NO_FEASIBLE_PLAN."""
    from grpo_tune.core.errors import NoFeasiblePlanError
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Workload

    m, hw = load_model("7b"), load_hardware("h100")
    tight = search(m, hw, Cluster(gpus=8), Workload(), top=3)
    margin = 0.2
    safe = search(m, hw, Cluster(gpus=8), Workload(), top=3, min_headroom=margin)
    assert all(e.headroom_bytes >= margin * hw.hbm_bytes for e in safe.ranked)
    assert tight.best.headroom_bytes < margin * hw.hbm_bytes  # the unconstrained winner is packed tighter
    assert rank_key(safe.best)[0] >= rank_key(tight.best)[0]
    # 7B on 2 GPUs with vLLM pinned to 90% of HBM fits, but a 30% margin rules every plan out (the
    # rollout phase alone takes 90%; unpinned, the CPU optimizer searched since issue 9 leaves room)
    pins = {"gpu_memory_utilization": 0.9}
    search(m, hw, Cluster(gpus=2), Workload(), top=1, pins=pins)
    with pytest.raises(NoFeasiblePlanError, match="safety margin"):
        search(m, hw, Cluster(gpus=2), Workload(), top=1, min_headroom=0.3, pins=pins)
