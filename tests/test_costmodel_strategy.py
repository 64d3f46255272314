"""The degree validator: plans that cannot exist raise INVALID_DEGREES and say why; nothing else escapes."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tune.core.errors import ConfigError, GrpoTuneError, InvalidDegreesError
from grpo_tune.core.specs import load_model
from grpo_tune.core.strategy import Batching, Layout, Memory, Rollout, Strategy, Workload, stage_layers, validate


@pytest.mark.parametrize(
    "name,gpus,kw,why",
    [
        ("qwen2.5-7b", 24, dict(tp=3), "does not divide the 28 attention heads"),
        ("qwen2.5-7b", 8, dict(tp=8), "does not divide the 28 attention heads"),
        ("llama-3.1-8b", 16, dict(tp=16), "does not divide the 8 key/value heads"),
        ("qwen2.5-7b", 24, dict(pp=3), "does not divide the 28 layers"),
        ("qwen3-30b-a3b", 8, dict(ep=3), "does not divide the 128 experts"),
        ("qwen3-30b-a3b", 8, dict(tp=2, ep=8), "MoE parallel folding"),
        ("qwen2.5-7b", 8, dict(tp=2, dp=2), "differs from the 8 GPUs"),
        ("qwen2.5-7b", 12, dict(tp=4, pp=2), "does not divide 12 GPUs"),
        ("qwen2.5-7b", 8, dict(ep=2), "dense: ep/etp apply to MoE models only"),
        ("qwen2.5-7b", 8, dict(vpp=2), "vpp > 1 needs pp > 1"),
        ("llama-3.1-8b", 8, dict(pp=4, vpp=3), "vpp=3 does not divide"),
        ("qwen2.5-7b", 8, dict(first_stage_layers=4), "need pp > 1"),
        (
            "deepseek-v3",
            256,
            dict(tp=8, pp=16, ep=16, etp=1, first_stage_layers=3, last_stage_layers=4),
            "do not split evenly",
        ),
        ("deepseek-v3", 256, dict(tp=8, pp=16, ep=16, etp=1), "does not divide the 61 layers"),
        ("qwen2.5-7b", 8, dict(rollout_tp=3), "rollout_tp=3"),
    ],
)
def test_invalid_degrees_say_why(name, gpus, kw, why):
    with pytest.raises(InvalidDegreesError, match=why.replace("(", r"\(").replace(")", r"\)")) as exc:
        validate(load_model(name), Strategy.of(**kw), gpus)
    assert exc.value.code == "INVALID_DEGREES"


def test_valid_plan_resolves_dp_etp_and_sp():
    m = load_model("qwen3-30b-a3b")
    s = validate(m, Strategy.of(tp=2, pp=2, ep=4), 16)
    assert (s.layout.dp, s.layout.etp, s.layout.sequence_parallel) == (4, 2, True)
    s = validate(m, Strategy.of(tp=1), 8)
    assert s.layout.sequence_parallel is False  # SP needs tp > 1


def test_uneven_stages_for_deepseek_and_qwen3_235b():
    ds = load_model("deepseek-v3")  # 61 layers
    s = validate(ds, Strategy.of(tp=8, pp=16, ep=16, etp=1, first_stage_layers=1, last_stage_layers=4), 256)
    assert sum(stage_layers(ds, s)) == 61
    q = load_model("qwen3-235b-a22b")  # 94 layers
    s = validate(q, Strategy.of(tp=4, pp=8, ep=16, etp=1, first_stage_layers=10, last_stage_layers=12), 128)
    assert stage_layers(q, s) == [10, 12, 12, 12, 12, 12, 12, 12]


def test_rollout_tp_above_kv_heads_is_allowed_when_a_multiple():
    m = load_model("qwen2.5-7b")  # 4 KV heads
    assert validate(m, Strategy.of(rollout_tp=4), 8).rollout.rollout_tp == 4
    with pytest.raises(InvalidDegreesError):
        validate(m, Strategy.of(rollout_tp=14), 28)  # 14 divides 28 heads, but 4 KV heads: neither way


# ---------------------------------------------------------------------------------------------
# Property tests: random input gives a resolved strategy or a coded error, never anything else.
# ---------------------------------------------------------------------------------------------

MODELS = ["tiny", "tiny-moe", "qwen2.5-7b", "llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-235b-a22b"]
ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-4, 300),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.lists(
        st.one_of(
            st.integers(),
            st.sampled_from(["param", "grad", "optimizer"]),
            st.lists(st.integers(), max_size=1),
            st.dictionaries(st.text(max_size=2), st.none(), max_size=1),
        ),
        max_size=2,
    ),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
SMALL = st.integers(1, 64)
# Every Strategy field (the list cannot go stale as fields are added) and one unknown key.
KEYS = Strategy.knob_names() + ["bogus_key"]


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(MODELS),
    gpus=st.one_of(st.integers(-2, 512), st.sampled_from([8, 16, 64, 256])),
    data=st.dictionaries(st.sampled_from(KEYS), st.one_of(ANY, SMALL), max_size=8),
)
def test_validator_raises_only_coded_errors(name, gpus, data):
    m = load_model(name)
    try:
        s = Strategy.from_dict(data)
        r = validate(m, s, gpus, gpus_per_node=8)
    except GrpoTuneError as exc:
        assert exc.code in ("INVALID_DEGREES", "BAD_CONFIG", "UNKNOWN_KEY")
        return
    # when it passes, the plan really exists
    assert r.layout.tp * r.layout.pp * r.layout.cp * r.layout.dp == gpus
    assert m.heads % r.layout.tp == 0 and gpus % r.rollout.rollout_tp == 0
    assert sum(stage_layers(m, r)) == m.layers and min(stage_layers(m, r)) >= 1
    if m.is_moe:
        assert (
            m.experts % r.layout.ep == 0
            and (r.layout.tp * r.layout.cp * r.layout.dp) % (r.layout.ep * r.layout.etp) == 0
        )


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(MODELS),
    gpus=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256, 512]),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.integers(1, 16),
    cp=st.sampled_from([1, 2]),
    ep=st.sampled_from([1, 2, 4, 8, 16, 32]),
)
def test_valid_degrees_satisfy_every_rule(name, gpus, tp, pp, cp, ep):
    m = load_model(name)
    try:
        r = validate(m, Strategy.of(tp=tp, pp=pp, cp=cp, ep=ep if m.is_moe else 1, etp=1 if m.is_moe else None), gpus)
    except InvalidDegreesError as exc:
        assert exc.message and exc.code == "INVALID_DEGREES"
        return
    assert r.layout.tp * r.layout.pp * r.layout.cp * r.layout.dp == gpus
    assert m.layers % r.layout.pp == 0


@settings(max_examples=200, deadline=None)
@given(
    data=st.dictionaries(
        st.sampled_from(
            [
                "kind",
                "prompts",
                "n",
                "prompt_len",
                "response_len",
                "mini_batch",
                "response_len_mean",
                "ppo_epochs",
                "kl",
                "dtype",
                "seq_len",
                "gbs",
                "nope",
            ]
        ),
        st.one_of(ANY, SMALL),
        max_size=6,
    )
)
def test_workload_raises_only_coded_errors(data):
    try:
        w = Workload.from_dict(data)
    except ConfigError:
        return
    assert w.kind in ("grpo", "pretrain") and w.prompts % w.mini_batch == 0


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    dp=st.one_of(st.none(), st.integers(1, 64)),
    mbs=st.integers(1, 16),
    offload=st.sampled_from([(), ("param",), ("param", "grad", "optimizer")]),
    log_prob_mbs=st.one_of(st.none(), st.integers(1, 8)),
)
def test_strategy_replace_equals_dataclasses_replace(tp, dp, mbs, offload, log_prob_mbs):
    """Strategy.replace copies the fields instead of re-running __init__ (estimate() resolves every plan through
    it); that is only the same as dataclasses.replace while Strategy has no __post_init__ to re-run."""
    assert not any(hasattr(c, "__post_init__") for c in (Strategy, Layout, Memory, Batching, Rollout))
    s = Strategy.of(tp=2, pp=2, mbs=3)
    kw = {"tp": tp, "dp": dp, "mbs": mbs, "offload": offload, "log_prob_mbs": log_prob_mbs}
    fast = s.replace(**kw)
    ref = dataclasses.replace(
        s,
        layout=dataclasses.replace(s.layout, tp=tp, dp=dp),
        memory=dataclasses.replace(s.memory, offload=offload),
        batching=dataclasses.replace(s.batching, mbs=mbs, log_prob_mbs=log_prob_mbs),
    )
    assert fast == ref and hash(fast) == hash(ref) and fast.to_dict() == ref.to_dict() and type(fast) is Strategy
    assert s == Strategy.of(tp=2, pp=2, mbs=3)  # the original is untouched
    with pytest.raises(TypeError):
        s.replace(no_such_field=1)
