"""Exact parameter counts: total, active, and per rank under TP/PP/VPP/EP/ETP.

The total equals the number of values in the Hugging Face checkpoint (MTP layers excluded). The
per-rank count follows megatron-core's layout:
- column/row-parallel linears split by TP; norms, the MoE router and MLA's down-projections are
  replicated on every TP rank (``parallel_mode="duplicated"`` in megatron.core's MLA);
- routed experts split by EP (whole experts) and ETP (inside an expert); shared experts by TP;
- the embedding on the first stage, the final norm and the output layer on the last stage; with
  tied embeddings and PP > 1 the last stage holds its own copy of the embedding (Megatron's
  ``shared_embedding``), so it is counted on both stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from grpo_tune.core.specs import ModelSpec
from grpo_tune.core.strategy import Strategy, stage_layers


def _attention(m: ModelSpec) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one attention block, its input norm included."""
    h = m.hidden
    if m.is_mla:
        qd = m.heads * m.q_head_dim
        rep = h  # input norm
        if m.q_lora_rank:
            rep += h * m.q_lora_rank + m.q_lora_rank  # q_a_proj + q_a_layernorm
            shard = m.q_lora_rank * qd  # q_b_proj
        else:
            shard = h * qd  # q_proj
        rep += h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # kv_a_proj_with_mqa + norm
        shard += m.kv_lora_rank * m.heads * (m.qk_nope_head_dim + m.v_head_dim)  # kv_b_proj
        shard += m.heads * m.v_head_dim * h  # o_proj
        return shard, rep
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim
    shard = h * qkv + (qkv if m.qkv_bias else 0) + m.heads * m.head_dim * h
    rep = h + (2 * m.head_dim if m.qk_norm else 0)
    return shard, rep


def _mlp(h: int, ffn: int, gated: bool = True) -> int:
    """SwiGLU MLP: gate, up and down projections, no bias (a plain GeLU MLP has no gate)."""
    return (3 if gated else 2) * h * ffn


def _expert(m: ModelSpec) -> int:
    return _mlp(m.hidden, m.expert_ffn_hidden)


@dataclass(frozen=True)
class LayerParams:
    sharded: int
    """Split by TP."""
    replicated: int
    """Full copy on every TP rank."""
    expert: int
    """Routed experts, split by EP x ETP."""

    @property
    def total(self) -> int:
        return self.sharded + self.replicated + self.expert


@lru_cache(maxsize=65536)
def layer_params(m: ModelSpec, index: int) -> LayerParams:
    """Parameters of decoder layer ``index`` (0-based)."""
    shard, rep = _attention(m)
    rep += m.hidden  # pre-MLP norm
    if m.is_moe and index >= m.dense_layers:
        rep += m.experts * m.hidden + (m.experts if m.router_bias else 0)  # router
        shard += _mlp(m.hidden, m.shared_experts * m.expert_ffn_hidden) if m.shared_experts else 0
        return LayerParams(shard, rep, m.experts * _expert(m))
    return LayerParams(shard + _mlp(m.hidden, m.ffn_hidden, m.gated_mlp), rep, 0)


def embedding_params(m: ModelSpec) -> int:
    return m.vocab * m.hidden


@lru_cache(maxsize=1024)
def total_params(m: ModelSpec) -> int:
    n = embedding_params(m) * (1 if m.tied_embeddings else 2) + m.hidden  # + final norm
    return n + sum(layer_params(m, i).total for i in range(m.layers))


@lru_cache(maxsize=1024)
def active_params(m: ModelSpec) -> int:
    """Parameters touched per token: only ``top_k`` of the routed experts."""
    if not m.is_moe:
        return total_params(m)
    return total_params(m) - m.moe_layers * (m.experts - m.top_k) * _expert(m)


def padded_vocab(m: ModelSpec, tp: int) -> int:
    """Vocab rounded up to a multiple of TP, as VocabParallelEmbedding requires."""
    return -(-m.vocab // tp) * tp


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one rank of a pipeline stage (any TP/EP coordinate)."""

    stage: int
    layers: int
    dense: int
    """Non-expert parameters on this rank (sharded part / TP + replicated part + embedding shards)."""
    expert: int
    """Routed-expert parameters on this rank."""
    replicated: int
    """Of ``dense``, the part that every TP rank holds in full."""

    @property
    def total(self) -> int:
        return self.dense + self.expert


def per_stage_params(m: ModelSpec, s: Strategy) -> list[StageParams]:
    """Per-rank parameter count of each pipeline stage under the strategy's TP/PP/EP/ETP."""
    lay = s.layout
    # Cached on the few fields that matter: the search calls this for thousands of strategies.
    return list(_per_stage(m, lay.tp, lay.ep, lay.etp_, tuple(stage_layers(m, s))))


@lru_cache(maxsize=8192)
def _per_stage(m: ModelSpec, tp: int, ep: int, etp: int, counts: tuple[int, ...]) -> tuple[StageParams, ...]:
    out = []
    start = 0
    vshard = padded_vocab(m, tp) // tp * m.hidden
    for st, n in enumerate(counts):
        sh = rep = ex = 0
        for i in range(start, start + n):
            lp = layer_params(m, i)
            sh += lp.sharded
            rep += lp.replicated
            ex += lp.expert
        start += n
        dense = sh // tp + rep
        if st == 0:
            dense += vshard
        if st == len(counts) - 1:
            dense += m.hidden  # final norm
            rep += m.hidden
            if not m.tied_embeddings or len(counts) > 1:
                dense += vshard  # output layer, or the tied copy on the last stage
        out.append(StageParams(st, n, dense, ex // (ep * etp), rep))
    return tuple(out)


def max_rank_params(m: ModelSpec, s: Strategy) -> int:
    return max(p.total for p in per_stage_params(m, s))


def optimizer_params(dense: float, expert: float, s: Strategy) -> float:
    """Of a rank's ``dense`` + ``expert`` parameters, those whose optimizer state it holds and steps.

    The distributed optimizer shards dense state over DP x CP and expert state over expert-DP =
    tp*cp*dp/(ep*etp) (Megatron's MoE parallel folding, arXiv 2504.14960); without it a rank holds all.
    """
    lay = s.layout
    if not s.memory.distributed_optimizer:
        return dense + expert
    dp = lay.dp or 1
    return dense / (dp * lay.cp) + expert / max(1, lay.tp * lay.cp * dp // (lay.ep * lay.etp_))
