#!/usr/bin/env bash
# expect: UNKNOWN_COMMAND
# Two tools that do not exist as advertised: a --dry-run flag, and verl's scripts/diagnose.py
# with parallel/memory/dtype checks (it only checks the environment).
python scripts/diagnose.py \
  --config ./examples/grpo_trainer/run_qwen2_5_7b_grpo_npu.sh \
  --check-parallel \
  --check-memory \
  --check-data-types

python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer --dry-run \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
