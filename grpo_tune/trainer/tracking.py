"""Where a training run's metrics go, under verl's names: TensorBoard (always, when installed), wandb
(when installed and ``trainer.wandb_project`` is set), next to ``metrics.jsonl``.

verl 0.9.1 names its per-step metrics ``actor/pg_loss``, ``critic/rewards/mean``, ``timing_s/gen``,
``response_length/mean``, ``perf/throughput`` ... (``verl/trainer/ppo/metric_utils.py``,
``ray_trainer.py``); :func:`verl_metrics` maps one step of the GRPO loop onto those names, so a verl
user's dashboards and scripts read a grpo-tune run unchanged. Only global rank 0 writes.

TensorBoard events go to ``<out>/tensorboard/`` (``tensorboard --logdir <out>/tensorboard``). A resumed
run opens its writer with ``purge_step`` at the first replayed step, so TensorBoard drops what the
killed run logged after its last checkpoint, as the trainer does with ``metrics.jsonl``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import RunConfig

# our step record's key -> verl's name (the same figure)
_SCALARS = {
    "pg_loss": "actor/pg_loss",
    "kl": "actor/kl_loss",
    "entropy": "actor/entropy",
    "clip_frac": "actor/pg_clipfrac",
    "approx_kl": "actor/ppo_kl",
    "grad_norm": "actor/grad_norm",
    "loss": "actor/loss",
    "reward_mean": "critic/rewards/mean",
    "response_len": "response_length/mean",
    "response_len_max": "response_length/max",
    "step_s": "timing_s/step",
    "tokens": "perf/total_num_tokens",
    "tokens_per_s_per_gpu": "perf/throughput",
    # the rollout engine's log-probs against the trainer's (verl/utils/debug/metrics.py, calculate_debug_metrics)
    "rollout_probs_diff_mean": "training/rollout_probs_diff_mean",
    "rollout_probs_diff_max": "training/rollout_probs_diff_max",
    "rollout_probs_diff_std": "training/rollout_probs_diff_std",
    "rollout_actor_probs_pearson_corr": "training/rollout_actor_probs_pearson_corr",
    # ours (verl has no name for them): the log-prob form of the same mismatch, and the policy version
    "rollout_logprob_diff_mean": "training/rollout_logprob_diff_mean",
    "rollout_logprob_diff_max": "training/rollout_logprob_diff_max",
    "weight_version": "training/weight_version",
}
# our phase -> verl's timer (timing_s/*)
_TIMERS = {
    "rollout": "timing_s/gen",
    "weight_sync": "timing_s/update_weights",
    "old_logprob": "timing_s/old_log_prob",
    "ref_logprob": "timing_s/ref",
    "update": "timing_s/update_actor",
}


def verl_metrics(m: dict[str, Any]) -> dict[str, float]:
    """One step's metrics (``GRPOLoop.step``) under verl's names; missing or non-finite values are left out."""
    out: dict[str, float] = {}
    for ours, theirs in _SCALARS.items():
        v = m.get(ours)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[theirs] = float(v)
    if "critic/rewards/mean" in out:
        out["critic/score/mean"] = out["critic/rewards/mean"]  # verl logs the raw score and the reward; here one
    if "training/rollout_probs_diff_mean" in out:
        out["training/rollout_probs_diff_valid"] = 1.0
    if "timing_s/step" in out:
        out["perf/time_per_step"] = out["timing_s/step"]
    for ph, theirs in _TIMERS.items():
        v = (m.get("phases_s") or {}).get(ph)
        if ph == "ref_logprob" and not v:
            continue  # no reference model (no KL): verl has no timing_s/ref then either
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[theirs] = float(v)
    return out


class Tracking:
    """TensorBoard and, when asked for, wandb; ``log`` takes verl-named scalars of one step."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, *, start_step: int = 0):
        from grpo_tune.core.errors import try_import

        t = cfg.trainer
        self.tb = None
        self.wandb = None
        if t.tensorboard:
            try_import("tensorboard", "train")  # SummaryWriter needs the tensorboard package
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(
                log_dir=str(Path(out_dir) / "tensorboard"), purge_step=start_step + 1 if start_step else None
            )
        if t.wandb_project:
            try:
                import wandb
            except ImportError:
                from grpo_tune.core.errors import MissingDependencyError

                raise MissingDependencyError(
                    f"trainer.wandb_project is {t.wandb_project!r} but wandb is not installed",
                    hint="pip install wandb (and `wandb login`), or drop trainer.wandb_project",
                ) from None
            self.wandb = wandb
            self.wandb.init(
                project=t.wandb_project,
                name=Path(out_dir).name,
                dir=str(out_dir),
                config=cfg.to_dict(),
                resume="allow",
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, global_step=step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
