"""SGLang (verl 0.9.1 ``rollout.name=sglang``; slime's engine).

Priced as vLLM's decode roofline (the same kernels' class: paged attention over HBM, the same weights and KV bytes)
with one difference from physics: SGLang's overlap scheduler ("zero-overhead batch scheduler", SGLang v0.4 release
notes, Dec 2024) prepares the next batch on the CPU while the GPU runs the current one, so the per-step host costs
overlap the GPU time instead of adding to it. Its sleep and wake (``release_memory_occupation`` /
``resume_memory_occupation`` through torch_memory_saver) are priced with the stack's vLLM sleep/wake parameters
until a stack profile is fitted on SGLang runs (docs/precision.md says so). The trainer has no SGLang adapter:
SGLang plans are priced and exported, not run by ``grpo-tune train``.
"""

from grpo_tune.engines.base import RolloutEngineSpec
from grpo_tune.engines.vllm import SHARED

ENGINE = RolloutEngineSpec(
    name="sglang",
    title="SGLang",
    adapter=None,
    knobs=(*SHARED, "free_cache_engine", "sync_bucket_mb"),  # mem_fraction_static, max_running_requests, ...
    overlaps_host=True,
    # SGLang ServerArgs cuda_graph_max_bs defaults on 60-160 GB GPUs (H100, H200): 256 at TP < 4, 512 at TP >= 4
    cuda_graph_max_batch=256,
    cuda_graph_max_batch_tp4=512,
    sleep_param="vllm_sleep_s",
    wake_param="vllm_wake_s",
    fp8_kv_name="fp8_e4m3",  # sglang ServerArgs kv_cache_dtype: auto | fp8_e5m2 | fp8_e4m3
    verl_name="sglang",
    nemo_rl_backend="sglang",
)
