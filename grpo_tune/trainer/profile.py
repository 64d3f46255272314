"""Profile mode: a short GRPO run on a synthetic workload at the config's lengths; writes the profile JSON.

The contract (read by autotune's refinement) is :class:`core.profile_report.ProfileReport`.

``step_s`` and each phase are medians over the steps after the first (the first pays one-off
costs: allocator warm-up, lazy initialisation). Peak memory is the allocator's peak on a GPU and
the peak resident set size on CPU (``peak_memory_bytes.kind`` says which; on CPU
``tensor_bytes_per_rank`` adds the bytes of the actor's parameters and optimizer state).
``peak_bytes_by_phase`` (max over steps and ranks) is, on a GPU, the CUDA allocator's peak within
each phase (peak statistics reset at the phase's start); on CPU, which has no allocator
statistics, the bytes of all live tensors at the phase's end (a gc scan outside the timed span):
not a peak, but what the phase left resident, which the memory model's per-phase figures bound.

The synthetic workload: ``prompts`` prompts of exactly ``prompt_len`` random token ids, and
responses of exactly ``response_len`` tokens (EOS is ignored), so the measured work is the
config's maximum; the reward is the share of even token ids in a response (any signal will do).
Only :func:`run_profile` imports torch; the writers below are used by the CLI too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_tune.core.phases import MEASURED_PHASES as PHASES  # noqa: F401 - named once, in core/phases.py; tests import it
from grpo_tune.core.profile_report import ProfileReport

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import RunConfig

    from .loop import Item


def result(
    status: str,
    *,
    message: str | None,
    config: str,
    steps: int,
    world_size: int,
    history: list[dict] = (),
    peak: dict | None = None,
    peak_bytes_by_phase: dict[str, int] | None = None,
) -> dict:
    """The profile JSON object (core/profile_report.py's ProfileReport); with no history (a failed run)
    the figures are null/empty."""
    return ProfileReport.from_history(
        status,
        message=message,
        config=config,
        steps=steps,
        world_size=world_size,
        history=history,
        peak=peak,
        peak_bytes_by_phase=peak_bytes_by_phase,
    ).to_dict()


def write(path: str | Path, obj: dict) -> None:
    from grpo_tune.core.config import atomic_write

    atomic_write(path, json.dumps(obj, indent=2) + "\n")


def synthetic_items(cfg: RunConfig, seed: int) -> list[Item]:
    """``prompts`` prompts of ``prompt_len`` ids drawn from the non-special part of the vocabulary."""
    import random

    from .loop import Item

    rng = random.Random(seed)
    lo = 4  # ids 0-3 are pad/specials in the byte tokenizer; harmless for HF vocabularies
    return [
        Item(prompt_ids=[rng.randrange(lo, cfg.model.vocab) for _ in range(cfg.workload.prompt_len)])
        for _ in range(cfg.workload.prompts)
    ]


def even_share_reward(item, ids) -> float:
    return sum(1 for i in ids if i % 2 == 0) / max(len(ids), 1)


class _NoEos:
    """The config's tokenizer with EOS disabled, so every response runs to ``response_len``."""

    def __init__(self, tok):
        self._tok = tok
        self.eos_id = -1

    def __getattr__(self, name):
        return getattr(self._tok, name)


def peak_memory(actor) -> dict:
    """This rank's peak: the CUDA allocator's, or the process's peak RSS plus live tensor bytes on CPU."""
    import resource

    import torch

    if torch.cuda.is_available():
        return {"bytes": int(torch.cuda.max_memory_allocated()), "kind": "cuda_max_allocated"}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB

    def tensor_bytes(obj) -> int:
        if torch.is_tensor(obj):
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(tensor_bytes(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(tensor_bytes(v) for v in obj)
        return 0

    return {"bytes": int(rss), "kind": "peak_rss", "tensor_bytes": tensor_bytes(actor.state_dict())}


def run_profile(cfg: RunConfig, json_path: str | Path, *, config_path: str | Path = "") -> dict:
    """Run ``cfg.trainer.steps`` GRPO steps on the synthetic workload and write the JSON (rank 0)."""
    import dataclasses
    import tempfile

    import torch
    import torch.distributed as dist

    from . import parallel
    from .build import build
    from .tokenizer import load_tokenizer

    t = cfg.trainer
    # No checkpoints; metrics go to a scratch folder unless the caller chose --out.
    scratch = tempfile.mkdtemp(prefix="grpo-profile-") if t.out_dir == "runs/train" else t.out_dir
    cfg = cfg.replace(trainer=dataclasses.replace(t, out_dir=scratch))
    lay = parallel.init(cfg)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    tok = _NoEos(load_tokenizer(cfg.model, t.hf_checkpoint))
    loop, lay = build(
        cfg, items=synthetic_items(cfg, t.seed), reward_fn=even_share_reward, tokenizer=tok, checkpoint_every=0
    )
    loop.track_memory = True
    hist = loop.run(t.steps)
    mine = peak_memory(loop.actor)
    by_phase: dict[str, int] = {}
    for h in hist:
        for ph, b in (h.get("phase_memory_bytes") or {}).items():
            by_phase[ph] = max(by_phase.get(ph, 0), int(b))
    if torch.cuda.is_available() and by_phase:  # the phase timer reset the allocator's peak per phase
        mine["bytes"] = max(mine["bytes"], *by_phase.values())
    mine["phases"] = by_phase
    peaks: list = [None] * lay.world_size
    if dist.is_initialized() and lay.world_size > 1:
        dist.all_gather_object(peaks, mine)
    else:
        peaks = [mine]
    peak = {"per_rank": [p["bytes"] for p in peaks], "max": max(p["bytes"] for p in peaks), "kind": peaks[0]["kind"]}
    if "tensor_bytes" in peaks[0]:
        peak["tensor_bytes_per_rank"] = [p["tensor_bytes"] for p in peaks]
    phases = {ph: max(p["phases"].get(ph, 0) for p in peaks) for ph in PHASES if any(ph in p["phases"] for p in peaks)}
    out = result(
        "ok",
        message=None,
        config=str(config_path),
        steps=t.steps,
        world_size=lay.world_size,
        history=hist,
        peak=peak,
        peak_bytes_by_phase={str(k): v for k, v in phases.items()},
    )
    if lay.rank == 0:
        write(json_path, out)
    return out
