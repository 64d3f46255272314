"""The exported overrides compose against verl 0.9.1's real Hydra config.

The wheel is fetched from PyPI here (``pip download --no-deps verl==0.9.1``) into a fresh cache:
when it cannot be had, these tests fail, they do not skip.
"""

from __future__ import annotations

import pytest

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl.diagnose import parse_script
from grpo_tune.frameworks.verl.export import verl_overrides
from grpo_tune.core.errors import UnknownKeyError
from _export_configs import ENGINE_KNOBS, configs

from pathlib import Path

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.sh"))


@pytest.fixture(scope="module", autouse=True)
def real_verl(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("GRPO_TUNE_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("GRPO_TUNE_VERL_WHEEL", raising=False)
    cdir = verl.config_dir(fetch=True)  # raises a coded error (test error) without PyPI
    assert (cdir / "ppo_megatron_trainer.yaml").is_file()
    yield cdir
    mp.undo()


def test_snapshot_matches_the_composed_wheel():
    composed = verl.flatten(verl.compose([]))
    shipped = verl.snapshot()
    assert set(composed) == set(shipped)
    # JSON turns tuples into lists and non-JSON values into strings; compare through the same lens
    import json

    assert json.loads(json.dumps(composed, default=str)) == shipped


@pytest.mark.parametrize("name", sorted(configs()))
def test_emitted_overrides_compose(name):
    cfg = configs()[name]
    tree = verl.compose(
        verl_overrides(cfg, model_path="/models/x", train_files="/d/train.parquet", val_files="/d/test.parquet")
    )
    s, w = cfg.strategy, cfg.workload
    aro = tree["actor_rollout_ref"]
    for role in ("actor", "ref"):
        meg = aro[role]["megatron"]
        assert meg["tensor_model_parallel_size"] == s.layout.tp
        assert meg["pipeline_model_parallel_size"] == s.layout.pp
        assert meg["context_parallel_size"] == s.layout.cp
        assert meg["expert_model_parallel_size"] == s.layout.ep
        assert meg["virtual_pipeline_model_parallel_size"] == (s.layout.vpp if s.layout.vpp > 1 else None)
        assert meg["dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[w.dtype]
    assert aro["rollout"]["n"] == w.n
    assert aro["rollout"]["tensor_model_parallel_size"] == s.rollout.rollout_tp
    assert aro["rollout"]["gpu_memory_utilization"] == s.rollout.gpu_memory_utilization
    assert tree["data"]["train_batch_size"] == w.prompts
    assert aro["actor"]["ppo_mini_batch_size"] == w.mini_batch
    assert aro["actor"]["ppo_micro_batch_size_per_gpu"] == s.batching.mbs
    assert (
        aro["rollout"]["log_prob_micro_batch_size_per_gpu"]
        == aro["ref"]["log_prob_micro_batch_size_per_gpu"]
        == s.batching.mbs
    )
    assert tree["trainer"]["n_gpus_per_node"] * tree["trainer"]["nnodes"] == cfg.cluster.gpus
    assert aro["rollout"]["checkpoint_engine"]["update_weights_bucket_megabytes"] == s.rollout.sync_bucket_mb
    assert aro["actor"]["megatron"]["optimizer_offload"] == ("optimizer" in s.memory.offload)
    assert aro["actor"]["megatron"]["param_offload"] == bool({"param", "grad"} & set(s.memory.offload))
    otc = aro["actor"]["megatron"]["override_transformer_config"]
    assert otc["recompute_granularity"] == (None if s.memory.recompute == "none" else s.memory.recompute)
    if s.layout.first_stage_layers is not None:
        assert otc["num_layers_in_first_pipeline_stage"] == s.layout.first_stage_layers
    # the reference reads the actor's transformer overrides (verl's oc.select default)
    assert aro["ref"]["megatron"]["override_transformer_config"] == otc


def test_a_removed_key_is_rejected_by_real_verl():
    with pytest.raises(UnknownKeyError):
        verl.compose(["actor_rollout_ref.actor.megatron.grad_offload=True"])
    with pytest.raises(UnknownKeyError):
        verl.compose(["algorithm.group_size=5"])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_scripts_compose(path):
    overrides, findings, facts = parse_script(path.read_text())
    assert facts["config_name"] == verl.CONFIG_NAME
    assert overrides
    verl.compose([f"{o.prefix}{o.key}={o.raw}" for o in overrides])


O = "actor_rollout_ref.actor.megatron.override_transformer_config"
HYDRA_CASES = [
    "algorithm.group_size=5",
    "+algorithm.group_size=5",
    "+actor_rollout_ref.rollout.n=5",
    "++actor_rollout_ref.rollout.n=5",
    f"{O}.fp16=True",
    f"+{O}.fp16=True",
    f"+{O}.recompute_granularity=full",
    f"{O}.recompute_granularity=full",
    f"+{O}.recompute_modules=[mlp]",
    "actor_rollout_ref.model.override_config.foo=1",
    "+actor_rollout_ref.model.override_config.foo=1",
    "actor_rollout_ref.actor.megatron.grad_offload=True",
    "+trainer.foo.bar=1",
    "data.train_batch_size=64",
]


@pytest.mark.parametrize("override", HYDRA_CASES)
def test_diagnose_agrees_with_hydra_on_keys(override):
    """diagnose flags a key as refused exactly when real Hydra + verl's config refuse to compose it."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.frameworks.verl.diagnose import diagnose_overrides

    try:
        verl.compose([override])
        composes = True
    except GrpoTuneError:
        composes = False
    key = override.lstrip("+").split("=", 1)[0]
    rep = diagnose_overrides([override])
    refused = [
        f for f in rep.findings if f.key == key and f.severity == "error" and f.code in ("UNKNOWN_KEY", "BAD_CONFIG")
    ]
    assert bool(refused) == (not composes), (override, [f.to_dict() for f in refused])


def test_new_contract_fields_compose_with_their_values():
    """Dynamic batching, the hybrid CPU optimizer and the vLLM engine knobs reach verl's composed config."""
    cfg = configs()["7b-tp2"]
    s = cfg.strategy.replace(**ENGINE_KNOBS)
    tree = verl.compose(verl_overrides(cfg.replace(strategy=s), model_path="/m", train_files="/t", val_files="/v"))
    aro = tree["actor_rollout_ref"]
    assert aro["actor"]["use_dynamic_bsz"] is True and aro["actor"]["ppo_max_token_len_per_gpu"] == 12000
    for role in ("ref", "rollout"):
        assert aro[role]["log_prob_use_dynamic_bsz"] is True
        assert aro[role]["log_prob_max_token_len_per_gpu"] == 24000
    assert aro["actor"]["optim"]["override_optimizer_config"] == {
        "optimizer_cpu_offload": True,
        "optimizer_offload_fraction": 0.5,
        "overlap_cpu_optimizer_d2h_h2d": True,
        "use_precision_aware_optimizer": True,
    }
    r = aro["rollout"]
    assert (
        r["max_num_seqs"],
        r["max_num_batched_tokens"],
        r["enforce_eager"],
        r["enable_chunked_prefill"],
        r["free_cache_engine"],
        r["checkpoint_engine"]["update_weights_bucket_megabytes"],
    ) == (64, 4096, True, False, False, 512)


def test_the_log_prob_micro_batch_composes_apart_from_the_training_one():
    cfg = configs()["7b-tp2"]
    s = cfg.strategy.replace(mbs=4, log_prob_mbs=8)
    tree = verl.compose(verl_overrides(cfg.replace(strategy=s), model_path="/m", train_files="/t", val_files="/v"))
    aro = tree["actor_rollout_ref"]
    assert aro["actor"]["ppo_micro_batch_size_per_gpu"] == 4
    assert aro["rollout"]["log_prob_micro_batch_size_per_gpu"] == aro["ref"]["log_prob_micro_batch_size_per_gpu"] == 8


def test_the_weight_sync_bucket_composes_at_the_default_and_apart_from_it():
    """verl 0.9.1 reads update_weights_bucket_megabytes from the rollout's checkpoint_engine (rollout.yaml l.296):
    the exported key composes (2048 as written at the default, 64 when the plan says so), nothing else moves."""
    cfg = configs()["7b-tp2"]
    kw = dict(model_path="/m", train_files="/t", val_files="/v")
    base = verl.compose(verl_overrides(cfg, **kw))
    small = verl.compose(verl_overrides(cfg.replace(strategy=cfg.strategy.replace(sync_bucket_mb=64)), **kw))
    ce = "checkpoint_engine"
    assert base["actor_rollout_ref"]["rollout"][ce]["update_weights_bucket_megabytes"] == 2048
    assert small["actor_rollout_ref"]["rollout"][ce]["update_weights_bucket_megabytes"] == 64
    assert small["actor_rollout_ref"]["rollout"][ce]["backend"] == "naive"  # the colocated CUDA-IPC sync priced
    flat_base, flat_small = verl.flatten(base), verl.flatten(small)
    moved = {k for k in flat_base if flat_base[k] != flat_small.get(k)}
    assert moved == {f"actor_rollout_ref.rollout.{ce}.update_weights_bucket_megabytes"}


@pytest.mark.parametrize(
    "knobs",
    [
        dict(engine="sglang"),
        dict(engine="sglang", rollout_precision="fp8", kv_cache_dtype="fp8"),
        dict(precision="fp8", rollout_precision="fp8", kv_cache_dtype="fp8"),
    ],
    ids=["sglang", "sglang-fp8-rollout", "fp8-train-vllm"],
)
def test_engine_and_precision_overrides_compose(knobs):
    """The engine and precision keys grpo-tune writes compose against verl 0.9.1's Hydra config and land where verl
    reads them: rollout.name, rollout.quantization, the engine kwargs' kv_cache_dtype, Megatron's fp8 overrides for
    actor and reference, and the importance-sampling correction exactly when FP8 rollout meets bf16 training."""
    from _export_configs import make

    cfg = make("qwen2.5-7b", 8, tp=2, rollout_tp=2, **knobs)
    tree = verl.compose(verl_overrides(cfg))
    ro = tree["actor_rollout_ref"]["rollout"]
    prec = cfg.strategy.precision
    assert ro["name"] == knobs.get("engine", "vllm")
    assert ro["quantization"] == ("fp8" if prec.rollout_precision == "fp8" else None)
    kv = ro["engine_kwargs"][ro["name"]].get("kv_cache_dtype")
    assert kv == ({"vllm": "fp8", "sglang": "fp8_e4m3"}[ro["name"]] if prec.kv_cache_dtype == "fp8" else None)
    for role in ("actor", "ref"):
        otc = tree["actor_rollout_ref"][role]["megatron"]["override_transformer_config"]
        assert (otc.get("fp8"), otc.get("fp8_recipe")) == (
            ("e4m3", "blockwise") if prec.precision == "fp8" else (None, None)
        )
    assert tree["algorithm"]["rollout_correction"]["rollout_is"] == ("token" if prec.off_policy_fp8 else None)


def test_search_with_sglang_emits_a_launch_that_composes(tmp_path):
    """`grpo-tune search --model 7b --gpus 8 --rollout-engine sglang`: verl.sh says rollout.name=sglang, composes
    against verl 0.9.1, and diagnose reads it back as an SGLang plan without NOT_PRICED."""
    import json

    from typer.testing import CliRunner

    from grpo_tune.cli.main import app

    out = tmp_path / "runs"
    r = CliRunner().invoke(
        app, ["search", "--model", "7b", "--gpus", "8", "--rollout-engine", "sglang", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    (run,) = out.iterdir()
    text = (run / "verl.sh").read_text()
    assert "actor_rollout_ref.rollout.name=sglang" in text
    overrides, _, _ = parse_script(text)
    tree = verl.compose([f"{o.prefix}{o.key}={o.raw}" for o in overrides])
    assert tree["actor_rollout_ref"]["rollout"]["name"] == "sglang"
    d = CliRunner().invoke(app, ["diagnose", str(run / "verl.sh"), "--json"])
    doc = json.loads(d.output)
    assert not [f for f in doc["findings"] if f["code"] == "NOT_PRICED"], doc["findings"]
    assert doc["summary"]["roles"]["rollout"]["name"] == "sglang"
