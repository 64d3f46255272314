"""Model presets GRPO users train most, models as users name them (HF ids, local folders), and
`grpo-tune models` readable in an 80-column terminal.

Exact parameter counts, tolerance zero. Sources (each preset file cites its config.json):
- Qwen3 0.6B/1.7B/4B/14B: keras-team/keras-hub keras_hub/src/models/qwen3/qwen3_presets.py "params" (tied
  embeddings counted once; its 8B figure 8,190,735,360 equals the HF index total_size 16,381,470,720 B / 2).
- Qwen2.5-Math-1.5B: 1,543,714,304 (HF model_info safetensors total; Qwen2.5-1.5B's shapes, tied).
- Qwen2.5-Math-7B, DeepSeek-R1-Distill-Qwen-7B: Qwen2.5-7B's shapes, HF index total_size 15,231,233,024 B / 2.
- DeepSeek-R1-Distill-Qwen-1.5B: 1,777,088,000 (HF safetensors; not tied, unlike Qwen2.5-Math-1.5B).
- DeepSeek-R1-Distill-Qwen-14B / -32B: Qwen2.5-14B / -32B shapes, 14,770,033,664 and 32,763,876,352 (HF API
  safetensors.parameters.BF16; keras-hub qwen2.5_instruct_32b_en).
- Llama-3.2-1B / -3B: 1,235,814,400 and 3,212,749,824 (HF API safetensors.parameters.BF16; tied).
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from cli.main import main
from core.errors import UnknownModelError
from core.specs import load_model
from costmodel.params import total_params

EXACT = {
    "qwen3-0.6b": (596_049_920, True),
    "qwen3-1.7b": (1_720_574_976, True),
    "qwen3-4b": (4_022_468_096, True),
    "qwen3-8b": (8_190_735_360, False),
    "qwen3-14b": (14_768_307_200, False),
    "qwen2.5-math-1.5b": (1_543_714_304, True),
    "qwen2.5-math-7b": (7_615_616_512, False),
    "deepseek-r1-distill-qwen-1.5b": (1_777_088_000, False),
    "deepseek-r1-distill-qwen-7b": (7_615_616_512, False),
    "deepseek-r1-distill-qwen-14b": (14_770_033_664, False),
    "deepseek-r1-distill-qwen-32b": (32_763_876_352, False),
    "llama-3.2-1b": (1_235_814_400, True),
    "llama-3.2-3b": (3_212_749_824, True),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_parameter_counts(name):
    m = load_model(name)
    total, tied = EXACT[name]
    assert total_params(m) == total
    assert m.tied_embeddings is tied
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
    assert total_params(m) == EXACT["qwen3-0.6b"][0]


def test_models_table_does_not_truncate_names_in_80_columns(monkeypatch):
    from cli import catalog

    buf = io.StringIO()
    monkeypatch.setattr(catalog, "Console", lambda: Console(file=buf, width=80))
    catalog.models(json_out=False)
    text = buf.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    from core.specs import list_models

    for name in list_models():
        assert f"│ {name} " in text, name  # whole, on one line
    assert "…" not in text
