#!/usr/bin/env bash
# expect: EXPERT_DEGREES
# Moonlight with TP4/EP4/ETP4 on 8 GPUs: EP x ETP = 16 does not fit in TP x CP x DP = 8.
# (TP4/EP4/ETP1 is the valid layout; see ../moonlight-16b-a3b-grpo-megatron.sh.)
python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=moonshotai/Moonlight-16B-A3B-Instruct \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1
