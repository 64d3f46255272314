"""Exact parameter counts against published figures, per-rank counts, and HF config.json reading."""

from __future__ import annotations

import json

import pytest

from _inputs import param_counts
from grpo_tune.core.errors import UnknownModelError
from grpo_tune.costmodel.params import active_params, layer_params, padded_vocab, per_stage_params, total_params
from grpo_tune.core.specs import ARCH_FIELDS, from_hf_config, load_model
from grpo_tune.core.strategy import Strategy, validate

# Published totals (tests/fixtures/param_counts.csv, each row with its source): the Hugging Face checkpoints'
# parameter counts (safetensors metadata, or the index's total_size / 2 for bf16 files). Exact, so the tolerance
# is zero.
PUBLISHED = param_counts()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_params_match_published(name):
    m = load_model(name)
    total, active = PUBLISHED[name]["total"], PUBLISHED[name]["active"]
    assert total_params(m) == total
    if active is not None:
        assert active_params(m) == active
    if not m.is_moe:
        assert active_params(m) == total


def test_deepseek_active_is_about_37b():
    # Tech report: 37B activated per token (rounded); 8 routed + 1 shared expert per MoE layer.
    a = active_params(load_model("deepseek-v3"))
    assert 36.5e9 < a < 38.0e9


def test_aliases_resolve_to_presets():
    assert load_model("7b").name == "qwen2.5-7b"
    assert load_model("30b-a3b").name == "qwen3-30b-a3b"
    assert load_model("70b").name == "llama-3.1-70b"


def _sum_back(m, s) -> int:
    """Reassemble the model from one rank per stage: sharded*tp + replicated + expert*ep*etp."""
    n = 0
    for st in per_stage_params(m, s):
        sharded = st.dense - st.replicated
        n += sharded * s.layout.tp + st.replicated + st.expert * s.layout.ep * s.layout.etp_
    return n


def _expected_sum(m, s) -> int:
    stages = len(per_stage_params(m, s))
    copies = 2 if (not m.tied_embeddings or stages > 1) else 1  # the tied copy on the last stage
    pad = (padded_vocab(m, s.layout.tp) - m.vocab) * m.hidden
    emb = m.vocab * m.hidden
    return total_params(m) + (copies - (1 if m.tied_embeddings else 2)) * emb + copies * pad


@pytest.mark.parametrize(
    "name,gpus,kw",
    [
        ("qwen2.5-7b", 8, dict(tp=4, pp=2)),
        ("qwen2.5-7b", 8, dict(tp=2, pp=4)),
        ("qwen2.5-0.5b", 4, dict(tp=2, pp=2)),  # tied embeddings: the last stage holds a copy
        ("qwen2.5-0.5b", 2, dict(tp=2)),  # tied, one stage: counted once
        ("llama-3.1-70b", 64, dict(tp=8, pp=8, vpp=5)),
        ("qwen3-30b-a3b", 16, dict(tp=2, pp=2, ep=4, etp=1)),
        ("qwen3-30b-a3b", 64, dict(tp=4, pp=4, ep=8, etp=2)),
        ("deepseek-v3", 256, dict(tp=8, pp=16, ep=16, etp=1, first_stage_layers=1, last_stage_layers=4)),
        ("qwen3-235b-a22b", 128, dict(tp=4, pp=8, ep=16, etp=1, first_stage_layers=10, last_stage_layers=12)),
    ],
)
def test_per_rank_sums_back_to_total(name, gpus, kw):
    m = load_model(name)
    s = validate(m, Strategy.of(**kw), gpus)
    assert _sum_back(m, s) == _expected_sum(m, s)
    assert sum(st.layers for st in per_stage_params(m, s)) == m.layers


def test_per_rank_tp_split_is_exact_for_qwen_7b():
    m = load_model("qwen2.5-7b")
    one = per_stage_params(m, Strategy())[0].total
    assert one == total_params(m)
    two = per_stage_params(m, Strategy.of(tp=2))[0]
    # Norms (2 per layer + final) and nothing else are replicated in Qwen2.5 (q/k/v biases are split).
    assert two.replicated == m.layers * 2 * m.hidden + m.hidden
    assert two.total == (one - two.replicated) // 2 + two.replicated


def test_uneven_stages_put_embedding_and_output_on_the_ends():
    m = load_model("deepseek-v3")
    s = validate(m, Strategy.of(tp=8, pp=16, ep=16, etp=1, first_stage_layers=1, last_stage_layers=4), 256)
    st = per_stage_params(m, s)
    assert [x.layers for x in st] == [1] + [4] * 14 + [4]
    emb = padded_vocab(m, 8) // 8 * m.hidden
    # stage 0 is one dense layer + the embedding: no experts
    assert st[0].expert == 0
    assert st[0].dense == layer_params(m, 0).sharded // 8 + layer_params(m, 0).replicated + emb


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json: the published configs give the presets' specs and counts.
# ---------------------------------------------------------------------------------------------

HF_CONFIGS = {
    # huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
    },
    # huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json (no attention_bias key: Qwen2 has q/k/v biases)
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 131072,
    },
    # huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
    },
    # huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (head_dim given explicitly)
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 4096,
        "head_dim": 128,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "max_position_embeddings": 40960,
    },
    # huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
    },
    # huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
    "deepseek-v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "num_hidden_layers": 61,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 129280,
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000,
        "max_position_embeddings": 163840,
    },
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_config_gives_the_preset(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HF_CONFIGS[name]))
    preset = load_model(name)
    for path in (str(d / "config.json"), str(d)):  # the file or its folder
        m = load_model(path)
        assert m.family == preset.family
        for f in ARCH_FIELDS:
            assert getattr(m, f) == getattr(preset, f), f
        assert total_params(m) == total_params(preset)
        assert active_params(m) == active_params(preset)
    if name in PUBLISHED:
        assert total_params(from_hf_config(d / "config.json")) == PUBLISHED[name]["total"]


def test_hf_config_errors_are_coded(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 768}))
    with pytest.raises(UnknownModelError, match="unsupported architecture"):
        load_model(str(bad))
    bad.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    with pytest.raises(UnknownModelError, match="lacks"):
        load_model(str(bad))
    bad.write_text("{not json")
    with pytest.raises(UnknownModelError):
        load_model(str(bad))
    with pytest.raises(UnknownModelError):
        load_model(str(tmp_path / "missing" / "config.json"))
