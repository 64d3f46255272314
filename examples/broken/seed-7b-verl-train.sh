#!/bin/bash
# expect: UNKNOWN_COMMAND UNKNOWN_KEY BAD_CONFIG
# A "7B template" as it circulates: a `verl-train` command that does not exist, blog-post keys
# (algorithm.group_size, training.batch_size, kl_coeff, grad_offload) and comments after `\`.
export CUDA_DEVICE_MAX_CONNECTIONS=1

verl-train \
  --config ./examples/grpo_trainer/config/qwen2_7b_base.yaml \
  actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.megatron.param_offload=True \
  actor_rollout_ref.actor.megatron.grad_offload=True \
  algorithm.group_size=5 \  # GRPO group size
  algorithm.adv_estimator=grpo \  # GRPO advantage estimator
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.kl_coeff=0.001 \
  training.batch_size=1024 \
  training.epochs=10 \
  --log-dir ./logs/qwen2_7b_grpo
