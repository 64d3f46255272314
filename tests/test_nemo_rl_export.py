"""NeMo-RL recipes: every field has a row, every emitted key is NeMo-RL 0.7.0's, the recipe loads with
OmegaConf the way NeMo-RL resolves its ``defaults``, and plan -> recipe -> plan is the identity on the plans
NeMo-RL can express (hypothesis). ``search --framework`` writes the right files."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from grpo_tune.core.config import TrainerOptions
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.frameworks.base.sections import SECTIONS, sections_of
from grpo_tune.frameworks.nemo_rl import recipe, snapshot, table
from _export_configs import make


def test_every_field_has_exactly_one_row():
    for section, cls in SECTIONS.items():
        names = [r.field for r in table.rows(section)]
        fields = Strategy.knob_names() if cls is Strategy else [f.name for f in dataclasses.fields(cls)]
        assert sorted(names) == sorted(fields), section
    for r in table.ROWS:
        if not r.keys:
            assert r.why, r.field


def test_snapshot_names_its_release_and_base():
    d = snapshot.data()
    assert d["release"] == "0.7.0" and len(d["commit"]) == 40
    assert d["base_config"] == "examples/configs/grpo_math_1B.yaml"
    # values NeMo-RL 0.7.0's base config sets (read from the tag): the snapshot must hold them as written
    k = snapshot.keys()
    assert k["policy.megatron_cfg.distributed_data_parallel_config.grad_reduce_in_fp32"] is False
    assert k["policy.generation.vllm_cfg.gpu_memory_utilization"] == 0.6
    assert k["policy.sequence_packing.enabled"] is True
    assert k["policy.dynamic_batching.train_mb_tokens"].startswith("${mul:")
    assert snapshot.key_status("policy.megatron_cfg.moe_grouped_gemm") == "declared"  # a NotRequired field
    assert snapshot.key_status("policy.generation.vllm_kwargs.max_num_seqs") == "open"
    assert snapshot.key_status("policy.megatron_cfg.tensor_parallel_size") == "unknown"


PLANS = [
    make(
        "qwen3-30b-a3b",
        32,
        tp=2,
        pp=2,
        ep=8,
        recompute="full",
        rollout_tp=4,
        max_tokens_per_gpu=8192,
        offload=("param", "grad", "optimizer"),
    ),
    make("qwen2.5-7b", 8, tp=1, recompute="selective", mbs=4, log_prob_mbs=8, offload=("param", "grad", "optimizer")),
    make(
        "llama-3.1-70b",
        64,
        tp=4,
        pp=4,
        recompute="none",
        rollout_tp=8,
        cpu_optimizer=1.0,
        first_stage_layers=19,
        last_stage_layers=19,
        offload=("param", "grad", "optimizer"),
    ),
]


@pytest.mark.parametrize("cfg", PLANS, ids=lambda c: c.model.name)
def test_every_emitted_key_is_in_the_snapshot(cfg):
    for key in recipe.recipe_values(cfg):
        assert snapshot.key_status(key) in ("base", "declared", "open"), key


def _nemo_rl_load(path: Path) -> dict:
    """NeMo-RL's documented resolution, written out with OmegaConf alone: load the file, pop ``defaults``,
    load the parent from its path relative to the file, merge parent then child, resolve with mul/div/max."""
    for name, fn in (("mul", lambda a, b: a * b), ("div", lambda a, b: a / b), ("max", max)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    child = OmegaConf.load(path)
    parent = path.parent / child.pop("defaults")
    merged = OmegaConf.merge(OmegaConf.load(parent), child)
    return OmegaConf.to_container(merged, resolve=True)


def _checkout(tmp: Path) -> Path:
    """A folder shaped like a NeMo-RL checkout with the base config rebuilt from the snapshot."""
    base = tmp / "examples" / "configs" / "grpo_math_1B.yaml"
    (tmp / recipe.RECIPE_DIR).mkdir(parents=True, exist_ok=True)
    base.write_text(yaml.safe_dump(snapshot.base_tree(), sort_keys=False))
    return tmp


@pytest.mark.parametrize("cfg", PLANS, ids=lambda c: c.model.name)
def test_recipe_loads_with_omegaconf_as_nemo_rl_resolves_defaults(cfg, tmp_path):
    root = _checkout(tmp_path)
    f = root / recipe.RECIPE_DIR / "grpo-tune-x.yaml"
    f.write_text(recipe.recipe_text(cfg, run_id="x"))
    tree = _nemo_rl_load(f)
    s, w = cfg.strategy, cfg.workload
    meg = tree["policy"]["megatron_cfg"]
    assert meg["enabled"] is True and tree["policy"]["dtensor_cfg"]["enabled"] is False
    assert (meg["tensor_model_parallel_size"], meg["pipeline_model_parallel_size"]) == (s.layout.tp, s.layout.pp)
    assert meg["distributed_data_parallel_config"]["grad_reduce_in_fp32"] is False
    assert tree["policy"]["make_sequence_length_divisible_by"] == s.layout.tp
    assert tree["policy"]["generation"]["vllm_cfg"]["tensor_parallel_size"] == s.rollout.rollout_tp
    assert tree["policy"]["generation"]["vllm_cfg"]["max_model_len"] == w.prompt_len + w.response_len
    assert tree["policy"]["train_global_batch_size"] == w.mini_batch * w.n
    assert tree["cluster"]["gpus_per_node"] * tree["cluster"]["num_nodes"] == cfg.cluster.gpus
    packed = tree["policy"]["sequence_packing"]
    assert packed["enabled"] is (s.batching.max_tokens_per_gpu is not None)
    # our reader agrees with the plain OmegaConf resolution key for key, and with the snapshot fallback
    assert recipe.load(f).resolved == snapshot.flatten(tree)
    g = tmp_path / "alone" / "nemo_rl.yaml"
    g.parent.mkdir()
    g.write_text(f.read_text())
    assert recipe.load(g).resolved == snapshot.flatten(tree)


@pytest.mark.skipif(not os.environ.get("NEMO_RL_CHECKOUT"), reason="set NEMO_RL_CHECKOUT to a NeMo-RL v0.7.0 tree")
def test_nemo_rl_own_loader_agrees(tmp_path):
    """With a NeMo-RL v0.7.0 checkout at hand: its own load_config + parse_hydra_overrides give what we read."""
    import importlib.util

    root = Path(os.environ["NEMO_RL_CHECKOUT"])
    spec = importlib.util.spec_from_file_location("nrl_config", root / "nemo_rl" / "utils" / "config.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.register_omegaconf_resolvers()
    f = root / recipe.RECIPE_DIR / "grpo-tune-pytest.yaml"
    f.write_text(recipe.recipe_text(PLANS[0], run_id="pytest"))
    try:
        ovs = ["grpo.max_num_steps=10", "policy.megatron_cfg.tensor_model_parallel_size=4"]
        theirs = OmegaConf.to_container(mod.parse_hydra_overrides(mod.load_config(f), ovs), resolve=True)
        assert recipe.load(f, ovs).resolved == snapshot.flatten(theirs)
    finally:
        f.unlink()


pos = st.integers(1, 64)


@st.composite
def plans(draw):
    """Plans NeMo-RL (colocated) can express: table.CONSTRAINTS hold, the CPU optimizer is all or nothing."""
    tp, pp, cp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    gpus = tp * pp * cp * dp
    gpn = min(gpus, draw(st.sampled_from([1, 2, 4, 8])))
    if gpus % gpn:
        gpn = gpus
    dyn = draw(st.one_of(st.none(), st.integers(1024, 65536)))
    lp = draw(st.one_of(st.none(), st.integers(1024, 65536))) if dyn else None
    mbs = draw(pos)
    lp_mbs = draw(st.one_of(st.none(), pos))
    frac = st.floats(0.01, 1.0, allow_nan=False)
    s = Strategy.of(
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        ep=draw(st.sampled_from([1, 2, 4])),
        etp=draw(st.sampled_from([1, tp])),
        mbs=mbs,
        log_prob_mbs=None if lp_mbs == mbs else lp_mbs,
        sequence_parallel=draw(st.booleans()) and tp > 1,
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        distributed_optimizer=draw(st.booleans()),
        first_stage_layers=draw(st.one_of(st.none(), pos)),
        last_stage_layers=draw(st.one_of(st.none(), pos)),
        rollout_tp=draw(st.sampled_from([1, 2, 4, 8])),
        gpu_memory_utilization=draw(frac),
        max_tokens_per_gpu=dyn,
        log_prob_max_tokens_per_gpu=None if lp == dyn else lp,
        cpu_optimizer=draw(st.sampled_from([None, 1.0])),
        precision_aware_optimizer=draw(st.booleans()),
        max_num_seqs=draw(st.integers(1, 4096)),
        max_num_batched_tokens=draw(st.integers(256, 1 << 20)),
        enforce_eager=draw(st.booleans()),
        chunked_prefill=draw(st.booleans()),
        sync_bucket_mb=draw(st.integers(1, 1 << 16)),
        **table.CONSTRAINTS,
    )
    mini, n = draw(pos), draw(pos)
    kl = draw(st.booleans())
    w = Workload(
        prompts=mini * draw(st.integers(1, 8)),
        n=n,
        prompt_len=draw(st.integers(1, 1 << 16)),
        response_len=draw(st.integers(1, 1 << 16)),
        mini_batch=mini,
        kl=kl,
        dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
    )
    num = st.floats(1e-9, 10, allow_nan=False)
    clip = draw(frac)
    high = draw(st.one_of(st.none(), frac))
    t = TrainerOptions(
        lr=draw(num),
        weight_decay=draw(num),
        grad_clip=draw(num),
        seed=draw(st.integers(0, 1 << 31)),
        steps=draw(st.integers(1, 10**6)),
        temperature=draw(num),
        top_p=draw(frac),
        clip_ratio=clip,
        clip_ratio_high=None if high == clip else high,
        kl_coef=draw(num) if kl else TrainerOptions().kl_coef,
    )
    return {"strategy": s, "workload": w, "trainer": t, "cluster": Cluster(gpus=gpus, gpus_per_node=gpn)}


class _Cfg:
    """What recipe_text needs of a run config, from a table plan."""

    def __init__(self, plan):
        from grpo_tune.core.specs import load_hardware, load_model

        self.strategy, self.workload, self.trainer, self.cluster = (plan[k] for k in SECTIONS)
        self.model, self.hardware = load_model("qwen2.5-7b"), load_hardware("h100")


@settings(max_examples=60)
@given(plans())
def test_plan_to_recipe_to_plan_is_the_identity(plan):
    import tempfile

    assert table.canonical(plan) == plan  # the generator draws expressible plans only
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "nemo_rl.yaml"
        f.write_text(recipe.recipe_text(_Cfg(plan)))
        back = table.read_sections(recipe.load(f).get)
    assert back == plan


def test_canonical_folds_what_nemo_rl_fixes():
    p = sections_of(make("qwen2.5-7b", 8, pp=2, vpp=2, recompute="full", recompute_layers=2))
    c = table.canonical(p)
    assert c["strategy"].layout.vpp == 1 and c["strategy"].memory.recompute_layers is None
    assert c["strategy"].memory.offload == ("param", "grad", "optimizer")


def _search(tmp_path, *extra):
    from typer.testing import CliRunner

    from grpo_tune.cli.main import app

    r = CliRunner().invoke(
        app, ["search", "--model", "qwen2.5-7b", "--gpus", "8", "--out", str(tmp_path), "--json", *extra]
    )
    assert r.exit_code == 0, r.output
    return Path(json.loads(r.output)["run_dir"])


def test_search_framework_option_writes_the_chosen_launches(tmp_path):
    d = _search(tmp_path / "n", "--framework", "nemo-rl")
    assert (d / "nemo_rl.yaml").is_file() and not (d / "verl.sh").exists()
    assert "uv run examples/run_grpo.py --config" in (d / "report.md").read_text()
    assert "nemo_rl.yaml" in (d / "report.md").read_text()
    # the emitted recipe reads back to the plan best.yaml holds
    from grpo_tune.core.config import load as load_run_config

    cfg = load_run_config(d / "best.yaml")
    back = table.read_sections(recipe.load(d / "nemo_rl.yaml").get)
    assert back == table.canonical(sections_of(cfg))
    assert back["strategy"] == cfg.strategy.replace(
        etp=cfg.strategy.layout.etp_, sequence_parallel=cfg.strategy.layout.sp
    )
    assert not (d / "nemo_rl.yaml").read_text().count("\t")
    d2 = _search(tmp_path / "a", "--framework", "all")
    assert (d2 / "nemo_rl.yaml").is_file() and (d2 / "verl.sh").is_file()
    d3 = _search(tmp_path / "v")
    assert (d3 / "verl.sh").is_file() and not (d3 / "nemo_rl.yaml").exists()


def test_framework_option_refuses_what_nemo_rl_cannot_run(tmp_path, capsys):
    from grpo_tune.cli.main import main

    base = ["search", "--model", "qwen2.5-7b", "--gpus", "8", "--out", str(tmp_path), "--framework"]
    assert main([*base, "nemo-rl", "--vpp", "2", "--pp", "2"]) == 2
    assert "NeMo-RL cannot run it" in capsys.readouterr().err
    assert main([*base, "megatron"]) == 2
    assert "choose verl, nemo-rl or all" in capsys.readouterr().err
    assert main([*base, "nemo-rl", "--cpu-optimizer", "1.0"]) == 2
    assert "NeMo-RL 0.7.0 cannot set" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()) if tmp_path.exists() else True


def test_estimate_and_compare_price_under_nemo_rl_s_stack(capsys):
    from grpo_tune.cli.main import main
    from grpo_tune.core.stacks import load_stack

    base = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--json"]
    assert main(base) == 0
    verl = json.loads(capsys.readouterr().out)
    assert main([*base, "--framework", "nemo-rl"]) == 0
    nemo = json.loads(capsys.readouterr().out)
    stack = load_stack("nemo-rl")
    assert stack.params["grad_reduce_bytes"] == 2.0  # grad_reduce_in_fp32: false in NeMo-RL's base config
    assert nemo["details"]["weight_sync_wake_s"] == stack.params["engine_wake_s"]
    assert verl["details"]["weight_sync_wake_s"] == load_stack("verl").params["engine_wake_s"]
    assert nemo["strategy"]["offload"] == ["param", "grad", "optimizer"] and verl["strategy"]["offload"] == []
    assert nemo["time"]["step_s"] != verl["time"]["step_s"]
    assert main([*base, "--framework", "nemo-rl", "--pp", "2", "--vpp", "2"]) == 2
    assert "NeMo-RL cannot run it" in capsys.readouterr().err
    assert main([*base, "--framework", "all"]) == 2
    capsys.readouterr()


def test_search_for_nemo_rl_is_priced_under_its_stack(tmp_path):
    d = _search(tmp_path, "--framework", "nemo-rl")
    best = yaml.safe_load((d / "best.yaml").read_text())
    assert best["hardware"]["stack"].startswith("nemo-rl")


@pytest.mark.skipif(not os.environ.get("NEMO_RL_CHECKOUT"), reason="set NEMO_RL_CHECKOUT to a NeMo-RL v0.7.0 tree")
def test_snapshot_and_renditions_match_the_release():
    """With a NeMo-RL v0.7.0 checkout: the shipped snapshot is what the tag builds to, and our renditions of
    its performance recipes hold every key and value of the originals."""
    root = Path(os.environ["NEMO_RL_CHECKOUT"])
    assert snapshot.build(root) == {k: v for k, v in snapshot.data().items()}
    ours = Path(__file__).resolve().parent.parent / "examples" / "nemo-rl-upstream"
    for f in ours.glob("*.yaml"):
        theirs = root / "examples/configs/recipes/llm/performance" / f.name
        assert yaml.safe_load(f.read_text()) == yaml.safe_load(theirs.read_text()), f.name
