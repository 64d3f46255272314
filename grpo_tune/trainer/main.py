"""The torchrun worker: ``python -m grpo_tune.trainer.main --config best.yaml [--steps N] [--out DIR] [...]``.

Started by ``grpo-tune train`` / ``grpo-tune profile`` through :mod:`trainer.launch`. Each rank
builds megatron's groups from the config, the actor (and reference) engines, the rollout engine and
the GRPO loop, resumes from the latest checkpoint in ``--out`` when there is one, and runs.

A failure is recorded per rank in ``<out>/failure.rank<R>.json`` (``status`` oom or error, and
the message) before the process exits with 3 (out of memory) or 4 (anything else), so the CLI can
tell an OOM from a crash even after torchrun has torn the other ranks down.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from .build import build
from .launch import EXIT_ERROR, EXIT_OOM, failure_path

if TYPE_CHECKING:  # annotations only
    from grpo_tune.core.config import RunConfig


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m grpo_tune.trainer.main", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", default=None, help="output folder (default: trainer.out_dir)")
    ap.add_argument("--no-resume", action="store_true", help="ignore checkpoints in --out")
    ap.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one key of the config"
    )
    ap.add_argument(
        "--profile-json", default=None, help="profile mode: synthetic workload, write the profile JSON here"
    )
    return ap.parse_args(argv)


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    msg = str(exc).lower()
    # torch's CPU allocator: "DefaultCPUAllocator: can't allocate memory"
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def load_config(args):
    from grpo_tune.core import config as run_config

    cfg = run_config.load(args.config, args.set)
    over = {}
    if args.steps is not None:
        over["steps"] = args.steps
    if args.out is not None:
        over["out_dir"] = args.out
    return cfg.replace(trainer=dataclasses.replace(cfg.trainer, **over)) if over else cfg


def train(cfg: RunConfig, *, resume: bool = True) -> list[dict]:
    from . import parallel

    if cfg.placement.separate:
        from . import separate

        return separate.train(cfg, resume=resume)
    parallel.init(cfg)
    loop, lay = build(cfg)
    done = loop.resume() if resume else 0
    if done and lay.rank == 0:
        print(f"resumed from the checkpoint after step {done}", flush=True)
    if lay.rank == 0:
        from .tracking import Tracking

        loop.tracker = Tracking(cfg, cfg.trainer.out_dir, start_step=done)
    try:
        hist = loop.run(cfg.trainer.steps)
    finally:
        if loop.tracker is not None:
            loop.tracker.close()
        close = getattr(loop.rollout, "close", None)
        if callable(close):  # vLLM: its engine and groups go before torch's (teardown)
            close()
    return hist


def die_with_parent() -> None:
    """Linux: SIGKILL this worker when torchrun dies (even by SIGKILL), so no worker outlives its launch.

    torchrun starts each worker in a session of its own, out of reach of a kill of the launcher's
    process group; prctl(PR_SET_PDEATHSIG) closes that gap.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(EXIT_ERROR)
    except (OSError, AttributeError):
        pass


FALLBACK_WARNING = r"(Transformer Engine and )?Apex (is|are) not installed"
"""megatron-core's import-time UserWarnings when Apex / Transformer Engine are absent (five of them, on
every rank): the fallbacks are PyTorch's own, the normal case on CPU."""


def quiet_fallback_warnings(rank: int) -> None:
    """Silence megatron-core's Apex/Transformer Engine fallback warnings and say it once, on rank 0."""
    import importlib.util
    import warnings

    warnings.filterwarnings("ignore", message=FALLBACK_WARNING, category=UserWarning)
    missing = [m for m in ("apex", "transformer_engine") if importlib.util.find_spec(m) is None]
    if rank == 0 and missing:
        print(
            f"[trainer] {' and '.join(missing)} not installed: megatron-core uses its PyTorch fallbacks "
            "(norms, optimizer kernels); expected on CPU",
            flush=True,
        )


def teardown() -> None:
    """Leave together and close the process groups before the interpreter exits. Without it,
    gloo's threads can be torn down at exit while a peer is already gone, and the process aborts
    ("terminate called without an active exception", seen once in CI)."""
    import torch.distributed as dist

    from . import parallel

    if dist.is_initialized():
        dist.barrier()
    parallel.destroy()


def main(argv=None) -> int:
    die_with_parent()
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    quiet_fallback_warnings(rank)
    out = Path(args.out) if args.out else None
    try:
        cfg = load_config(args)
        out = Path(cfg.trainer.out_dir)
        if args.profile_json:
            from .profile import run_profile

            run_profile(cfg, args.profile_json, config_path=args.config)
        else:
            train(cfg, resume=not args.no_resume)
        teardown()
        return 0
    except BaseException as exc:  # record why, then exit with the contract's code
        if isinstance(exc, KeyboardInterrupt):
            raise
        oom = is_oom(exc)
        from grpo_tune.core.errors import GrpoTuneError

        from .launch import classify_failure

        kind, why = classify_failure(exc)
        if kind is not None:
            msg = why
        elif isinstance(exc, GrpoTuneError):
            msg = f"[{exc.code}] {exc.message}"
        else:
            msg = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        if out is not None:
            rec = {"status": "oom" if oom else "error", "message": msg, "rank": rank, "kind": kind}
            try:
                from grpo_tune.core.config import atomic_write

                atomic_write(failure_path(out, rank), json.dumps(rec))
            except OSError:  # the disk is full: say it on stderr (train.log may be full too), one line
                print(f"[grpo-tune failure] {json.dumps(rec)}", file=sys.stderr, flush=True)
        return EXIT_OOM if oom else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
