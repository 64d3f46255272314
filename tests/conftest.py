"""Shared test settings.

Property tests run beside multi-process torchrun tests on 2 cores, so wall-clock limits per example
would make them fail by load, not by behaviour: no Hypothesis deadline and no too-slow health check.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("grpo-tune", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("grpo-tune")
# `pytest --hypothesis-profile=long tests/test_fuzz_cli.py`: many more fuzz cases than CI runs.
settings.register_profile("long", parent=settings.get_profile("grpo-tune"), max_examples=300)
