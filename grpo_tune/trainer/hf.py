"""Hugging Face <-> megatron-core weights for Llama / Qwen2 / Qwen3 / Qwen3-MoE / DeepSeek-V3 (Moonlight),
sharded for TP/PP/EP.

Every megatron parameter has a *global key*: its name with the global layer number and global
expert id, and a *full* layout that does not depend on the degrees:
- ``linear_qkv``: rows interleaved per query group ``[q(g) ; k(g) ; v(g)]`` for g in groups, the
  layout megatron's attention splits into q/k/v; TP takes a contiguous block of groups;
- ``linear_fc1`` (SwiGLU): ``[gate ; up]``; a TP rank holds ``[gate_r ; up_r]``;
- embedding / output layer: rows padded to a multiple of TP (``costmodel.params.padded_vocab``);
- column-parallel weights split on dim 0, row-parallel on dim 1, norms and the router replicated.

Import reads the full tensor for each local key (from safetensors, or from a seeded generator for
random init) and keeps this rank's shard. Export rebuilds each full tensor with one all-reduce
over the world, to which only one replica of each shard contributes, and converts it back to HF
names; every rank gets every tensor (what weight sync and ``save_pretrained`` need).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.costmodel.params import padded_vocab
from grpo_tune.core.specs import ARCH_FIELDS, ModelSpec, spec_from_hf_dict


class CheckpointError(GrpoTuneError):
    """A HF checkpoint that is missing, incomplete or does not fit the configured model."""

    code = "CHECKPOINT_ERROR"


@dataclass(frozen=True)
class Key:
    """One megatron parameter, globally named, in its degree-independent full layout."""

    name: str
    shape: tuple[int, ...]
    split: str
    """``rep`` (replicated over TP), ``col`` (dim 0) or ``row`` (dim 1)."""
    kind: str
    """``plain``, ``qkv``, ``fc1`` or ``vocab`` (how HF tensors map onto the full layout)."""
    hf: tuple[str, ...]
    expert: bool = False


def param_keys(m: ModelSpec, tp: int) -> list[Key]:
    """Every parameter of the model, in a fixed order shared by all ranks."""
    h, hd = m.hidden, m.head_dim
    vp = padded_vocab(m, tp)
    keys = [Key("embedding.word_embeddings.weight", (vp, h), "col", "vocab", ("model.embed_tokens.weight",))]
    qkv_rows = (m.heads + 2 * m.kv_heads) * hd
    for i in range(m.layers):
        L, H = f"decoder.layers.{i}.", f"model.layers.{i}."
        attn = H + "self_attn."
        keys.append(Key(L + "input_layernorm.weight", (h,), "rep", "plain", (H + "input_layernorm.weight",)))
        if m.is_mla:
            keys += _mla_keys(m, L, attn)
        else:
            keys.append(
                Key(
                    L + "self_attention.linear_qkv.weight",
                    (qkv_rows, h),
                    "col",
                    "qkv",
                    (attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"),
                )
            )
            if m.qkv_bias:
                keys.append(
                    Key(
                        L + "self_attention.linear_qkv.bias",
                        (qkv_rows,),
                        "col",
                        "qkv",
                        (attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias"),
                    )
                )
            if m.qk_norm:
                keys += [
                    Key(L + "self_attention.q_layernorm.weight", (hd,), "rep", "plain", (attn + "q_norm.weight",)),
                    Key(L + "self_attention.k_layernorm.weight", (hd,), "rep", "plain", (attn + "k_norm.weight",)),
                ]
            keys.append(
                Key(
                    L + "self_attention.linear_proj.weight",
                    (h, m.heads * hd),
                    "row",
                    "plain",
                    (attn + "o_proj.weight",),
                )
            )
        keys.append(Key(L + "pre_mlp_layernorm.weight", (h,), "rep", "plain", (H + "post_attention_layernorm.weight",)))
        if m.is_moe and i >= m.dense_layers:
            keys.append(Key(L + "mlp.router.weight", (m.experts, h), "rep", "plain", (H + "mlp.gate.weight",)))
            if m.router_bias:  # a buffer in megatron (updated by rule, not by the optimizer)
                keys.append(
                    Key(
                        L + "mlp.router.expert_bias",
                        (m.experts,),
                        "rep",
                        "plain",
                        (H + "mlp.gate.e_score_correction_bias",),
                    )
                )
            if m.shared_experts:
                fs = m.shared_experts * m.expert_ffn_hidden
                keys += _swiglu_keys(L + "mlp.shared_experts.", H + "mlp.shared_experts.", fs, h)
            for e in range(m.experts):
                E, HE = L + f"mlp.experts.local_experts.{e}.", H + f"mlp.experts.{e}."
                keys += _swiglu_keys(E, HE, m.expert_ffn_hidden, h, expert=True)
        else:
            keys += _swiglu_keys(L + "mlp.", H + "mlp.", m.ffn_hidden, h)
    keys.append(Key("decoder.final_layernorm.weight", (h,), "rep", "plain", ("model.norm.weight",)))
    if not m.tied_embeddings:
        keys.append(Key("output_layer.weight", (vp, h), "col", "vocab", ("lm_head.weight",)))
    return keys


def _swiglu_keys(L: str, H: str, f: int, h: int, *, expert: bool = False) -> list[Key]:
    """One SwiGLU MLP of intermediate size ``f`` (dense, shared experts or one routed expert): megatron's
    ``linear_fc1`` is HF's gate and up projections stacked, ``linear_fc2`` its down projection."""
    return [
        Key(L + "linear_fc1.weight", (2 * f, h), "col", "fc1", (H + "gate_proj.weight", H + "up_proj.weight"), expert),
        Key(L + "linear_fc2.weight", (h, f), "row", "plain", (H + "down_proj.weight",), expert),
    ]


def _mla_keys(m: ModelSpec, L: str, attn: str) -> list[Key]:
    """DeepSeek-V3 / Moonlight attention (HF ``modeling_deepseek.py`` names) onto megatron's MLA.

    Both sides lay a head out the same way: q rows ``[nope ; rope]`` per head, kv_b rows
    ``[k_nope ; v]`` per head, ``kv_a_proj_with_mqa`` rows ``[latent ; k_rope]``; megatron's MLA
    de-interleaves the rope dims as HF does, so every tensor maps one to one. The down-projections
    and the latent norms are replicated on TP ranks (megatron's ``duplicated`` mode).
    """
    h, qd = m.hidden, m.heads * m.q_head_dim
    S = L + "self_attention."
    keys = []
    if m.q_lora_rank:
        keys += [
            Key(S + "linear_q_down_proj.weight", (m.q_lora_rank, h), "rep", "plain", (attn + "q_a_proj.weight",)),
            Key(S + "q_layernorm.weight", (m.q_lora_rank,), "rep", "plain", (attn + "q_a_layernorm.weight",)),
            Key(S + "linear_q_up_proj.weight", (qd, m.q_lora_rank), "col", "plain", (attn + "q_b_proj.weight",)),
        ]
    else:
        keys.append(Key(S + "linear_q_proj.weight", (qd, h), "col", "plain", (attn + "q_proj.weight",)))
    keys += [
        Key(
            S + "linear_kv_down_proj.weight",
            (m.kv_lora_rank + m.qk_rope_head_dim, h),
            "rep",
            "plain",
            (attn + "kv_a_proj_with_mqa.weight",),
        ),
        Key(S + "kv_layernorm.weight", (m.kv_lora_rank,), "rep", "plain", (attn + "kv_a_layernorm.weight",)),
        Key(
            S + "linear_kv_up_proj.weight",
            (m.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
            "col",
            "plain",
            (attn + "kv_b_proj.weight",),
        ),
        Key(S + "linear_proj.weight", (h, m.heads * m.v_head_dim), "row", "plain", (attn + "o_proj.weight",)),
    ]
    return keys


# --- full layout <-> HF tensors ----------------------------------------------------------------


def to_full(key: Key, m: ModelSpec, hf: list[torch.Tensor]) -> torch.Tensor:
    """HF tensors (in ``key.hf`` order) -> the full megatron tensor."""
    if key.kind == "plain":
        return hf[0]
    if key.kind == "vocab":
        full = hf[0].new_zeros(key.shape)
        full[: hf[0].shape[0]] = hf[0]
        return full
    if key.kind == "fc1":
        return torch.cat(hf, 0)
    # qkv: per query group g, the group's query heads then its key and value head.
    q, k, v = hf
    g, hd = m.kv_heads, m.head_dim
    per = m.heads // g
    rest = q.shape[1:]
    q = q.reshape(g, per * hd, *rest)
    k = k.reshape(g, hd, *rest)
    v = v.reshape(g, hd, *rest)
    return torch.cat([q, k, v], 1).reshape(key.shape)


def from_full(key: Key, m: ModelSpec, full: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of :func:`to_full`."""
    if key.kind == "plain":
        return [full]
    if key.kind == "vocab":
        return [full[: m.vocab]]
    if key.kind == "fc1":
        return list(full.chunk(2, 0))
    g, hd = m.kv_heads, m.head_dim
    per = m.heads // g
    rest = full.shape[1:]
    x = full.reshape(g, (per + 2) * hd, *rest)
    q, k, v = x.split([per * hd, hd, hd], 1)
    return [q.reshape(m.heads * hd, *rest), k.reshape(g * hd, *rest), v.reshape(g * hd, *rest)]


# --- full layout <-> one rank's shard ----------------------------------------------------------


def _slices(key: Key, rank: int, size: int) -> list[tuple[slice, ...]]:
    """Index expressions into the full tensor that make up this rank's shard (in order)."""
    if key.split == "rep" or size == 1:
        return [tuple(slice(None) for _ in key.shape)]
    if key.split == "row":
        n = key.shape[1] // size
        return [(slice(None), slice(rank * n, (rank + 1) * n))]
    if key.kind == "fc1":
        half = key.shape[0] // 2
        n = half // size
        return [(slice(rank * n, (rank + 1) * n),), (slice(half + rank * n, half + (rank + 1) * n),)]
    n = key.shape[0] // size
    return [(slice(rank * n, (rank + 1) * n),)]


def shard(key: Key, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    parts = [full[s] for s in _slices(key, rank, size)]
    dim = 1 if key.split == "row" else 0
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def place(key: Key, local: torch.Tensor, rank: int, size: int, out: torch.Tensor) -> None:
    """Write this rank's shard into its place in the full tensor ``out``."""
    sl = _slices(key, rank, size)
    if len(sl) == 1:
        out[sl[0]] = local
        return
    n = local.shape[0] // len(sl)
    for j, s in enumerate(sl):
        out[s] = local[j * n : (j + 1) * n]


# --- local parameters -> global keys -----------------------------------------------------------

_TE_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


def _unwrap(chunk):
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def local_params(chunks, m: ModelSpec) -> list[tuple[str, torch.nn.Parameter]]:
    """(global key name, parameter) for every parameter this rank holds.

    With tied embeddings and PP > 1 the last stage's copy of the embedding appears under
    ``output_layer.weight``, which :func:`param_keys` omits (only the first stage's copy counts).
    """
    from megatron.core import parallel_state as ps

    ep_rank = ps.get_expert_model_parallel_rank()
    out = []
    for chunk in chunks:
        model = _unwrap(chunk)
        layer_no = {}
        experts_per_rank = {}
        if getattr(model, "decoder", None) is not None:
            for i, layer in enumerate(model.decoder.layers):
                layer_no[i] = layer.layer_number - 1
                mlp = layer.mlp
                if hasattr(mlp, "experts") and hasattr(mlp.experts, "local_experts"):
                    experts_per_rank[i] = len(mlp.experts.local_experts)
        named = list(model.named_parameters())
        # DeepSeek's router bias is a megatron buffer but a tensor of the HF checkpoint
        named += [(n, b) for n, b in model.named_buffers() if n.endswith("router.expert_bias")]
        for name, p in named:
            mt = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
            if mt:
                i, rest = int(mt.group(1)), mt.group(2)
                rest = _TE_NAMES.get(rest, rest)
                me = re.match(r"mlp\.experts\.local_experts\.(\d+)\.(.*)", rest)
                if me:
                    e = ep_rank * experts_per_rank[i] + int(me.group(1))
                    rest = f"mlp.experts.local_experts.{e}.{me.group(2)}"
                name = f"decoder.layers.{layer_no[i]}.{rest}"
            out.append((name, p))
    return out


def _tp(key: Key) -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    if key.expert:
        return ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def load_into(chunks, m: ModelSpec, get: Callable[[str], torch.Tensor]) -> None:
    """Fill every local parameter from full HF tensors returned by ``get(hf_name)``."""
    from megatron.core import parallel_state as ps

    keys = {k.name: k for k in param_keys(m, ps.get_tensor_model_parallel_world_size())}
    emb = keys["embedding.word_embeddings.weight"]
    with torch.no_grad():
        for name, p in local_params(chunks, m):
            key = keys.get(name)
            if key is None and name == "output_layer.weight" and m.tied_embeddings:
                key = emb  # the last stage's copy of a tied embedding
            if key is None:
                raise CheckpointError(f"megatron parameter {name} has no Hugging Face counterpart")
            full = to_full(key, m, [get(n).to(torch.float32) for n in key.hf])
            if tuple(full.shape) != key.shape:
                raise CheckpointError(f"{key.hf[0]}: shape {tuple(full.shape)} does not fit {key.shape} of {m.name}")
            rank, size = _tp(key)
            p.data.copy_(shard(key, full, rank, size).to(p.dtype))


def full_tensors(chunks, m: ModelSpec) -> Iterator[tuple[Key, torch.Tensor]]:
    """Yield (key, full tensor) for every key on every rank; a collective (all ranks must iterate)."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    local = dict(local_params(chunks, m))
    dense_lead = ps.get_data_parallel_rank(with_context_parallel=True) == 0
    expert_lead = ps.get_expert_data_parallel_rank() == 0
    dev = next(iter(local.values())).device if local else torch.device("cpu")
    for key in param_keys(m, tp):
        out = torch.zeros(key.shape, dtype=torch.float32, device=dev)
        p = local.get(key.name)
        if p is not None:
            rank, size = _tp(key)
            lead = expert_lead if key.expert else dense_lead
            if lead and (key.split != "rep" or rank == 0):
                place(key, p.detach().float(), rank, size, out)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(out)
        yield key, out


def named_hf_tensors(chunks, m: ModelSpec, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Full tensors under HF names on every rank (collective)."""
    for key, full in full_tensors(chunks, m):
        for name, t in zip(key.hf, from_full(key, m, full)):
            yield name, t if dtype is None else t.to(dtype)


# --- random init -------------------------------------------------------------------------------


def random_tensor(name: str, shape: tuple[int, ...], seed: int, std: float = 0.02) -> torch.Tensor:
    """The full HF tensor ``name`` drawn from a seed of its own: the same on every rank and layout."""
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias") or name.endswith("e_score_correction_bias"):
        return torch.zeros(shape)
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g) * std


def hf_shapes(m: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of the model's HF checkpoint."""
    shapes = {}
    for key in param_keys(m, 1):
        full = torch.empty(key.shape, device="meta")
        for name, t in zip(key.hf, from_full(key, m, full)):
            shapes[name] = tuple(t.shape)
    return shapes


def init_random(chunks, m: ModelSpec, seed: int) -> None:
    """Layout-independent random init (norms 1, biases 0, weights N(0, 0.02))."""
    shapes = hf_shapes(m)
    load_into(chunks, m, lambda n: random_tensor(n, shapes[n], seed))


# --- safetensors checkpoints -------------------------------------------------------------------


def _index(path: Path) -> dict[str, Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {path}", hint="pass a Hugging Face checkpoint folder")
    from safetensors import safe_open

    where = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                where[k] = f
    return where


def load_spec(path: str | Path) -> ModelSpec:
    p = Path(path)
    cfg = p / "config.json"
    if not cfg.exists():
        raise CheckpointError(f"no config.json in {p}", hint="a Hugging Face checkpoint folder has config.json")
    return spec_from_hf_dict(json.loads(cfg.read_text()), name=p.name, source=str(cfg))


def check_matches(m: ModelSpec, ckpt: ModelSpec) -> None:
    bad = [
        f"{f}: config {getattr(m, f)} vs checkpoint {getattr(ckpt, f)}"
        for f in ARCH_FIELDS
        if getattr(m, f) != getattr(ckpt, f)
    ]
    if bad:
        raise CheckpointError(
            f"the checkpoint does not match model {m.name}: " + "; ".join(bad),
            hint="set model: to the checkpoint's config.json",
        )


def load_hf(chunks, m: ModelSpec, path: str | Path) -> None:
    """Load a HF safetensors checkpoint folder into this rank's chunks (sharded for TP/PP/EP)."""
    from safetensors import safe_open

    path = Path(path)
    check_matches(m, load_spec(path))
    where = _index(path)
    handles = {}

    def get(name: str) -> torch.Tensor:
        if name not in where:
            if name == "lm_head.weight" and "model.embed_tokens.weight" in where:
                name = "model.embed_tokens.weight"
            else:
                raise CheckpointError(f"{path}: tensor {name} is missing")
        f = where[name]
        if f not in handles:
            handles[f] = safe_open(str(f), framework="pt")
        return handles[f].get_tensor(name)

    load_into(chunks, m, get)


def hf_config(m: ModelSpec, dtype: str = "float32") -> dict:
    """A transformers ``config.json`` for the spec (Llama, Qwen2, Qwen3, Qwen3-MoE)."""
    arch = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "deepseek_v3": "DeepseekV3ForCausalLM",
    }[m.family]
    cfg = {
        "architectures": [arch],
        "model_type": m.family,
        "hidden_size": m.hidden,
        "intermediate_size": m.ffn_hidden,
        "num_hidden_layers": m.layers,
        "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "vocab_size": m.vocab,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "max_position_embeddings": m.max_seq_len,
        "tie_word_embeddings": m.tied_embeddings,
        "hidden_act": "silu",
        "torch_dtype": dtype,
    }
    if m.family == "llama":
        cfg["attention_bias"] = m.qkv_bias
    if m.family == "qwen3_moe":
        cfg.update(
            num_experts=m.experts,
            num_experts_per_tok=m.top_k,
            moe_intermediate_size=m.expert_ffn_hidden,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if m.family == "deepseek_v3":
        # keys as in deepseek-ai/DeepSeek-V3 and moonshotai/Moonlight-16B-A3B config.json
        cfg.update(
            n_routed_experts=m.experts,
            num_experts_per_tok=m.top_k,
            moe_intermediate_size=m.expert_ffn_hidden,
            n_shared_experts=m.shared_experts or None,
            first_k_dense_replace=m.dense_layers,
            moe_layer_freq=1,
            topk_method="noaux_tc" if m.router_bias else "greedy",
            scoring_func="sigmoid",
            norm_topk_prob=True,
            n_group=m.router_groups or 1,
            topk_group=m.router_group_topk or 1,
            routed_scaling_factor=m.routed_scaling,
            q_lora_rank=m.q_lora_rank or None,
            kv_lora_rank=m.kv_lora_rank,
            qk_nope_head_dim=m.qk_nope_head_dim,
            qk_rope_head_dim=m.qk_rope_head_dim,
            v_head_dim=m.v_head_dim,
            num_nextn_predict_layers=0,
            rope_scaling=None,
        )
        cfg.pop("head_dim")
    return cfg


def save_hf(
    named: Iterator[tuple[str, torch.Tensor]],
    m: ModelSpec,
    path: str | Path,
    *,
    write: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Path | None:
    """Write ``model.safetensors`` + ``config.json``. ``named`` is consumed on every rank (it may be a
    collective); only ranks with ``write`` touch the disk."""
    from safetensors.torch import save_file

    tensors = {}
    for name, t in named:
        if write:
            tensors[name] = t.detach().to("cpu", dtype).contiguous()
    if not write:
        return None
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path / "model.safetensors")
    dname = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    (path / "config.json").write_text(json.dumps(hf_config(m, dname), indent=2))
    return path
