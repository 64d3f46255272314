"""core/rules.py: the degree and batch rules return findings; validate/preflight/search raise or filter on them."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tune.core.errors import InvalidDegreesError
from grpo_tune.core.rules import Finding, Severity, check_batches, check_degrees, errors, micro_batches
from grpo_tune.core.specs import load_model
from grpo_tune.core.strategy import Strategy, Workload, validate


def test_check_degrees_reports_every_broken_rule_with_its_code():
    m = load_model("tiny")  # 4 heads, 2 kv heads, 4 layers (profiles/models/tiny.toml)
    fs = check_degrees(m, Strategy.of(tp=3, pp=3, rollout_tp=3), 9)
    msgs = [f.message for f in fs]
    assert any("tp=3 does not divide the 4 attention heads" in x for x in msgs)
    assert any("tp=3 does not divide the 2 key/value heads" in x for x in msgs)
    assert any("pp=3 does not divide the" in x for x in msgs)
    assert any("rollout_tp=3 does not divide the 4 attention heads" in x for x in msgs)
    assert all(f.code == "INVALID_DEGREES" and f.severity is Severity.ERROR for f in fs)
    with pytest.raises(InvalidDegreesError, match="tp=3 does not divide the 4 attention heads"):
        validate(m, Strategy.of(tp=3, pp=3, rollout_tp=3), 9)  # the first finding, as before


def test_expert_rules_carry_their_own_codes():
    m = load_model("tiny-moe")  # 4 experts
    codes = {f.code for f in check_degrees(m, Strategy.of(tp=1, ep=3), 8)}
    assert codes == {"EXPERT_IMBALANCE", "EXPERT_DEGREES"}  # 3 divides neither 4 experts nor tp*cp*dp = 8
    codes = {f.code for f in check_degrees(m, Strategy.of(tp=2, ep=4, etp=2), 4)}
    assert codes == {"EXPERT_DEGREES"}  # ep*etp = 8 does not divide tp*cp*dp = 2*1*2 = 4
    with pytest.raises(InvalidDegreesError) as exc:
        validate(m, Strategy.of(tp=2, ep=4, etp=2), 4)
    assert exc.value.code == "INVALID_DEGREES"  # validate's code is unchanged


def test_valid_degrees_have_no_findings():
    assert check_degrees(load_model("tiny"), Strategy.of(tp=2, pp=2), 8) == []


def test_check_batches_hand_computed():
    w = Workload(prompts=8, n=3, mini_batch=2, prompt_len=8, response_len=8)  # 6 sequences per mini-batch
    assert check_batches(w, dp=2) == [] and check_batches(w, dp=3, mbs=2) == []
    (f,) = check_batches(w, dp=4)  # 6 % 4 and 24 % 4 == 0: only the mini-batch rule
    assert f.code == "BATCH_DIVISIBILITY" and "6 sequences does not split over dp=4" in f.message
    (f,) = check_batches(w, dp=1, mbs=4)
    assert "does not split over dp=1 x mbs=4" in f.message
    # vpp: 6 / (1 x 1) = 6 micro-batches per mini-batch; pp=4 does not divide 6, pp=3 does.
    assert [f.message for f in check_batches(w, dp=1, mbs=1, pp=4, vpp=2)] == [
        "vpp=2 needs micro-batches per mini-batch (6) to be a multiple of pp=4"
    ]
    assert check_batches(w, dp=1, mbs=1, pp=3, vpp=2) == []
    pre = Workload(kind="pretrain", gbs=12)
    assert check_batches(pre, dp=4) == [] and len(check_batches(pre, dp=5)) == 1


def test_micro_batches_rounds_up_and_is_at_least_one():
    assert micro_batches(6, dp=4, mbs=1) == 2 and micro_batches(1, dp=8, mbs=2) == 1
    assert micro_batches(8, dp=2, mbs=2) == 2


# A GRPO step of 1-4 mini-batches of 1-8 prompts each, every prompt answered n = 1-8 times.
STEPS = st.builds(
    lambda per_mini, minis, n: Workload(prompts=per_mini * minis, mini_batch=per_mini, n=n),
    st.integers(1, 8),
    st.integers(1, 4),
    st.integers(1, 8),
)


@settings(max_examples=200, deadline=None)
@given(w=STEPS, dp=st.integers(1, 16), mbs=st.integers(1, 8))
def test_no_error_iff_every_rank_gets_whole_micro_batches(w, dp, mbs):
    ok = (w.mini_batch * w.n) % (dp * mbs) == 0
    assert (errors(check_batches(w, dp=dp, mbs=mbs)) == []) == ok


def test_finding_is_frozen_and_defaults_to_error():
    f = Finding("BAD_CONFIG", "x")
    assert f.severity is Severity.ERROR and str(Severity.WARNING) == "warning"
    with pytest.raises(AttributeError):
        f.code = "OOM_RISK"  # type: ignore[misc]


def test_a_tp_group_never_spans_two_nodes():
    """Ranks fill a node before the next and TP groups are consecutive ranks: on 2 nodes of 5 GPUs (the training
    pool of a 16-GPU 6 + 10 split) tp=2 puts ranks 4 and 5 on two nodes, tp=5 and tp=1 do not; one node never
    splits a group."""
    from grpo_tune.core.rules import within_node

    m = load_model("qwen2.5-7b")  # 28 heads, 4 kv heads
    assert [t for t in (1, 2, 4, 5, 10) if within_node(t, 10, 5)] == [1, 5]
    assert within_node(2, 6, 6) and within_node(4, 16, 8) and not within_node(4, 12, 6)
    msgs = [f.message for f in check_degrees(m, Strategy.of(tp=2), 10, gpus_per_node=5)]
    assert msgs == ["tp=2 does not divide the 5 GPUs per node: a TP group would span two nodes"]
    assert not check_degrees(m, Strategy.of(tp=2), 10, gpus_per_node=5, allow_cross_node_tp=True)
    assert not check_degrees(m, Strategy.of(tp=2), 6, gpus_per_node=6)


def test_separate_rollout_replicas_stay_on_one_node():
    """A rollout pool of 3 GPUs on each of 2 nodes: a vLLM TP2 replica would take the third GPU of one node and the
    first of the next, so only TP 1 (and TP 3 where the heads split) is proposed."""
    from grpo_tune.autotune.search.placement import rollout_options
    from grpo_tune.core.specs import load_hardware
    from grpo_tune.core.strategy import Cluster

    m = load_model("qwen2.5-7b")
    tps = {o["rollout_tp"] for o in rollout_options(m, load_hardware("h100"), Cluster(gpus=6, gpus_per_node=3), {})}
    assert tps == {1}  # 28 heads: 3 does not divide them; 2 spans nodes
    tps = {o["rollout_tp"] for o in rollout_options(m, load_hardware("h100"), Cluster(gpus=4, gpus_per_node=2), {})}
    assert tps == {1, 2}
