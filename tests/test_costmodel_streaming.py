"""Streaming within a step (costmodel.streaming): hand-computed pipelines, the bounds, and the hook into
separate-pool pricing at staleness 0."""

from __future__ import annotations

import random

import pytest

from grpo_tune.costmodel import streaming as S


@pytest.mark.parametrize(
    ("g", "t", "n", "want"),
    [
        (2.0, 1.0, 4, 2 + 1 + 3 * 2),  # generation-bound: warm-up + the slower side per unit
        (1.0, 2.0, 4, 1 + 2 + 3 * 2),  # training-bound
        (1.5, 1.5, 10, 1.5 + 1.5 + 9 * 1.5),  # balanced
        (3.0, 0.5, 1, 3.5),  # one unit: nothing to overlap, the sequential sum
    ],
)
def test_pipeline_formula_by_hand(g: float, t: float, n: int, want: float) -> None:
    assert S.streamed_step(g, t, n) == pytest.approx(want)


def test_tail_holds_the_last_unit() -> None:
    # arrivals 1, 2, 3, 4 + 3 = 7; training 1 s each: ends 2, 3, 4, then 7 + 1 = 8
    assert S.streamed_step(1.0, 1.0, 4, tail_s=3.0) == pytest.approx(8.0)
    # a tail shorter than the training backlog is hidden: arrivals 1, 2, 3, 4.5; training 2 s: 3, 5, 7, 9
    assert S.streamed_step(1.0, 2.0, 4, tail_s=0.5) == pytest.approx(9.0)


def test_serial_work_waits_for_the_last_unit() -> None:
    assert S.streamed_step(2.0, 1.0, 4, serial_s=5.0) == pytest.approx(9.0 + 5.0)


def test_streaming_falls_with_more_units_until_the_slower_side_binds() -> None:
    gen, train = 12.0, 8.0
    steps = [S.streamed_step(gen / n, train / n, n) for n in (1, 2, 4, 8, 64)]
    assert steps == sorted(steps, reverse=True)
    assert steps[0] == pytest.approx(gen + train)  # one unit: in sequence
    assert steps[-1] == pytest.approx(gen + train / 64)  # many: the generation plus one unit of training


def test_bounds_hold_for_random_arrivals() -> None:
    rng = random.Random(40)
    for _ in range(500):
        n = rng.randint(1, 40)
        gen = rng.uniform(0.1, 50.0)
        arr = sorted(rng.uniform(0.0, gen) for _ in range(n - 1)) + [gen]
        t_unit = rng.uniform(0.0, 3.0)
        step = S.streamed_step_at(arr, t_unit)
        assert S.check_bounds(step, gen, n * t_unit), (arr, t_unit, step)


def test_units_follow_the_mini_batch() -> None:
    assert S.units_of(1024, 256) == 4
    assert S.units_of(1024, 256, require_batches=2) == 2
    assert S.units_of(256, 256) == 1


def test_train_split_keeps_later_epochs_serial() -> None:
    phases = {"old_logprob": 1.0, "ref_logprob": 2.0, "update": 6.0, "offload": 0.5}
    assert S.train_split(phases, 10.0, ppo_epochs=1) == pytest.approx((9.0, 1.0))
    assert S.train_split(phases, 10.0, ppo_epochs=3) == pytest.approx((5.0, 5.0))


class _Uniform:
    """Responses uniform on [0, L]: S(j) = 1 - j / L."""

    def __init__(self, top: float) -> None:
        self.top = top

    def __call__(self, j: float) -> float:
        return max(0.0, 1.0 - j / self.top)


def test_arrivals_of_a_batch_in_flight_at_once() -> None:
    # no steady phase; groups of n=1 with uniform lengths complete evenly over the drain: 2.5, 5, 7.5, 10 after a
    # 1 s start
    arr = S.unit_arrivals(
        gen_s=11.0,
        start_s=1.0,
        steady_s=0.0,
        steady_fraction=0.0,
        survival=_Uniform(100.0),
        longest=100.0,
        n=1,
        units=4,
    )
    assert arr == pytest.approx([3.5, 6.0, 8.5, 11.0], abs=1e-6)
    # groups of n=2 complete later: (j/L)^2 = f, so j = L sqrt(f)
    arr2 = S.unit_arrivals(
        gen_s=11.0,
        start_s=1.0,
        steady_s=0.0,
        steady_fraction=0.0,
        survival=_Uniform(100.0),
        longest=100.0,
        n=2,
        units=4,
    )
    assert arr2[:3] == pytest.approx([1 + 10 * 0.25**0.5, 1 + 10 * 0.5**0.5, 1 + 10 * 0.75**0.5], abs=1e-6)


def test_arrivals_through_a_steady_phase_then_equal_lengths() -> None:
    # half the groups complete evenly in a 6 s steady phase; every response has the maximum length, so the rest
    # complete together at the end
    def equal(j: float) -> float:
        return 1.0 if j < 100.0 else 0.0

    arr = S.unit_arrivals(
        gen_s=10.0, start_s=0.0, steady_s=6.0, steady_fraction=0.5, survival=equal, longest=100.0, n=4, units=4
    )
    assert arr == pytest.approx([3.0, 6.0, 10.0, 10.0], abs=1e-6)


def test_all_at_once_does_not_stream() -> None:
    def equal(j: float) -> float:
        return 1.0 if j < 100.0 else 0.0

    arr = S.unit_arrivals(
        gen_s=10.0, start_s=0.0, steady_s=0.0, steady_fraction=0.0, survival=equal, longest=100.0, n=4, units=8
    )
    assert S.streamed_step_at(arr, 1.0) == pytest.approx(10.0 + 8.0)  # the sequential sum


@pytest.mark.parametrize(
    ("pass_s", "m", "pp", "vpp", "units", "want"),
    [
        (11.0, 8, 4, 1, 4, 9.0),  # t = 11 / (8 + 3) = 1; 4 passes of 2 + 3: 20 - 11 = (units - 1)(pp - 1) t
        (9.0, 8, 4, 3, 4, 3.0),  # vpp 3: a bubble of 1 micro-batch per pass; 4 x 3 - 9
        (9.0, 6, 4, 1, 4, 11.0),  # 6 micro-batches over 4 units: 2 each (the split rounds up), 4 x 5 - 9
        (10.0, 8, 1, 1, 4, 0.0),  # no pipeline: no bubble
        (11.0, 8, 4, 1, 1, 0.0),  # one unit: the step's own pass
    ],
)
def test_pass_bubbles_by_hand(pass_s: float, m: int, pp: int, vpp: int, units: int, want: float) -> None:
    assert S.pass_bubbles_s(pass_s, m, pp, vpp, units) == pytest.approx(want)


def test_pass_bubbles_grow_with_units_and_stages_and_shrink_with_chunks() -> None:
    by_units = [S.pass_bubbles_s(20.0, 16, 4, 1, u) for u in (1, 2, 4, 8, 16)]
    assert by_units == sorted(by_units) and by_units[0] == 0.0 < by_units[-1]
    by_pp = [S.pass_bubbles_s(20.0, 16, p, 1, 4) for p in (1, 2, 4, 8)]
    assert by_pp == sorted(by_pp) and len(set(by_pp)) == 4
    by_vpp = [S.pass_bubbles_s(20.0, 16, 4, v, 4) for v in (1, 2, 4)]
    assert by_vpp == sorted(by_vpp, reverse=True) and len(set(by_vpp)) == 3


def _separate_30b(stream: bool, staleness: int = 0, pp: int = 1):
    from grpo_tune.core.placement import Placement
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.costmodel.pools import estimate_separate

    s = Strategy.of(tp=2, pp=pp, ep=8, rollout_tp=4, max_num_seqs=1024)
    return estimate_separate(
        model=load_model("qwen3-30b-a3b"),
        hardware=load_hardware("h100-sxm-80gb"),
        cluster=Cluster(gpus=64, gpus_per_node=8),
        strategy=s,
        workload=Workload(response_len_mean=205, prompt_len_mean=205),
        placement=Placement(mode="separate", rollout_gpus=32, staleness=staleness, stream=stream),
    )


def test_separate_step_streams_within_its_bounds() -> None:
    on, off = _separate_30b(True), _separate_30b(False)
    f = on.placement
    assert f["stream_units"] == 4 and off.placement["stream_units"] == 0
    assert off.step_s == pytest.approx(f["gen_s"] + f["train_s"] + f["sync_s"])
    assert f["unstreamed_step_s"] == pytest.approx(off.step_s)
    assert max(f["gen_s"], f["train_s"]) + f["sync_s"] - 1e-9 <= on.step_s < off.step_s
    # the phases (each pool's own work) do not change; only their composition does
    assert dict(on.time.phases) == dict(off.time.phases)


def test_a_pipelined_stream_pays_each_units_log_prob_bubbles(monkeypatch) -> None:
    # PP 2: the streamed log-prob passes run once per unit, each filling and draining the pipeline
    from grpo_tune.costmodel.timing_base import check_calibration

    on = _separate_30b(True, pp=2)
    f, ph, d = on.placement, on.time.phases, on.details
    assert _separate_30b(True).placement["stream_bubble_s"] == 0.0  # PP 1: none
    cal = check_calibration(None)
    want = sum(
        S.pass_bubbles_s(ph[p] - cal[o], d["logprob_micro_batches"], 2, 1, f["stream_units"])
        for p, o in (("old_logprob", "old_logprob_overhead_s"), ("ref_logprob", "ref_logprob_overhead_s"))
        if ph.get(p, 0.0) > 0
    )
    assert f["stream_bubble_s"] == pytest.approx(want) and want > 0
    # the bubbles lengthen the streamed step by at most their own sum; the unstreamed step has none
    monkeypatch.setattr(S, "pass_bubbles_s", lambda *a: 0.0)
    flat = _separate_30b(True, pp=2)
    assert flat.placement["stream_bubble_s"] == 0.0
    assert flat.step_s < on.step_s <= flat.step_s + want + 1e-9
    assert f["unstreamed_step_s"] == pytest.approx(flat.placement["unstreamed_step_s"])


def test_stream_needs_separate_pools() -> None:
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.core.placement import Placement, check

    with pytest.raises(ConfigError):
        check(Placement(stream=True))


def test_rlinf_formula_is_the_tailless_pipeline() -> None:
    """RLinf's DisaggregatedScheduleResult (one warm-up group) on even per-group costs is streamed_step without a
    tail: the side-by-side benchmark's two rules differ only in the tail, the units and the sync."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_rlinf_placement.py"
    spec = importlib.util.spec_from_file_location("bench_rlinf_placement", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for gen, train, groups in ((12.7, 14.8, 1024), (30.0, 5.0, 16), (4.0, 4.0, 2)):
        assert mod.rlinf_two(gen, train, groups) == pytest.approx(S.streamed_step(gen / groups, train / groups, groups))
    # three pools, by hand: 10 groups, per group 1 / 0.5 / 2 s: warm-up (1 + (0.5 + 2)) + 2 x 9
    assert mod.rlinf_three(10.0, 5.0, 20.0, 10) == pytest.approx(1 + 2.5 + 2 * 9)
