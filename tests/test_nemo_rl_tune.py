"""diagnose and tune on NeMo-RL recipes: NeMo-RL's own rules as coded findings, the recipe read back to the
plan search emitted, tune on NeMo-RL's own performance recipe (current vs best, a minimal tuned.yaml that
NeMo-RL inherits from the recipe), and a second tune that proposes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpo_tune.cli.main import main
from grpo_tune.frameworks.base.sections import sections_of
from grpo_tune.frameworks.nemo_rl import read, recipe, snapshot, table
from grpo_tune.frameworks.nemo_rl.diagnose import diagnose_recipe

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "examples" / "nemo-rl-upstream" / "grpo-qwen3-30ba3b-4n8g.yaml"


def test_upstream_recipe_reads_as_nemo_rl_resolves_it():
    """Values that come from v0.7.0's base config through the recipe's defaults, and the recipe's own."""
    r = recipe.load(UPSTREAM)
    assert r.get("policy.sequence_packing.enabled") is True  # base config default, not in the recipe
    assert r.get("policy.sequence_packing.train_mb_tokens") == 4096 * 1  # ${mul:max_total_sequence_length, mbs}
    assert r.get("policy.sequence_packing.logprob_mb_tokens") == 4096 * 2
    assert r.get("policy.generation.vllm_cfg.gpu_memory_utilization") == 0.6
    assert r.get("loss_fn.reference_policy_kl_penalty") == 0.01
    assert r.get("policy.make_sequence_length_divisible_by") == 1
    plan = read.read_plan(UPSTREAM)
    s, w = plan.strategy, plan.workload
    assert (s.layout.tp, s.layout.pp, s.layout.ep, s.layout.dp, s.rollout.rollout_tp) == (1, 1, 8, 32, 2)
    assert (s.batching.max_tokens_per_gpu, s.batching.log_prob_max_tokens_per_gpu, s.batching.log_prob_mbs) == (
        4096,
        8192,
        2,
    )
    assert (w.prompts, w.n, w.mini_batch, w.kl) == (64, 32, 64, True)
    assert w.prompt_len + w.response_len == 4096


def test_upstream_recipe_has_no_warning_and_a_summary():
    rep = diagnose_recipe(UPSTREAM)
    assert rep.count("error") == 0 and rep.count("warning") == 0, [f.message for f in rep.findings]
    roles = rep.summary["roles"]
    assert roles["actor"]["ep"] == 8 and roles["rollout"]["replicas"] == 16
    assert rep.summary["memory"]["capacity_bytes"] > 0


def _recipe(tmp_path: Path, **over) -> Path:
    data = yaml.safe_load(UPSTREAM.read_text())
    for key, value in over.items():
        node = data
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    f = tmp_path / "recipe.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def test_nemo_rl_rules_are_coded_findings(tmp_path):
    f = _recipe(tmp_path)
    rep = diagnose_recipe(
        f,
        [
            "policy.megatron_cfg.pipeline_model_parallel_size=2",
            "policy.dynamic_batching.enabled=true",
            "++policy.megatron_cfg.tensor_paralel_size=2",
        ],
    )
    msgs = {(x.code, x.severity) for x in rep.findings}
    assert ("BAD_CONFIG", "error") in msgs  # dynamic batching with PP, and with packing on
    assert any("single pipeline parallel stage" in x.message for x in rep.findings)
    assert any("exclusive" in x.message for x in rep.findings)
    unknown = [x for x in rep.findings if x.code == "UNKNOWN_KEY"]
    assert unknown and "tensor_model_parallel_size" in unknown[0].hint
    assert rep.exit_code == 1


def test_dtensor_and_degrees(tmp_path):
    rep = diagnose_recipe(_recipe(tmp_path), ["policy.megatron_cfg.enabled=false"])
    assert "TRAINER_UNSUPPORTED" in rep.codes("error")
    rep = diagnose_recipe(_recipe(tmp_path), ["policy.megatron_cfg.tensor_model_parallel_size=3"])
    assert "INVALID_DEGREES" in rep.codes("error")


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["policy.megatron_cfg.fp8_cfg.enabled=true", "policy.megatron_cfg.fp8_cfg.fp8=e5m2"], "FP8 format e5m2"),
        (["policy.generation.vllm_cfg.precision=int8"], "a int8 vLLM rollout is priced as bf16"),
        (["policy.megatron_cfg.peft.enabled=true"], "LoRA (peft) training is priced as full-parameter"),
    ],
)
def test_settings_the_model_does_not_price_are_said(tmp_path, overrides, words):
    """A LoRA recipe, an FP8 format other than e4m3/hybrid and a non-FP8 quantized rollout run; their prices are
    full-parameter and bf16, and diagnose says so. NeMo-RL's FP8 70B recipe (grpo_math_70B_megatron_fp8.yaml:
    fp8_cfg e4m3, vllm_cfg.precision fp8) is priced (docs/precision.md): not said."""
    rep = diagnose_recipe(_recipe(tmp_path), overrides)
    said = [x.message for x in rep.findings if x.code == "NOT_PRICED"]
    assert len(said) == 1 and words in said[0], said
    assert not [x for x in diagnose_recipe(UPSTREAM).findings if x.code == "NOT_PRICED"]
    fp8 = ["policy.megatron_cfg.fp8_cfg.enabled=true", "policy.generation.vllm_cfg.precision=fp8"]
    assert not [x for x in diagnose_recipe(_recipe(tmp_path), fp8).findings if x.code == "NOT_PRICED"]


def test_diagnose_cli_takes_overrides(tmp_path, capsys):
    assert main(["diagnose", str(UPSTREAM), "--json", "policy.megatron_cfg.pipeline_model_parallel_size=2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "nemo_rl_recipe" and doc["summary"]["roles"]["actor"]["pp"] == 2
    assert main(["diagnose", str(UPSTREAM), "policy.megatron_cfg.tensor_parallel_size=2"]) == 2
    assert "is not in the config" in capsys.readouterr().err


def test_search_recipe_diagnoses_back_to_its_plan(tmp_path, capsys):
    assert (
        main(
            [
                "search",
                "--model",
                "qwen3-30b-a3b",
                "--gpus",
                "32",
                "--framework",
                "nemo-rl",
                "--json",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    run = Path(json.loads(capsys.readouterr().out)["run_dir"])
    assert main(["diagnose", str(run / "nemo_rl.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == 0 and doc["warnings"] == 0, doc["findings"]
    best = yaml.safe_load((run / "best.yaml").read_text())["strategy"]
    actor = doc["summary"]["roles"]["actor"]
    assert {k: actor[k] for k in ("tp", "pp", "cp", "ep", "dp")} == {k: best[k] for k in ("tp", "pp", "cp", "ep", "dp")}
    from grpo_tune.core.config import load

    cfg = load(run / "best.yaml")
    assert read.read_plan(run / "nemo_rl.yaml").strategy == table.canonical(sections_of(cfg))["strategy"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune")
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["tune", str(UPSTREAM), "--json", "--out", str(out)]) == 0
    return json.loads(buf.getvalue())


def test_tune_on_nemo_rl_recipe_proposes_a_faster_plan(tuned):
    cur, best = tuned["current"], tuned["best"]
    assert cur["fits"] and best["fits"]
    assert best["step_s"] < cur["step_s"] * 0.99
    assert tuned["overrides"], "a faster plan comes with the keys that change"
    assert all(snapshot.key_status(k) in ("base", "declared", "open") for k in tuned["overrides"])


def test_tuned_yaml_changes_only_the_reported_keys(tuned):
    run = Path(tuned["run_dir"])
    f = run / "tuned.yaml"
    data = yaml.safe_load(f.read_text())
    assert (run / data["defaults"]).resolve() == UPSTREAM.resolve()
    r = recipe.load(f)
    assert set(r.own) == set(tuned["overrides"])
    base = recipe.load(UPSTREAM)
    for k, v in tuned["overrides"].items():
        assert r.get(k) == v["new"] and base.get(k) == v["old"]
    # every other resolved key is the recipe's, except what interpolates from a changed key
    derived = {"policy.make_sequence_length_divisible_by"}
    diff = {k for k in set(r.resolved) | set(base.resolved) if r.resolved.get(k) != base.resolved.get(k)}
    assert diff <= set(tuned["overrides"]) | derived
    # and the tuned recipe runs the plan tune priced as best
    assert read.read_plan(f).strategy.to_dict() == tuned["best"]["strategy"]


def test_second_tune_proposes_nothing(tuned, tmp_path, capsys):
    f = Path(tuned["run_dir"]) / "tuned.yaml"
    assert main(["tune", str(f), "--json", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overrides"] == {}
    assert doc["current"]["step_s"] == pytest.approx(tuned["best"]["step_s"], rel=1e-9)


def test_a_recipe_s_positions_override_is_read_and_written_back(tmp_path):
    """NeMo-RL passes policy.hf_config_overrides to vLLM (v0.7.0 grpo.py: vllm_kwargs["hf_overrides"]); its DAPO
    recipe raises Qwen2.5-Math-7B's 4,096 positions to 16,384 that way. The recipe is read with the override's
    positions (without it the 16,384-token sequences exceed the preset), and a plan that needs more positions than
    its preset writes the override back into nemo_rl.yaml; one within them writes none."""
    from _export_configs import dapo_7b

    from grpo_tune.core.specs import load_model

    f = _recipe(
        tmp_path,
        policy__model_name="Qwen/Qwen2.5-Math-7B",
        policy__max_total_sequence_length=16384,
        policy__hf_config_overrides={"max_position_embeddings": 16384},
    )
    m, note = read.resolve_model(recipe.load(f), None)
    assert m.name == "qwen2.5-math-7b" and m.max_seq_len == 16384, note
    assert "16384 positions (hf_config_overrides)" in note
    assert load_model("qwen2.5-math-7b").max_seq_len == 4096
    key = "policy.hf_config_overrides.max_position_embeddings"
    out = tmp_path / "nemo_rl.yaml"
    out.write_text(recipe.recipe_text(dapo_7b("h100", 8192, tmp_path / "run", positions=16384)))
    assert recipe.load(out).get(key) == 16384
    assert key not in recipe.recipe_values(dapo_7b("h100", 1024, tmp_path / "run"))
