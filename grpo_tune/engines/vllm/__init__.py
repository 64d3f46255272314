"""vLLM (verl 0.9.1's and NeMo-RL's default rollout engine).

Its sleep and wake have no figures of their own here: every shipped stack was fitted on vLLM runs and prices them in
its ``[engine]`` table (verl-0.9.1: sleep 0.673 s, wake 4.2 s, fitted on verl's timing_s/gen and
timing_s/update_weights)."""

from grpo_tune.engines.base import RolloutEngineSpec

SHARED = ("rollout_tp", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enforce_eager")
"""The rollout knobs every KV-cache engine honours (each spells them in its own launcher)."""

ENGINE = RolloutEngineSpec(
    name="vllm",
    title="vLLM",
    adapter="grpo_tune.trainer.rollout.vllm",
    knobs=(*SHARED, "chunked_prefill", "free_cache_engine", "sync_bucket_mb"),
    # vLLM V1's default scheduler runs the next step's scheduling after the GPU step (async scheduling is opt-in)
    overlaps_host=False,
    cuda_graph_max_batch=512,  # vLLM's default max_capture_size (CompilationConfig, V1)
    fp8_kv_name="fp8",  # vllm EngineArgs kv_cache_dtype: auto | fp8 | fp8_e4m3 | fp8_e5m2
    verl_name="vllm",
    nemo_rl_backend="vllm",
)
