"""Candidate generation: every plan is valid, none is missed, pins are honoured."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from grpo_tune.autotune.search.candidates import CP_MIN_TOKENS, Space, stage_splits
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, stage_layers, validate

H100 = load_hardware("h100")
WL = Workload()
SMALL = Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8)


def _space(model, gpus, wl=WL, pins=None, gpn=8, hw=H100):
    return Space(load_model(model), hw, Cluster(gpus=gpus, gpus_per_node=min(gpn, gpus)), wl, dict(pins or {}))


def _check_valid(sp: Space, s: Strategy) -> Strategy:
    r = validate(
        sp.model, s, sp.cluster.gpus, gpus_per_node=sp.cluster.gpus_per_node, allow_cross_node_tp=sp.allow_cross_node_tp
    )
    wl = sp.workload
    seqs = wl.mini_batch * wl.n if wl.kind == "grpo" else wl.gbs
    assert seqs % (r.layout.dp * r.batching.mbs) == 0, "mbs must divide the per-DP micro-batch count (verl's rule)"
    assert r.layout.sp == (r.layout.tp > 1)
    assert sp.workload.train_seq_len % (2 * r.layout.cp) == 0 or r.layout.cp == 1
    return r


@pytest.mark.parametrize("model,gpus", [("tiny", 4), ("tiny-moe", 4)])
def test_every_candidate_validates_small(model, gpus):
    sp = _space(model, gpus, SMALL, hw=load_hardware("cpu"))
    n = 0
    for s in sp.candidates():
        _check_valid(sp, s)
        n += 1
    assert n == sp.candidate_count() > 100


@pytest.mark.parametrize(
    "model,gpus",
    [("7b", 8), ("moonlight-16b-a3b", 32), ("qwen3-30b-a3b", 64), ("deepseek-v3", 256), ("qwen3-235b-a22b", 64)],
)
def test_every_layout_and_rollout_validates(model, gpus):
    """Validity depends on the layout and the rollout TP; mbs/recompute/offload are checked per layout."""
    sp = _space(model, gpus)
    rolls = sp.rollout_options()
    assert rolls
    layouts = sp.layouts()
    assert layouts
    seqs = sp.workload.mini_batch * sp.workload.n
    for lay in layouts:
        opts = sp.train_options(lay)
        for roll in rolls:
            r = _check_valid(sp, sp.strategy(lay, opts[0], roll))
        for opt in opts:  # validate() does not read mbs/recompute/offload: check verl's batch rule here
            assert seqs % (r.layout.dp * opt["mbs"]) == 0


@pytest.mark.parametrize("model,gpus,layers", [("deepseek-v3", 256, 61), ("qwen3-235b-a22b", 64, 94)])
def test_uneven_pipeline_splits(model, gpus, layers):
    sp = _space(model, gpus)
    uneven = [lay for lay in sp.layouts() if lay["first_stage_layers"] or lay["last_stage_layers"]]
    pps = {lay["pp"] for lay in uneven}
    need = {lay["pp"] for lay in sp.layouts()} | {p for p in (2, 4, 8, 16) if layers % p}
    assert {p for p in need if layers % p} <= pps and pps, "PP not dividing the layers gets uneven stages"
    m = load_model(model)
    for lay in uneven:
        stages = stage_layers(m, Strategy.of(**lay))
        assert sum(stages) == layers and min(stages) >= 1
        # balanced: no stage more than one layer above the even share
        assert max(stages) <= -(-layers // lay["pp"]) + 1


def test_layouts_complete_against_brute_force():
    """The generator finds every (tp, pp, vpp, cp, ep, etp) that validate and verl's batch rule accept."""
    sp = _space("tiny-moe", 8, SMALL, hw=load_hardware("cpu"))
    got = {tuple(lay[k] for k in ("tp", "pp", "vpp", "cp", "ep", "etp")) for lay in sp.layouts()}
    want = set()
    m = sp.model
    for tp, pp, vpp, cp, ep, etp in itertools.product(
        range(1, 9), range(1, 5), range(1, 5), range(1, 9), range(1, 9), range(1, 9)
    ):
        if m.layers % pp or etp > tp or tp % etp:  # even stages here; etp among tp's divisors
            continue
        try:
            r = validate(m, Strategy.of(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp), 8, gpus_per_node=8)
        except GrpoTuneError:
            continue
        if cp > 1 and (SMALL.train_seq_len % (2 * cp) or SMALL.train_seq_len // cp < CP_MIN_TOKENS):
            continue
        if (SMALL.mini_batch * SMALL.n) % r.layout.dp:
            continue
        want.add((tp, pp, vpp, cp, ep, etp))
    assert got == want


def test_cp_only_for_long_sequences_unless_pinned():
    """Unpinned, CP > 1 appears only when each CP rank keeps >= CP_MIN_TOKENS of the sequence."""
    short = _space("7b", 8, Workload())  # 2k tokens
    assert {lay["cp"] for lay in short.layouts()} == {1}
    long = _space("7b", 8, Workload(prompt_len=4096, response_len=12288))  # 16k tokens
    assert {lay["cp"] for lay in long.layouts()} >= {1, 2, 4}
    pinned = Space(short.model, short.hardware, short.cluster, short.workload, {"cp": 2}, False)
    assert {lay["cp"] for lay in pinned.layouts()} == {2}


def test_tp_within_node_unless_allowed():
    sp = _space("llama-3.1-70b", 32, gpn=4)
    assert max(lay["tp"] for lay in sp.layouts()) == 4
    wide = Space(sp.model, sp.hardware, sp.cluster, sp.workload, {}, allow_cross_node_tp=True)
    assert max(lay["tp"] for lay in wide.layouts()) == 8  # 64 heads, 8 KV heads


def test_rollout_tp_fits_weights():
    sp = _space("llama-3.1-70b", 16)
    rtps = {t for t, _ in sp.rollout_options()}
    # 70.6e9 params x 2 B = 141 GB: TP 1 cannot hold them in 80 GiB, TP 2 can at a high fraction.
    assert 1 not in rtps and 2 in rtps and max(rtps) <= 8
    for t, g in sp.rollout_options():
        assert 2 * 70_553_706_496 / t < g * H100.hbm_bytes


def test_offload_subsets_and_recompute():
    sp = _space("7b", 8)
    lay = sp.layouts()[0]
    opts = sp.train_options(lay)
    # Only the sets verl 0.9.1 can run: its param_offload frees parameters and gradients together and
    # it has no grad_offload, so param-only / grad-only sets would be priced but never run.
    assert {o["offload"] for o in opts} == {(), ("optimizer",), ("param", "grad"), ("param", "grad", "optimizer")}
    assert {o["recompute"] for o in opts} == {"none", "selective", "full"}


@pytest.mark.parametrize(
    "pins",
    [
        {"tp": 2},
        {"offload": ("optimizer",)},
        {"rollout_tp": 4},
        {"pp": 2, "vpp": 2, "mbs": 4},
        {"recompute": "full", "gpu_memory_utilization": 0.5},
        {"cp": 2, "distributed_optimizer": False},
    ],
)
def test_pins_are_honoured(pins):
    sp = _space("7b", 8, pins=pins)
    n = 0
    for lay in sp.layouts():
        for opt in sp.train_options(lay):
            for roll in sp.rollout_options()[:2]:
                s = sp.strategy(lay, opt, roll)
                for k, v in pins.items():
                    assert s.knob(k) == v
                n += 1
    assert n > 0


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 200), pp=st.integers(1, 64))
def test_stage_splits_are_valid(layers, pp):
    for first, last in stage_splits(layers, pp):
        m = load_model("tiny").__class__(
            name="x", family="llama", layers=layers, hidden=8, ffn_hidden=8, heads=1, kv_heads=1, head_dim=8, vocab=8
        )
        s = Strategy.of(pp=pp, first_stage_layers=first, last_stage_layers=last)
        validate(m, s, pp)  # raises if the split cannot exist
        assert sum(stage_layers(m, s)) == layers
    if pp <= layers and layers % pp == 0:
        assert stage_splits(layers, pp) == [(None, None)]


@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([None, 1, 2, 3, 4, 8]),
    pp=st.sampled_from([None, 1, 2, 3, 4]),
    cp=st.sampled_from([None, 1, 2, 4]),
    mbs=st.sampled_from([None, 1, 2, 3, 64]),
    rollout_tp=st.sampled_from([None, 1, 2, 3, 4, 16]),
)
def test_random_pins_give_valid_plans_or_coded_errors(tp, pp, cp, mbs, rollout_tp):
    pins = {k: v for k, v in dict(tp=tp, pp=pp, cp=cp, mbs=mbs, rollout_tp=rollout_tp).items() if v is not None}
    sp = _space("tiny", 4, SMALL, pins=pins, hw=load_hardware("cpu"))
    for s in itertools.islice(sp.candidates(), 200):
        r = _check_valid(sp, s)
        for k, v in pins.items():
            assert r.knob(k) == v


def test_space_is_identical_across_processes():
    """refine rebuilds the space in later runs: it must not depend on hash seeds or set order."""
    import subprocess
    import sys

    code = (
        "from grpo_tune.autotune.search.candidates import Space; "
        "from grpo_tune.core.specs import load_model, load_hardware; "
        "from grpo_tune.core.strategy import Cluster, Workload; "
        "sp = Space(load_model('deepseek-v3'), load_hardware('h100'), Cluster(gpus=256), Workload()); "
        "print(repr([tuple(sorted(l.items())) for l in sp.layouts()][:400]), sp.candidate_count())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2)
    }
    assert len(outs) == 1


def test_offload_options_are_what_verl_runs():
    """Every proposed offload set survives the verl table's round trip unchanged (the plan we price
    is the plan that runs)."""
    from grpo_tune.frameworks.verl.table import _offload_read, _offload_write

    sp = _space("7b", 8)
    for off in sp.offload_options():
        written = _offload_write({"strategy": Strategy.of(offload=off)})
        assert _offload_read(written.get) == off


@pytest.mark.parametrize("text", ["param", "grad", "param,optimizer", "grad,optimizer"])
def test_offload_pin_param_or_grad_alone_refused(text):
    from grpo_tune.cli.options import strategy_pins
    from grpo_tune.core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        strategy_pins(offload=text)
    assert e.value.code == "BAD_CONFIG" and "param,grad" in e.value.hint


@pytest.mark.parametrize(
    "text,want",
    [
        ("param,grad", ("param", "grad")),
        ("optimizer", ("optimizer",)),
        ("grad,param,optimizer", ("param", "grad", "optimizer")),
        ("none", ()),
    ],
)
def test_offload_pin_verl_sets_accepted(text, want):
    from grpo_tune.cli.options import strategy_pins

    assert strategy_pins(offload=text)["offload"] == want


def test_search_never_emits_a_plan_the_trainer_refuses():
    """The plan we price is the plan that runs: CP (which only verl runs) is not proposed for long
    sequences, and a pinned CP is a coded error naming the trainer, not a plan `train` refuses."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Workload
    from grpo_tune.core.support import check_supported
    from grpo_tune.autotune.search.driver import search

    m, hw = load_model("qwen2.5-7b"), load_hardware("h100")
    long = Workload(prompts=64, n=8, mini_batch=32, prompt_len=2048, response_len=14336)
    res = search(m, hw, Cluster(gpus=8), long, top=5)
    assert res.ranked and all(e.strategy.layout.cp == 1 for e in res.ranked + res.pareto)
    assert all(not check_supported(m, e.strategy, workload=long) for e in res.ranked[:20])
    with pytest.raises(GrpoTuneError) as exc:
        search(m, hw, Cluster(gpus=8), long, pins={"cp": 2})
    assert exc.value.code == "TRAINER_UNSUPPORTED" and "estimate" in exc.value.hint
