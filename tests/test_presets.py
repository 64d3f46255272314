"""Model presets GRPO users train most, models as users name them (HF ids, local folders), and
`grpo-tune models` readable in an 80-column terminal.

Exact parameter counts, tolerance zero: tests/fixtures/param_counts.csv, each row with its source (and each
preset file cites its config.json).
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from _inputs import param_counts
from grpo_tune.cli.main import main
from grpo_tune.core.errors import UnknownModelError
from grpo_tune.core.specs import load_model
from grpo_tune.costmodel.params import total_params

# Presets whose published count also states tied embeddings (tests/fixtures/param_counts.csv; totals are checked
# for every row there by test_costmodel_params).
COUNTS = param_counts()
EXACT = sorted(name for name, row in COUNTS.items() if row["tied"] is not None)


@pytest.mark.parametrize("name", EXACT)
def test_exact_parameter_counts(name):
    m = load_model(name)
    assert total_params(m) == COUNTS[name]["total"]
    assert m.tied_embeddings is COUNTS[name]["tied"]
    assert m.source.startswith("https://huggingface.co/") and m.hf_id in m.source


@pytest.mark.parametrize(
    "hf_id,preset",
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),  # the failing case
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
        ("qwen/qwen2.5-math-7b-instruct", "qwen2.5-math-7b"),
        ("Qwen/Qwen3-4B-Base", "qwen3-4b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-r1-distill-qwen-1.5b"),
        ("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2-3b"),
        ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),  # NeMo-RL's grpo_math_70B_megatron.yaml
    ],
)
def test_hf_ids_and_their_instruct_base_variants_resolve(hf_id, preset):
    assert load_model(hf_id).name == preset


def test_unknown_hf_id_is_a_coded_error_with_close_matches():
    with pytest.raises(UnknownModelError) as exc:
        load_model("Qwen/Qwen9-7B-Instruct")
    assert "qwen" in exc.value.hint


def test_cli_takes_the_hf_id(capsys):
    assert main(["estimate", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpus", "8", "--tp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "qwen2.5-7b"


def test_local_checkpoint_folder_with_config_json(tmp_path):
    ckpt = tmp_path / "my-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "hidden_size": 1024,
                "intermediate_size": 3072,
                "num_hidden_layers": 28,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
                "tie_word_embeddings": True,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000,
                "max_position_embeddings": 40960,
            }
        )
    )
    m = load_model(str(ckpt))
    assert total_params(m) == COUNTS["qwen3-0.6b"]["total"]


def test_models_table_does_not_truncate_names_in_80_columns(monkeypatch):
    from grpo_tune.cli import catalog

    buf = io.StringIO()
    monkeypatch.setattr(catalog, "Console", lambda: Console(file=buf, width=80))
    catalog.models(json_out=False)
    text = buf.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    from grpo_tune.core.specs import list_models

    for name in list_models():
        assert f"│ {name} " in text, name  # whole, on one line
    assert "…" not in text


def test_llama_3_3_70b_is_llama_3_1_70b_s_architecture():
    """Llama 3.3 70B keeps 3.1 70B's sizes (both config.json files): the same parameters, 70,553,706,496."""
    a, b = load_model("llama-3.3-70b"), load_model("llama-3.1-70b")
    assert total_params(a) == total_params(b) == 70_553_706_496
