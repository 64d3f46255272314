"""The trainer's own sampler (``grpo-tune train`` on CPU): the training model's forward over every prefix, no KV
cache (costmodel/rollout.py ``native_rollout_s``). A plan with ``engine = "megatron"`` samples with it:
the default on a platform whose ranks compute in host memory (``cpu``, ``HardwareSpec.default_engine``)."""

from grpo_tune.engines.base import RolloutEngineSpec

ENGINE = RolloutEngineSpec(
    name="megatron",
    title="the trainer's Megatron sampler",
    adapter="grpo_tune.trainer.rollout.megatron",
    knobs=("rollout_tp",),
    kv_cache=False,
    memory_map_s_per_gib=0.0,  # it is the training model: nothing sleeps or wakes
)
