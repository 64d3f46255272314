"""Run configs shared by the export and diagnose tests (a plain module, not a test file)."""

from __future__ import annotations

from core.config import RunConfig, TrainerOptions
from core.specs import load_hardware, load_model
from core.strategy import Cluster, Strategy, Workload, validate


def make(
    model: str,
    gpus: int,
    *,
    hardware: str = "h100",
    gpus_per_node: int = 8,
    workload: Workload | None = None,
    trainer: TrainerOptions | None = None,
    **strategy,
) -> RunConfig:
    m = load_model(model)
    s = validate(m, Strategy(**strategy), gpus, gpus_per_node=gpus_per_node, allow_cross_node_tp=True)
    return RunConfig(
        model=m,
        hardware=load_hardware(hardware),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus_per_node),
        strategy=s,
        workload=workload or Workload(),
        trainer=trainer or TrainerOptions(),
    )


# Non-default values for the dynamic-batching, CPU-optimizer and vLLM-engine fields of Strategy, so that a test
# sees each of them reach verl's overrides.
ENGINE_KNOBS = dict(
    max_tokens_per_gpu=12000,
    log_prob_max_tokens_per_gpu=24000,
    cpu_optimizer=0.5,
    overlap_cpu_optimizer=True,
    precision_aware_optimizer=True,
    max_num_seqs=64,
    max_num_batched_tokens=4096,
    enforce_eager=True,
    chunked_prefill=False,
    free_cache_engine=False,
)


def configs() -> dict[str, RunConfig]:
    """Plans that exercise every branch of the exporters."""
    return {
        "7b-tp2": make("qwen2-7b", 8, tp=2, rollout_tp=2, mbs=2, offload=("param", "optimizer")),
        "7b-fp16-grad-offload": make(
            "qwen2.5-7b",
            8,
            tp=4,
            rollout_tp=4,
            mbs=1,
            offload=("grad",),
            recompute="none",
            workload=Workload(dtype="fp16", n=8, prompts=512, mini_batch=128),
            trainer=TrainerOptions(clip_ratio_high=0.28),
        ),
        "32b-pp-vpp-uneven": make(
            "qwen2.5-32b",
            32,
            tp=4,
            pp=4,
            vpp=2,
            first_stage_layers=14,
            last_stage_layers=14,
            rollout_tp=8,
            mbs=1,
            recompute="full",
            recompute_layers=4,
            offload=("param", "grad", "optimizer"),
        ),
        "moonlight-tp4-ep4-etp1": make(
            "moonlight-16b-a3b", 8, tp=4, ep=4, etp=1, rollout_tp=4, mbs=1, offload=("param", "optimizer")
        ),
        "qwen3-30b-a3b-ep8": make(
            "qwen3-30b-a3b",
            16,
            tp=2,
            pp=2,
            ep=8,
            etp=1,
            rollout_tp=4,
            mbs=1,
            recompute="full",
            offload=("param", "optimizer"),
        ),
        "deepseek-v3-cp": make(
            "deepseek-v3",
            256,
            tp=8,
            pp=8,
            cp=2,
            ep=16,
            etp=1,
            rollout_tp=8,
            mbs=1,
            first_stage_layers=5,
            last_stage_layers=8,
            recompute="full",
            distributed_optimizer=True,
            offload=("param", "optimizer"),
        ),
    }
