"""Each rollout engine's sleep and wake: the stack's ``[engine]`` figures for the engine it was fitted on, the
engine's own figures otherwise (engines/sglang: torch_memory_saver's unmap/map, docs/precision.md), and the
stack files written before the ``[engine]`` table (``[params] vllm_sleep_s`` / ``vllm_wake_s``) still load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from grpo_tune import engines
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.hardware import apply_stack
from grpo_tune.core.specs import load_hardware
from grpo_tune.core.stacks import ENGINES, STACKS_DIR, StackSpec, load_stack
from grpo_tune.core.strategy import Strategy

VERL = STACKS_DIR / "verl-0.9.1.toml"


def test_sglang_is_priced_with_its_own_figures_not_vllms():
    """On verl-0.9.1 (fitted on vLLM: sleep 0.65 s, wake 4.2 s) a vLLM plan takes the stack's figures and an SGLang
    plan its own: 3 ms per GiB of its pool (0.6 x the H100 profile's 85.52e9 bytes = 47.79 GiB: 0.1434 s each way,
    computed by hand)."""
    hw = load_hardware("h100")
    assert hw.stack == "verl-0.9.1" and hw.stack_engine == "vllm"
    vllm = engines.sleep_wake_s(Strategy.of(engine="vllm", gpu_memory_utilization=0.6), hw)
    sglang = engines.sleep_wake_s(Strategy.of(engine="sglang", gpu_memory_utilization=0.6), hw)
    assert vllm == (0.65, 4.2)
    assert hw.hbm_bytes == 85520809984
    assert sglang == pytest.approx((0.1434, 0.1434), abs=5e-5)
    assert engines.REGISTRY["sglang"].memory_map_s_per_gib == 3e-3  # the figure lives in engines/sglang
    assert engines.REGISTRY["vllm"].memory_map_s_per_gib is None  # vLLM's come from the stacks fitted on it


def test_the_estimate_moves_by_the_engines_figures():
    """The weight-sync phase of an SGLang plan carries SGLang's wake, the rollout phase its sleep (a price that moves
    with the engine's own figure, not only with its decode)."""
    from grpo_tune.core.specs import load_model
    from grpo_tune.core.strategy import Cluster, Workload
    from grpo_tune.costmodel.estimate import estimate

    hw = load_hardware("h100")
    kw = dict(model=load_model("qwen2.5-7b"), cluster=Cluster(gpus=8), workload=Workload())
    s = Strategy.of(engine="sglang")
    base = estimate(hardware=hw, strategy=s, **kw).time
    slow = dataclasses.replace(engines.REGISTRY["sglang"], memory_map_s_per_gib=1.0)
    reg = dict(engines.REGISTRY, sglang=slow)
    mp = pytest.MonkeyPatch()
    mp.setattr(engines, "REGISTRY", reg)
    try:
        moved = estimate(hardware=hw, strategy=s, **kw).time
    finally:
        mp.undo()
    assert base is not None and moved is not None
    pool_gib = s.rollout.gpu_memory_utilization * hw.hbm_bytes / 2**30
    dwake = moved["weight_sync"] - base["weight_sync"]
    assert dwake == pytest.approx(pool_gib * (1.0 - 3e-3), rel=1e-6)
    assert moved["rollout"] - base["rollout"] == pytest.approx(pool_gib * (1.0 - 3e-3), rel=1e-6)


def test_a_stack_fitted_on_sglang_prices_sglang_with_its_own_fit(tmp_path):
    text = (
        VERL.read_text()
        .replace('name = "verl-0.9.1"', 'name = "verl-sglang-test"')
        .replace('aliases = ["verl"]', "aliases = []")
    )
    text = text.replace('name = "vllm"  ', 'name = "sglang"')
    p = tmp_path / "verl-sglang.toml"
    p.write_text(text)
    st = load_stack(str(p))
    assert st.engine == "sglang"
    hw = apply_stack(load_hardware("h100"), st)
    assert hw.stack_engine == "sglang"
    assert engines.sleep_wake_s(Strategy.of(engine="sglang"), hw) == (0.65, 4.2)
    # vLLM has no figures of its own: the stack's price it
    assert engines.sleep_wake_s(Strategy.of(engine="vllm"), hw) == (0.65, 4.2)


def _old_spelling(tmp_path: Path, extra: str = "") -> Path:
    """verl-0.9.1.toml as it was written before the [engine] table: the figures in [params] as vllm_*."""
    head, _, eng = VERL.read_text().partition("\n[engine]\n")
    lines = {ln.split("=")[0].strip(): ln.split("=", 1)[1] for ln in eng.splitlines() if "=" in ln}
    text = head.replace('name = "verl-0.9.1"', 'name = "verl-old-test"').replace('aliases = ["verl"]', "aliases = []")
    text = text.replace("[params]\n", f"[params]\nvllm_sleep_s ={lines['sleep_s']}\nvllm_wake_s ={lines['wake_s']}\n")
    p = tmp_path / "old.toml"
    p.write_text(text + extra)
    return p


def test_a_stack_file_with_the_old_vllm_keys_loads_as_before(tmp_path):
    old = load_stack(str(_old_spelling(tmp_path)))
    new = load_stack("verl-0.9.1")
    assert old.engine == new.engine == "vllm"
    assert old.params == new.params
    assert old.params["engine_sleep_s"] == 0.65 and old.params["engine_wake_s"] == 4.2


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("\n[engine]\nwake_s = 1.0\n", "both [params] vllm_wake_s and [engine] wake_s"),
        ('\n[engine]\nname = "sglang"\n', "prices vLLM, but the stack's engine is 'sglang'"),
        ('\n[engine]\nname = "trtllm"\n', "engine.name must be one of vllm, sglang, megatron"),
        ("\n[engine]\nwarmup_s = 1.0\n", "unknown key 'warmup_s'"),
    ],
)
def test_engine_table_mistakes_are_coded(tmp_path, extra, needle):
    p = _old_spelling(tmp_path, extra)
    with pytest.raises(ConfigError) as e:
        StackSpec.from_dict(__import__("tomllib").loads(p.read_text()), where="stack")
    assert e.value.code == "BAD_CONFIG" and needle in e.value.message, e.value.message
    assert e.value.hint


def test_the_engine_figures_belong_in_the_engine_table(tmp_path):
    text = VERL.read_text().replace("[params]\n", "[params]\nengine_wake_s = 1.0\n")
    import tomllib

    with pytest.raises(ConfigError) as e:
        StackSpec.from_dict(tomllib.loads(text), where="stack")
    assert "engine's figures" in e.value.message and "[engine] table as wake_s" in e.value.hint


def test_a_hardware_profile_with_the_old_keys_is_told_where_they_go(tmp_path):
    from grpo_tune.core.specs import _load_hardware_file

    hw_file = next(p for p in (STACKS_DIR.parent / "hardware").glob("*.toml") if "h100" in p.name)
    text = hw_file.read_text()
    assert "[efficiency]\n" in text
    text = text.replace("[efficiency]\n", "[efficiency]\nvllm_wake_s = 4.2\n")
    p = tmp_path / "h100-old.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        _load_hardware_file(str(p))
    assert "vllm_wake_s" in e.value.message and "[engine] table" in e.value.hint


def test_stack_engine_names_are_the_engine_registry():
    """core/stacks.py cannot import engines/ (the layers): its list of engine names is held equal here."""
    assert set(ENGINES) == set(engines.REGISTRY)


def test_one_name_per_thing_rollout():
    """The plan's rollout concern is ``core.strategy.Rollout``; the trainer config's choice of sampler is
    ``core.choices.TrainerRolloutEngine``; neither module keeps a second ``RolloutEngine``."""
    from grpo_tune.core import choices, strategy

    assert not hasattr(strategy, "RolloutEngine") and not hasattr(choices, "RolloutEngine")
    assert strategy.Strategy().rollout.__class__ is strategy.Rollout
    assert choices.TrainerRolloutEngine.values() == ("auto", "vllm", "megatron")
