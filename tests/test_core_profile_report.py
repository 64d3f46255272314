"""core/profile_report.py: the profile JSON's one typed shape, written by the trainer and read by refine."""

import json

import pytest

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.phases import MEASURED_PHASES, Phase
from grpo_tune.core.profile_report import PeakMemory, ProfileReport, ProfileStatus

STEP = {
    "step_s": 2.0,
    "tokens_per_s": 100.0,
    "tokens_per_s_per_gpu": 50.0,
    "reward_mean": 0.5,
    "response_len": 8,
    "loss": 0.1,
}


def _hist():
    # three steps; the first (warm-up) is slow and is left out of the medians
    out = []
    for k, step_s in enumerate((9.0, 2.0, 4.0)):
        out.append(
            {
                **STEP,
                "step_s": step_s,
                "phases_s": {p.value: float(k + 1) for p in MEASURED_PHASES},
                "tokens_per_s": 600.0 / step_s,
            }
        )
    return out


def _ok_report(peak_kind, **kw):
    """A finished 3-step run on 2 ranks over _hist(), peak 12 bytes of the given kind."""
    return ProfileReport.from_history(
        "ok",
        message=None,
        config="c.yaml",
        steps=3,
        world_size=2,
        history=_hist(),
        peak={"per_rank": [10, 12], "max": 12, "kind": peak_kind},
        **kw,
    )


def test_from_history_takes_medians_after_the_first_step():
    r = _ok_report("peak_rss")
    assert r.step_s == 3.0  # median of 2.0 and 4.0
    assert r.tokens_per_s == pytest.approx((300.0 + 150.0) / 2)
    assert r.phases_s[Phase.UPDATE] == 2.5  # median of 2 and 3
    assert r.ok and r.peak_memory == PeakMemory(per_rank=(10, 12), max=12, kind="peak_rss")


def test_json_round_trip_with_peak_bytes_by_phase():
    r = _ok_report("cuda_max_allocated", peak_bytes_by_phase={"rollout": 7, "update": 12})
    d = json.loads(json.dumps(r.to_dict()))
    assert list(d["phases_s"]) == [p.value for p in MEASURED_PHASES]
    assert d["peak_bytes_by_phase"] == {"rollout": 7, "update": 12}
    back = ProfileReport.from_dict(d)
    assert back == r and back.peak_bytes_by_phase == {Phase.ROLLOUT: 7, Phase.UPDATE: 12}


def test_failed_run_has_null_figures_and_is_not_ok():
    r = ProfileReport.from_history("oom", message="CUDA out of memory", config="c.yaml", steps=4, world_size=1)
    d = r.to_dict()
    assert d["step_s"] is None and d["peak_memory_bytes"] == {"per_rank": [], "max": None} and d["steps"] == 4
    assert not ProfileReport.from_dict(d).ok and ProfileReport.from_dict(d).status is ProfileStatus.OOM


def test_trainer_writer_is_the_core_type():
    from grpo_tune.trainer.profile import result

    d = result("ok", message=None, config="c.yaml", steps=3, world_size=1, history=_hist())
    assert d == ProfileReport.from_dict(d).to_dict()
    assert "peak_bytes_by_phase" not in d  # optional: only when the trainer measured it


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"status": "done"},
        {"status": "ok", "step_s": "fast"},
        {"status": "ok", "phases_s": [1]},
        {"status": "ok", "peak_memory_bytes": {"max": "lots"}},
        {"status": "ok", "peak_bytes_by_phase": {"warmup": 1}},
        {"status": "ok", "peak_bytes_by_phase": {"update": -1}},
    ],
)
def test_malformed_json_is_a_coded_error(bad):
    with pytest.raises(ConfigError):
        ProfileReport.from_dict(bad)


def test_ok_needs_positive_finite_figures():
    assert not ProfileReport(status=ProfileStatus.OK, step_s=0.0, tokens_per_s=1.0).ok
    assert not ProfileReport(status=ProfileStatus.OK, step_s=1.0, tokens_per_s=float("inf")).ok
    assert ProfileReport(status=ProfileStatus.OK, step_s=1.0, tokens_per_s=1.0).ok
