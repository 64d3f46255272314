"""core/placement.py: the Placement type's fields, its rules and its mapping round trip."""

from __future__ import annotations

import pytest

from grpo_tune.core.errors import ConfigError, UnknownKeyError
from grpo_tune.core.placement import Placement, check


def test_default_is_colocated_on_policy():
    p = Placement()
    assert (p.mode, p.separate, p.staleness, p.rollout_gpus) == ("colocated", False, 0, 0)


def test_round_trip_through_a_mapping():
    p = Placement(mode="separate", rollout_gpus=16, rollout_hardware="h20", staleness=1, partial_rollout=True)
    assert Placement.from_dict(p.to_dict()) == p
    q = Placement(mode="separate", rollout_gpus=16, staleness=1, recompute_logprobs=False)
    assert Placement.from_dict(q.to_dict()) == q and q.to_dict()["recompute_logprobs"] is False


@pytest.mark.parametrize(
    "data, words",
    [
        ({"mode": "split"}, "mode"),
        ({"mode": "colocated", "staleness": 1}, "need mode 'separate'"),
        ({"mode": "colocated", "rollout_gpus": 8}, "need mode 'separate'"),
        ({"mode": "colocated", "recompute_logprobs": False}, "needs mode 'separate'"),
        ({"mode": "separate", "rollout_gpus": 4, "recompute_logprobs": 0}, "recompute_logprobs"),
        ({"mode": "separate"}, "rollout_gpus >= 1"),
        ({"mode": "separate", "rollout_gpus": 4, "partial_rollout": True}, "partial_rollout needs staleness"),
        ({"mode": "separate", "rollout_gpus": -1}, "rollout_gpus"),
        ({"mode": "separate", "rollout_gpus": 4, "sync_interval": 0}, "sync_interval"),
        ({"mode": "separate", "rollout_gpus": 4, "staleness": -1}, "staleness"),
    ],
)
def test_bad_placements_are_coded_errors(data, words):
    with pytest.raises(ConfigError) as e:
        Placement.from_dict(data)
    assert words in str(e.value)


def test_an_unknown_key_names_the_closest():
    with pytest.raises(UnknownKeyError) as e:
        Placement.from_dict({"stalenes": 1})
    assert "staleness" in str(e.value.hint)


def test_the_rollout_pool_must_leave_gpus_to_train():
    p = Placement(mode="separate", rollout_gpus=8)
    assert check(p, gpus=16) is p
    with pytest.raises(ConfigError, match="leaves no GPU"):
        check(p, gpus=8)


# --- the placement options' table (core/placement.py PLACEMENT_KNOBS) -----------------------------------


def test_every_placement_option_comes_from_its_table_row():
    """estimate, search, compare and tune take exactly the table's placement options, with its flags and
    defaults: the CLI spells none of them itself."""
    import inspect

    from grpo_tune.cli.compare import compare
    from grpo_tune.cli.estimate import estimate
    from grpo_tune.cli.search import search
    from grpo_tune.cli.tune import tune
    from grpo_tune.core.placement import PLACEMENT_KNOBS

    for cmd in (estimate, search, compare, tune):
        params = inspect.signature(cmd).parameters
        for k in PLACEMENT_KNOBS:
            p = params[k.name]
            assert p.default == k.default, (cmd.__name__, k.name)
            opt = p.annotation.__metadata__[0]
            assert (opt.default, *opt.param_decls) == (k.flag,), (cmd.__name__, k.name)


def test_placement_ask_reads_the_options_as_the_commands_did():
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.core.placement import PlacementAsk

    plain = PlacementAsk.of({})
    assert plain == PlacementAsk() and not plain.pool_options and not plain.allows_split
    assert PlacementAsk.of({"staleness": None}).staleness == 0  # an unset option is its default
    assert PlacementAsk.of({"rollout_gpus": 8}).pool_options
    assert PlacementAsk.of({"partial_rollout": True}).pool_options
    # partial rollout alone allows no split (it needs a staleness); a staleness or a pool does
    assert not PlacementAsk.of({"partial_rollout": True}).allows_split
    assert PlacementAsk.of({"staleness": 1}).allows_split
    assert PlacementAsk.of({"placement": "auto"}).allows_split
    assert PlacementAsk.of({"placement": "auto"}).require_separate() == "auto"
    with pytest.raises(ConfigError, match="need separate pools"):
        PlacementAsk.of({"staleness": 1}).require_separate()
