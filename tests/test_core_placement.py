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


@pytest.mark.parametrize(
    "data, words",
    [
        ({"mode": "split"}, "mode"),
        ({"mode": "colocated", "staleness": 1}, "need mode 'separate'"),
        ({"mode": "colocated", "rollout_gpus": 8}, "need mode 'separate'"),
        ({"mode": "separate"}, "rollout_gpus >= 1"),
        ({"mode": "separate", "rollout_gpus": 4, "partial_rollout": True}, "partial_rollout needs staleness"),
        ({"mode": "separate", "rollout_gpus": -1}, "rollout_gpus"),
        ({"mode": "separate", "rollout_gpus": 4, "sync_interval": 0}, "sync_interval"),
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
