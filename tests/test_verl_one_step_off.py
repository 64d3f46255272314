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


# What the user's one-step-off recipe sets besides the plan: tune keeps every one of them (issue 38: a fresh verl.sh
# replaced the data files, dropped the DAPO reward and the warmup, and changed clip_ratio_high, weight decay, the
# truncation and the logger).
KEPT = {
    "data.train_files": "$HOME/verl/data/dapo-math-17k.parquet",
    "data.val_files": "$HOME/verl/data/aime-2024.parquet",
    "data.truncation": "left",
    "reward_model.reward_manager": "dapo",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "trainer.logger": ["console", "tensorboard"],
}


def _tune_json(tmp_path, *extra: str) -> dict:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
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
                "--json",
                *extra,
            ]
        )
    assert rc == 0
    return json.loads(buf.getvalue())


def _composed(text: str, config) -> tuple[dict, dict]:
    """The launch's overrides (key -> value as written) and the config its trainer composes from them."""
    from grpo_tune.frameworks.verl.diagnose import parse_script

    ovs, _, facts = parse_script(text)
    assert facts["config_name"] == config.name
    args = [f"{o.prefix}{o.key}={o.raw}" for o in ovs]
    return {o.key: o.raw for o in ovs}, verl.flatten(config.compose(args))


def _only_priced_keys_change(before: dict, after: dict, reported: dict) -> None:
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    dropped = {"actor_rollout_ref.actor.megatron.grad_offload"}  # a key 0.9.1 refuses (--ignore-unknown)
    assert changed - dropped <= set(reported), changed - dropped - set(reported)


def test_tune_edits_the_one_step_off_launch_in_place(tmp_path):
    """The plan tune finds is the one-step-off schedule (staleness 1, no partial rollout, a sync per step): tuned.sh
    is the user's launch, still one-step-off, with only the priced keys changed; it composes against the wheel's
    one-step-off config, keeps the recipe's data, reward, optimizer and logging, and passes diagnose."""
    d = _tune_json(tmp_path)
    assert d["overrides"], "the search finds a faster plan for this launch on 16 H20"
    tuned = Path(d["files"]["tuned.sh"])
    text = tuned.read_text()
    assert one_step_off.ENTRY in text and fully_async.ENTRY not in text
    before, _ = _composed(RECIPE.read_text().replace("grad_offload=False", ""), one_step_off.CONFIG)
    after, tree = _composed(text, one_step_off.CONFIG)
    _only_priced_keys_change(before, after, d["overrides"])
    for k, v in KEPT.items():
        assert tree[k] == v, (k, tree[k])
    for k, v in d["overrides"].items():
        assert tree[k] == v["new"], k
    back = diagnose_path(tuned, hardware="h20")
    assert not [f for f in back.findings if f.severity.value == "error"], [f.message for f in back.findings]
    assert back.summary["placement"]["trainer"] == "one-step-off"


def test_a_plan_one_step_off_cannot_run_switches_the_users_launch_to_fully_async(tmp_path):
    """Staleness 2 is not the one-step-off schedule: tuned.sh is still the user's launch, its module and
    --config-name switched to the fully-async trainer, with what that trainer asserts added and every key changed
    or added listed; it composes against the wheel's fully-async config and keeps the recipe's other settings."""
    import dataclasses

    from grpo_tune.costmodel.pools import estimate_separate
    from grpo_tune.frameworks.verl.retune import edited_launch, separate_edit

    plan = read_plan(RECIPE, hardware="h20")
    assert plan.placement is not None and plan.launch is not None
    two = dataclasses.replace(plan.placement, staleness=2, partial_rollout=True)
    est = estimate_separate(
        model=plan.model,
        hardware=plan.hardware,
        cluster=plan.cluster,
        strategy=plan.strategy,
        workload=plan.workload,
        placement=two,
    )
    from grpo_tune.rundir.emit import run_config

    edit = separate_edit(plan.launch, run_config(est), plan.model)
    assert edit.switched and any("fully-async" in n for n in edit.notes)
    d = {"overrides": {k: {"old": a, "new": b} for k, (a, b) in edit.changes.items()}}
    tuned = tmp_path / "tuned.sh"
    tuned.write_text(edited_launch(plan.launch, edit))
    text = tuned.read_text()
    assert fully_async.ENTRY in text and one_step_off.ENTRY not in text
    assert f"--config-name='{fully_async.CONFIG_NAME}.yaml'" in text  # the user's quoting kept
    before, _ = _composed(RECIPE.read_text().replace("grad_offload=False", ""), one_step_off.CONFIG)
    after, tree = _composed(text, fully_async.CONFIG)
    _only_priced_keys_change(before, after, d["overrides"])
    for k, v in KEPT.items():
        assert tree[k] == v, (k, tree[k])
    assert tree["data.train_batch_size"] == 0 and tree["data.gen_batch_size"] == 1
    assert tree["actor_rollout_ref.hybrid_engine"] is False and tree["actor_rollout_ref.rollout.calculate_log_probs"]
    assert tree["actor_rollout_ref.rollout.mode"] == "async"  # the rollouter asserts it (0.9.1's default)
    assert tree["actor_rollout_ref.rollout.n"] == 12 and tree["rollout.total_rollout_steps"] == 512 * 100
    assert tree["async_training.trigger_parameter_sync_step"] * 32 == 512  # a parameter version per 512 prompts
    for k, v in d["overrides"].items():
        assert tree[k] == v["new"], k
    back = diagnose_path(tuned, hardware="h20")
    assert not [f for f in back.findings if f.severity.value == "error"], [f.message for f in back.findings]
    assert back.summary["placement"]["trainer"] == "fully-async"
    assert back.summary["placement"]["staleness"] == 2 and back.summary["placement"]["partial_rollout"] is True
    # and what it runs is the plan that was priced: tune reads it back to the same pools, schedule and layout
    again = read_plan(tuned, hardware="h20")
    assert again.placement is not None
    assert (again.placement.rollout_gpus, again.placement.staleness, again.placement.partial_rollout) == (4, 2, True)
    assert again.strategy == plan.strategy and again.workload == plan.workload


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
