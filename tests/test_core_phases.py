"""core/phases.py: one name per phase, and the phases that reach JSON/YAML stay plain strings."""

import json

import yaml

from grpo_tune.core.phases import ALL_PHASES, MEASURED_PHASES, Phase
from grpo_tune.costmodel import timing


def test_values_are_the_names_written_to_json():
    assert [p.value for p in ALL_PHASES] == [
        "rollout",
        "weight_sync",
        "old_logprob",
        "ref_logprob",
        "update",
        "offload",
    ]
    assert Phase.ROLLOUT == "rollout" and str(Phase.UPDATE) == "update" and f"{Phase.OFFLOAD}" == "offload"
    assert json.dumps({Phase.ROLLOUT: 1.0}) == '{"rollout": 1.0}'


def test_measured_phases_are_all_but_offload_in_step_order():
    assert MEASURED_PHASES == tuple(p for p in ALL_PHASES if p is not Phase.OFFLOAD)


def test_cost_model_prices_every_phase():
    assert tuple(timing.PHASES) == tuple(p.value for p in ALL_PHASES)


def test_profile_report_keys_are_plain_strings():
    from grpo_tune.trainer.profile import result

    out = result("ok", message=None, config="c.yaml", steps=1, world_size=1)
    assert all(type(k) is str for k in out["phases_s"])
    yaml.safe_dump(out)  # a Phase key would fail here ("cannot represent an object")
