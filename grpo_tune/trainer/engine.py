"""Engine: the megatron-core model of one role (actor or reference) with its DDP and optimizer.

Build it after :func:`trainer.parallel.init`. Every method is a collective: all ranks call it
with the same arguments (the full batch; the engine takes this data-parallel rank's share), and
every rank gets the full result back.

Loss scaling: megatron's schedule divides each micro-batch's loss by the number of micro-batches
and DDP averages gradients over DP ranks, so ``train_step`` follows the gradient of the *mean of
``loss_fn`` over all micro-batches of the mini-batch* (on all DP ranks). A loss that must weigh
micro-batches differently (token-mean over the whole mini-batch) scales inside ``loss_fn``, e.g.
by ``n_micro_batches_global * mb_tokens / total_tokens`` (``micro_batch["_scale_ctx"]`` gives the
counts).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from grpo_tune.costmodel.params import padded_vocab, total_params

from . import hf
from . import model as tmodel
from . import microbatch, optim

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import RunConfig

LAYOUT_FREE_INIT_MAX_PARAMS = 2_000_000_000
"""Random init draws every full tensor from its own seed (same weights under any layout) up to
this size; larger random models use megatron's faster per-shard init."""

LossFn = Callable[[torch.Tensor, "torch.Tensor | None", dict], "tuple[torch.Tensor, dict]"]


def vocab_parallel_logprobs(
    logits: torch.Tensor, target: torch.Tensor, *, vocab: int, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and entropy from vocab-sharded logits ``[..., V/tp]`` (differentiable).

    log p = z_t - log sum_v exp z_v, entropy = log Z - sum_v p_v z_v, with each sum over the TP
    shards done by megatron's reduce (all-reduce forward, identity backward: the loss is
    replicated on every TP rank). Columns past ``vocab`` (TP padding) are masked out.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as tp_sum

    tp = ps.get_tensor_model_parallel_world_size()
    vl = logits.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * vl
    logits = logits.float()
    if start + vl > vocab:
        pad = torch.arange(start, start + vl, device=logits.device) >= vocab
        logits = logits.masked_fill(pad, float("-inf"))
    with torch.no_grad():
        m = logits.max(-1, keepdim=True).values
        if tp > 1:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    z = logits - m
    e = z.exp()
    sumexp = tp_sum(e.sum(-1))
    log_z = sumexp.log()
    local_t = target - start
    ok = (local_t >= 0) & (local_t < vl)
    picked = z.gather(-1, local_t.clamp(0, vl - 1).unsqueeze(-1)).squeeze(-1)
    picked = tp_sum(torch.where(ok, picked, torch.zeros_like(picked)))
    logp = picked - log_z
    ent = None
    if with_entropy:
        pz = torch.where(e > 0, e * z, torch.zeros_like(z)).sum(-1)  # exp(-inf) * -inf is nan
        ent = log_z - tp_sum(pz) / sumexp
    return logp, ent


class Engine:
    """The actor (``trainable=True``: DDP + distributed optimizer) or a frozen reference model."""

    def __init__(self, cfg: RunConfig, *, trainable: bool = True, init_weights: bool = True):
        from megatron.core import parallel_state as ps

        if not ps.model_parallel_is_initialized():
            raise RuntimeError("call trainer.parallel.init(cfg) before building an Engine")
        self.cfg = cfg
        self.spec = cfg.model
        self.strategy = cfg.strategy
        self.trainable = trainable
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        t = cfg.trainer
        self.config = tmodel.transformer_config(
            self.spec,
            self.strategy,
            dtype=cfg.workload.dtype,
            aux_loss_coeff=t.moe_aux_loss_coeff if trainable else 0.0,
            load_balancing_type=t.moe_router_load_balancing_type,
        )
        self.dtype = self.config.params_dtype
        chunks = tmodel.build_chunks(self.spec, self.strategy, self.config)
        if init_weights:
            if cfg.trainer.hf_checkpoint:
                hf.load_hf(chunks, self.spec, cfg.trainer.hf_checkpoint)
            elif total_params(self.spec) <= LAYOUT_FREE_INIT_MAX_PARAMS:
                hf.init_random(chunks, self.spec, cfg.trainer.seed)
            # else: megatron's own (per-layout, on-device) init, done while building: a random
            # large model only serves profiling, where drawing full tensors per rank costs minutes.
        if self.dtype != torch.float32:
            from megatron.core.transformer.module import Float16Module

            chunks = [Float16Module(self.config, c) for c in chunks]
        self.optimizer = None
        if trainable:
            chunks = optim.wrap_ddp(chunks, self.config, self.strategy)
            self.optimizer = optim.build_optimizer(chunks, self.config, cfg.trainer, self.strategy, self.dtype)
        else:
            for c in chunks:
                c.requires_grad_(False)
                c.eval()
        self.chunks = chunks

    # --- helpers ----------------------------------------------------------------------------

    @property
    def layout(self):
        from . import parallel

        return parallel.layout()

    def param_count(self) -> int:
        """Parameters held by this rank (shards), summed over its virtual-pipeline chunks."""
        return tmodel.local_param_count(self.chunks)

    def _pad_seq(self, tokens: torch.Tensor) -> torch.Tensor:
        """Pad the sequence to a multiple of TP (sequence parallel splits it) and 2*CP."""
        s = self.strategy
        mult = (s.layout.tp if s.layout.sp else 1) * (2 * s.layout.cp if s.layout.cp > 1 else 1)
        S = tokens.shape[1]
        pad = (-S) % mult
        if pad:
            tokens = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], pad)], 1)
        return tokens

    def _contributes(self) -> bool:
        """One rank per DP replica holds the final answer: last stage, TP rank 0, CP rank 0."""
        from megatron.core import parallel_state as ps

        return (
            ps.is_pipeline_last_stage(ignore_virtual=True)
            and ps.get_tensor_model_parallel_rank() == 0
            and ps.get_context_parallel_rank() == 0
        )

    def _split(self, batch: dict, mbs: int, *, pad_ok: bool):
        """This DP rank's rows in micro-batches of ``mbs`` rows (:func:`microbatch.split_rows`)."""
        from megatron.core import parallel_state as ps

        dp, rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        return microbatch.split_rows(batch, mbs, dp=dp, rank=rank, s=self.strategy, device=self.device, pad_ok=pad_ok)

    def _split_budget(self, batch: dict, lengths: torch.Tensor, max_tokens: int, *, pad_ok: bool, width: int):
        """This DP rank's rows in token-budget micro-batches (:func:`microbatch.split_budget`)."""
        from megatron.core import parallel_state as ps

        return microbatch.split_budget(
            batch,
            lengths,
            max_tokens,
            dp=ps.get_data_parallel_world_size(),
            rank=ps.get_data_parallel_rank(),
            dp_group=ps.get_data_parallel_group(),
            s=self.strategy,
            device=self.device,
            thd=self.thd_packing,
            pad_ok=pad_ok,
            width=width,
        )

    def _padded_rows(self, B: int, mbs: int) -> int:
        return microbatch.padded_rows(B, mbs, self._dp(), self.strategy)

    def _run(
        self,
        micro_batches: list[dict],
        loss_func,
        *,
        forward_only: bool,
        seq_len: int,
        mbs: int,
        variable: bool = False,
    ):
        from megatron.core.pipeline_parallel import get_forward_backward_func

        # micro-batches of different shapes: pipeline stages send each tensor's shape first
        self.config.variable_seq_lengths = variable

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            tokens = mb["tokens"]
            kv = mb.get("_kv")
            if "_lens" in mb:  # token-budget micro-batch, THD-packed (TransformerEngine on a GPU)
                out = self._thd_forward(model, mb)
            elif kv is None:
                pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
                out = model(tokens, pos, attention_mask=None)
            else:  # a KV-cached decoding step: this micro-batch's rows and positions in the cache
                ctx, ctx.batch_size_offset, ctx.sequence_len_offset = kv
                pos = torch.arange(kv[2], kv[2] + tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
                out = model(tokens, pos, attention_mask=None, inference_context=ctx, runtime_gather_output=True)
            return out, partial(loss_func, mb)

        iters = [iter(micro_batches) for _ in self.chunks]
        fb = get_forward_backward_func()
        ctx = torch.no_grad() if forward_only else nullcontext()  # forward_only keeps autograd on
        with ctx:
            return fb(
                forward_step_func=forward_step,
                data_iterator=iters if len(iters) > 1 else iters[0],
                model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
                num_microbatches=len(micro_batches),
                seq_length=seq_len,
                micro_batch_size=mbs,
                forward_only=forward_only,
            )

    @property
    def thd_packing(self) -> bool:
        """Token-budget micro-batches run as one packed THD row: needs TransformerEngine's
        attention (a GPU with TE); megatron's local attention refuses ``packed_seq_params``."""
        return tmodel.use_transformer_engine() and self.strategy.layout.cp == 1

    def _thd_forward(self, model, mb: dict):
        """Forward a micro-batch as one packed row (its sequences back to back, positions restarting
        at 0, ``cu_seqlens`` from :func:`microbatch.packed_seq_params`); the last stage's logits are put back
        into the padded ``[b, L, V/tp]`` layout, so the loss functions see what they see unpacked."""
        rows, lens = mb["tokens"], list(mb["_lens"])
        flat = torch.cat([rows[i, :n] for i, n in enumerate(lens)])
        mult = self.strategy.layout.tp if self.strategy.layout.sp else 1
        pad = (-flat.numel()) % mult
        if pad:  # sequence parallel splits the packed row over TP: the last sequence absorbs the pad
            flat = torch.cat([flat, flat.new_zeros(pad)])
        cu_lens = lens[:-1] + [lens[-1] + pad]
        pos = torch.cat([torch.arange(n, device=flat.device) for n in cu_lens])
        thd = microbatch.packed_seq_params(cu_lens, self.device)
        out = model(flat[None], pos[None], attention_mask=None, packed_seq_params=thd)
        if not getattr(hf._unwrap(model), "post_process", False):
            return out  # hidden states for the next stage (shapes travel with variable_seq_lengths)
        full = out.new_zeros(rows.shape[0], rows.shape[1], out.shape[-1])
        off = 0
        for i, n in enumerate(lens):
            full[i, :n] = out[0, off : off + n]
            off += n
        return full

    # --- forward-only -----------------------------------------------------------------------

    def logprobs(
        self,
        tokens: torch.Tensor,
        *,
        micro_batch_size: int,
        with_entropy: bool = False,
        temperature: float = 1.0,
        max_tokens: int | None = None,
        lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log p(tokens[:, 1:]) ``[B, S-1]`` (fp32) and optionally the entropy of each
        next-token distribution ``[B, S-1]``, computed under no_grad through the pipeline; the
        result is on every rank (CPU tensors). With ``max_tokens`` the rows (real ``lengths``) are
        packed into token-budget micro-batches instead of ``micro_batch_size`` rows each; positions
        past a row's length hold whatever the padding gave (callers mask them, as with ``mbs``)."""
        B, S = tokens.shape
        padded = self._pad_seq(tokens.long())
        Sp = padded.shape[1]
        if max_tokens:
            return self._logprobs_budget(padded, B, S, max_tokens, lengths, with_entropy, temperature)
        mbs, lo, hi = self._split({"tokens": padded}, micro_batch_size, pad_ok=True)
        self.last_logprob_micro_batches = len(mbs)  # per DP rank (reported by the loop)
        loss_func = self._logprob_loss(with_entropy, temperature)
        out = self._run(mbs, loss_func, forward_only=True, seq_len=Sp, mbs=micro_batch_size)
        full = torch.zeros(2 if with_entropy else 1, self._padded_rows(B, micro_batch_size), Sp - 1, device=self.device)
        if self._contributes():
            rows = torch.cat([d["logprobs"].float() for d in out], 0)
            full[0, lo:hi] = rows
            if with_entropy:
                full[1, lo:hi] = torch.cat([d["entropy"].float() for d in out], 0)
        self._world_sum(full)
        full = full[:, :B, : S - 1].cpu()
        return full[0], (full[1] if with_entropy else None)

    def _logprob_loss(self, with_entropy: bool, temperature: float):
        """A forward-only "loss" that hands back each micro-batch's log-probs (and entropy)."""

        def loss_func(mb, logits):
            lp, ent = vocab_parallel_logprobs(
                logits[:, :-1] / temperature, mb["tokens"][:, 1:], vocab=self.spec.vocab, with_entropy=with_entropy
            )
            return logits.new_zeros(()), {"logprobs": lp, "entropy": ent}

        return loss_func

    def _logprobs_budget(self, padded, B, S, max_tokens, lengths, with_entropy, temperature):
        Sp = padded.shape[1]
        lengths = torch.full((B,), S, dtype=torch.long) if lengths is None else torch.as_tensor(lengths).long()
        micro, _, _ = self._split_budget({"tokens": padded}, lengths, max_tokens, pad_ok=True, width=S)
        self.last_logprob_micro_batches = len(micro)
        loss_func = self._logprob_loss(with_entropy, temperature)
        uniform = self.strategy.layout.vpp > 1
        out = self._run(
            micro,
            loss_func,
            forward_only=True,
            seq_len=Sp,
            mbs=micro[0]["tokens"].shape[0] if uniform else 1,
            variable=not uniform,
        )
        rows_total = B + (-B) % max(1, self._dp())
        full = torch.zeros(2 if with_entropy else 1, rows_total, Sp - 1, device=self.device)
        if self._contributes():
            for mb, d in zip(micro, out):
                if mb["_dummy"]:
                    continue
                idx = torch.tensor(mb["_rows"], dtype=torch.long, device=self.device)
                n, w = len(mb["_rows"]), d["logprobs"].shape[1]
                full[0, idx, :w] = d["logprobs"][:n].float()
                if with_entropy:
                    full[1, idx, :w] = d["entropy"][:n].float()
        self._world_sum(full)
        full = full[:, :B, : S - 1].cpu()
        return full[0], (full[1] if with_entropy else None)

    def _dp(self) -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_world_size()

    def _world_sum(self, t: torch.Tensor) -> None:
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(t)

    # --- KV-cached decoding -------------------------------------------------------------------

    @contextmanager
    def kv_session(self, batch: int, max_len: int, *, micro_batch_size: int | None = None):
        """A KV cache for ``batch`` rows of up to ``max_len`` tokens: megatron-core's static
        inference context on this rank's rows (DP splits them, micro-batches use
        ``batch_size_offset``), with the training model in eval mode and sequence parallel off
        (a decoding step has one token, which SP cannot split over TP ranks). Yields a callable
        ``step(tokens [B, T], start) -> logits [B, V]`` of the chunk's last position; chunks
        must be fed in order, ``start`` being the position of the chunk's first token."""
        from megatron.core import parallel_state as ps
        from megatron.core.inference.contexts import StaticInferenceContext

        mbs = micro_batch_size or max(1, -(-batch // (ps.get_data_parallel_world_size() * self.strategy.layout.pp)))
        rows = self._padded_rows(batch, mbs) // ps.get_data_parallel_world_size()
        ctx = StaticInferenceContext(max_batch_size=rows, max_sequence_length=max_len)
        flipped = []
        for c in self.chunks:
            for mod in c.modules():
                for attr in ("sequence_parallel", "reduce_scatter_embeddings"):
                    if getattr(mod, attr, None) is True:
                        setattr(mod, attr, False)
                        flipped.append((mod, attr))
        sp, self.config.sequence_parallel = self.config.sequence_parallel, False
        modes = [c.training for c in self.chunks]
        for c in self.chunks:
            c.eval()
        try:
            yield lambda tokens, start: self._kv_step(ctx, tokens, start, mbs)
        finally:
            self.config.sequence_parallel = sp
            for mod, attr in flipped:
                setattr(mod, attr, True)
            for c, m in zip(self.chunks, modes):
                c.train(m)

    def _kv_step(self, ctx, tokens: torch.Tensor, start: int, mbs: int) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        B, T = tokens.shape
        micro, lo, hi = self._split({"tokens": tokens.long()}, mbs, pad_ok=True)
        for i, mb in enumerate(micro):
            mb["_kv"] = (ctx, i * mbs, start)

        def loss_func(mb, logits):
            return logits.new_zeros(()), {"logits": logits[:, -1].float()}

        out = self._run(micro, loss_func, forward_only=True, seq_len=T, mbs=mbs, variable=True)
        # inference gathers the TP logits: every TP rank holds the whole (padded) vocabulary
        full = torch.zeros(
            self._padded_rows(B, mbs),
            padded_vocab(self.spec, ps.get_tensor_model_parallel_world_size()),
            device=self.device,
        )
        if self._contributes():
            full[lo:hi] = torch.cat([d["logits"] for d in out], 0)
        self._world_sum(full)
        return full[:B, : self.spec.vocab].cpu()

    def next_token_logits(
        self, tokens: torch.Tensor, lengths: torch.Tensor | list[int], *, micro_batch_size: int | None = None
    ) -> torch.Tensor:
        """Full-vocabulary logits ``[B, V]`` (fp32, CPU) of the token after ``tokens[b, :lengths[b]]``,
        on every rank. ``tokens`` is right-padded; the causal mask makes the padding irrelevant.
        Recomputes the whole prefix (no KV cache): meant for the CPU sampler and small models."""
        from megatron.core import parallel_state as ps

        B, S = tokens.shape
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        # one micro-batch per pipeline stage and DP rank keeps every stage busy
        mbs = micro_batch_size or max(1, -(-B // (ps.get_data_parallel_world_size() * self.strategy.layout.pp)))
        padded = self._pad_seq(tokens.long())
        Sp = padded.shape[1]
        micro, lo, hi = self._split({"tokens": padded, "last": lengths - 1}, mbs, pad_ok=True)
        V = self.spec.vocab

        def loss_func(mb, logits):
            rows = torch.arange(logits.shape[0], device=logits.device)
            return logits.new_zeros(()), {"logits": logits[rows, mb["last"].to(logits.device)].float()}

        out = self._run(micro, loss_func, forward_only=True, seq_len=Sp, mbs=mbs)
        tp = ps.get_tensor_model_parallel_world_size()
        vl = padded_vocab(self.spec, tp) // tp
        full = torch.zeros(self._padded_rows(B, mbs), vl * tp, device=self.device)
        if ps.is_pipeline_last_stage(ignore_virtual=True) and ps.get_context_parallel_rank() == 0:
            r = ps.get_tensor_model_parallel_rank()
            full[lo:hi, r * vl : (r + 1) * vl] = torch.cat([d["logits"] for d in out], 0)
        self._world_sum(full)
        return full[:B, :V].cpu()

    # --- training -----------------------------------------------------------------------------

    def train_step(
        self,
        batch: dict[str, torch.Tensor],
        loss_fn: LossFn,
        *,
        micro_batch_size: int,
        with_entropy: bool = False,
        temperature: float = 1.0,
        max_tokens: int | None = None,
        lengths: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """One optimizer step over one mini-batch.

        ``batch["tokens"]`` is ``[B, S]`` (the whole mini-batch, on every rank); other tensors with
        leading dim B travel with their rows. For each micro-batch the last stage calls
        ``loss_fn(logprobs [b, S-1], entropy [b, S-1] | None, micro_batch) -> (loss, metrics)``;
        ``micro_batch["_scale_ctx"]`` is ``{"micro_batches": n_global, "rows": b}``. Returns the
        mean of ``loss`` and of each metric over micro-batches and DP ranks, plus ``grad_norm``
        and ``update_ok``, on every rank.

        With ``max_tokens`` (verl's ``use_dynamic_bsz``) the rows, of real ``lengths`` (default:
        all ``S``), are packed into token-budget micro-batches (:meth:`_split_budget`); the
        logprobs a micro-batch's ``loss_fn`` sees are then ``[b, L-1]`` with L its longest row,
        and every ``[B, S-1]`` tensor of the batch is cut the same way.
        """
        from megatron.core import parallel_state as ps

        if not self.trainable:
            raise RuntimeError("train_step on a frozen (reference) engine")
        B, S = batch["tokens"].shape
        batch = dict(batch, tokens=self._pad_seq(batch["tokens"].long()))
        Sp = batch["tokens"].shape[1]
        if max_tokens:
            lengths = torch.full((B,), S, dtype=torch.long) if lengths is None else torch.as_tensor(lengths).long()
            micro, _, _ = self._split_budget(batch, lengths, max_tokens, pad_ok=False, width=S)
        else:
            micro, _, _ = self._split(batch, micro_batch_size, pad_ok=False)
        n_global = len(micro) * ps.get_data_parallel_world_size()
        self.last_micro_batches = len(micro)  # per DP rank (reported by the loop)
        for mb in micro:
            mb["_scale_ctx"] = {"micro_batches": n_global, "rows": mb["tokens"].shape[0]}

        def loss_func(mb, logits):
            t = mb["tokens"]
            L = mb.get("_len", S)
            lp, ent = vocab_parallel_logprobs(
                logits[:, : L - 1] / temperature, t[:, 1:L], vocab=self.spec.vocab, with_entropy=with_entropy
            )
            loss, metrics = loss_fn(lp, ent, mb)
            if mb.get("_dummy"):  # a filler micro-batch: runs the schedule, adds nothing
                loss = loss * 0.0
                metrics = {k: 0.0 for k in (metrics or {})}
            rep = {"loss": float(loss.detach())}
            rep.update({k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in (metrics or {}).items()})
            return loss, rep

        for c in self.chunks:
            c.zero_grad_buffer()
        self.optimizer.zero_grad()
        uniform = bool(max_tokens) and self.strategy.layout.vpp > 1  # one shape per micro-batch (_split_budget)
        out = self._run(
            micro,
            loss_func,
            forward_only=False,
            seq_len=Sp,
            mbs=micro[0]["tokens"].shape[0] if uniform else micro_batch_size,
            variable=bool(max_tokens) and not uniform,
        )
        ok, grad_norm, _ = self.optimizer.step()
        local = None
        if self._contributes():
            keys = out[0].keys() if out else []
            local = {k: sum(d[k] for d in out) / len(out) for k in keys}
        metrics = _mean_over_contributors(local)
        metrics["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        metrics["update_ok"] = float(bool(ok))
        return metrics

    # --- weights ------------------------------------------------------------------------------

    def named_parameters_for_export(self, dtype: torch.dtype | None = None):
        """(HF name, full tensor) for every weight, on every rank; a collective generator."""
        return hf.named_hf_tensors(self.chunks, self.spec, dtype)

    def load_hf_tensors(self, get: Callable[[str], torch.Tensor]) -> None:
        """Overwrite the weights from full HF tensors (``get(name)``), e.g. to sync a reference."""
        hf.load_into(self.chunks, self.spec, get)
        if self.optimizer is not None:
            self.optimizer.reload_model_params()

    def export_hf(self, path, *, dtype: torch.dtype = torch.float32):
        """Write a HF safetensors checkpoint (global rank 0 writes; all ranks must call)."""
        write = not dist.is_initialized() or dist.get_rank() == 0
        out = hf.save_hf(self.named_parameters_for_export(), self.spec, path, write=write, dtype=dtype)
        if dist.is_initialized():
            dist.barrier()
        return out

    def _inner_optimizers(self):
        return getattr(self.optimizer, "chained_optimizers", [self.optimizer])

    def state_dict(self) -> dict[str, Any]:
        """This rank's shards: model chunks and (actor) optimizer state incl. fp32 main params."""
        sd: dict[str, Any] = {"model": [c.state_dict() for c in self.chunks]}
        if self.optimizer is not None:
            opts = []
            for o in self._inner_optimizers():
                main = [[p.detach().clone() for p in g] for g in getattr(o, "shard_fp32_from_float16_groups", [])]
                opts.append({"inner": o.optimizer.state_dict(), "main": main})
            sd["optimizer"] = opts
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        with torch.no_grad():
            for c, s in zip(self.chunks, sd["model"]):
                c.load_state_dict(s, strict=True)
        if self.optimizer is not None and "optimizer" in sd:
            for o, s in zip(self._inner_optimizers(), sd["optimizer"]):
                o.optimizer.load_state_dict(s["inner"])
                for g, sg in zip(getattr(o, "shard_fp32_from_float16_groups", []), s["main"]):
                    for p, v in zip(g, sg):
                        p.data.copy_(v)
            if not sd["optimizer"] or not sd["optimizer"][0]["main"]:
                self.optimizer.reload_model_params()


def _mean_over_contributors(local: dict[str, float] | None) -> dict[str, float]:
    """Average dicts held by some ranks (None elsewhere); every rank gets the result."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return dict(local or {})
    objs: list = [None] * dist.get_world_size()
    dist.all_gather_object(objs, local)
    got = [o for o in objs if o]
    if not got:
        return {}
    return {k: sum(o[k] for o in got) / len(got) for k in got[0]}
