"""SGLang (verl 0.9.1 ``rollout.name=sglang``; slime's engine).

Priced as vLLM's decode roofline (the same kernels' class: paged attention over HBM, the same weights and KV bytes)
with one difference from physics: SGLang's overlap scheduler ("zero-overhead batch scheduler", SGLang v0.4 release
notes, Dec 2024) prepares the next batch on the CPU while the GPU runs the current one, so the per-step host costs
overlap the GPU time instead of adding to it. The trainer has no SGLang adapter: SGLang plans are priced and
exported, not run by ``grpo-tune train``.

Its sleep and wake are its own (docs/precision.md derives them). verl 0.9.1 puts SGLang to sleep after generation with
``release_memory_occupation`` (tags weights and kv_cache) and wakes it with ``resume_memory_occupation`` before and
after the weight load. Both go through torch_memory_saver, which unmaps the pool's physical pages at a pause and maps
fresh ones at a resume (CUDA virtual memory management: the virtual addresses stay, the contents do not), with no
host copy: SGLang's ``enable_weights_cpu_backup`` is off by default and the weights come back from the trainer's
sync (sgl-project/sglang#6367: "we direct release the physical memory and re-mem-allocate one during resume").
Without the CPU backup, a pause costs "a few ms per GiB" (torch_memory_saver#111, measured on an L20 with
``TMS_INIT_ENABLE_CPU_BACKUP=0``; with the backup, 2.41 GiB/s out and 5.32 GiB/s back). Priced at 3 ms per GiB of
the pool (``mem_fraction_static`` of the GPU) each way, with no fixed cost: a stack fitted on SGLang runs
(``[engine] name = "sglang"``) replaces both figures with its own.
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
    memory_map_s_per_gib=3e-3,  # torch_memory_saver#111: "a few ms per GiB" without a CPU backup
    fp8_kv_name="fp8_e4m3",  # sglang ServerArgs kv_cache_dtype: auto | fp8_e5m2 | fp8_e4m3
    verl_name="sglang",
    nemo_rl_backend="sglang",
)
