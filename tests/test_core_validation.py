"""core/validation.py: one from_mapping() validator for every config dataclass, with per-field ranges and choices."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tune.core.choices import KlType, LossAgg, Offload, Recompute, TrainerRolloutEngine
from grpo_tune.core.config import TrainerOptions, _TRAINER_SCHEMA
from grpo_tune.core.errors import ConfigError, GrpoTuneError, UnknownKeyError
from grpo_tune.core.specs import HardwareSpec, ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.core.validation import POSITIVE, Range, from_mapping


@pytest.mark.parametrize(
    "build, data, code, text",
    [
        (Strategy.from_dict, {"tp": 0}, "BAD_CONFIG", "strategy.tp must be a positive integer, got 0"),
        (Strategy.from_dict, {"tp": True}, "BAD_CONFIG", "positive integer"),
        (Strategy.from_dict, {"gpu_memory_utilization": 1.5}, "BAD_CONFIG", "must be a number in (0, 1], got 1.5"),
        (Strategy.from_dict, {"gpu_memory_utilization": 0}, "BAD_CONFIG", "(0, 1]"),
        (Strategy.from_dict, {"cpu_optimizer": float("nan")}, "BAD_CONFIG", "(0, 1]"),
        (Strategy.from_dict, {"recompute": "some"}, "BAD_CONFIG", "must be one of none, selective, full"),
        (Strategy.from_dict, {"offload": ["param", "kv"]}, "BAD_CONFIG", "unknown 'kv'"),
        (Strategy.from_dict, {"sequence_parallel": "yes"}, "BAD_CONFIG", "true or false"),
        (Strategy.from_dict, {"tpp": 2}, "UNKNOWN_KEY", "unknown key 'tpp'"),
        (Strategy.from_dict, [1, 2], "BAD_CONFIG", "must be a table/mapping"),
        (Workload.from_dict, {"kind": "sft"}, "BAD_CONFIG", "must be one of grpo, pretrain"),
        (Workload.from_dict, {"dtype": "int8"}, "BAD_CONFIG", "must be one of bf16, fp16, fp32"),
        (Workload.from_dict, {"prompts": 8, "mini_batch": 16}, "BAD_CONFIG", "exceeds prompts"),
        (Workload.from_dict, {"n": 2.0}, "BAD_CONFIG", "positive integer"),
    ],
)
def test_bad_values_are_coded_errors(build, data, code, text):
    with pytest.raises(GrpoTuneError) as exc:
        build(data)
    assert exc.value.code == code and text in exc.value.message


def test_model_and_hardware_ranges():
    base = load_model("tiny").to_dict()
    with pytest.raises(ConfigError, match=r"model.layers must be an integer in \[1, 4096\], got 0"):
        ModelSpec.from_dict({**base, "layers": 0})
    with pytest.raises(ConfigError, match=r"model.norm_eps must be a finite number >= 0, got inf"):
        ModelSpec.from_dict({**base, "norm_eps": math.inf})
    with pytest.raises(ConfigError, match="missing required key"):
        ModelSpec.from_dict({k: v for k, v in base.items() if k != "vocab"})
    hw = load_hardware("cpu").to_dict()
    with pytest.raises(ConfigError, match=r"hardware.hbm_bytes must be a finite number > 0, got 0"):
        HardwareSpec.from_dict({**hw, "hbm_bytes": 0})
    assert HardwareSpec.from_dict(hw) == load_hardware("cpu")
    assert ModelSpec.from_dict(base) == load_model("tiny")


def test_trainer_section_choices_come_from_core_choices():
    assert set(_TRAINER_SCHEMA.choices) == {"rollout_engine", "loss_agg_mode", "kl_type"}
    for field, enum in (("rollout_engine", TrainerRolloutEngine), ("loss_agg_mode", LossAgg), ("kl_type", KlType)):
        for v in enum.values():
            assert getattr(from_mapping(TrainerOptions, {field: v}, "t", _TRAINER_SCHEMA), field) == v
        with pytest.raises(ConfigError, match=f"t.{field} must be one of"):
            from_mapping(TrainerOptions, {field: "nope"}, "t", _TRAINER_SCHEMA)
    with pytest.raises(ConfigError, match=r"t.top_p must be a number in \(0, 1\]"):
        from_mapping(TrainerOptions, {"top_p": 0}, "t", _TRAINER_SCHEMA)
    assert Recompute.values() == ("none", "selective", "full") and Offload.values() == ("param", "grad", "optimizer")


def test_cluster_needs_gpus():
    with pytest.raises(ConfigError, match="missing required key"):
        from_mapping(Cluster, {"gpus_per_node": 8}, "cluster")
    with pytest.raises(UnknownKeyError) as exc:
        from_mapping(Cluster, {"gpu": 8}, "cluster")
    assert exc.value.hint == "did you mean 'gpus'?"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none()))
def test_ranges_accept_exactly_their_numbers(v):
    """A value passes POSITIVE iff it is an int >= 1, and FRACTION iff it is a number in (0, 1]."""

    def ok(field, value):
        try:
            Strategy.from_dict({field: value})
            return True
        except ConfigError:
            return False

    is_num = isinstance(v, (int, float)) and not isinstance(v, bool)
    assert ok("tp", v) == (isinstance(v, int) and not isinstance(v, bool) and v >= 1)
    assert ok("gpu_memory_utilization", v) == (is_num and 0 < v <= 1)
    assert ok("cpu_optimizer", v) == (v is None or (is_num and 0 < v <= 1))


def test_range_descriptions():
    assert Range(lo=0).describe(False) == "a number >= 0"
    assert Range(lo=0, hi=1, lo_open=True).describe(False) == "a number in (0, 1]"
    assert POSITIVE.describe(True) == "a positive integer"
    assert not Range(lo=0, finite=True).contains(math.inf) and Range(lo=0).contains(math.inf)
