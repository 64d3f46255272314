"""The GRPO step: rollout -> weight sync -> old log-probs -> ref log-probs -> update (ppo_epochs x mini-batches).

One step, as verl's ``RayPPOTrainer.fit`` does it for GRPO:

* Sequences are numbered prompt-major: sequence ``j = p * n + k`` is response k to prompt p, so a
  group is ``n`` consecutive sequences (what :func:`trainer.grpo.group_advantages` expects).
  Mini-batch ``b`` is sequences ``[b*M, (b+1)*M)`` with ``M = mini_batch * n``.
* :class:`trainer.engine.Engine` methods are collectives that take the *whole* batch on every rank
  and hand each DP rank its contiguous share themselves, so every rank builds the same batch here.
  A rollout engine that is itself such a collective (``collective_batch = True``, the native
  megatron sampler) gets every prompt on every rank with the same seed; any other engine (vLLM,
  one replica per ``rollout_tp`` ranks) gets its replica's contiguous share of the sequences and
  the responses (token ids only) are all-gathered.
* Prompts come from :class:`trainer.data.PromptStream` (seeded per-epoch shuffles; its position is
  checkpointed) and sampling is seeded by ``(seed, step)``, so a resumed run replays the
  uninterrupted run exactly, given the restored weights and optimizer state.
* The loss is :func:`trainer.grpo.actor_loss` normalized by the *mini-batch's* token (or sequence)
  totals; each micro-batch's value is a partial sum, which ``loss_fn`` multiplies by the global
  micro-batch count to undo the engine's mean over micro-batches and DP ranks, so the gradient is
  that of the mini-batch mean however the batch is split.

Phase timers bracket each phase with a device sync and a barrier, so the per-phase times are those
of the slowest rank (what the cost model predicts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.distributed as dist

from . import checkpoint
from .data import PromptStream
from .grpo import LossConfig, actor_loss, agg_loss, group_advantages
from .rollout.base import SamplingParams
from .tracking import verl_metrics

from grpo_tune.core.phases import MEASURED_PHASES as PHASES  # named once, in core/phases.py

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import RunConfig


@dataclass
class Item:
    """One prompt: its token ids and whatever the reward needs (e.g. the reference answer)."""

    prompt_ids: list[int]
    answer: Any = None


@dataclass
class Dist:
    """This rank's place in the run, as the loop needs it (decoupled from megatron for unit tests)."""

    rank: int = 0
    world_size: int = 1
    rollout_tp: int = 1
    """Ranks per rollout replica (engines that are not batch collectives)."""
    log_rank: bool = True
    """Whether this rank writes metrics (global rank 0)."""

    def barrier(self) -> None:
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            dist.barrier()


def sync(d: Dist) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    d.barrier()


def live_tensor_bytes() -> int:
    """Bytes of every tensor storage alive in this process (a gc scan; CPU phase memory)."""
    import gc

    seen, n = set(), 0
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and not o.is_meta:
                st = o.untyped_storage()
                if st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    n += st.nbytes()
        except (RuntimeError, ReferenceError, TypeError):
            continue
    return n


class PhaseTimer:
    """Times each phase (device sync + barrier on both ends). With ``memory``, also its memory:
    on a GPU the CUDA allocator's peak within the phase (peak stats reset at its start); on CPU,
    which has no allocator statistics, the bytes of live tensors at the phase's end (a gc scan).
    The memory reads happen while no clock runs: outside the phase's time, and ``instrument_s``
    (their total) is taken off the step's time, so a profiled step times what a training step does."""

    def __init__(self, d: Dist, *, memory: bool = False):
        self.d = d
        self.times = {p: 0.0 for p in PHASES} | {"offload": 0.0}
        self.memory = memory
        self.peak_bytes: dict[str, int] = {}
        self.instrument_s = 0.0
        """Seconds spent reading memory (not GRPO work); the step timer leaves them out."""

    def __call__(self, phase: str):
        timer = self

        class _T:
            def __enter__(self):
                sync(timer.d)
                if timer.memory and torch.cuda.is_available():
                    m0 = time.perf_counter()
                    timer.peak_bytes["_before"] = max(
                        timer.peak_bytes.get("_before", 0), int(torch.cuda.max_memory_allocated())
                    )
                    torch.cuda.reset_peak_memory_stats()
                    timer.instrument_s += time.perf_counter() - m0
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if exc[0] is None:
                    sync(timer.d)
                t1 = time.perf_counter()
                timer.times[phase] += t1 - self.t0
                if timer.memory and exc[0] is None:
                    b = int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else live_tensor_bytes()
                    timer.peak_bytes[str(phase)] = max(timer.peak_bytes.get(str(phase), 0), b)
                    timer.instrument_s += time.perf_counter() - t1

        return _T()


@dataclass
class LoopConfig:
    """The knobs of one GRPO step, read from a RunConfig by :meth:`from_run_config`."""

    prompts: int
    n: int
    mini_batch: int
    ppo_epochs: int
    mbs: int
    max_response_len: int
    log_prob_mbs: int | None = None
    """Rows per old/ref log-prob micro-batch (verl's log_prob_micro_batch_size_per_gpu); None: ``mbs``."""
    seed: int = 1234
    temperature: float = 1.0
    top_p: float = 1.0
    norm_adv_by_std: bool = True
    loss: LossConfig = field(default_factory=LossConfig)
    stop_token_ids: tuple[int, ...] = ()
    seq_multiple: int = 1
    """Pad the sequence dimension up to a multiple of this (sequence parallel splits it over TP)."""
    max_seq_len: int | None = None
    max_tokens_per_gpu: int | None = None
    """Token budget of an update micro-batch (verl's use_dynamic_bsz); None: ``mbs`` rows each."""
    log_prob_max_tokens_per_gpu: int | None = None
    """Token budget of a log-prob micro-batch; None: the update's."""
    is_threshold: float = 2.0
    """Truncation of the off-policy importance weights (verl's ``rollout_is_threshold`` default)."""

    @classmethod
    def from_run_config(cls, cfg: RunConfig) -> LoopConfig:
        w, s, t = cfg.workload, cfg.strategy, cfg.trainer
        return cls(
            prompts=w.prompts,
            n=w.n,
            mini_batch=w.mini_batch,
            ppo_epochs=w.ppo_epochs,
            mbs=s.batching.mbs,
            max_response_len=w.response_len,
            log_prob_mbs=s.batching.log_prob_mbs,
            seed=t.seed,
            temperature=t.temperature,
            top_p=t.top_p,
            norm_adv_by_std=t.norm_adv_by_std,
            loss=LossConfig.from_options(t, use_kl=w.kl),
            seq_multiple=s.layout.tp * s.layout.cp if s.layout.sp or s.layout.cp > 1 else 1,
            max_seq_len=cfg.model.max_seq_len,
            max_tokens_per_gpu=s.batching.max_tokens_per_gpu,
            log_prob_max_tokens_per_gpu=s.batching.log_prob_max_tokens_per_gpu or s.batching.max_tokens_per_gpu,
        )


def _pad_to(x: int, k: int) -> int:
    return -(-x // k) * k


def build_batch(
    prompts: list[list[int]], responses: list[list[int]], *, pad_id: int, seq_multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``tokens[B, S]`` = prompt + response + pad, and ``mask[B, S-1]`` over predicted response tokens.

    Position t of the log-prob tensors predicts ``tokens[:, t+1]``; it counts iff that token is a
    response token. Right padding keeps positions (RoPE) identical to generation, and causal
    attention keeps the padding from touching earlier positions.
    """
    S = max(len(p) + len(r) for p, r in zip(prompts, responses))
    S = _pad_to(max(S, 2), seq_multiple)
    tokens = torch.full((len(prompts), S), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), S - 1), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        seq = list(p) + list(r)
        tokens[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, len(p) - 1 : len(seq) - 1] = 1.0
    return tokens, mask


@dataclass
class LogProbs:
    """What the log-prob passes give the update of some rows (:meth:`GRPOLoop._logprob_passes`)."""

    old: torch.Tensor
    """The old (proximal) log-probs: recomputed, or the rollout's own (``recompute_logprobs`` off)."""
    entropy: torch.Tensor | None
    """The old pass's entropy (None when there was no old pass)."""
    ref: torch.Tensor | None
    is_weights: torch.Tensor | None
    is_metrics: dict
    micro: dict
    """The passes' micro-batch counts (``old_logprob_micro_batches``, ``ref_logprob_micro_batches``)."""

    def mini_batch(self, tokens: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, sl: slice) -> dict:
        """The update's input for rows ``sl``."""
        batch = {"tokens": tokens[sl], "mask": mask[sl], "old_logprobs": self.old[sl], "advantages": adv[sl]}
        if self.ref is not None:
            batch["ref_logprobs"] = self.ref[sl]
        if self.is_weights is not None:
            batch["is_weights"] = self.is_weights[sl]
        return batch


class GRPOLoop:
    """Runs GRPO steps on an actor :class:`Engine`, an optional reference, and a rollout engine.

    ``reward_fn(item, response_ids) -> float`` scores one response. ``metrics_path`` (on the logging
    rank) receives one JSON line per step. ``offloader`` (trainer.offload) moves training state off
    the device around the rollout when the strategy asks for it.
    """

    def __init__(
        self,
        cfg: LoopConfig,
        *,
        actor,
        rollout,
        dataset: Sequence[Item],
        reward_fn: Callable[[Item, list[int]], float],
        pad_id: int,
        eos_id: int,
        ref=None,
        d: Dist | None = None,
        out_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 0,
        offloader=None,
        sync_weights: bool | None = None,
        log_every: int = 1,
    ):
        self.cfg, self.actor, self.ref, self.rollout = cfg, actor, ref, rollout
        self.stream = PromptStream(list(dataset), cfg.prompts, seed=cfg.seed)
        self.reward_fn, self.pad_id, self.eos_id = reward_fn, pad_id, eos_id
        self.d = d or Dist()
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.checkpoint_every = checkpoint_every
        self.log_every = max(1, log_every)
        self.offloader = offloader
        self.step_done = 0
        self.track_memory = False
        """Record each phase's memory (PhaseTimer); profile mode turns it on."""
        self.tracker = None
        """Where rank 0 sends each logged step's verl-named metrics (trainer.tracking.Tracking); None: nowhere."""
        self.history: list[dict] = []
        self.recompute_logprobs = True
        """Recompute the old (proximal) log-probs; False (separate pools): the behaviour log-probs are the old ones."""
        # A rollout engine that runs on the actor's own parameters needs no weight copy.
        self.sync_weights = (
            (not getattr(rollout, "shares_actor_weights", False)) if sync_weights is None else sync_weights
        )
        if cfg.loss.use_kl and cfg.loss.kl_coef > 0 and ref is None:
            raise ValueError("KL loss needs a reference engine")
        if cfg.prompts % cfg.mini_batch:
            raise ValueError("prompts must be a multiple of mini_batch")

    # -- phases ---------------------------------------------------------------------------------
    def _generate(self, prompts: list[list[int]], step: int) -> list[list[int]]:
        """Responses in prompt order. An engine that returns its own log-probs of the sampled tokens
        (vLLM) leaves them in ``self._rollout_lp`` for the rollout/trainer mismatch metrics."""
        c, d = self.cfg, self.d
        self._rollout_lp = None
        with_lp = callable(getattr(self.rollout, "generate_with_logprobs", None))
        params = SamplingParams(
            temperature=c.temperature,
            top_p=c.top_p,
            max_tokens=c.max_response_len,
            stop_token_ids=c.stop_token_ids,
            seed=c.seed * 1_000_003 + step,
        )
        if getattr(self.rollout, "collective_batch", False) or d.world_size == 1:
            if with_lp:
                out, self._rollout_lp = self.rollout.generate_with_logprobs(prompts, params)
                return out
            return self.rollout.generate(prompts, params)
        # One replica per rollout_tp ranks; each replica samples its contiguous share.
        replicas = d.world_size // d.rollout_tp
        rep = d.rank // d.rollout_tp
        per = -(-len(prompts) // replicas)
        share = prompts[rep * per : (rep + 1) * per]
        share_params = dataclasses.replace(params, seed=params.seed * 4099 + rep)
        mine = (
            self.rollout.generate_with_logprobs(share, share_params)
            if with_lp
            else (self.rollout.generate(share, share_params), None)
        )
        parts: list = [None] * d.world_size
        dist.all_gather_object(parts, mine)
        if with_lp:
            self._rollout_lp = [x for k in range(replicas) for x in parts[k * d.rollout_tp][1]]
        return [r for k in range(replicas) for r in parts[k * d.rollout_tp][0]]

    def _rollout_phase(self, step: int, prompts: list[list[int]], timer: PhaseTimer):
        """Colocated: sync the rollout engine's weights, generate, around any offload. Returns (responses,
        behaviour log-probs or None: the sampling policy is the current one). Separate pools override it."""
        with timer("weight_sync"):
            if hasattr(self.rollout, "resume"):
                self.rollout.resume()
            if self.sync_weights:
                self.rollout.update_weights(self.actor.named_parameters_for_export())
        if self.offloader is not None:  # after the sync, which reads the parameters
            with timer("offload"):
                self.offloader.offload(keep_params=not self.sync_weights)
        with timer("rollout"):
            responses = self._generate(prompts, step)
            if hasattr(self.rollout, "release"):
                self.rollout.release()
        if self.offloader is not None:
            with timer("offload"):
                self.offloader.reload()
        return responses, None

    def _after_update(self, step: int, timer: PhaseTimer) -> dict:
        """After the update: nothing colocated (the next step syncs); separate pools broadcast the weights."""
        return {}

    def step(self, step: int) -> dict:
        """Run step ``step`` (0-based) and return its metrics (the same on every rank)."""
        c = self.cfg
        timer = PhaseTimer(self.d, memory=self.track_memory)
        t0 = time.perf_counter()
        items = self.stream.next_batch()
        prompts = [items[j // c.n].prompt_ids for j in range(c.prompts * c.n)]

        responses, behaviour_lp = self._rollout_phase(step, prompts, timer)

        rewards = torch.tensor([float(self.reward_fn(items[j // c.n], r)) for j, r in enumerate(responses)])
        adv = group_advantages(rewards, c.n, norm_by_std=c.norm_adv_by_std)
        tokens, mask = build_batch(prompts, responses, pad_id=self.pad_id, seq_multiple=c.seq_multiple)

        lengths = torch.tensor([len(p) + len(r) for p, r in zip(prompts, responses)], dtype=torch.long)
        rollout_lp = behaviour_lp
        if rollout_lp is None and getattr(self, "_rollout_lp", None) is not None:
            rollout_lp = scatter_response_logprobs(prompts, self._rollout_lp, mask)
        lp = self._logprob_passes(tokens, mask, lengths, behaviour_lp, timer)
        old_lp = lp.old
        mismatch = rollout_mismatch(old_lp, rollout_lp, mask) if rollout_lp is not None else {}

        M = c.mini_batch * c.n
        mb_metrics: list[dict] = []
        with timer("update"):
            for _epoch in range(c.ppo_epochs):
                for b in range(c.prompts // c.mini_batch):
                    sl = slice(b * M, (b + 1) * M)
                    mb_metrics.append(self._train_minibatch(lp.mini_batch(tokens, mask, adv, sl), lengths[sl]))

        extra = self._after_update(step, timer)
        step_s = time.perf_counter() - t0 - timer.instrument_s  # the memory reads are not the step's work
        entropy = float(agg_loss(lp.entropy, mask, "token-mean")) if lp.entropy is not None else None
        return self._metrics(
            step,
            prompts,
            responses,
            rewards,
            entropy=entropy,
            step_s=step_s,
            timer=timer,
            mb_metrics=mb_metrics,
            extra={**mismatch, **lp.is_metrics, **extra},
            lp_micro=lp.micro,
        )

    def _logprob_passes(self, tokens, mask, lengths, behaviour_lp, timer: PhaseTimer) -> LogProbs:
        """The old (proximal) and reference log-prob passes over ``tokens`` (a step's batch, or one streamed
        mini-batch), and the off-policy importance weights: what the update of those rows needs."""
        c = self.cfg
        temp = {"temperature": c.temperature} if c.temperature > 0 and c.temperature != 1.0 else {}
        lp_kw = dict(max_tokens=c.log_prob_max_tokens_per_gpu, lengths=lengths) if c.log_prob_max_tokens_per_gpu else {}
        lp_mbs = c.log_prob_mbs or c.mbs
        is_w, is_metrics = None, {}
        if behaviour_lp is not None and not self.recompute_logprobs:
            # the rollout's log-probs are the old ones (verl's rollout_correction.bypass_mode): no old pass,
            # the PPO ratio is taken against the behaviour policy itself
            old_lp, old_ent = behaviour_lp, None
            lp_micro = {"old_logprob_micro_batches": 0}
            is_metrics = {"is_weight_mean": 1.0, "is_weight_max": 1.0, "is_truncated_frac": 0.0}
        else:
            with timer("old_logprob"):
                old_lp, old_ent = self.actor.logprobs(
                    tokens, micro_batch_size=lp_mbs, with_entropy=True, **temp, **lp_kw
                )
            lp_micro = {"old_logprob_micro_batches": getattr(self.actor, "last_logprob_micro_batches", 0)}
        if behaviour_lp is not None and self.recompute_logprobs:
            # off-policy samples: decoupled PPO's truncated importance weights
            from .grpo import truncated_is_weights

            is_w, is_metrics = truncated_is_weights(old_lp, behaviour_lp, mask, c.is_threshold)
        ref_lp = None
        if self.ref is not None and c.loss.use_kl:
            with timer("ref_logprob"):
                ref_lp, _ = self.ref.logprobs(tokens, micro_batch_size=lp_mbs, **temp, **lp_kw)
            lp_micro["ref_logprob_micro_batches"] = getattr(self.ref, "last_logprob_micro_batches", 0)
        return LogProbs(old_lp, old_ent, ref_lp, is_w, is_metrics, lp_micro)

    def _train_minibatch(self, batch: dict, lengths: torch.Tensor) -> dict:
        """One optimizer step on one mini-batch (``batch``: its tokens, mask, old log-probs, advantages and, if
        any, reference log-probs and importance weights); returns the engine's metrics."""
        c = self.cfg
        temp = {"temperature": c.temperature} if c.temperature > 0 and c.temperature != 1.0 else {}
        # grpo.agg_loss normalizers: the whole mini-batch's token and sequence counts.
        mask = batch["mask"]
        num_tokens = float(mask.sum())
        num_seqs = float((mask.sum(-1) > 0).sum())
        up_kw = dict(max_tokens=c.max_tokens_per_gpu, lengths=lengths) if c.max_tokens_per_gpu else {}
        m = self.actor.train_step(
            batch,
            self._loss_fn(num_tokens, num_seqs),
            micro_batch_size=c.mbs,
            with_entropy=c.loss.entropy_coef > 0,
            **temp,
            **up_kw,
        )
        m["_micro_batches"] = getattr(self.actor, "last_micro_batches", 0)
        return m

    def _metrics(
        self,
        step: int,
        prompts: list[list[int]],
        responses: list[list[int]],
        rewards: torch.Tensor,
        *,
        entropy: float | None,
        step_s: float,
        timer: PhaseTimer,
        mb_metrics: list[dict],
        extra: dict,
        lp_micro: dict,
    ) -> dict:
        """One step's metrics (the same on every rank)."""
        d = self.d
        resp_lens = [len(r) for r in responses]
        total_tokens = sum(len(p) for p in prompts) + sum(resp_lens)
        out = {
            "step": step + 1,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "response_len": float(statistics.fmean(resp_lens)),
            "response_len_max": max(resp_lens),
            "entropy": entropy,
            "step_s": step_s,
            "phases_s": {p.value: timer.times[p] for p in PHASES},
            **(
                {"phase_memory_bytes": {str(k): v for k, v in timer.peak_bytes.items() if not k.startswith("_")}}
                if self.track_memory
                else {}
            ),
            "offload_s": timer.times["offload"],
            "tokens": total_tokens,
            "tokens_per_s": total_tokens / step_s,
            "tokens_per_s_per_gpu": total_tokens / step_s / d.world_size,
        }
        out["weight_version"] = step  # colocated: the rollout ran on the weights after `step` updates
        if self.sync_weights and hasattr(self.rollout, "buckets_pushed"):
            out["weight_sync_buckets"] = int(self.rollout.buckets_pushed)
        out.update(extra)
        out["update_micro_batches"] = int(sum(x.get("_micro_batches", 0) for x in mb_metrics))
        out.update(lp_micro)  # per DP rank, like the update's
        for k in ("loss", "pg_loss", "kl", "clip_frac", "approx_kl", "grad_norm"):
            vals = [float(x[k]) for x in mb_metrics if x.get(k) is not None]
            out[k] = statistics.fmean(vals) if vals else None
        return out

    def _loss_fn(self, num_tokens: float, num_seqs: float):
        cfg = self.cfg.loss

        def loss_fn(logprobs, entropy, mb):
            loss, metrics = actor_loss(
                logprobs,
                entropy,
                old_logprobs=mb["old_logprobs"],
                advantages=mb["advantages"],
                mask=mb["mask"],
                cfg=cfg,
                ref_logprobs=mb.get("ref_logprobs"),
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                is_weights=mb.get("is_weights"),
            )
            # Engine.train_step averages over micro-batches x DP ranks; the values here are partial
            # sums of the mini-batch mean, so scale by that count (engine.py, "Loss scaling").
            k = float(mb.get("_scale_ctx", {}).get("micro_batches", 1))
            return loss * k, {name: v * k for name, v in metrics.items()}

        return loss_fn

    # -- the run --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"step": self.step_done, "engine": self.actor.state_dict(), "data": self.stream.state_dict()}

    def load_state_dict(self, st: dict) -> None:
        self.actor.load_state_dict(st["engine"])
        self.stream.load_state_dict(st["data"])
        self.step_done = int(st["step"])

    def resume(self) -> int:
        """Load the latest complete checkpoint, if any; returns the number of steps already done."""
        if self.out_dir is None:
            return 0
        got = checkpoint.load(self.out_dir, rank=self.d.rank, world_size=self.d.world_size)
        if got is not None:
            self.load_state_dict(got[1])
        if self.d.log_rank:  # also with no checkpoint yet: a run killed before its first one logged steps
            _truncate_metrics(self.out_dir / "metrics.jsonl", self.step_done)
        return self.step_done

    def save(self) -> None:
        checkpoint.save(
            self.out_dir,
            self.step_done,
            self.state_dict(),
            rank=self.d.rank,
            world_size=self.d.world_size,
            barrier=self.d.barrier,
        )

    def run(self, steps: int, *, on_step: Callable[[dict], None] | None = None) -> list[dict]:
        """Run until ``steps`` steps are done in total (resumed steps count), checkpointing every K."""
        while self.step_done < steps:
            m = self.step(self.step_done)
            self.step_done += 1
            self.history.append(m)
            if (
                self.d.log_rank
                and self.out_dir is not None
                and (self.step_done % self.log_every == 0 or self.step_done == steps)
            ):
                verl = verl_metrics(m)
                _append_jsonl(self.out_dir / "metrics.jsonl", {**m, **verl})  # ours, then verl's names
                if self.tracker is not None:
                    self.tracker.log(verl, self.step_done)
            if on_step is not None:
                on_step(m)
            if (
                self.out_dir is not None
                and self.checkpoint_every
                and (self.step_done % self.checkpoint_every == 0 or self.step_done == steps)
            ):
                self.save()
        return self.history


def scatter_response_logprobs(prompts: list[list[int]], lps: list[list[float]], mask: torch.Tensor) -> torch.Tensor:
    """Per-response log-prob lists (a rollout engine's, one per sampled token) on the ``mask[B, S-1]`` grid."""
    out = torch.zeros_like(mask, dtype=torch.float32)
    for i, (p, lp) in enumerate(zip(prompts, lps)):
        if lp:
            out[i, len(p) - 1 : len(p) - 1 + len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return out


def rollout_mismatch(trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict:
    """The rollout engine's log-probs of its sampled tokens against the trainer's recomputed ones.

    Under verl's names and definitions (``verl/utils/debug/metrics.py``, ``calculate_debug_metrics``, logged
    as ``training/rollout_probs_diff_*``): the absolute difference of the two *probabilities*
    ``|exp(lp_trainer) - exp(lp_rollout)|`` over the response tokens (mean, max, std) and the Pearson
    correlation of the probabilities; and, ours, the absolute difference of the log-probs
    (``rollout_logprob_diff_mean`` / ``_max``), the figure the off-policy correction's weights are made of.
    """
    m = mask.bool()
    if not bool(m.any()):
        return {}
    a, b = trainer_lp.detach().float()[m], rollout_lp.detach().float()[m]
    pa, pb = a.exp(), b.exp()
    dp, dl = (pa - pb).abs(), (a - b).abs()
    corr = float(torch.corrcoef(torch.stack([pa, pb]))[0, 1]) if a.numel() > 1 else 1.0
    return {
        "rollout_probs_diff_mean": float(dp.mean()),
        "rollout_probs_diff_max": float(dp.max()),
        "rollout_probs_diff_std": float(dp.std()) if dp.numel() > 1 else 0.0,
        "rollout_actor_probs_pearson_corr": corr if corr == corr else 1.0,  # constant vectors: nan -> 1
        "rollout_logprob_diff_mean": float(dl.mean()),
        "rollout_logprob_diff_max": float(dl.max()),
    }


def _append_jsonl(path: Path, rec: dict) -> None:
    from grpo_tune.core import safeio

    path.parent.mkdir(parents=True, exist_ok=True)
    with safeio.open_append(path) as fh:  # never through a link planted in the run folder
        fh.write((json.dumps(rec, allow_nan=True) + "\n").encode())
        fh.flush()


def _truncate_metrics(path: Path, steps_done: int) -> None:
    """Drop metric lines after the checkpoint we resume from (a killed run may have logged more)."""
    from grpo_tune.core import safeio

    try:
        text = safeio.read_text(path)
    except FileNotFoundError:
        return
    keep = []
    for line in text.splitlines():
        try:
            if json.loads(line)["step"] <= steps_done:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line from a kill
    from grpo_tune.core.config import atomic_write

    atomic_write(path, "".join(k + "\n" for k in keep))
