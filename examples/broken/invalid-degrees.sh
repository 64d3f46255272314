#!/usr/bin/env bash
# expect: INVALID_DEGREES
# TP4 x PP4 = 16 model-parallel ranks on 8 GPUs; rollout TP 3 does not divide 8 either.
python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=3 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1
