"""GRPO as pure tensor functions: advantages, clipped policy loss, KL, entropy, aggregation.

The variant implemented, stated exactly (it follows verl's ``core_algos`` defaults):

* Outcome-reward GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, sec. 4.1.2): one scalar
  reward per response; the advantage of every token of response i in group g is
  ``(r_i - mean_g) / (std_g + eps)`` with the *unbiased* (n-1) standard deviation, as verl does,
  or ``r_i - mean_g`` when std normalization is off (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).
  A group of one gets advantage ``r_i`` (verl: mean 0, std 1).
* PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7) per token, with an
  optional asymmetric upper bound ("clip-higher", DAPO, Yu et al. 2025, arXiv:2503.14476 sec. 3.1)
  and optional dual-clip for negative advantages (Ye et al. 2020, arXiv:1912.09729).
* The KL term is a *loss* against the frozen reference (GRPO eq. 3-4, verl ``use_kl_loss``), not a
  reward penalty; estimators k1/k2/k3 from Schulman, "Approximating KL Divergence" (2020); the
  paper's estimator is k3.
* Departure from the paper: the GRPO paper averages per sequence, then over the group
  (``seq-mean-token-mean``); the default here is verl's ``token-mean``.
* An entropy bonus is subtracted: ``loss = pg + kl_coef * kl - entropy_coef * entropy``.

Tensors: ``logprobs``/``old_logprobs``/``ref_logprobs``/``mask`` are [B, T] over the same token
positions (padding and prompt positions have mask 0); rewards and sequence advantages are [B].

Micro-batches and DP: with ``num_tokens``/``num_seqs`` left None each aggregate is the mean over
the tensors given. Pass the *mini-batch's* totals (summed over all micro-batches and DP ranks)
and each returned value becomes a partial sum whose sum over micro-batches and ranks is exactly
the mini-batch mean, independent of how the batch was split. The caller must then undo any
averaging its schedule applies (Megatron divides by the number of micro-batches, DDP by DP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from grpo_tune.core.choices import KlType, LossAgg
from grpo_tune.core.errors import ConfigError

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import TrainerOptions

LOSS_AGG_MODES = LossAgg.values()  # named once, in core/choices.py
KL_TYPES = KlType.values()


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages, one per response: FloatTensor[N] from rewards[N].

    Responses ``g*G .. g*G+G-1`` form group g (the caller repeats each prompt G times in a row).
    ``(r - mean) / (std + eps)`` with the unbiased std when ``norm_by_std``, else ``r - mean``;
    groups of size 1 use mean 0 and std 1 (verl's convention).
    """
    r = rewards.detach().float().reshape(-1)
    if group_size < 1 or r.numel() % group_size:
        raise ValueError(f"{r.numel()} rewards do not split into groups of {group_size}")
    g = r.view(-1, group_size)
    if group_size == 1:
        mean, std = torch.zeros_like(g), torch.ones_like(g)
    else:
        mean, std = g.mean(dim=1, keepdim=True), g.std(dim=1, keepdim=True)  # std: Bessel-corrected
    adv = (g - mean) / (std + eps) if norm_by_std else g - mean
    return adv.reshape(-1)


def agg_loss(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values[B, T]`` under ``mask`` to a scalar.

    * ``token-mean``: sum(values * mask) / num_tokens (default: mask.sum()); every token weighs the same.
    * ``seq-mean-token-mean``: each sequence's masked token mean, summed, / num_seqs (default: the
      number of rows with at least one masked-in token); every sequence weighs the same.
    * ``seq-mean-token-sum``: each sequence's masked token sum, summed, / num_seqs.
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else num_tokens
        return (values * mask).sum() / _clamp1(denom)
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        seq_sum = (values * mask).sum(dim=-1)
        tokens = mask.sum(dim=-1)
        per_seq = seq_sum / tokens.clamp(min=1) if mode == "seq-mean-token-mean" else seq_sum
        denom = (tokens > 0).sum() if num_seqs is None else num_seqs
        return per_seq.sum() / _clamp1(denom)
    raise ConfigError(f"unknown loss_agg_mode {mode!r}", hint=f"choose one of: {', '.join(LOSS_AGG_MODES)}")


def _clamp1(x):
    # an all-masked batch contributes 0, not NaN
    return x.clamp(min=1) if isinstance(x, torch.Tensor) else max(float(x), 1.0)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio: float,
    clip_ratio_high: float | None = None,
    loss_agg_mode: str = "token-mean",
    clip_ratio_c: float | None = None,
    num_tokens=None,
    num_seqs=None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO clipped policy-gradient loss (to minimize) and its metrics.

    Per token, with ``ratio = exp(logprobs - old_logprobs)`` (log-ratio clamped to [-20, 20] as
    verl does) and advantage A (``advantages`` is [B] per sequence or [B, T] per token)::

        loss_t = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio, 1 + clip_ratio_high))

    ``clip_ratio_high`` None means symmetric. With ``clip_ratio_c`` (> 1, verl uses 3) tokens with
    A < 0 use ``min(loss_t, -A * clip_ratio_c)`` (dual clip). Aggregated by :func:`agg_loss`.

    Metrics (detached scalars, normalized like the loss): ``pg_loss``, ``clip_frac`` (share of
    tokens where the clipped term is active), ``clip_frac_lower`` (dual clip active), ``approx_kl``
    (mean of ``old_logprobs - logprobs``, the k1 estimate of KL(old || new)).

    ``is_weights`` (off-policy samples, [B, T], detached): each token's clipped loss is multiplied by
    its importance weight pi_old / pi_behaviour, truncated (decoupled PPO: Fu et al., "AReaL", arXiv
    2505.24298, sec. 5; the truncation as verl's ``rollout_correction`` token-level TIS). None: 1.
    """
    hi = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ConfigError(f"clip_ratio_c must be > 1 (dual-clip bound), got {clip_ratio_c}")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio, 1.0 + hi)
    per_token = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).float()
    lower_active = torch.zeros_like(per_token)
    if clip_ratio_c is not None:
        bound = -adv * clip_ratio_c
        lower_active = ((per_token > bound) & (adv < 0)).float()
        per_token = torch.where(adv < 0, torch.minimum(per_token, bound), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights
    loss = agg_loss(per_token, mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    m = mask.to(per_token.dtype)
    tok = _clamp1(m.sum() if num_tokens is None else num_tokens)
    metrics = {
        "pg_loss": loss.detach(),
        "clip_frac": (clip_active * m).sum().detach() / tok,
        "clip_frac_lower": (lower_active * m).sum().detach() / tok,
        "approx_kl": (-log_ratio * m).sum().detach() / tok,
    }
    return loss, metrics


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

    With ``log_r = ref_logprobs - logprobs`` (r = pi_ref / pi):

    * ``k1`` / ``kl``: ``-log_r`` (unbiased, high variance, can be negative);
    * ``k2`` / ``mse``: ``0.5 * log_r**2`` (biased, low variance);
    * ``k3`` / ``low_var_kl``: ``r - 1 - log_r`` (unbiased, >= 0); as verl, log_r is clamped to
      [-20, 20] and the result to [-10, 10]; computed as ``expm1(log_r) - log_r`` so that float32
      rounding near r = 1 cannot make it negative (verl's ``exp(log_r) - 1 - log_r`` can, by ~1e-38);
    * ``abs``: ``|log_r|``.
    """
    log_r = ref_logprobs - logprobs
    if kind in ("k1", "kl"):
        return -log_r
    if kind in ("k2", "mse"):
        return 0.5 * log_r.square()
    if kind in ("k3", "low_var_kl"):
        log_r = log_r.clamp(-20.0, 20.0)
        return (torch.expm1(log_r) - log_r).clamp(-10.0, 10.0)  # expm1: exp(x)-1-x rounds below 0 near x=0
    if kind == "abs":
        return log_r.abs()
    raise ConfigError(f"unknown kl_type {kind!r}", hint=f"choose one of: {', '.join(KL_TYPES)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: ``logsumexp(z) - sum(softmax(z) * z)``."""
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position: logits[..., V], labels[...] -> [...]."""
    z = logits.float()
    return z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The knobs of :func:`actor_loss` (TrainerOptions carries them in a run config)."""

    clip_ratio: float = 0.2
    clip_ratio_high: float | None = None
    clip_ratio_c: float | None = None
    loss_agg_mode: str = "token-mean"
    kl_coef: float = 0.001
    kl_type: str = "low_var_kl"
    use_kl: bool = True
    """False: no reference model, the KL term is skipped (workload.kl)."""
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(
                f"unknown loss_agg_mode {self.loss_agg_mode!r}", hint=f"choose one of: {', '.join(LOSS_AGG_MODES)}"
            )
        if self.kl_type not in KL_TYPES:
            raise ConfigError(f"unknown kl_type {self.kl_type!r}", hint=f"choose one of: {', '.join(KL_TYPES)}")

    @classmethod
    def from_options(cls, trainer: TrainerOptions, *, use_kl: bool = True) -> LossConfig:
        """From an ``core.config.TrainerOptions`` (and ``workload.kl`` as ``use_kl``)."""
        return cls(
            clip_ratio=trainer.clip_ratio,
            clip_ratio_high=trainer.clip_ratio_high,
            clip_ratio_c=getattr(trainer, "clip_ratio_c", None),
            loss_agg_mode=trainer.loss_agg_mode,
            kl_coef=trainer.kl_coef,
            kl_type=trainer.kl_type,
            use_kl=use_kl,
            entropy_coef=trainer.entropy_coef,
        )


def actor_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    *,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
    num_tokens=None,
    num_seqs=None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """The GRPO actor loss ``pg + kl_coef * kl - entropy_coef * entropy`` and its metrics.

    Each term is aggregated with ``cfg.loss_agg_mode`` and the same normalizers (see module doc).
    ``ref_logprobs`` is required when ``cfg.use_kl`` and ``cfg.kl_coef > 0``; ``entropy`` when
    ``cfg.entropy_coef > 0`` (otherwise, if given, it is only reported). Metrics: those of
    :func:`policy_loss` plus ``kl``, ``entropy`` (when computed) and ``loss``.
    """
    loss, metrics = policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_ratio=cfg.clip_ratio,
        clip_ratio_high=cfg.clip_ratio_high,
        clip_ratio_c=cfg.clip_ratio_c,
        loss_agg_mode=cfg.loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        is_weights=is_weights,
    )
    agg = dict(mode=cfg.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    if cfg.use_kl and cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = agg_loss(kl_penalty(logprobs, ref_logprobs, cfg.kl_type), mask, **agg)
        loss = loss + cfg.kl_coef * kl
        metrics["kl"] = kl.detach()
    if entropy is not None:
        ent = agg_loss(entropy, mask, **agg)
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * ent
        metrics["entropy"] = ent.detach()
    elif cfg.entropy_coef > 0:
        raise ValueError("entropy_coef > 0 needs the entropy (logprobs(..., with_entropy=True))")
    metrics["loss"] = loss.detach()
    return loss, metrics


def truncated_is_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, threshold: float = 2.0
) -> tuple[torch.Tensor, dict]:
    """Per-token importance weights ``min(pi_old / pi_behaviour, threshold)`` (detached) and their metrics.

    Off-policy GRPO samples with an older policy (the behaviour policy, whose log-probs the rollout pool
    returns) and clips against the proximal policy (the training pool's weights before the update, the
    ``old_logprobs``): decoupled PPO (Fu et al., "AReaL: A Large-Scale Asynchronous Reinforcement Learning
    System for Language Reasoning", arXiv 2505.24298, sec. 5; Hilton et al. 2021) weights each token's clipped
    loss by pi_prox / pi_behaviour, truncated at ``threshold`` as verl's ``algorithm.rollout_correction``
    (``rollout_is: token``, ``rollout_is_threshold`` 2.0) does to bound the variance.
    When the behaviour log-probs are the rollout engine's own (vLLM returns them with each sampled token), the
    same weights also correct the engine/trainer mismatch: this is the truncated importance sampling (TIS) of
    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (the trainer's
    probability over the inference engine's, truncated at C), which verl implements as that token-level
    ``rollout_is``; separate pools at staleness >= 1 with ``rollout_engine: vllm`` use it so.
    Metrics: ``is_weight_mean``, ``is_weight_max`` (before truncation) and ``is_truncated_frac`` over the
    response tokens.
    """
    log_w = (old_logprobs - behaviour_logprobs).clamp(-20.0, 20.0).detach()
    w = torch.exp(log_w)
    m = mask.to(w.dtype)
    tok = _clamp1(m.sum())
    trunc = w.clamp(max=threshold)
    return trunc * m, {
        "is_weight_mean": float((trunc * m).sum() / tok),
        "is_weight_max": float((w * m).max()) if m.any() else 1.0,
        "is_truncated_frac": float(((w > threshold).to(w.dtype) * m).sum() / tok),
    }
