"""autotune.calibrate.runlog: verl's file-logger JSONL, verl's console lines and our metrics.jsonl -> per-step records.

The fixture logs under tests/fixtures/verl_logs/ are written by verl 0.9.1's own logger code
(make_fixtures.py); the small inline cases here test edge cases of the reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_tune.autotune.calibrate import runlog
from grpo_tune.core.errors import ConfigError

FIX = Path(__file__).parent / "fixtures" / "verl_logs"


def _w(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", ["verl.jsonl", "metrics.jsonl"])
def test_a_deeply_nested_line_is_skipped_with_a_warning(tmp_path, name):
    """A line of 5,000 brackets was INTERNAL_ERROR (RecursionError) in both JSON-lines readers."""
    verl = {"step": 1, "data": {"timing_s/gen": 2.0}}
    ok = verl if name == "verl.jsonl" else {"step": 1, "phases_s": {"rollout": 2.0}}
    p = _w(tmp_path, name, json.dumps(ok) + "\n" + "[" * 5000 + "\n")
    log = runlog.read_log(p)
    assert [r.phases_s for r in log.records] == [{"rollout": 2.0}]
    assert log.warnings == [f"{p}:2: not a JSON object; skipped"]


def test_console_line_with_ray_prefix_numpy_scalars_and_validation_step(tmp_path):
    p = _w(
        tmp_path,
        "console.log",
        "Training Progress:   0%|\n"
        "(TaskRunner pid=88) step:0 - val-core/openai/gsm8k/acc/mean@1:0.25\n"
        "(TaskRunner pid=88) step:1 - actor/pg_loss:-0.01 - timing_s/gen:np.float64(61.5) - "
        "timing_s/update_weights:4.0 - timing_s/old_log_prob:9.5 - timing_s/ref:9.0 - "
        "timing_s/update_actor:30.25 - timing_s/step:120.0 - response_length/mean:512.5 - "
        "prompt_length/max:1024.0 - perf/max_memory_allocated_gb:41.5\n",
    )
    log = runlog.read_log(p)
    assert log.format == "verl-console"
    assert [r.step for r in log.records] == [1]
    r = log.records[0]
    assert r.phases_s == {"rollout": 61.5, "weight_sync": 4.0, "old_logprob": 9.5, "ref_logprob": 9.0, "update": 30.25}
    assert r.step_s == 120.0 and r.response_len_mean == 512.5 and r.prompt_len_max == 1024.0
    assert r.max_memory_allocated_gib == 41.5
    assert log.warnings == []


def test_jsonl_null_values_and_relogged_step_keeps_the_last(tmp_path):
    lines = [
        {"step": 1, "data": {"timing_s/gen": 10.0, "timing_s/step": 20.0, "actor/kl": None}},
        {"step": 2, "data": {"timing_s/gen": 11.0, "timing_s/step": None}},
        {"step": 2, "data": {"timing_s/gen": 12.0, "timing_s/step": 22.0}},
    ]
    p = _w(tmp_path, "run.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    log = runlog.read_log(p)
    assert log.format == "verl-jsonl"
    assert [(r.step, r.phases_s["rollout"], r.step_s) for r in log.records] == [(1, 10.0, 20.0), (2, 12.0, 22.0)]


def test_partly_written_last_line_is_skipped_with_a_warning(tmp_path):
    full = json.dumps({"step": 1, "data": {"timing_s/gen": 10.0}}) + "\n"
    p = _w(tmp_path, "killed.jsonl", full + '{"step": 2, "data": {"timing_s/gen": 1')
    log = runlog.read_log(p)
    assert [r.step for r in log.records] == [1]
    assert len(log.warnings) == 1 and "no newline" in log.warnings[0]
    # A console line cut inside a number would still parse; it is dropped for the same reason.
    p2 = _w(tmp_path, "killed.log", "step:1 - timing_s/gen:10.0\nstep:2 - timing_s/gen:1")
    log2 = runlog.read_log(p2)
    assert [r.step for r in log2.records] == [1] and log2.warnings


def test_no_timing_keys_is_a_coded_error(tmp_path):
    p = _w(tmp_path, "val.jsonl", json.dumps({"step": 0, "data": {"val-core/acc": 0.5}}) + "\n")
    with pytest.raises(ConfigError, match="no step .* has a timing key"):
        runlog.read_log(p)
    p2 = _w(tmp_path, "junk.txt", "hello\nworld\n")
    with pytest.raises(ConfigError, match="not a training log"):
        runlog.read_log(p2)


def test_bounded_read_refuses_big_files_and_non_regular_files(tmp_path):
    p = _w(tmp_path, "big.log", "x" * 2000 + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        runlog.read_log(p, max_bytes=1000)
    with pytest.raises(ConfigError, match="no log file"):
        runlog.read_log(tmp_path / "missing.log")
    with pytest.raises(ConfigError, match="not a regular file"):
        runlog.read_log(tmp_path)
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        with pytest.raises(ConfigError, match="not a regular file"):
            runlog.read_log(fifo)  # must not block on open


def test_our_metrics_jsonl(tmp_path):
    rec = {
        "step": 1,
        "reward_mean": 0.1,
        "response_len": 7.5,
        "response_len_max": 12,
        "step_s": 2.0,
        "phases_s": {"rollout": 1.0, "weight_sync": 0.1, "old_logprob": 0.2, "ref_logprob": 0.0, "update": 0.6},
        "offload_s": 0.0,
        "tokens": 300,
        "tokens_per_s": 150.0,
        "tokens_per_s_per_gpu": 37.5,
    }
    p = _w(tmp_path, "metrics.jsonl", json.dumps(rec) + "\n")
    log = runlog.read_log(tmp_path)  # the run folder works too
    assert log.format == "grpo-tune" and log.path == str(p)
    r = log.records[0]
    assert r.phases_s["update"] == 0.6 and r.response_len_mean == 7.5 and r.response_len_max == 12
    assert r.step_s == 2.0 and r.total_tokens == 300


def test_summary_drops_warmup_and_takes_medians_and_peaks(tmp_path):
    lines = [
        {
            "step": s,
            "data": {
                "timing_s/gen": g,
                "timing_s/step": g + 1,
                "perf/max_memory_allocated_gb": m,
                "response_length/mean": 100.0 + s,
            },
        }
        for s, g, m in ((1, 100.0, 10.0), (2, 10.0, 12.0), (3, 12.0, 11.0), (4, 11.0, 11.5))
    ]
    p = _w(tmp_path, "r.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    s = runlog.summary(runlog.read_log(p), skip_warmup=1)
    assert s["steps"] == [2, 3, 4]
    assert s["phases_s"] == {"rollout": 11.0} and s["step_s"] == 12.0
    assert s["max_memory_allocated_gib"] == 12.0 and s["response_len_mean"] == 103.0


_LINE = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda k, v, s: f"step:{s} - {k}:{v}",
        st.sampled_from(["timing_s/gen", "timing_s/step", "x/y", ""]),
        st.one_of(st.floats(allow_nan=True), st.text(max_size=8)),
        st.integers(-3, 10**12),
    ),
    st.builds(
        lambda d, s: json.dumps({"step": s, "data": d}),
        st.dictionaries(
            st.sampled_from(["timing_s/gen", "timing_s/update_actor", "response_length/mean"]),
            st.one_of(st.none(), st.floats(allow_nan=True), st.text(max_size=5), st.booleans()),
        ),
        st.one_of(st.integers(-5, 100), st.text(max_size=3), st.none()),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINE, max_size=12), tail=st.booleans())
def test_any_input_gives_records_or_a_coded_error(tmp_path, lines, tail):
    p = tmp_path / "fuzz.log"
    p.write_text("\n".join(lines) + ("\n" if tail else ""))
    try:
        log = runlog.read_log(p)
    except ConfigError:
        return
    assert log.records and all(r.phases_s for r in log.records)
    assert [r.step for r in log.records] == sorted({r.step for r in log.records})
    for r in log.records:
        assert all(isinstance(v, float) and v == v for v in r.phases_s.values())  # finite floats, no NaN
