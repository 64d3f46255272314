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


# -- streaming as a searched choice (neither --stream nor --no-stream) ---------------------------------------------

FIXED = dict(prompts=256, mini_batch=16, response_len=1024, response_len_mean=1024)
"""Every response runs to the maximum and the batch fits the rollout pool at once: the units all arrive near the
end, so a stream overlaps little and its PP bubbles can outweigh it."""


def _price_30b(pp: int, r: int, **wl):
    from grpo_tune.core.placement import Placement
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.costmodel.pools import estimate_separate

    m, hw, cl = load_model("qwen3-30b-a3b"), load_hardware("h100-sxm-80gb"), Cluster(gpus=64, gpus_per_node=8)
    s, w = Strategy.of(tp=2, pp=pp, ep=8, rollout_tp=4, max_num_seqs=1024), Workload(**wl)

    def price(on: bool):
        pl = Placement(mode="separate", rollout_gpus=r, stream=on)
        return estimate_separate(model=m, hardware=hw, cluster=cl, strategy=s, workload=w, placement=pl)

    return price


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize(
    "wl",
    [
        dict(response_len_mean=205, prompt_len_mean=205),
        FIXED,
        dict(FIXED, response_len_mean=1000),
        dict(FIXED, prompts=1024),
        dict(prompts=512, mini_batch=32, response_len=2048),
    ],
)
def test_the_auto_stream_is_the_cheaper_of_streamed_and_sequential(pp: int, wl: dict) -> None:
    """Property: the choice is never above min(streamed, sequential) and is one of the two, priced as that plan
    (a declined stream keeps its streamed step as a figure)."""
    price = _price_30b(pp, 32, **wl)
    on, off, auto = price(True), price(False), S.cheaper_stream(price)
    assert auto.step_s <= min(on.step_s, off.step_s) * (1 + S.TIE_REL)
    assert auto.step_s in (on.step_s, off.step_s)
    f = auto.placement
    if f["stream_units"]:
        assert auto.step_s == on.step_s <= off.step_s * (1 + S.TIE_REL) and f["streamed_step_s"] == on.step_s
    else:
        assert auto.step_s == off.step_s < on.step_s and f["streamed_step_s"] == on.step_s
        assert {k: v for k, v in f.items() if k != "streamed_step_s"} == {
            k: v for k, v in off.placement.items() if k != "streamed_step_s"
        }
    # without the bubbles the stream never costs more than the sequential sum (pp 1 has none; ties stream)
    if pp == 1:
        assert f["stream_units"] == on.placement["stream_units"] and auto.step_s == on.step_s


def test_at_pp2_a_stream_that_overlaps_little_loses_to_the_sequence_by_hand() -> None:
    """30B-A3B 32 + 32, tp2 pp2 ep8, 256 prompts x 5 of exactly 1024 tokens, 16 units: the streamed step is the
    sequential sum less its overlap plus the bubbles; here the bubbles win, and the auto choice runs in sequence."""
    price = _price_30b(2, 32, **FIXED)
    on, off = price(True), price(False)
    f = on.placement
    assert f["stream_units"] == 16 and f["stream_bubble_s"] > 0
    assert off.step_s == pytest.approx(f["gen_s"] + f["train_s"] + f["sync_s"])
    assert on.step_s > off.step_s  # bubbles > overlap: the bound needs the choice
    assert on.step_s <= off.step_s + f["stream_bubble_s"] + 1e-9  # ... and never more than the bubbles above it
    auto = S.cheaper_stream(price)
    assert auto.placement["stream_units"] == 0 and auto.step_s == off.step_s
    assert auto.placement["streamed_step_s"] == on.step_s
    assert S.cheaper_stream(_price_30b(1, 32, **FIXED)).placement["stream_units"] == 16  # pp 1: a tie streams


def test_search_auto_stream_runs_in_sequence_at_pp2_and_emits_the_whole_batch_fetch() -> None:
    """search (neither flag) at PP 2 where the stream does not pay: the best separate plan runs in sequence, says
    why, carries the streamed step it declined, and its verl launch fetches the whole batch (require_batches =
    units, one fetch per version); the same plan forced to stream prices higher."""
    import dataclasses

    from grpo_tune.autotune.search.placement import search_placement
    from grpo_tune.cli.search import streaming_why
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Workload
    from grpo_tune.costmodel.pools import estimate_separate
    from grpo_tune.frameworks.verl.fully_async import pool_keys
    from grpo_tune.rundir.emit import placement_of, run_config

    m, hw, cl, wl = load_model("qwen2.5-1.5b"), load_hardware("h100-sxm-80gb"), Cluster(gpus=8), Workload(**FIXED)
    res = search_placement(m, hw, cl, wl, placement="separate", rollout_gpus=4, stream=None, pins={"pp": 2})
    b = res.best_separate
    assert b is not None and b.strategy.layout.pp == 2
    f = b.placement
    assert f["stream_units"] == 0 and b.step_s == f["unstreamed_step_s"] < f["streamed_step_s"]
    forced = estimate_separate(
        model=m,
        hardware=hw,
        cluster=cl,
        strategy=b.strategy,
        workload=wl,
        placement=dataclasses.replace(placement_of(b), stream=True),
    )
    assert forced.step_s == pytest.approx(f["streamed_step_s"]) and forced.step_s > b.step_s
    why = streaming_why(b, None, res.stream)
    assert why.startswith("not streamed:") and f"{f['streamed_step_s'] - b.step_s:.2f} s more" in why
    cfg = run_config(b)
    assert cfg.placement.stream is False
    keys = pool_keys(cfg)
    units = wl.prompts // wl.mini_batch
    assert (keys["async_training.require_batches"], keys["async_training.trigger_parameter_sync_step"]) == (units, 1)


# -- a native (CPU) rollout pool streams in waves of its replicas' max_num_seqs ------------------------------------


@pytest.mark.parametrize(
    ("units", "rows", "seqs", "replicas", "want"),
    [
        (4, 8, 4, 2, [1, 1, 1, 1]),  # 4 x 2 = 8 resident sequences: one unit of 8 rows per wave
        (4, 8, 8, 2, [2, 2]),
        (5, 8, 8, 2, [2, 2, 1]),  # the last wave is what is left
        (4, 8, 256, 2, [4]),  # the batch fits: one wave, the unstreamed call
        (4, 8, 2, 1, [1, 1, 1, 1]),  # fewer slots than a unit: still one whole unit per wave
    ],
)
def test_native_waves_by_hand(units: int, rows: int, seqs: int, replicas: int, want: list[int]) -> None:
    assert S.native_waves(units, rows, seqs, replicas) == want


def _cpu_pool(max_num_seqs: int, stream: bool):
    from grpo_tune.core.placement import Placement
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.costmodel.pools import estimate_separate

    cpu, m = load_hardware("cpu"), load_model("tiny")
    wl = Workload(prompts=8, n=4, prompt_len=8, response_len=6, mini_batch=2, kl=False, dtype="fp32")
    s = Strategy.of(mbs=8, recompute="none", rollout_tp=1, max_num_seqs=max_num_seqs, engine="megatron")
    pl = Placement(mode="separate", rollout_gpus=2, stream=stream, recompute_logprobs=False)
    return estimate_separate(model=m, hardware=cpu, cluster=Cluster(gpus=4, gpus_per_node=4), strategy=s,
                             workload=wl, placement=pl)  # fmt: skip


def test_a_native_pool_streams_in_waves_each_decoding_its_own_rows() -> None:
    """tiny on the cpu profile, 2 + 2 ranks, 8 prompts x 4, mini-batch 2 (4 units of 8 rows), rollout tp 1 (2
    replicas). max_num_seqs 4: 8 resident sequences, one unit per wave, 4 waves one after the other, each
    ``response_len`` forward-only steps over its own 8 rows (4 per replica); unit k arrives at the end of wave k.
    max_num_seqs 256: the batch fits, one wave, every unit at the end of the unstreamed generation."""
    import dataclasses

    from grpo_tune.costmodel import pools as P
    from grpo_tune.costmodel.rollout import native_rollout_s
    from grpo_tune.costmodel.timing_base import check_calibration

    cal = check_calibration(None)
    off, on = _cpu_pool(4, False), _cpu_pool(4, True)
    e = on
    roll = P.pools(e.cluster, 2).rollout
    ns = P.native_strategy(e.model, e.strategy, roll)
    whole = native_rollout_s(e.model, e.hardware, roll, ns, e.workload, cal)
    wave = native_rollout_s(e.model, e.hardware, roll, ns, dataclasses.replace(e.workload, prompts=2), cal)
    # by hand: a wave's decode is response_len steps, each one forward of its 4 rows per replica
    assert wave["decode_s"] == pytest.approx(6 * wave["decode_step_s"]) and wave["decode_step_s"] > 0
    gen_one = cal["rollout_overhead_s"] + whole["decode_s"]
    assert off.placement["gen_s"] == pytest.approx(gen_one, rel=1e-12)
    want = [cal["rollout_overhead_s"] + k * wave["decode_s"] for k in (1, 2, 3, 4)]
    got = S.rollout_arrivals(e.model, e.hardware, roll, P.rollout_strategy(e.strategy), e.workload, cal, gen_one, 4)
    assert got == pytest.approx(want, rel=1e-12)
    # the streamed plan's generation ends with its last wave; in sequence it is one call of the whole batch
    assert on.placement["gen_s"] == pytest.approx(want[-1], rel=1e-12)
    assert on.placement["unstreamed_step_s"] == pytest.approx(off.step_s, rel=1e-12)
    # four small waves decode less efficiently than one (each step's fixed cost is paid four times)
    assert want[-1] > gen_one
    # the step: the training pool takes unit k at wave k's end (its serial part after the last), then the sync
    f = on.placement
    assert on.step_s == pytest.approx(
        S.streamed_step_at(want, (f["train_s"] - S.train_split(dict(on.time.phases), f["train_s"], 1)[1]) / 4,
                           S.train_split(dict(on.time.phases), f["train_s"], 1)[1]) + f["sync_s"],
        rel=1e-9,
    )  # fmt: skip
    # the batch fits the replicas at once: one wave, every unit at the unstreamed generation's end
    fits = _cpu_pool(256, True)
    assert fits.placement["gen_s"] == pytest.approx(gen_one, rel=1e-12) and fits.placement["stream_units"] == 4
    assert fits.step_s <= _cpu_pool(256, False).step_s * (1 + S.TIE_REL)
    # neither flag: the cheaper of the two
    auto = S.cheaper_stream(lambda st: _cpu_pool(4, st))
    assert auto.step_s == min(on.step_s, off.step_s)
