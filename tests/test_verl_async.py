"""The separate-pool launch (frameworks/verl/fully_async.py) composes against verl 0.9.1's real fully-async config,
and diagnose reads it back to the plan that was searched.

The wheel is fetched from PyPI (``pip download --no-deps verl==0.9.1``) into a fresh cache, as
tests/test_verl_compose.py does: without it these tests fail, they do not skip.
"""

from __future__ import annotations

import json

import pytest

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl import fully_async as verl_async
from grpo_tune.frameworks.verl.diagnose import diagnose_path
from grpo_tune.frameworks.verl.export import verl_script
from grpo_tune.core.errors import ConfigError
from grpo_tune.rundir.emit import emit, run_config
from grpo_tune.autotune.search.placement import search_placement
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Workload


@pytest.fixture(scope="module", autouse=True)
def real_verl(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GRPO_TUNE_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("GRPO_TUNE_VERL_WHEEL", raising=False)
    assert (verl_async.config_dir(fetch=True) / f"{verl_async.CONFIG_NAME}.yaml").is_file()
    yield
    mp.undo()


@pytest.fixture(scope="module")
def best():
    """The Must-show search: qwen3-30b-a3b on 64 H100, placement auto, staleness up to 1."""
    res = search_placement(
        load_model("qwen3-30b-a3b"), load_hardware("h100"), Cluster(gpus=64), Workload(), placement="auto", staleness=1
    )
    assert res.best_separate is not None
    return res.best_separate


def test_snapshot_matches_the_composed_wheel():
    base = verl.flatten(verl.compose([]))
    tree = verl.flatten(verl_async.compose([]))
    delta = {k: v for k, v in tree.items() if k not in base or base[k] != v}
    assert json.loads(json.dumps(delta, default=str)) == verl_async.snapshot()


def test_separate_launch_composes_with_its_pools(best):
    cfg = run_config(best)
    p, s, w = cfg.placement, cfg.strategy, cfg.workload
    assert p.separate and p.rollout_gpus == best.placement["rollout_gpus"]
    tree = verl_async.compose(
        verl_async.overrides(cfg, model_path="/m", train_files="/t.parquet", val_files="/v.parquet")
    )
    tr, ro, at, aro = tree["trainer"], tree["rollout"], tree["async_training"], tree["actor_rollout_ref"]
    assert tr["nnodes"] * tr["n_gpus_per_node"] == cfg.cluster.gpus - p.rollout_gpus
    assert ro["nnodes"] * ro["n_gpus_per_node"] == p.rollout_gpus
    assert at["staleness_threshold"] == p.staleness and at["partial_rollout"] is p.partial_rollout
    assert at["trigger_parameter_sync_step"] * aro["actor"]["ppo_mini_batch_size"] * at["require_batches"] == w.prompts
    assert tree["data"]["train_batch_size"] == 0 and tree["data"]["gen_batch_size"] == 1  # the rollouter's asserts
    # the rest of fully_async_rollouter.py's asserts (verl 0.9.1): an async rollout that computes the log-probs
    assert aro["rollout"]["mode"] == "async" and aro["rollout"]["calculate_log_probs"] is True
    assert at["staleness_threshold"] >= 0 and at["trigger_parameter_sync_step"] >= 1
    assert aro["hybrid_engine"] is False and aro["rollout"]["free_cache_engine"] is False
    assert aro["rollout"]["checkpoint_engine"]["backend"] != "naive"  # separate trainers assert it
    assert aro["rollout"]["tensor_model_parallel_size"] == s.rollout.rollout_tp
    assert aro["rollout"]["gpu_memory_utilization"] == s.rollout.gpu_memory_utilization
    assert at["concurrent_samples_per_replica"] * w.n >= s.rollout.max_num_seqs
    for role in ("actor", "ref"):
        meg = aro[role]["megatron"]
        assert (meg["tensor_model_parallel_size"], meg["expert_model_parallel_size"]) == (s.layout.tp, s.layout.ep)
        assert meg["pipeline_model_parallel_size"] == s.layout.pp
    rc = tree["algorithm"]["rollout_correction"]
    assert (rc["bypass_mode"], rc["rollout_is"], rc["rollout_is_threshold"]) == (False, "token", 2.0)


def test_the_colocated_launch_refuses_a_separate_plan(best):
    """verl.sh of a separate plan is the fully-async launch (the framework picks it); the colocated writer refuses."""
    with pytest.raises(ConfigError, match="colocated plans"):
        verl_script(run_config(best))


def test_diagnose_reads_the_emitted_script_back_to_the_same_plan(best, tmp_path):
    files = emit(best, tmp_path / "run")
    text = files["verl"].read_text()
    assert verl_async.ENTRY in text and f"--config-name={verl_async.CONFIG_NAME}" in text
    rep = diagnose_path(files["verl"])
    assert not [f for f in rep.findings if f.severity.value == "error"], [f.message for f in rep.findings]
    sm = rep.summary
    s, f = best.strategy, best.placement
    assert sm["world_size"] == f["train_gpus"]
    a = sm["roles"]["actor"]
    assert (a["tp"], a["pp"], a["cp"], a["ep"], a["dp"]) == (
        s.layout.tp,
        s.layout.pp,
        s.layout.cp,
        s.layout.ep,
        s.layout.dp,
    )
    assert sm["roles"]["rollout"]["tp"] == s.rollout.rollout_tp
    assert sm["roles"]["rollout"]["replicas"] == f["rollout_gpus"] // s.rollout.rollout_tp
    pl = sm["placement"]
    assert (pl["rollout_gpus"], pl["staleness"], pl["partial_rollout"]) == (
        f["rollout_gpus"],
        f["staleness"],
        f["partial_rollout"],
    )
    assert sm["memory"] is not None  # priced as separate pools
    assert "vllm_resident" not in json.dumps(sm["memory"])  # no vLLM in the training pool's phases


def test_rollout_logprobs_plan_emits_bypass_mode_and_reads_back(best, tmp_path):
    # recompute_logprobs off: verl's bypass_mode (no old log-prob pass), priced, emitted and read back as such
    import dataclasses

    from grpo_tune.core.placement import Placement
    from grpo_tune.costmodel.pools import estimate_separate

    f = best.placement
    pl = Placement(
        mode="separate",
        rollout_gpus=int(f["rollout_gpus"]),
        staleness=int(f["staleness"]),
        partial_rollout=bool(f["partial_rollout"]),
        recompute_logprobs=False,
    )
    e = estimate_separate(
        model=best.model,
        hardware=best.hardware,
        cluster=best.cluster,
        strategy=best.strategy,
        workload=best.workload,
        placement=pl,
    )
    cfg = run_config(e)
    assert cfg.placement == dataclasses.replace(cfg.placement, recompute_logprobs=False)
    tree = verl_async.compose(verl_async.overrides(cfg, model_path="/m", train_files="/t", val_files="/v"))
    assert tree["algorithm"]["rollout_correction"]["bypass_mode"] is True
    files = emit(e, tmp_path / "run")
    rep = diagnose_path(files["verl"])
    assert not [x for x in rep.findings if x.severity.value == "error"], [x.message for x in rep.findings]
    assert rep.summary["placement"]["recompute_logprobs"] is False


def test_diagnose_reads_the_emitted_best_yaml_as_its_verl_launch(best, tmp_path):
    """best.yaml of a separate plan is checked as the fully-async launch it exports to: the same findings and
    summary as the emitted verl.sh (it used to be read as a colocated launch on every GPU: INVALID_DEGREES
    whenever the training layout did not divide the whole cluster, rollout replicas over every GPU)."""
    files = emit(best, tmp_path / "run")
    from_yaml, from_sh = diagnose_path(files["best"]), diagnose_path(files["verl"])
    assert not [f for f in from_yaml.findings if f.severity.value == "error"], [f.message for f in from_yaml.findings]
    for k in ("world_size", "dp", "roles", "placement"):
        assert from_yaml.summary[k] == from_sh.summary[k], k
    assert from_yaml.summary["memory"] == from_sh.summary["memory"]


def test_diagnose_prices_a_best_yaml_rollout_pool_on_its_own_hardware(tmp_path):
    """A rollout pool on another profile (h100 training, h20 rollout): the launch cannot say so, best.yaml does,
    and diagnose prices each pool's memory on its own GPUs, as the search did."""
    res = search_placement(
        load_model("qwen2.5-7b"),
        load_hardware("h100"),
        Cluster(gpus=16),
        Workload(),
        placement="separate",
        staleness=1,
        rollout_hardware=load_hardware("h20"),
    )
    e = res.best_separate
    assert e is not None and e.placement["rollout_hardware"] == load_hardware("h20").name
    files = emit(e, tmp_path / "run")
    rep = diagnose_path(files["best"])
    assert rep.summary["rollout_hardware"] == load_hardware("h20").name
    mem = rep.summary["memory"]
    assert mem is not None
    assert mem["phases"] == {k: int(v.total_bytes) for k, v in e.memory.items()}  # the search's bytes per phase


def test_a_key_the_async_config_moved_is_named_where_it_went():
    """verl 0.9.1 moved async_training.use_rollout_log_probs to actor_rollout_ref.actor.use_rollout_log_probs (verl's
    own 96:32 script of January 2026 still sets the old one): the did-you-mean looks in the fully-async config's
    own keys too."""
    from grpo_tune.frameworks.verl.diagnose import diagnose_overrides

    rep = diagnose_overrides(["async_training.use_rollout_log_probs=True"], config_name=verl_async.CONFIG_NAME)
    (f,) = [f for f in rep.findings if f.key == "async_training.use_rollout_log_probs"]
    assert f.code == "UNKNOWN_KEY" and f.hint == "did you mean actor_rollout_ref.actor.use_rollout_log_probs?"


@pytest.mark.parametrize("stream", [True, False])
def test_staleness0_stream_is_the_minibatch_fetch(best, stream):
    """Issue 40: a streamed staleness-0 plan fetches one mini-batch at a time (the trainer starts on the first
    finished groups); one that does not stream fetches the whole batch; both compose against the wheel."""
    import dataclasses

    cfg = run_config(best)
    p = dataclasses.replace(cfg.placement, staleness=0, partial_rollout=False, stream=stream)
    cfg = dataclasses.replace(cfg, placement=p)
    tree = verl_async.compose(
        verl_async.overrides(cfg, model_path="/m", train_files="/t.parquet", val_files="/v.parquet")
    )
    at, w = tree["async_training"], cfg.workload
    units = w.prompts // w.mini_batch
    assert at["staleness_threshold"] == 0
    assert (at["require_batches"], at["trigger_parameter_sync_step"]) == ((1, units) if stream else (units, 1))


@pytest.mark.parametrize("stream", [True, False])
def test_staleness0_stream_is_emitted_priced_and_read_back(best, tmp_path, stream):
    """A staleness-0 plan's stream (issue 40) survives emit -> verl.sh -> diagnose: best.yaml records it, the launch
    fetches per mini-batch (or the whole batch), diagnose finds no error in it, and reading it back gives the stream."""
    from grpo_tune.core.placement import Placement
    from grpo_tune.costmodel.pools import estimate_separate

    f = best.placement
    e = estimate_separate(
        model=best.model,
        hardware=best.hardware,
        cluster=best.cluster,
        strategy=best.strategy,
        workload=best.workload,
        placement=Placement(mode="separate", rollout_gpus=int(f["rollout_gpus"]), stream=stream),
    )
    assert bool(e.placement["stream_units"]) is stream
    assert run_config(e).placement.stream is stream
    files = emit(e, tmp_path / "run")
    rep = diagnose_path(files["verl"])
    assert not [x for x in rep.findings if x.severity.value == "error"], [x.message for x in rep.findings]
    from grpo_tune.frameworks.verl.launch import read_launch
    from grpo_tune.frameworks.verl.read import separate_of

    assert separate_of(read_launch(files["verl"]))[0].stream is stream
