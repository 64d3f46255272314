"""The KV-cached native sampler (megatron-core's static inference context on the training
layout) gives the uncached sampler's tokens: greedy, and sampled draw for draw, under DP2,
TP2 (sequence parallel switched off while decoding), PP2, and the MLA-MoE model under TP2 and EP2
(real torchrun, CPU). The speed-up is measured by benchmarks/bench_sampler.py, not here."""

from __future__ import annotations

import pytest

from trainer_harness import torchrun_json

pytestmark = pytest.mark.slow

TWO = [
    {"model": "tiny", "strategy": {}},
    {"model": "tiny", "strategy": {"tp": 2}},
    {"model": "tiny", "strategy": {"pp": 2}},
    {"model": "tiny-mla-moe", "strategy": {"tp": 2}},
    {"model": "tiny-mla-moe", "strategy": {"ep": 2}},
]


def task_kv(spec: dict) -> dict:
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.engine import Engine
    from grpo_tune.trainer.rollout.base import SamplingParams
    from grpo_tune.trainer.rollout.megatron import MegatronRollout
    from trainer_harness import run_config

    parallel.init_distributed()
    out = []
    for lay in spec["layouts"]:
        cfg = run_config(lay["model"], lay["strategy"], dist.get_world_size())
        parallel.reinit(cfg.strategy, seed=cfg.trainer.seed)
        eng = Engine(cfg)
        g = torch.Generator().manual_seed(0)
        toks = torch.randint(2, cfg.model.vocab, (6, 12), generator=g)
        prompts = [toks[i, : 2 + 2 * i].tolist() for i in range(6)]  # ragged prompts: 2..12 tokens
        tok = SimpleNamespace(pad_id=0, eos_id=1)
        got = {}
        for temp in (0.0, 1.0):
            for kv in (False, True):
                ro = MegatronRollout(engine=eng, tokenizer=tok, max_seq_len=64, kv_cache=kv)
                got[f"{temp}-{kv}"] = ro.generate(prompts, SamplingParams(max_tokens=12, temperature=temp, seed=3))
        out.append({"layout": lay, **got})
        del eng
    parallel.destroy()
    return {"results": out}


def _check(res):
    for r in res:
        assert r["0.0-True"] == r["0.0-False"], r["layout"]  # greedy: identical tokens
        assert r["1.0-True"] == r["1.0-False"], r["layout"]  # sampled: the same draws
        assert any(len(x) > 3 for x in r["0.0-True"])


def test_cached_sampler_matches_uncached_dp2_tp2_pp2_mla_moe():
    _check(torchrun_json("test_trainer_kv_sampler:task_kv", nproc=2, spec={"layouts": TWO}, timeout=400)["results"])
