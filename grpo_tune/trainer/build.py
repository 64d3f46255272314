"""What one rank runs GRPO with, assembled from the run config: the prompts and tokenizer, the actor and
reference engines, the rollout engine and the loop (:func:`build`). The worker (:mod:`trainer.main`), the
profile mode (:mod:`trainer.profile`) and the separate pools (:mod:`trainer.separate`) all start from it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import RunConfig


def load_items(cfg: RunConfig, *, items=None, tokenizer=None):
    """The run's prompts (trainer.loop.Item) and tokenizer: the config's dataset and checkpoint, or the given ones."""
    from .loop import Item

    t, w = cfg.trainer, cfg.workload
    if tokenizer is None:
        from .tokenizer import load_tokenizer

        tokenizer = load_tokenizer(cfg.model, t.hf_checkpoint)
    if items is None:
        from .data import load_dataset

        examples = load_dataset(t.dataset, seed=t.seed)
        items = [Item(tokenizer.encode_prompt(e.prompt), e.answer) for e in examples]
        items = [it for it in items if len(it.prompt_ids) <= w.prompt_len]  # verl drops over-long prompts
        if not items:
            from grpo_tune.core.errors import ConfigError

            raise ConfigError(f"every prompt of {t.dataset} is longer than workload.prompt_len={w.prompt_len} tokens")
    return items, tokenizer


def build(
    cfg: RunConfig,
    *,
    items=None,
    reward_fn=None,
    tokenizer=None,
    checkpoint_every: int | None = None,
    loop_cls=None,
):
    """Everything a rank needs for GRPO, from the config: (loop, layout).

    ``items``/``reward_fn``/``tokenizer`` replace the dataset, the reward and the tokenizer (profile
    mode passes synthetic ones). Call after :func:`trainer.parallel.init`.
    """
    from . import parallel
    from .engine import Engine
    from .loop import Dist, GRPOLoop, LoopConfig
    from .offload import Offloader
    from .rollout import get_rollout_engine, resolve_engine_name

    lay = parallel.layout()
    t, w = cfg.trainer, cfg.workload
    items, tokenizer = load_items(cfg, items=items, tokenizer=tokenizer)
    if reward_fn is None:
        from .reward import load_reward

        score = load_reward(t.reward)

        def reward_fn(item, ids):
            return score(tokenizer.decode(ids), item.answer)

    rollout = None
    separate = cfg.placement.separate or loop_cls is not None
    if resolve_engine_name(t.rollout_engine) == "vllm" and not separate:
        # Before the actor and the reference: vLLM's start-up check wants gpu_memory_utilization x
        # total free, which it is only on an empty GPU; the engine sleeps as soon as it is built.
        rollout = get_rollout_engine("vllm", **rollout_kwargs(cfg, None, tokenizer))
    actor = Engine(cfg)
    ref = Engine(cfg, trainable=False) if w.kl and t.kl_coef > 0 else None
    if rollout is None and separate:  # the rollout pool generates; this pool only trains
        rollout = get_rollout_engine(
            "megatron",
            **rollout_kwargs(cfg.replace(trainer=dataclasses.replace(t, rollout_engine="megatron")), actor, tokenizer),
        )
    if rollout is None:
        rollout = get_rollout_engine(t.rollout_engine, **rollout_kwargs(cfg, actor, tokenizer))
    lc = LoopConfig.from_run_config(cfg)
    d = Dist(
        rank=lay.rank, world_size=lay.world_size, rollout_tp=cfg.strategy.rollout.rollout_tp, log_rank=lay.rank == 0
    )
    loop = (loop_cls or GRPOLoop)(
        lc,
        actor=actor,
        ref=ref,
        rollout=rollout,
        dataset=items,
        reward_fn=reward_fn,
        pad_id=tokenizer.pad_id,
        eos_id=tokenizer.eos_id,
        d=d,
        out_dir=t.out_dir,
        checkpoint_every=t.checkpoint_every if checkpoint_every is None else checkpoint_every,
        log_every=t.log_every,
        offloader=Offloader(actor, cfg.strategy.memory.offload) if cfg.strategy.memory.offload else None,
    )
    return loop, lay


def rollout_kwargs(cfg: RunConfig, actor, tokenizer) -> dict:
    """Keyword arguments for the chosen rollout engine's constructor (see trainer/rollout/*)."""
    from .rollout import resolve_engine_name

    name = resolve_engine_name(cfg.trainer.rollout_engine)
    kw = {"engine": actor, "tokenizer": tokenizer}
    if name == "megatron":
        kw["max_seq_len"] = cfg.workload.prompt_len + cfg.workload.response_len
        s = cfg.strategy
        if s.rollout.rollout_tp != s.layout.tp:
            import torch.distributed as dist

            if not dist.is_initialized() or dist.get_rank() == 0:
                print(
                    f"[trainer] the native Megatron sampler generates with the training layout (tp={s.layout.tp}); "
                    f"strategy.rollout_tp={s.rollout.rollout_tp} applies to the vLLM engine only",
                    flush=True,
                )
    elif name == "vllm":
        kw["cfg"] = cfg
    return kw
