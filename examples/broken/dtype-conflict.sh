#!/usr/bin/env bash
# expect: DTYPE_CONFLICT BAD_CONFIG
# The circulating "mixed-precision fix": fp16 on top of verl's bf16 default (and without the `+`
# Hydra needs), plus params_dtype=fp32, which keeps the very fp16/fp32 mismatch it claims to fix.
python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen3-8B \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.override_transformer_config.fp16=True \
    +actor_rollout_ref.actor.megatron.override_transformer_config.params_dtype=fp32 \
    +actor_rollout_ref.actor.megatron.override_transformer_config.attention_softmax_in_fp32=True \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1
