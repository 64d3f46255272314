"""Run configs shared by the export and diagnose tests (a plain module, not a test file)."""

from __future__ import annotations

from pathlib import Path

import yaml

from grpo_tune.core.config import RunConfig, TrainerOptions
from grpo_tune.core.specs import ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate


def make(
    model: str | ModelSpec,
    gpus: int,
    *,
    hardware: str = "h100",
    gpus_per_node: int = 8,
    workload: Workload | None = None,
    trainer: TrainerOptions | None = None,
    **strategy,
) -> RunConfig:
    m = load_model(model) if isinstance(model, str) else model
    s = validate(m, Strategy.of(**strategy), gpus, gpus_per_node=gpus_per_node, allow_cross_node_tp=True)
    return RunConfig(
        model=m,
        hardware=load_hardware(hardware),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus_per_node),
        strategy=s,
        workload=workload or Workload(),
        trainer=trainer or TrainerOptions(),
    )


def dapo_7b(hardware: str, response_len: int, out_dir: Path, positions: int | None = None) -> RunConfig:
    """Qwen2.5-Math-7B on 16 GPUs (TP2 PP2 DP4, mbs 2), 512 prompts x 16 of 2,048 + ``response_len`` tokens: the
    DAPO recipes' plan, with the preset's 4,096 positions raised to ``positions`` as their launches override it."""
    import dataclasses

    m = load_model("qwen2.5-math-7b")
    if positions is not None:
        m = dataclasses.replace(m, max_seq_len=positions)
    wl = Workload(prompts=512, n=16, mini_batch=32, prompt_len=2048, response_len=response_len)
    return make(m, 16, hardware=hardware, workload=wl, trainer=TrainerOptions(out_dir=str(out_dir)), tp=2, pp=2, mbs=2)


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
    sync_bucket_mb=512,
)


def configs() -> dict[str, RunConfig]:
    """Plans that exercise every branch of the exporters (tests/fixtures/export_configs.yaml)."""
    table = yaml.safe_load((Path(__file__).parent / "fixtures" / "export_configs.yaml").read_text())
    return {
        name: make(
            e["model"],
            e["gpus"],
            workload=Workload(**e["workload"]) if "workload" in e else None,
            trainer=TrainerOptions(**e["trainer"]) if "trainer" in e else None,
            **{k: tuple(v) if isinstance(v, list) else v for k, v in e["strategy"].items()},
        )
        for name, e in table.items()
    }
