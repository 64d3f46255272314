"""verl's one-step-off trainer (frameworks/verl/one_step_off.py), read back by diagnose and tune as separate pools at
staleness 1: its config composed from the real 0.9.1 wheel, and our rendition of verl's own 4 + 12 recipe
(examples/verl-upstream/dapo-7b-math-megatron-one-step-off-4-12.sh, the run validate --grpo scores as a pair).

The wheel is fetched from PyPI into a fresh cache, as tests/test_verl_async.py does: without it these tests fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_tune.cli.main import main
from grpo_tune.frameworks.verl import fully_async, one_step_off
from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl.diagnose import diagnose_path
from grpo_tune.frameworks.verl.read import read_plan

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "verl-upstream" / "dapo-7b-math-megatron-one-step-off-4-12.sh"


@pytest.fixture(scope="module", autouse=True)
def real_verl(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GRPO_TUNE_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("GRPO_TUNE_VERL_WHEEL", raising=False)
    assert (one_step_off.CONFIG.config_dir(fetch=True) / f"{one_step_off.CONFIG_NAME}.yaml").is_file()
    yield
    mp.undo()


def test_snapshot_matches_the_composed_wheel():
    base = verl.flatten(verl.compose([]))
    tree = verl.flatten(one_step_off.CONFIG.compose([]))
    delta = {k: v for k, v in tree.items() if k not in base or base[k] != v}
    assert json.loads(json.dumps(delta, default=str)) == one_step_off.CONFIG.snapshot()
    # the rollout pool, vLLM awake, the NCCL engine, the rollout's log-probs as the old ones (0.9.1's defaults)
    assert delta["rollout.n_gpus_per_node"] == 8 and delta["algorithm.rollout_correction.bypass_mode"] is True


def test_the_shared_wheel_config_moved_without_change():
    """fully_async's snapshot machinery moved to frameworks/verl/experimental.py: the keys it writes are the
    shipped ones."""
    tree = verl.flatten(fully_async.compose([]))
    base = verl.flatten(verl.compose([]))
    delta = {k: v for k, v in tree.items() if k not in base or base[k] != v}
    assert json.loads(json.dumps(delta, default=str)) == fully_async.snapshot()


def test_diagnose_reads_verls_recipe_as_separate_pools_at_staleness_1():
    rep = diagnose_path(RECIPE, hardware="h20")
    sm = rep.summary
    pl = sm["placement"]
    assert (pl["rollout_gpus"], pl["train_gpus"], pl["staleness"], pl["partial_rollout"]) == (4, 12, 1, False)
    assert pl["trainer"] == "one-step-off" and pl["shared_nodes"] is True
    assert pl["recompute_logprobs"] is False  # 0.9.1's one-step-off config sets bypass_mode=True; the recipe keeps it
    a = sm["roles"]["actor"]
    assert (a["tp"], a["pp"], a["dp"]) == (2, 2, 3)
    assert sm["roles"]["rollout"]["replicas"] == 2
    assert sm["batch"]["train_batch_size"] == 512 and sm["batch"]["n"] == 12  # a step is the train batch
    assert sm["memory"] is not None and "vllm_resident" not in json.dumps(sm["memory"])
    # the only error is the source's own: a key 0.9.1 removed; the entry point and its pool keys are known
    errors = [(f.code, f.key) for f in rep.findings if f.severity.value == "error"]
    assert errors == [("UNKNOWN_KEY", "actor_rollout_ref.actor.megatron.grad_offload")], errors
    assert not [f for f in rep.findings if f.code == "UNKNOWN_COMMAND"]


def test_the_recipe_is_priced_with_its_positions_and_pools():
    """tune's reader: the pools, staleness 1, the train batch as the step, and the override of the checkpoint's
    4,096 positions (the recipe's 2,048 + 8,192 tokens need it; without it no plan of the search could run)."""
    p = read_plan(RECIPE, hardware="h20")
    assert p.model.max_seq_len == 32768
    assert p.placement is not None and (p.placement.rollout_gpus, p.placement.staleness) == (4, 1)
    assert (p.cluster.gpus, p.cluster.gpus_per_node) == (16, 8)
    assert (p.workload.prompts, p.workload.n, p.workload.mini_batch) == (512, 12, 32)


def test_tune_proposes_the_fully_async_equivalent(tmp_path, capsys):
    rc = main(
        [
            "tune",
            str(RECIPE),
            "--hardware",
            "h20",
            "--ignore-unknown",
            "--response-len-mean",
            "790",
            "--prompt-len-mean",
            "200",
            "--out",
            str(tmp_path / "runs"),
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    text = " ".join(out.out.split())
    assert "verl one-step-off launch of qwen2.5-math-7b on 16 x h20-96gb" in text, text
    assert "as launched: 4 rollout + 12 training GPUs, staleness 1" in text, text
    assert "the one-step-off schedule" in text
    (run,) = (tmp_path / "runs").iterdir()
    sh = (run / "verl.sh").read_text()
    assert fully_async.ENTRY in sh
    assert "+actor_rollout_ref.model.override_config.max_position_embeddings=32768" in sh  # the recipe's positions
    from grpo_tune.core.config import load

    cfg = load(run / "best.yaml")
    tree = fully_async.compose(fully_async.overrides(cfg, model_path="/m", train_files="/t", val_files="/v"))
    assert tree["actor_rollout_ref"]["model"]["override_config"]["max_position_embeddings"] == 32768
    back = diagnose_path(run / "verl.sh", hardware="h20")
    assert not [f for f in back.findings if f.severity.value == "error"], [f.message for f in back.findings]
    assert back.summary["placement"]["staleness"] == 1 and back.summary["placement"]["partial_rollout"] is False


def test_a_colocated_launch_carries_the_positions_it_was_priced_with(tmp_path):
    """A plan whose sequences need more positions than the preset's config.json gives (read from a launch's
    override) writes the override into its colocated verl.sh too, and verl's real config takes it; a plan within
    the preset's positions writes none."""
    from _export_configs import dapo_7b

    from grpo_tune.core.specs import load_model
    from grpo_tune.frameworks.verl.export import verl_overrides

    assert load_model("qwen2.5-math-7b").max_seq_len == 4096
    key = "actor_rollout_ref.model.override_config.max_position_embeddings"
    long = verl_overrides(dapo_7b("h20", 8192, tmp_path / "run", positions=32768))
    assert f"+{key}=32768" in long
    tree = verl.compose(long)
    assert tree["actor_rollout_ref"]["model"]["override_config"]["max_position_embeddings"] == 32768
    assert not [o for o in verl_overrides(dapo_7b("h20", 1024, tmp_path / "run")) if key in o]
