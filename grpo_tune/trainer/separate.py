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

Streaming within a step (``placement.stream``): the rollout pool samples each step in waves of as many whole
mini-batches as its replicas hold at once (``strategy.rollout.max_num_seqs`` per replica, :func:`wave_units`;
the native sampler draws the whole batch's per-row uniforms, so the waves give the batch's responses) and queues
each mini-batch as its wave ends; the training pool scores, passes and trains each as it arrives
(:meth:`SeparateLoop._stream_step`), the later PPO epochs after the last, and logs ``stream_*`` timings per step.
At staleness 0 with ``recompute_logprobs: false`` the losses are the colocated run's.

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
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from grpo_tune.core.errors import ConfigError

from .grpo import agg_loss, group_advantages, truncated_is_weights
from .loop import GRPOLoop, PhaseTimer, build_batch, rollout_mismatch, scatter_response_logprobs
from .rollout.base import SamplingParams

_PREFIX = "grpo-tune-pools/"
TIMEOUT_S = 600.0


@dataclass
class PoolRank:
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


def init_pools(cfg) -> PoolRank:
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
    return PoolRank(role, rank, pool_rank, t, r, store, bridge)


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


def export_flat(actor, pools: PoolRank) -> torch.Tensor | None:
    """Every training rank exports (a collective in the pool); training rank 0 gets the HF tensors, flat."""
    named = dict(actor.named_parameters_for_export(torch.float32))
    if pools.bridge is None:
        return None
    return torch.cat([named[n].detach().reshape(-1).to(torch.float32).cpu() for n, _ in _layout(actor.spec)])


def send_flat(flat: torch.Tensor | None, pools: PoolRank, bucket_bytes: int) -> int:
    """Training rank 0 broadcasts one version's flat HF tensors to every rollout rank (others: nothing)."""
    if pools.bridge is None or flat is None:
        return 0
    return _broadcast(pools.bridge, flat, bucket_bytes)


def send_weights(actor, pools: PoolRank, bucket_bytes: int) -> int:
    """Export the current weights and broadcast them (a collective in the training pool)."""
    return send_flat(export_flat(actor, pools), pools, bucket_bytes)


def recv_weights(spec, pools: PoolRank, bucket_bytes: int) -> dict[str, torch.Tensor]:
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


def _key(step: int, unit: int | None) -> str:
    """A step's batch (``unit`` None), or mini-batch ``unit`` of a streamed step."""
    return f"samples/{step}" if unit is None else f"samples/{step}/{unit}"


def _put(store, step: int, payload: dict, unit: int | None = None) -> None:
    buf = io.BytesIO()
    torch.save(payload, buf)
    store.set(_key(step, unit), buf.getvalue())


def _get(store, step: int, unit: int | None = None) -> dict:
    raw = store.get(_key(step, unit))  # blocks until the rollout pool has put it
    return torch.load(io.BytesIO(raw), weights_only=False)


# -- the training pool -------------------------------------------------------------------------


class SeparateLoop(GRPOLoop):
    """The training pool's loop: samples come from the rollout pool's queue; weights go out every N updates."""

    pools: PoolRank
    total_steps: int
    staleness: int
    sync_interval: int
    bucket_bytes: int
    streamed = False
    """Take each step's mini-batches as they arrive (``placement.stream``); False: the whole batch at once."""
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

    def step(self, step: int) -> dict:
        return self._stream_step(step) if self.streamed else super().step(step)

    def _stream_step(self, step: int) -> dict:
        """A streamed step: each mini-batch of whole prompt groups is scored, passed through the log-prob passes
        and trained (the first PPO epoch) as it arrives, while the rollout pool generates the rest; later epochs
        wait for the last. The mini-batches are trained in the colocated step's order, each normalised by its own
        token (or sequence) totals as :meth:`GRPOLoop.step` does, and group advantages need only the group, so
        with the rollout's log-probs as the old ones (``recompute_logprobs: false``) the losses are the colocated
        step's. With recomputed old log-probs, mini-batch ``k``'s proximal policy is the one after ``k`` updates
        (verl's fully-async trainer computes them so), corrected to the rollout's by importance weights."""
        c = self.cfg
        timer = PhaseTimer(self.d, memory=self.track_memory)
        t0, w0 = time.perf_counter(), time.time()
        items = self.stream.next_batch()
        prompts = [items[j // c.n].prompt_ids for j in range(c.prompts * c.n)]
        M, units = c.mini_batch * c.n, c.prompts // c.mini_batch
        parts, events, mb_metrics = [], [], []
        responses: list[list[int]] = []
        gen = (0.0, 0.0)
        for k in range(units):
            with timer("rollout"):  # the wait for mini-batch k (verl fully-async: _get_samples_from_queue)
                msg = _get(self.pools.store, step, k)
            got = time.time()
            sl = slice(k * M, (k + 1) * M)
            if msg["step"] != step or msg["unit"] != k or [list(p) for p in msg["prompts"]] != prompts[sl]:
                raise RuntimeError(f"sample queue out of order at step {step}, mini-batch {k}")
            self._sample_version = int(msg["version"])
            gen = (float(msg["gen_start_ts"]), float(msg["ready_ts"]))
            resp = msg["responses"]
            responses += resp
            rewards = torch.tensor([float(self.reward_fn(items[(k * M + j) // c.n], r)) for j, r in enumerate(resp)])
            adv = group_advantages(rewards, c.n, norm_by_std=c.norm_adv_by_std)  # whole groups: the step's values
            tokens, mask = build_batch(prompts[sl], resp, pad_id=self.pad_id, seq_multiple=c.seq_multiple)
            lengths = torch.tensor([len(p) + len(r) for p, r in zip(prompts[sl], resp)], dtype=torch.long)
            behaviour = msg["behaviour_logprobs"]
            lp = self._logprob_passes(tokens, mask, lengths, behaviour, timer)
            parts.append((tokens, mask, adv, lengths, lp, behaviour, rewards))
            started = time.time()
            with timer("update"):
                mb_metrics.append(self._train_minibatch(lp.mini_batch(tokens, mask, adv, slice(None)), lengths))
            events.append(
                {
                    "unit": k,
                    "wave": int(msg["wave"]),
                    "ready_s": float(msg["ready_ts"]) - w0,
                    "got_s": got - w0,
                    "update_start_s": started - w0,
                    "update_end_s": time.time() - w0,
                }
            )
        with timer("update"):  # later PPO epochs: every mini-batch is here now
            for _epoch in range(1, c.ppo_epochs):
                for tokens, mask, adv, lengths, lp, _, _ in parts:
                    mb_metrics.append(self._train_minibatch(lp.mini_batch(tokens, mask, adv, slice(None)), lengths))
        extra = self._after_update(step, timer)
        step_s = time.perf_counter() - t0 - timer.instrument_s

        # the step's figures over all mini-batches, as the whole batch gives them
        def flat(i: int, of=lambda x: x) -> torch.Tensor:
            return torch.cat([of(p[i])[p[1].bool()] for p in parts])

        ones = torch.ones(sum(int(p[1].sum()) for p in parts))
        old = flat(4, lambda lp: lp.old)
        behaviour_flat = flat(5)
        is_metrics = parts[0][4].is_metrics
        if self.recompute_logprobs:
            is_metrics = truncated_is_weights(old, behaviour_flat, ones, self.cfg.is_threshold)[1]
        entropy = None
        if parts[0][4].entropy is not None:
            entropy = float(agg_loss(flat(4, lambda lp: lp.entropy), ones, "token-mean"))
        micro: dict = {}
        for p in parts:
            for key, v in p[4].micro.items():
                micro[key] = micro.get(key, 0) + v
        gen_start, gen_end = gen[0] - w0, gen[1] - w0
        overlap = sum(max(0.0, min(e["update_end_s"], gen_end) - e["got_s"]) for e in events)
        stream = {
            "stream": True,
            "stream_units": units,
            "stream_first_wait_s": events[0]["got_s"],
            "stream_wait_s": timer.times["rollout"],
            "stream_gen_start_s": gen_start,
            "stream_gen_end_s": gen_end,
            "stream_overlap_s": overlap,
            "stream_events": events,
        }
        return self._metrics(
            step,
            prompts,
            responses,
            torch.cat([p[6] for p in parts]),
            entropy=entropy,
            step_s=step_s,
            timer=timer,
            mb_metrics=mb_metrics,
            extra={**rollout_mismatch(old, behaviour_flat, ones), **is_metrics, **extra, **stream},
            lp_micro=micro,
        )

    def state_dict(self) -> dict:
        st = super().state_dict()
        if self.pools.bridge is not None:  # training rank 0 holds the synced copies
            st["synced_versions"] = dict(self._kept)
        return st

    def load_state_dict(self, st: dict) -> None:
        super().load_state_dict(st)
        self._kept = dict(st.get("synced_versions") or {})


def train_pool(cfg, pools: PoolRank, *, resume: bool = True) -> list[dict]:
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
    loop.streamed = cfg.placement.stream
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


def rollout_pool(cfg, pools: PoolRank, *, items=None, tokenizer=None) -> None:
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


def _produce(cfg, pools: PoolRank, rcfg, lc, stream, tokenizer, eng, sampler, vllm, first: int) -> None:
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
        gen_start = time.time()
        if not cfg.placement.stream:
            responses, behaviour = _sample(cfg, pools, lc, tokenizer, eng, sampler, vllm, prompts, params, temp)
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
        else:  # in waves of the engine's concurrency, each mini-batch queued as soon as its wave is done
            M, units = lc.mini_batch * lc.n, lc.prompts // lc.mini_batch
            per_wave = wave_units(cfg, pools.rollout_size, M, units)
            for w, first_unit in enumerate(range(0, units, per_wave)):
                ks = range(first_unit, min(units, first_unit + per_wave))
                lo, hi = ks[0] * M, (ks[-1] + 1) * M
                rows = None if per_wave >= units else (lo, len(prompts))  # one wave: the unstreamed call itself
                responses, behaviour = _sample(
                    cfg, pools, lc, tokenizer, eng, sampler, vllm, prompts[lo:hi], params, temp, rows=rows
                )
                ready = time.time()
                if not pools.leader:
                    continue
                for k in ks:
                    part, resp = prompts[k * M : (k + 1) * M], responses[k * M - lo : (k + 1) * M - lo]
                    _, mask = build_batch(part, resp, pad_id=tokenizer.pad_id, seq_multiple=lc.seq_multiple)
                    payload = {
                        "step": step,
                        "unit": k,
                        "wave": w,
                        "version": version,
                        "prompts": part,
                        "responses": resp,
                        # the wave's grid cut to the mini-batch's own (right padding: the positions are the same)
                        "behaviour_logprobs": behaviour[k * M - lo : (k + 1) * M - lo, : mask.shape[1]].detach().cpu(),
                        "gen_start_ts": gen_start,
                        "ready_ts": ready,
                    }
                    _put(pools.store, step, payload, unit=k)
        dist.barrier()


def wave_units(cfg, rollout_gpus: int, unit_rows: int, units: int) -> int:
    """Mini-batches a streaming rollout pool samples per call: as many whole ones as its replicas hold at once
    (``strategy.rollout.max_num_seqs`` sequences per replica of ``rollout_tp`` ranks), at least one. The engine's
    concurrency bounds a wave as it bounds vLLM's running batch: a batch that fits at once is one call (every
    mini-batch ends with the batch's longest response, as the cost model prices a pool whose batch runs at once:
    costmodel.streaming), and a larger one streams wave by wave."""
    r = cfg.strategy.rollout
    replicas = max(1, rollout_gpus // r.rollout_tp)
    return max(1, min(units, r.max_num_seqs * replicas // unit_rows))


def _sample(cfg, pools: PoolRank, lc, tokenizer, eng, sampler, vllm, prompts, params, temp, rows=None):
    """The rollout pool's responses to ``prompts`` (rows ``rows = (offset, total)`` of the step's batch, or the
    whole batch) and their behaviour log-probs on the ``build_batch`` grid (a collective in the pool)."""
    if eng is not None:
        responses = sampler.generate(prompts, params, rows=rows)
        tokens, mask = build_batch(prompts, responses, pad_id=tokenizer.pad_id, seq_multiple=lc.seq_multiple)
        behaviour, _ = eng.logprobs(tokens, micro_batch_size=lc.log_prob_mbs or lc.mbs, **temp)
        return responses, behaviour
    # one vLLM replica per rollout_tp ranks, each sampling its contiguous share (as the colocated loop); a
    # streamed mini-batch is shared out the same way, its seeds apart from the other mini-batches'
    tp = cfg.strategy.rollout.rollout_tp
    replicas, rep = pools.rollout_size // tp, pools.pool_rank // tp
    per = -(-len(prompts) // replicas)
    seed = params.seed * 4099 + rep + (0 if rows is None else 7_919 * rows[0])
    mine = vllm.generate_with_logprobs(prompts[rep * per : (rep + 1) * per], dataclasses.replace(params, seed=seed))
    parts: list = [None] * pools.rollout_size
    dist.all_gather_object(parts, mine)
    responses = [x for k in range(replicas) for x in parts[k * tp][0]]
    lps = [x for k in range(replicas) for x in parts[k * tp][1]]
    tokens, mask = build_batch(prompts, responses, pad_id=tokenizer.pad_id, seq_multiple=lc.seq_multiple)
    return responses, scatter_response_logprobs(prompts, lps, mask)


def train(cfg, *, resume: bool = True) -> list[dict]:
    """The separate-pool run of this process: the training loop's history, or [] on a rollout rank."""
    check_separate(cfg)
    pools = init_pools(cfg)
    if pools.role == "train":
        return train_pool(cfg, pools, resume=resume)
    rollout_pool(cfg, pools)
    return []
