"""Async NeMo-RL recipes are complete (issue 38): the recipe grpo-tune emits for a separate generation pool with
staleness, and the one tune writes from the user's async recipe, load as NeMo-RL loads them (``recipe.load``:
NeMo-RL 0.7.0's load_config + parse_hydra_overrides) and pass NeMo-RL 0.7.0's own async checks, reproduced and cited
in frameworks/nemo_rl/async_checks.py (run_grpo.py, grpo.py async_grpo_train, vllm_generation.py)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from grpo_tune.cli.main import main
from grpo_tune.frameworks.nemo_rl import async_checks, recipe
from grpo_tune.frameworks.nemo_rl import snapshot as snap
from grpo_tune.frameworks.nemo_rl.diagnose import diagnose_recipe

ROOT = Path(__file__).resolve().parent.parent
ASYNC = ROOT / "examples" / "nemo-rl-upstream" / "grpo-qwen3-30ba3b-4n8g-async-1off.yaml"


def _tree(path: Path) -> dict:
    """The recipe as NeMo-RL's MasterConfig holds it: defaults merged, interpolations resolved, nested."""
    return snap.unflatten(dict(recipe.load(path).resolved))


def _cli(*argv: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.parametrize("model,gpus,rollout", [("qwen2.5-7b", 16, 8), ("qwen3-30b-a3b", 32, 16)])
def test_the_emitted_async_recipe_passes_nemo_rls_async_checks(tmp_path, model, gpus, rollout):
    d = _cli(
        *("search", "--model", model, "--gpus", str(gpus), "--framework", "nemo-rl", "--placement", "separate"),
        *("--rollout-gpus", str(rollout), "--staleness", "1", "--out", str(tmp_path)),
    )
    assert d
    (run,) = list(tmp_path.iterdir())
    tree = _tree(run / "nemo_rl.yaml")
    assert tree["grpo"]["async_grpo"]["enabled"] is True
    assert tree["policy"]["generation"]["vllm_cfg"]["async_engine"] is True  # issue 38: it was never set
    assert async_checks.check(tree) == []
    assert diagnose_recipe(run / "nemo_rl.yaml").count("error") == 0


def test_an_async_recipe_without_the_async_engine_fails_nemo_rls_check(tmp_path):
    f = tmp_path / "no-engine.yaml"
    f.write_text(f"defaults: {ASYNC}\npolicy:\n  generation:\n    vllm_cfg:\n      async_engine: false\n")
    (fail,) = [m for sev, m, _ in async_checks.check(_tree(f)) if sev == "error"]
    assert "async generation engine" in fail
    msgs = [x.message for x in diagnose_recipe(f).findings if x.severity == "error"]
    assert any("async generation engine" in m for m in msgs), msgs


def test_nemo_rls_other_async_refusals_are_reproduced():
    tree = _tree(ASYNC)
    assert async_checks.check(tree) == []
    tree["grpo"]["use_dynamic_sampling"] = True
    tree["loss_fn"]["use_importance_sampling_correction"] = False
    tree["grpo"]["async_grpo"]["max_trajectory_age_steps"] = 2
    tree["grpo"]["async_grpo"]["in_flight_weight_updates"] = False
    got = {(sev, m.split(" ")[0]) for sev, m, _ in async_checks.check(tree)}
    assert ("error", "grpo.use_dynamic_sampling") in got
    assert ("error", "async") in got  # use_importance_sampling_correction
    assert ("warning", "max_trajectory_age_steps=2") in got


@pytest.mark.parametrize("hw", ["a100", "h200"])
def test_tune_of_an_async_recipe_keeps_the_users_settings_and_passes_the_checks(tmp_path, hw):
    """tune changed lr 3e-7 -> 1e-6, added weight_decay 0.01 and dropped min_lr, the warmup,
    in_flight_weight_updates and vllm_kwargs.moe_backend (a fresh recipe); tuned.yaml inherits the user's."""
    d = _cli("tune", str(ASYNC), "--hardware", hw, "--out", str(tmp_path))
    assert d["overrides"], "tune changes the plan on this GPU"
    tuned = Path(d["files"]["tuned.yaml"])
    before, after = _tree(ASYNC), _tree(tuned)
    opt, opt2 = before["policy"]["megatron_cfg"]["optimizer"], after["policy"]["megatron_cfg"]["optimizer"]
    assert (opt2["lr"], opt2["min_lr"], opt2["weight_decay"]) == (opt["lr"], opt["min_lr"], opt["weight_decay"])
    assert after["policy"]["megatron_cfg"]["scheduler"] == before["policy"]["megatron_cfg"]["scheduler"]
    assert after["grpo"]["async_grpo"] == before["grpo"]["async_grpo"]  # in_flight_weight_updates as the user set it
    assert after["policy"]["generation"]["vllm_kwargs"] == before["policy"]["generation"]["vllm_kwargs"]
    assert after["policy"]["generation"]["vllm_cfg"]["async_engine"] is True
    assert async_checks.check(after) == []
    assert diagnose_recipe(tuned, hardware=hw).count("error") == 0
