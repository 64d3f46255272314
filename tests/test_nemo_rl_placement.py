"""NeMo-RL's separate generation pool: policy.generation.colocated with its resources and grpo.async_grpo
(staleness) written from a plan's placement, read back as NeMo-RL 0.7.0's setup splits the cluster, and priced
by diagnose through the separate-pool cost model; what NeMo-RL cannot run is a coded finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_tune.cli.main import main
from grpo_tune.core.placement import Placement
from grpo_tune.core.strategy import Cluster
from grpo_tune.frameworks.nemo_rl import recipe, table
from grpo_tune.frameworks.nemo_rl.diagnose import diagnose_recipe
from _export_configs import make

UPSTREAM = Path(__file__).resolve().parent.parent / "examples" / "nemo-rl-upstream"


def test_nemo_rl_async_recipe_reads_its_generation_pool():
    rep = diagnose_recipe(UPSTREAM / "grpo-qwen3-30ba3b-4n8g-async-1off.yaml")
    assert rep.count("error") == 0 and rep.count("warning") == 0, [f.message for f in rep.findings]
    s = rep.summary
    assert s["placement"]["rollout_gpus"] == 16 and s["placement"]["staleness"] == 1
    assert s["train_gpus"] == 16 and s["roles"]["actor"]["dp"] == 8  # 16 training GPUs / PP 2
    assert s["roles"]["rollout"]["replicas"] == 8  # 16 generation GPUs / vLLM TP 2
    assert s["memory"]["peak_bytes"] > 0


def test_a_vllm_tp_group_straddling_two_nodes_is_a_warning(tmp_path):
    """The upstream recipe's 4 nodes, as nodes of 6 GPUs with vLLM TP 4: a replica takes GPUs of two nodes."""
    src = (UPSTREAM / "grpo-qwen3-30ba3b-4n8g.yaml").read_text()
    assert "gpus_per_node: 8" in src and "tensor_parallel_size: 2" in src
    six = src.replace("gpus_per_node: 8", "gpus_per_node: 6")
    for tp, flagged in ((2, False), (4, True)):
        f = tmp_path / f"tp{tp}.yaml"
        f.write_text(six.replace("tensor_parallel_size: 2", f"tensor_parallel_size: {tp}"))
        msgs = [x.message for x in diagnose_recipe(f).findings if x.code == "TP_MISMATCH"]
        assert any("vLLM tensor_parallel_size=4 spans nodes of 6 GPUs" in m for m in msgs) is flagged, msgs


@pytest.mark.parametrize(
    "gpus,rollout,staleness",
    [(8, 4, 0), (16, 8, 1), (32, 16, 2), (24, 8, 0)],
)
def test_placement_round_trips_through_the_recipe(tmp_path, gpus, rollout, staleness):
    train = gpus - rollout
    cfg = make("qwen2.5-1.5b", train, gpus_per_node=min(8, train), offload=())
    cfg = cfg.replace(
        cluster=Cluster(gpus=gpus, gpus_per_node=8),
        placement=Placement(mode="separate", rollout_gpus=rollout, staleness=staleness),
    )
    f = tmp_path / "nemo_rl.yaml"
    f.write_text(recipe.recipe_text(cfg))
    r = recipe.load(f)
    assert table.read_placement(r.get) == cfg.placement
    assert r.get("grpo.async_grpo.enabled") is (staleness > 0)
    assert r.get("policy.generation.colocated.enabled") is False
    rep = diagnose_recipe(f)
    assert rep.count("error") == 0, [x.message for x in rep.findings]
    assert rep.summary["train_gpus"] == train
    if staleness:
        assert r.get("loss_fn.use_importance_sampling_correction") is True


def test_what_nemo_rl_cannot_place_is_refused():
    c = Cluster(gpus=32, gpus_per_node=8)
    assert "whole nodes" in table.placement_problem(Placement(mode="separate", rollout_gpus=12), c)
    # partial rollout is NeMo-RL 0.7.0's in_flight_weight_updates (issue 36): placed, not refused
    partial = Placement(mode="separate", rollout_gpus=8, staleness=1, partial_rollout=True)
    assert table.placement_problem(partial, c) is None
    assert table.placement_problem(Placement(mode="separate", rollout_gpus=8), c) is None
    assert table.placement_problem(Placement(), c) is None


def test_async_with_colocated_generation_is_nemo_rl_s_error(tmp_path):
    rep = diagnose_recipe(
        UPSTREAM / "grpo-qwen3-30ba3b-4n8g.yaml",
        ["grpo.async_grpo.enabled=true"],
    )
    msgs = [x.message for x in rep.findings if x.severity == "error"]
    assert any("Colocated inference is not supported for async GRPO" in m for m in msgs)
    assert any("use_importance_sampling_correction" in m for m in msgs)


def test_diagnose_cli_json_of_the_async_recipe(capsys):
    assert main(["diagnose", str(UPSTREAM / "grpo-qwen3-30ba3b-4n8g-async-1off.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["placement"]["mode"] == "separate"


def test_placement_keys_are_nemo_rl_s():
    from grpo_tune.frameworks.nemo_rl import snapshot

    for key in table.PLACEMENT_KEYS:
        assert snapshot.key_status(key) in ("base", "declared"), key


def test_search_separate_for_nemo_rl_writes_a_recipe_that_reads_back(tmp_path, capsys):
    from grpo_tune.core.config import load
    from grpo_tune.frameworks.nemo_rl import read

    argv = [
        "search",
        "--model",
        "qwen2.5-7b",
        "--gpus",
        "16",
        "--framework",
        "nemo-rl",
        "--placement",
        "separate",
        "--rollout-gpus",
        "8",
        "--staleness",
        "1",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    (run,) = list(tmp_path.iterdir())
    assert not (run / "verl.sh").exists()
    cfg = load(run / "best.yaml")
    assert cfg.placement == Placement(mode="separate", rollout_gpus=8, staleness=1)
    r = recipe.load(run / "nemo_rl.yaml")
    assert table.read_placement(r.get) == cfg.placement
    c = read.cluster_of(r)
    tc = read.train_cluster(r, c)
    assert tc.gpus == 8
    back = read.strategy_of(r, cfg.model, tc.gpus, tc.gpus_per_node)
    want = cfg.strategy.replace(
        etp=None if not cfg.model.is_moe else cfg.strategy.layout.etp_, sequence_parallel=cfg.strategy.layout.sp
    )
    assert back == want.replace(etp=back.layout.etp)  # a dense model's expert TP is not a NeMo-RL setting
    assert cfg.strategy.memory.offload == ()  # a NeMo-RL training pool keeps its state: priced without offload
    rep = diagnose_recipe(run / "nemo_rl.yaml")
    assert rep.count("error") == 0, [x.message for x in rep.findings]


@pytest.mark.parametrize("gpus,rollout,staleness", [(16, 8, 1), (24, 8, 0)])
def test_a_separate_recipe_reads_back_to_its_plan(tmp_path, gpus, rollout, staleness):
    """plan -> nemo_rl.yaml -> frameworks.read_plan is the identity for a separate generation pool: the placement,
    the whole cluster, the training pool's strategy (as NeMo-RL can say it) and the workload."""
    from grpo_tune.core.config import TrainerOptions
    from grpo_tune.frameworks import read_plan

    train = gpus - rollout
    cfg = make("qwen2.5-1.5b", train, gpus_per_node=min(8, train), offload=())
    place = Placement(mode="separate", rollout_gpus=rollout, staleness=staleness)
    cfg = cfg.replace(cluster=Cluster(gpus=gpus, gpus_per_node=8), placement=place)
    f = tmp_path / "nemo_rl.yaml"
    f.write_text(recipe.recipe_text(cfg))
    plan = read_plan(f)
    assert plan.framework == "nemo-rl" and plan.placement == place
    assert plan.cluster == cfg.cluster
    tc = Cluster(gpus=train, gpus_per_node=min(8, train))
    fixed = table.canonical(
        {"strategy": cfg.strategy, "workload": cfg.workload, "trainer": TrainerOptions(), "cluster": tc}
    )
    # a generation pool of its own stays up between generations (no vLLM sleep) and the policy stays on its GPUs
    want = fixed["strategy"].replace(free_cache_engine=False, offload=())
    assert plan.strategy.replace(etp=plan.strategy.layout.etp_) == want.replace(etp=want.layout.etp_)
    assert (
        plan.strategy.layout.dp * plan.strategy.layout.tp * plan.strategy.layout.pp * plan.strategy.layout.cp == train
    )
    wl = plan.workload
    assert (wl.prompts, wl.n, wl.prompt_len, wl.response_len) == (
        cfg.workload.prompts,
        cfg.workload.n,
        cfg.workload.prompt_len,
        cfg.workload.response_len,
    )


def test_tune_on_a_separate_recipe_keeps_its_split_and_writes_a_recipe(tmp_path, capsys):
    """tune on NeMo-RL's own async recipe (16 generation + 16 training GPUs): priced as read back, the pools' plans
    re-searched with the recipe's split, and the run folder holds a NeMo-RL recipe (no verl.sh) that reads back."""
    from grpo_tune.frameworks import read_plan

    src = UPSTREAM / "grpo-qwen3-30ba3b-4n8g-async-1off.yaml"
    assert main(["tune", str(src), "--out", str(tmp_path), "--json"]) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["current"]["placement"]["rollout_gpus"] == 16
    assert doc["best"]["placement"]["rollout_gpus"] == 16  # NeMo-RL's split is kept as the recipe has it
    assert doc["gain"] >= 1.0
    names = {Path(p).name for p in doc["files"].values()}
    assert "nemo_rl.yaml" in names and "verl.sh" not in names
    back = read_plan(Path(doc["files"]["nemo_rl"]))
    assert back.placement is not None and back.placement.rollout_gpus == 16
    assert back.strategy.memory.offload == ()  # the training pool keeps the policy on its GPUs
    rep = diagnose_recipe(Path(doc["files"]["nemo_rl"]))
    assert rep.count("error") == 0, [x.message for x in rep.findings]  # NeMo-RL runs what tune wrote


def test_calibrate_refuses_a_separate_recipe(tmp_path, capsys):
    from grpo_tune.autotune.calibrate.runlog import RunLog, StepRecord, log_point
    from grpo_tune.core.errors import ConfigError

    log = RunLog(
        path="x", format="nemo-rl-console", records=[StepRecord(step=i, phases_s={"rollout": 1.0}) for i in (1, 2)]
    )
    with pytest.raises(ConfigError, match="separate rollout and training pools"):
        log_point(log, UPSTREAM / "grpo-qwen3-30ba3b-4n8g-async-1off.yaml")


@pytest.mark.parametrize("partial", [True, False])
def test_partial_rollout_is_written_as_in_flight_weight_updates(tmp_path, partial):
    """NeMo-RL 0.7.0's refit skips the wait for pending generations with grpo.async_grpo.in_flight_weight_updates
    and the async engine (trajectory_collector.py prepare_for_refit): the exporter writes it for partial rollout,
    the recipe reads back to the same placement, and NeMo-RL's own async checks pass (no warning either)."""
    from grpo_tune.frameworks.nemo_rl import async_checks, snapshot

    c = Cluster(gpus=16, gpus_per_node=8)
    p = Placement(mode="separate", rollout_gpus=8, staleness=2, partial_rollout=partial)
    keys = table.write_placement(p, c)
    assert keys["grpo.async_grpo.in_flight_weight_updates"] is partial
    assert keys["policy.generation.vllm_cfg.async_engine"] is True
    assert table.read_placement(lambda k: {**keys, "cluster.gpus_per_node": 8, "cluster.num_nodes": 2}.get(k)) == p
    tree = snapshot.base_tree()
    for k, v in {**keys, "policy.generation.backend": "vllm"}.items():
        node = tree
        *head, last = k.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = v
    got = async_checks.check(tree)
    assert [x for x in got if x[0] == "error"] == []
    assert any("in_flight_weight_updates" in m for _, m, _ in got) is (not partial)  # NeMo-RL's own warning at age 2
