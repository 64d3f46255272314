"""HF import/export: a tiny Hugging Face checkpoint (written here, Llama / Qwen2 / Qwen3 / Qwen3-MoE
naming) loads into megatron under TP/PP/EP with the logits of an independent plain-torch forward
of the HF weights, and megatron -> HF export -> import gives identical logits and tensors.

The reference forward follows the transformers modeling code of these families (RMSNorm in fp32,
rotate-half RoPE, GQA by repeating KV heads, SwiGLU, Qwen3 qk-norm before RoPE, Qwen3-MoE
softmax router with top-k renormalization).
"""

import json
import math
from pathlib import Path

import pytest
import torch

from trainer_harness import run_config, torchrun_json

pytestmark = pytest.mark.slow

FAMILIES = {
    # family: (architecture, extra config)
    "llama": ("LlamaForCausalLM", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3ForCausalLM", {"tie_word_embeddings": False}),
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        {
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
        },
    ),
}


def hf_config(family: str) -> dict:
    arch, extra = FAMILIES[family]
    cfg = {
        "architectures": [arch],
        "model_type": family,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 96,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "hidden_act": "silu",
    }
    cfg.update(extra)
    return cfg


def hf_tensors(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the transformers parameter names of the family."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.05
    norm = lambda n: 1.0 + 0.1 * torch.randn(n, generator=g)  # not all ones: a mix-up must show
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    fam = cfg["model_type"]
    t = {"model.embed_tokens.weight": r(v, h), "model.norm.weight": norm(h)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = r(v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = r(nh * hd, h)
        t[p + "self_attn.k_proj.weight"] = r(nkv * hd, h)
        t[p + "self_attn.v_proj.weight"] = r(nkv * hd, h)
        t[p + "self_attn.o_proj.weight"] = r(h, nh * hd)
        if fam == "qwen2":
            t[p + "self_attn.q_proj.bias"] = r(nh * hd)
            t[p + "self_attn.k_proj.bias"] = r(nkv * hd)
            t[p + "self_attn.v_proj.bias"] = r(nkv * hd)
        if fam in ("qwen3", "qwen3_moe"):
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        if fam == "qwen3_moe":
            fe = cfg["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = r(cfg["num_experts"], h) * 10
            for e in range(cfg["num_experts"]):
                q = p + f"mlp.experts.{e}."
                t[q + "gate_proj.weight"], t[q + "up_proj.weight"], t[q + "down_proj.weight"] = (
                    r(fe, h),
                    r(fe, h),
                    r(h, fe),
                )
        else:
            t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"], t[p + "mlp.down_proj.weight"] = (
                r(f, h),
                r(f, h),
                r(h, f),
            )
    return t


def write_checkpoint(path: Path, family: str) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(family)
    tensors = hf_tensors(cfg)
    # two shards, as real checkpoints come: the importer must find tensors across files
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[::2]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[1::2]}, str(path / "model-00002-of-00002.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path


# --- an independent forward of the HF weights -------------------------------------------------


def _rms(x, w, eps):
    x32 = x.double()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)) * w.double()


def _rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def reference_logits(t: dict, cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    """[B, S, V] logits in float64 from the HF tensors (transformers' math, written out)."""
    t = {k: v.double() for k, v in t.items()}
    B, S = ids.shape
    nh, nkv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    x = t["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, t[p + "input_layernorm.weight"], eps)
        proj = lambda n: h @ t[p + f"self_attn.{n}_proj.weight"].T + t.get(p + f"self_attn.{n}_proj.bias", 0)
        q = proj("q").view(B, S, nh, hd)
        k = proj("k").view(B, S, nkv, hd)
        v = proj("v").view(B, S, nkv, hd)
        if p + "self_attn.q_norm.weight" in t:
            q = _rms(q, t[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, t[p + "self_attn.k_norm.weight"], eps)
        q = q * cos[:, None] + _rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
        k = k.repeat_interleave(nh // nkv, 2)
        v = v.repeat_interleave(nh // nkv, 2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd) + mask
        o = torch.einsum("bhqk,bkhd->bqhd", att.softmax(-1), v).reshape(B, S, nh * hd)
        x = x + o @ t[p + "self_attn.o_proj.weight"].T
        h = _rms(x, t[p + "post_attention_layernorm.weight"], eps)
        swiglu = lambda q: (
            (torch.nn.functional.silu(h @ t[q + "gate_proj.weight"].T) * (h @ t[q + "up_proj.weight"].T))
            @ t[q + "down_proj.weight"].T
        )
        if cfg["model_type"] == "qwen3_moe":
            probs = (h @ t[p + "mlp.gate.weight"].T).softmax(-1)
            w, idx = probs.topk(cfg["num_experts_per_tok"], -1)
            w = w / w.sum(-1, keepdim=True)  # norm_topk_prob
            out = torch.zeros_like(x)
            for e in range(cfg["num_experts"]):
                sel = (idx == e).double() * w
                out = out + sel.sum(-1, keepdim=True) * swiglu(p + f"mlp.experts.{e}.")
            x = x + out
        else:
            x = x + swiglu(p + "mlp.")
    x = _rms(x, t["model.norm.weight"], eps)
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return x @ head.T


# --- worker ----------------------------------------------------------------------------------


def task_hf(spec: dict) -> dict:
    """Import ``spec["ckpt"]`` under each layout: log-probs and last-position logits of fixed
    tokens; the first layout also exports to ``spec["export"]``."""
    import torch.distributed as dist

    from grpo_tune.trainer import hf, parallel
    from grpo_tune.trainer.engine import Engine

    parallel.init_distributed()
    world = dist.get_world_size()
    out = []
    for i, lay in enumerate(spec["layouts"]):
        ckpt = lay.get("ckpt", spec["ckpt"])
        cfg = run_config(hf.load_spec(ckpt), lay["strategy"], world, hf_checkpoint=ckpt)
        parallel.reinit(cfg.strategy)
        eng = Engine(cfg, trainable=lay.get("trainable", False))
        ids = torch.tensor(spec["ids"])
        lp, _ = eng.logprobs(ids, micro_batch_size=1)
        last = eng.next_token_logits(ids, [ids.shape[1]] * ids.shape[0])
        if lay.get("export"):
            eng.export_hf(lay["export"])
        out.append({"strategy": lay["strategy"], "logprobs": lp.tolist(), "last_logits": last.tolist()})
        del eng
    parallel.destroy()
    return {"results": out}


# --- tests -----------------------------------------------------------------------------------

IDS = [[3, 17, 42, 5, 77, 8, 13, 90, 21, 2, 64, 30], [11, 0, 95, 44, 6, 19, 58, 71, 25, 33, 4, 88]]


def _ref(ckpt: Path):
    from safetensors import safe_open

    cfg = json.loads((ckpt / "config.json").read_text())
    t = {}
    for f in ckpt.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as fh:
            t.update({k: fh.get_tensor(k) for k in fh.keys()})
    ids = torch.tensor(IDS)
    logits = reference_logits(t, cfg, ids)
    lp = logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return lp, logits[:, -1], t


def test_reference_forward_is_not_trivial(tmp_path):
    # Guard the guard: the reference must depend on every family feature it claims to check.
    ck = write_checkpoint(tmp_path / "q3", "qwen3")
    lp, last, t = _ref(ck)
    cfg = json.loads((ck / "config.json").read_text())
    t2 = dict(t)
    t2["model.layers.0.self_attn.q_norm.weight"] = torch.ones_like(t2["model.layers.0.self_attn.q_norm.weight"])
    assert not torch.allclose(reference_logits(t2, cfg, torch.tensor(IDS))[:, -1], last, atol=1e-6)


@pytest.mark.parametrize(
    "family,layouts",
    [
        ("llama", [{"tp": 2}, {"pp": 2}]),
        ("qwen2", [{"pp": 2}, {"tp": 2}]),  # tied embeddings: the last stage holds a copy
        ("qwen3", [{"tp": 2}, {"pp": 2, "vpp": 2}]),
        ("qwen3_moe", [{"ep": 2}, {"tp": 2, "ep": 2, "etp": 1}]),
    ],
)
def test_import_matches_reference_and_export_round_trips(tmp_path, family, layouts):
    from safetensors.torch import load_file

    ck = write_checkpoint(tmp_path / family, family)
    exported = tmp_path / "exported"
    lp_ref, last_ref, tensors = _ref(ck)
    spec = {
        "ckpt": str(ck),
        "ids": IDS,
        "layouts": [
            {"strategy": layouts[0], "export": str(exported)},
            # the exported checkpoint, read back under another layout
            {"strategy": layouts[1], "ckpt": str(exported)},
        ],
    }
    res = torchrun_json("test_trainer_hf:task_hf", nproc=2, spec=spec, timeout=240)["results"]
    a, b = res
    # 1) import under the first layout matches the independent HF forward (fp32 vs fp64)
    assert torch.allclose(torch.tensor(a["logprobs"]), lp_ref.float(), atol=2e-5), family
    assert torch.allclose(torch.tensor(a["last_logits"]), last_ref.float(), atol=2e-5), family
    # 2) export wrote the same tensors under the same names (fp32: bit-exact)
    back = load_file(str(exported / "model.safetensors"))
    expect = {
        k: v
        for k, v in tensors.items()
        if not (k == "lm_head.weight" and json.loads((ck / "config.json").read_text())["tie_word_embeddings"])
    }
    assert set(back) == set(expect), set(back) ^ set(expect)
    for k, v in expect.items():
        assert torch.equal(back[k], v), k
    cfg_back = json.loads((exported / "config.json").read_text())
    assert cfg_back["architectures"] == [FAMILIES[family][0]]
    # 3) re-import of the export under another layout gives the same logits
    assert torch.allclose(torch.tensor(b["last_logits"]), torch.tensor(a["last_logits"]), atol=1e-5), family
    assert torch.allclose(torch.tensor(b["logprobs"]), torch.tensor(a["logprobs"]), atol=1e-5), family


# --- layout algebra (no processes) ------------------------------------------------------------


def test_every_preset_maps_onto_exactly_its_hf_parameters():
    """For each supported preset, the HF tensors the importer expects hold exactly the cost
    model's total parameter count (so no tensor is dropped or invented by the mapping)."""
    from grpo_tune.costmodel.params import total_params
    from grpo_tune.core.specs import list_models, load_model
    from grpo_tune.trainer import hf
    from grpo_tune.trainer.model import SUPPORTED_FAMILIES

    checked = 0
    for name in list_models():
        m = load_model(name)
        if m.family not in SUPPORTED_FAMILIES:
            continue
        shapes = hf.hf_shapes(m)
        assert sum(math.prod(s) for s in shapes.values()) == total_params(m), name
        assert ("lm_head.weight" in shapes) == (not m.tied_embeddings), name
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_tile_the_full_tensor(tp):
    """shard() over all TP ranks, placed back with place(), rebuilds every full tensor; and the
    HF <-> full conversion is a bijection (Qwen2 spec: QKV bias, GQA; tiny-moe: experts)."""
    from grpo_tune.core.specs import load_model
    from grpo_tune.trainer import hf

    for name in ("qwen2.5-0.5b", "tiny-moe", "tiny-mla-moe"):
        m = load_model(name)
        m = type(m)(
            **{**m.to_dict(), "layers": 2 if m.dense_layers else 1, "vocab": 1001}
        )  # small, and a vocab TP must pad
        g = torch.Generator().manual_seed(tp)
        for key in hf.param_keys(m, tp):
            hf_parts = [torch.randn(t.shape, generator=g) for t in hf.from_full(key, m, torch.empty(key.shape))]
            full = hf.to_full(key, m, hf_parts)
            assert tuple(full.shape) == key.shape
            for a, b in zip(hf.from_full(key, m, full), hf_parts):
                assert torch.equal(a, b), key.name
            size = 1 if key.expert else tp
            rebuilt = torch.zeros(key.shape)
            for r in range(size):
                piece = hf.shard(key, full, r, size)
                assert piece.numel() * (size if key.split != "rep" else 1) == full.numel(), key.name
                hf.place(key, piece, r, size, rebuilt)
            assert torch.equal(rebuilt, full), key.name


def test_mismatched_or_incomplete_checkpoint_is_a_coded_error(tmp_path):
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.core.specs import load_model
    from grpo_tune.trainer import hf

    ck = write_checkpoint(tmp_path / "l", "llama")
    spec = hf.load_spec(ck)
    hf.check_matches(spec, spec)  # its own config matches
    with pytest.raises(GrpoTuneError) as e:
        hf.check_matches(load_model("tiny"), spec)  # vocab 128 vs 96, ffn 128 vs 96
    assert e.value.code == "CHECKPOINT_ERROR" and "vocab" in e.value.message
    (ck / "config.json").unlink()
    with pytest.raises(GrpoTuneError) as e:
        hf.load_spec(ck)
    assert e.value.code == "CHECKPOINT_ERROR"
    with pytest.raises(GrpoTuneError) as e:
        hf._index(tmp_path / "empty")
    assert e.value.code == "CHECKPOINT_ERROR"
