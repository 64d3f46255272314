"""Separate rollout and training pools in one torchrun job: a producer and a consumer of samples.

``placement.mode: separate`` with ``rollout_gpus = R`` on a cluster of ``N`` GPUs starts ``N`` processes
(one torchrun job). Ranks ``[0, N - R)`` are the training pool, ranks ``[N - R, N)`` the rollout pool.
Each pool is its own ``torch.distributed`` world (the default group, gloo on CPU, NCCL on GPUs), so
megatron-core builds its groups inside the pool exactly as a colocated run does on the whole job:

- the training pool runs :class:`trainer.loop.GRPOLoop` on the training layout (``strategy``), except
  that it takes each step's samples from the rollout pool instead of generating them;
- the rollout pool holds its own copy of the model: on CPU a forward-only megatron engine on the
  rollout layout (``tp = strategy.rollout_tp``) sampled by the native sampler, on GPUs vLLM
  (``trainer.rollout_engine: vllm``). It generates step ``s``'s batch with the newest weights it has
  received, computes the behaviour log-probs (vLLM returns them; the native engine recomputes them)
  and queues the batch with the policy version that produced it.

The pools meet in two places. The weights: after each update the training pool exports its
parameters as HF tensors and training rank 0 broadcasts them, bucketed (``strategy.sync_bucket_mb``),
over a process group of itself and every rollout rank (gloo on CPU; NCCL on GPUs). The samples: a
queue on the job's TCP store (rollout pool rank 0 puts, every training rank gets), as verl's
fully-async trainer takes samples from its message queue.

Staleness ``K``: the rollout pool generates batch ``s`` with policy version ``max(0, s - K)``
(version ``v`` = the weights after ``v`` updates), so a sample is at most ``K`` versions old; at
``K = 0`` generation, sync and training run in sequence, at ``K = 1`` generation of batch ``s + 1``
overlaps the training of batch ``s`` (one-step-off). Off-policy samples are corrected with decoupled
PPO's truncated importance weights (:func:`trainer.grpo.truncated_is_weights`); every step logs
``weight_version``, ``sample_version``, ``sample_age`` and the weights' statistics.
"""

from __future__ import annotations

import datetime
import io
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from grpo_tune.core.errors import ConfigError

from .loop import GRPOLoop, PhaseTimer, build_batch
from .rollout.base import SamplingParams

_PREFIX = "grpo-tune-pools/"
TIMEOUT_S = 600.0


@dataclass
class Pools:
    """This process's place in a separate-pool job."""

    role: str
    """``train`` or ``rollout``."""
    rank: int
    """Global rank in the torchrun job."""
    pool_rank: int
    train_size: int
    rollout_size: int
    store: Any
    """The job's TCP store (prefixed): the sample queue."""
    bridge: Any | None
    """Training rank 0 + every rollout rank (weights broadcast from its rank 0); None elsewhere."""

    @property
    def leader(self) -> bool:
        return self.pool_rank == 0


def check_separate(cfg) -> None:
    p = cfg.placement
    if p.sync_interval != 1:
        raise ConfigError(
            f"placement.sync_interval {p.sync_interval}: the trainer syncs after every update",
            hint="set placement.sync_interval: 1",
        )


def _store(rank: int, world: int) -> Any:
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"])
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        base = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    else:  # no agent store: rank 0 serves one
        base = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout)
    return dist.PrefixStore(_PREFIX, base)


def init_pools(cfg) -> Pools:
    """Start this process's pool (the default process group) and, on its members, the bridge group."""
    from . import compat

    compat.enable()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    r = cfg.placement.rollout_gpus
    if world != cfg.cluster.gpus or not 1 <= r < world:
        raise ConfigError(
            f"separate pools need {cfg.cluster.gpus} processes ({r} rollout + {cfg.cluster.gpus - r} training); "
            f"this job has {world}",
            hint="launch with `grpo-tune train --config` (it starts cluster.gpus processes)",
        )
    t = world - r
    role = "train" if rank < t else "rollout"
    pool_rank, size = (rank, t) if role == "train" else (rank - t, r)
    store = _store(rank, world)
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # the pool is this process's world: megatron and the engines see only it
    os.environ.update(RANK=str(pool_rank), WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size))
    dist.init_process_group(
        backend, store=dist.PrefixStore(f"pool-{role}/", store), rank=pool_rank, world_size=size, timeout=timeout
    )
    bridge = None
    if rank == 0 or role == "rollout":
        brank = 0 if rank == 0 else pool_rank + 1
        bstore = dist.PrefixStore("bridge/", store)
        bridge = dist.ProcessGroupGloo(bstore, brank, r + 1, timeout)
    return Pools(role, rank, pool_rank, t, r, store, bridge)


# -- weights -----------------------------------------------------------------------------------


def _layout(spec) -> list[tuple[str, tuple[int, ...]]]:
    from .hf import hf_shapes

    return sorted(hf_shapes(spec).items())


def _broadcast(bridge, flat: torch.Tensor, bucket_bytes: int) -> int:
    """Broadcast ``flat`` from bridge rank 0 in buckets; returns the number of buckets."""
    per = max(1, bucket_bytes // flat.element_size())
    n = 0
    for chunk in flat.split(per):
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        bridge.broadcast([chunk], opts).wait()
        n += 1
    return n


def send_weights(actor, pools: Pools, bucket_bytes: int) -> int:
    """Every training rank exports (a collective in the pool); training rank 0 broadcasts the HF tensors."""
    named = dict(actor.named_parameters_for_export(torch.float32))
    if pools.bridge is None:
        return 0
    flat = torch.cat([named[n].detach().reshape(-1).to(torch.float32).cpu() for n, _ in _layout(actor.spec)])
    return _broadcast(pools.bridge, flat, bucket_bytes)


def recv_weights(spec, pools: Pools, bucket_bytes: int) -> dict[str, torch.Tensor]:
    """A rollout rank's copy of the broadcast HF tensors, by name."""
    lay = _layout(spec)
    total = sum(int(torch.Size(s).numel()) for _, s in lay)
    flat = torch.empty(total, dtype=torch.float32)
    _broadcast(pools.bridge, flat, bucket_bytes)
    out, i = {}, 0
    for name, shape in lay:
        k = int(torch.Size(shape).numel())
        out[name] = flat[i : i + k].view(shape)
        i += k
    return out


# -- samples -----------------------------------------------------------------------------------


def _put(store, step: int, payload: dict) -> None:
    buf = io.BytesIO()
    torch.save(payload, buf)
    store.set(f"samples/{step}", buf.getvalue())


def _get(store, step: int) -> dict:
    raw = store.get(f"samples/{step}")  # blocks until the rollout pool has put it
    return torch.load(io.BytesIO(raw), weights_only=False)


# -- the training pool -------------------------------------------------------------------------


class SeparateLoop(GRPOLoop):
    """The training pool's loop: samples come from the rollout pool's queue; weights go out after each update."""

    pools: Pools
    total_steps: int
    staleness: int
    bucket_bytes: int
    _sample_version = 0
    _sync_s = 0.0

    def _rollout_phase(self, step: int, prompts: list[list[int]], timer: PhaseTimer):
        with timer("rollout"):  # the wait for the rollout pool (verl's wait_prev_gen / gen in fully async)
            msg = _get(self.pools.store, step)
        if msg["step"] != step or [list(p) for p in msg["prompts"]] != [list(p) for p in prompts]:
            raise RuntimeError(f"sample queue out of order at step {step}")  # both pools draw the same stream
        self._sample_version = int(msg["version"])
        return msg["responses"], msg["behaviour_logprobs"]

    def _after_update(self, step: int, timer: PhaseTimer) -> dict:
        nxt = step + 1
        if nxt <= self.total_steps - 1 - self.staleness:  # the rollout pool still needs version nxt
            with timer("weight_sync"):
                send_weights(self.actor, self.pools, self.bucket_bytes)
        return {
            "weight_version": step,
            "sample_version": self._sample_version,
            "sample_age": step - self._sample_version,
            "staleness": self.staleness,
        }


def train_pool(cfg, pools: Pools) -> list[dict]:
    from grpo_tune.core.strategy import Cluster

    from . import parallel
    from .build import build

    t = pools.train_size
    tcfg = cfg.replace(cluster=Cluster(gpus=t, gpus_per_node=min(cfg.cluster.gpus_per_node, t)))
    parallel.reinit(tcfg.strategy, seed=cfg.trainer.seed)
    loop, _ = build(tcfg, loop_cls=SeparateLoop)
    loop.pools = pools
    loop.total_steps = cfg.trainer.steps
    loop.staleness = cfg.placement.staleness
    loop.bucket_bytes = cfg.strategy.rollout.sync_bucket_bytes
    send_weights(loop.actor, pools, loop.bucket_bytes)  # version 0: both pools start from the same weights
    return loop.run(cfg.trainer.steps)


# -- the rollout pool --------------------------------------------------------------------------


def rollout_strategy(cfg):
    """The rollout pool's layout: tensor parallel ``rollout_tp``, data parallel over the rest, forward only."""
    from grpo_tune.core.strategy import Strategy

    s, r = cfg.strategy, cfg.placement.rollout_gpus
    if r % s.rollout.rollout_tp:
        raise ConfigError(f"strategy.rollout_tp {s.rollout.rollout_tp} does not divide placement.rollout_gpus {r}")
    return Strategy.of(
        tp=s.rollout.rollout_tp,
        dp=r // s.rollout.rollout_tp,
        mbs=s.batching.log_prob_mbs_,
        recompute="none",
        rollout_tp=s.rollout.rollout_tp,
        sync_bucket_mb=s.rollout.sync_bucket_mb,
    )


def rollout_pool(cfg, pools: Pools, *, items=None, tokenizer=None) -> None:
    """Generate every step's batch with the newest weights received, and queue it (rank 0 of the pool)."""
    from grpo_tune.core.strategy import Cluster

    from . import parallel
    from .data import PromptStream
    from .loop import Item, LoopConfig
    from .build import load_items
    from .rollout import resolve_engine_name

    s = rollout_strategy(cfg)
    r = pools.rollout_size
    rcfg = cfg.replace(strategy=s, cluster=Cluster(gpus=r, gpus_per_node=min(cfg.cluster.gpus_per_node, r)))
    parallel.reinit(s, seed=cfg.trainer.seed)
    if items is None or tokenizer is None:
        items, tokenizer = load_items(rcfg)
    items = [it if isinstance(it, Item) else Item(it.prompt_ids, it.answer) for it in items]
    lc = LoopConfig.from_run_config(cfg)
    stream = PromptStream(list(items), lc.prompts, seed=lc.seed)
    engine_name = resolve_engine_name(cfg.trainer.rollout_engine)
    bucket = cfg.strategy.rollout.sync_bucket_bytes
    K, steps = cfg.placement.staleness, cfg.trainer.steps
    if engine_name == "vllm":  # GPU: vLLM serves the pool (tests/test_trainer_gpu.py)
        from .rollout import get_rollout_engine

        vllm = get_rollout_engine("vllm", cfg=rcfg, engine=None, tokenizer=tokenizer)
        eng = None
    else:
        from .engine import Engine
        from .rollout.megatron import MegatronRollout

        eng = Engine(rcfg, trainable=False)
        sampler = MegatronRollout(
            engine=eng, tokenizer=tokenizer, max_seq_len=cfg.workload.prompt_len + lc.max_response_len
        )
    version = -1
    temp = {"temperature": lc.temperature} if lc.temperature > 0 and lc.temperature != 1.0 else {}
    for step in range(steps):
        while version < max(0, step - K):  # the newest weights this batch may use
            named = recv_weights(rcfg.model, pools, bucket)
            if eng is not None:
                eng.load_hf_tensors(named.__getitem__)
            else:
                vllm.update_weights(named.items())
            version += 1
        batch = stream.next_batch()
        prompts = [batch[j // lc.n].prompt_ids for j in range(lc.prompts * lc.n)]
        params = SamplingParams(
            temperature=lc.temperature,
            top_p=lc.top_p,
            max_tokens=lc.max_response_len,
            stop_token_ids=lc.stop_token_ids,
            seed=lc.seed * 1_000_003 + step,  # the colocated loop's seed for this step
        )
        tokens_of = None
        if eng is not None:
            responses = sampler.generate(prompts, params)
            tokens, mask = build_batch(prompts, responses, pad_id=tokenizer.pad_id, seq_multiple=lc.seq_multiple)
            behaviour, _ = eng.logprobs(tokens, micro_batch_size=lc.log_prob_mbs or lc.mbs, **temp)
        else:
            responses, lps = vllm.generate_with_logprobs(prompts, params)
            tokens, mask = build_batch(prompts, responses, pad_id=tokenizer.pad_id, seq_multiple=lc.seq_multiple)
            behaviour = torch.zeros_like(mask)
            for i, (p, lp) in enumerate(zip(prompts, lps or [])):
                behaviour[i, len(p) - 1 : len(p) - 1 + len(lp)] = torch.tensor(lp, dtype=behaviour.dtype)
        del tokens_of
        if pools.leader:
            _put(
                pools.store,
                step,
                {
                    "step": step,
                    "version": version,
                    "prompts": prompts,
                    "responses": responses,
                    "behaviour_logprobs": behaviour.detach().cpu(),
                },
            )
        dist.barrier()


def train(cfg) -> list[dict]:
    """The separate-pool run of this process: the training loop's history, or [] on a rollout rank."""
    check_separate(cfg)
    pools = init_pools(cfg)
    if pools.role == "train":
        return train_pool(cfg, pools)
    rollout_pool(cfg, pools)
    return []
