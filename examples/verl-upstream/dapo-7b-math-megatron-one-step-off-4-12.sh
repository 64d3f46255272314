#!/usr/bin/env bash
# Our rendition of the settings of verl's
# verl/experimental/one_step_off_policy/shell/dapo_7b_math_megatron_4_12.sh (volcengine/verl @ b178a3cd, last
# changed 2bb42bae6, 2026-01-06): the recipe of docs/advance/one_step_off.md's Megatron 4 + 12 run (two nodes of
# 8 GPUs, 2 of each for rollout). Written for grpo-tune's tests, not copied: same plan, pools and workload, our own
# layout. It keeps the source's actor_rollout_ref.actor.megatron.grad_offload, a key verl 0.9.1 no longer has.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-Math-7B}
DATA=${DATA:-$HOME/verl/data}
NNODES=${NNODES:-2}
ROLLOUT_GPUS=2
TRAIN_GPUS=$((8 - ROLLOUT_GPUS))
PROMPT=$((1024 * 2))
RESPONSE=$((1024 * 8))

python3 -m verl.experimental.one_step_off_policy.main_ppo \
    --config-path=config \
    --config-name='one_step_off_ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.kl_ctrl.kl_coef=0.0 \
    data.train_files="$DATA/dapo-math-17k.parquet" \
    data.val_files="$DATA/aime-2024.parquet" \
    data.prompt_key=prompt \
    data.truncation=left \
    data.max_prompt_length=$PROMPT \
    data.max_response_length=$RESPONSE \
    data.train_batch_size=512 \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.model.path="$MODEL" \
    +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \
    actor_rollout_ref.actor.strategy=megatron \
    critic.strategy=megatron \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_coef=0.0 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.optim.clip_grad=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.param_offload=False \
    actor_rollout_ref.actor.megatron.optimizer_offload=False \
    actor_rollout_ref.actor.megatron.grad_offload=False \
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.ref.megatron.param_offload=True \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=12 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.80 \
    actor_rollout_ref.rollout.enable_chunked_prefill=True \
    actor_rollout_ref.rollout.max_num_batched_tokens=$((PROMPT + RESPONSE)) \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.top_k=-1 \
    reward_model.reward_manager=dapo \
    trainer.logger='["console","tensorboard"]' \
    trainer.project_name=DAPO \
    trainer.experiment_name=dapo-qwen2.5-math-7b-megatron-one-step-off-4-12 \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=-1 \
    trainer.total_epochs=10 \
    trainer.total_training_steps=100 \
    trainer.resume_mode=auto \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$TRAIN_GPUS" \
    rollout.nnodes="$NNODES" \
    rollout.n_gpus_per_node="$ROLLOUT_GPUS" \
    "$@"
