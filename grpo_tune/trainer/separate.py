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

Staleness ``K`` and sync interval ``N`` (``N <= max(1, K)``): the training pool broadcasts its weights
after every ``N``-th update (version ``v`` = the weights after ``v`` updates), and the rollout pool
generates batch ``s`` with the oldest synced version at most ``K`` behind, ``N * ceil(max(0, s - K) / N)``
(:func:`sample_versions`), so a sample is at most ``K`` versions old; at ``K = 0`` generation, sync and
training run in sequence, at ``K = 1`` generation of batch ``s + 1`` overlaps the training of batch ``s``
(one-step-off). Off-policy samples are corrected with decoupled PPO's truncated importance weights
(:func:`trainer.grpo.truncated_is_weights`), or, with ``placement.recompute_logprobs: false``, the
behaviour log-probs are the old ones (no old log-prob pass; verl's ``bypass_mode``). Every step logs
``weight_version``, ``sample_version``, ``sample_age``, ``rollout_version`` (the newest weights the
rollout pool holds after the step) and the importance weights' statistics.

Resume: the training pool checkpoints as a colocated run does (``trainer.checkpoint_every`` into
``trainer.out_dir``; ``grpo-tune train`` resumes from the latest), and its rank 0 adds the synced
versions that batches after the checkpoint may still be generated with (at most ``ceil(K / N)`` copies of
the HF tensors). A resumed job hands the rollout pool the step and the prompt stream's position through
the store and re-sends those versions, so it replays the uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from grpo_tune.core.errors import ConfigError

from .loop import GRPOLoop, PhaseTimer, build_batch, scatter_response_logprobs
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
    from grpo_tune.costmodel.pools import check_fields

    check_fields(cfg.placement)  # the sync interval against the staleness, as the cost model prices it


def sample_versions(steps: int, staleness: int, interval: int = 1, start: int = 0) -> list[int]:
    """The policy version each batch ``start..steps-1`` is generated with: the oldest synced version (a
    multiple of ``interval``) at most ``staleness`` versions behind the batch."""
    n = max(1, interval)
    return [n * -(-max(0, s - staleness) // n) for s in range(start, steps)]


def _needed(steps: int, staleness: int, interval: int, start: int) -> list[int]:
    """The versions the rollout pool receives, in order, for the batches ``start..steps-1``."""
    return sorted(set(sample_versions(steps, staleness, interval, start)))


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


def export_flat(actor, pools: Pools) -> torch.Tensor | None:
    """Every training rank exports (a collective in the pool); training rank 0 gets the HF tensors, flat."""
    named = dict(actor.named_parameters_for_export(torch.float32))
    if pools.bridge is None:
        return None
    return torch.cat([named[n].detach().reshape(-1).to(torch.float32).cpu() for n, _ in _layout(actor.spec)])


def send_flat(flat: torch.Tensor | None, pools: Pools, bucket_bytes: int) -> int:
    """Training rank 0 broadcasts one version's flat HF tensors to every rollout rank (others: nothing)."""
    if pools.bridge is None or flat is None:
        return 0
    return _broadcast(pools.bridge, flat, bucket_bytes)


def send_weights(actor, pools: Pools, bucket_bytes: int) -> int:
    """Export the current weights and broadcast them (a collective in the training pool)."""
    return send_flat(export_flat(actor, pools), pools, bucket_bytes)


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
    """The training pool's loop: samples come from the rollout pool's queue; weights go out every N updates."""

    pools: Pools
    total_steps: int
    staleness: int
    sync_interval: int
    bucket_bytes: int
    _sample_version = 0
    _rollout_version = 0
    _start = 0

    def init_versions(self, start: int) -> None:
        """Before the first step of this job: the versions the rollout pool will receive, and the kept ones."""
        self._start = start
        self._needed = _needed(self.total_steps, self.staleness, self.sync_interval, start)
        if not hasattr(self, "_kept"):
            self._kept: dict[int, torch.Tensor] = {}

    def _keep(self, version: int, flat: torch.Tensor | None) -> None:
        """Keep the synced versions later batches (of this run or a longer resumed one) may be generated with."""
        if flat is not None:
            self._kept[version] = flat
        low = sample_versions(version + 1, self.staleness, self.sync_interval, version)[0]
        for v in [v for v in self._kept if v < low]:
            del self._kept[v]

    def send_initial(self) -> None:
        """The versions due by now (the start's weights; on resume also the kept older ones), in order."""
        d = self._start
        for v in [v for v in self._needed if v <= d]:
            flat = export_flat(self.actor, self.pools) if v == d else self._kept.get(v)
            if self.pools.bridge is not None and flat is None:
                raise RuntimeError(f"resume: the checkpoint after step {d} holds no copy of weight version {v}")
            if v == d:
                self._keep(v, flat)
            send_flat(flat, self.pools, self.bucket_bytes)
            self._rollout_version = v

    def _rollout_phase(self, step: int, prompts: list[list[int]], timer: PhaseTimer):
        with timer("rollout"):  # the wait for the rollout pool (verl's wait_prev_gen / gen in fully async)
            msg = _get(self.pools.store, step)
        if msg["step"] != step or [list(p) for p in msg["prompts"]] != [list(p) for p in prompts]:
            raise RuntimeError(f"sample queue out of order at step {step}")  # both pools draw the same stream
        self._sample_version = int(msg["version"])
        return msg["responses"], msg["behaviour_logprobs"]

    def _after_update(self, step: int, timer: PhaseTimer) -> dict:
        v = step + 1  # the version this update made
        # a synced version: sent when a later batch is generated with it, kept when a resumed run may need it
        if v % self.sync_interval == 0 and (v in self._needed or self.checkpoint_every):
            with timer("weight_sync"):
                flat = export_flat(self.actor, self.pools)
                self._keep(v, flat)
                if v in self._needed:  # a later batch of this run is generated with it
                    send_flat(flat, self.pools, self.bucket_bytes)
                    self._rollout_version = v
        return {
            "weight_version": step,
            "sample_version": self._sample_version,
            "sample_age": step - self._sample_version,
            "staleness": self.staleness,
            "sync_interval": self.sync_interval,
            "rollout_version": self._rollout_version,
        }

    def state_dict(self) -> dict:
        st = super().state_dict()
        if self.pools.bridge is not None:  # training rank 0 holds the synced copies
            st["synced_versions"] = dict(self._kept)
        return st

    def load_state_dict(self, st: dict) -> None:
        super().load_state_dict(st)
        self._kept = dict(st.get("synced_versions") or {})


def train_pool(cfg, pools: Pools, *, resume: bool = True) -> list[dict]:
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
    loop.sync_interval = cfg.placement.sync_interval
    loop.bucket_bytes = cfg.strategy.rollout.sync_bucket_bytes
    loop.recompute_logprobs = cfg.placement.recompute_logprobs
    done = loop.resume() if resume else 0
    if done and pools.leader:
        print(f"resumed from the checkpoint after step {done}", flush=True)
    loop.init_versions(done)
    if pools.leader:  # where the rollout pool starts: the step and the prompt stream's position
        buf = io.BytesIO()
        torch.save({"step": done, "stream": loop.stream.state_dict()}, buf)
        pools.store.set("start", buf.getvalue())
    loop.send_initial()  # both pools start from the same weights
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
    if engine_name == "vllm":  # vLLM serves the pool (GPU, or its CPU build), with the plan's engine knobs
        from .rollout import get_rollout_engine

        vcfg = rcfg.replace(strategy=dataclasses.replace(s, rollout=cfg.strategy.rollout))
        vllm = get_rollout_engine("vllm", cfg=vcfg, engine=None, tokenizer=tokenizer)
        eng = sampler = None
    else:
        from .engine import Engine
        from .rollout.megatron import MegatronRollout

        vllm = None
        eng = Engine(rcfg, trainable=False)
        sampler = MegatronRollout(
            engine=eng, tokenizer=tokenizer, max_seq_len=cfg.workload.prompt_len + lc.max_response_len
        )
    start = torch.load(io.BytesIO(pools.store.get("start")), weights_only=False)  # the training pool's
    first = int(start["step"])
    stream.load_state_dict(start["stream"])
    try:
        _produce(cfg, pools, rcfg, lc, stream, tokenizer, eng, sampler, vllm, first)
    finally:
        if vllm is not None:
            vllm.close()  # vLLM's groups go before torch's (teardown)


def _produce(cfg, pools: Pools, rcfg, lc, stream, tokenizer, eng, sampler, vllm, first: int) -> None:
    """The rollout pool's steps ``first..steps-1``: receive due weights, generate, queue."""
    K, steps = cfg.placement.staleness, cfg.trainer.steps
    bucket = cfg.strategy.rollout.sync_bucket_bytes
    N = cfg.placement.sync_interval
    due = iter(_needed(steps, K, N, first))  # the versions the training pool sends, in order
    version = -1
    temp = {"temperature": lc.temperature} if lc.temperature > 0 and lc.temperature != 1.0 else {}
    for step, want in zip(range(first, steps), sample_versions(steps, K, N, first)):
        while version < want:  # the oldest synced weights this batch may use
            named = recv_weights(rcfg.model, pools, bucket)
            if eng is not None:
                eng.load_hf_tensors(named.__getitem__)
            else:
                vllm.update_weights(named.items())
            version = next(due)
        batch = stream.next_batch()
        prompts = [batch[j // lc.n].prompt_ids for j in range(lc.prompts * lc.n)]
        params = SamplingParams(
            temperature=lc.temperature,
            top_p=lc.top_p,
            max_tokens=lc.max_response_len,
            stop_token_ids=lc.stop_token_ids,
            seed=lc.seed * 1_000_003 + step,  # the colocated loop's seed for this step
        )
        if eng is not None:
            responses = sampler.generate(prompts, params)
            tokens, mask = build_batch(prompts, responses, pad_id=tokenizer.pad_id, seq_multiple=lc.seq_multiple)
            behaviour, _ = eng.logprobs(tokens, micro_batch_size=lc.log_prob_mbs or lc.mbs, **temp)
        else:
            # one vLLM replica per rollout_tp ranks, each sampling its contiguous share (as the colocated loop)
            tp = cfg.strategy.rollout.rollout_tp
            replicas, rep = pools.rollout_size // tp, pools.pool_rank // tp
            per = -(-len(prompts) // replicas)
            mine = vllm.generate_with_logprobs(
                prompts[rep * per : (rep + 1) * per], dataclasses.replace(params, seed=params.seed * 4099 + rep)
            )
            parts: list = [None] * pools.rollout_size
            dist.all_gather_object(parts, mine)
            responses = [x for k in range(replicas) for x in parts[k * tp][0]]
            lps = [x for k in range(replicas) for x in parts[k * tp][1]]
            tokens, mask = build_batch(prompts, responses, pad_id=tokenizer.pad_id, seq_multiple=lc.seq_multiple)
            behaviour = scatter_response_logprobs(prompts, lps, mask)
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


def train(cfg, *, resume: bool = True) -> list[dict]:
    """The separate-pool run of this process: the training loop's history, or [] on a rollout rank."""
    check_separate(cfg)
    pools = init_pools(cfg)
    if pools.role == "train":
        return train_pool(cfg, pools, resume=resume)
    rollout_pool(cfg, pools)
    return []
