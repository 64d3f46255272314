#!/bin/bash
# expect: UNKNOWN_COMMAND UNKNOWN_KEY EXPERT_IMBALANCE
# A "30B+ MoE template" as it circulates, pointed at Qwen3-30B-A3B: EP=3 does not split 128
# experts evenly, and a router key that Megatron does not have.
export CUDA_DEVICE_MAX_CONNECTIONS=1

verl-train \
  actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B \
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
  actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4 \
  actor_rollout_ref.actor.megatron.expert_model_parallel_size=3 \
  actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.actor.megatron.param_offload=True \
  +actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type="flex" \
  +actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32 \
  +actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_load_balance=True \
  algorithm.adv_estimator=grpo \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
  data.train_batch_size=2048 \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=6 \
  --num-nodes 6
