"""Sharded, atomic checkpoints: every rank saves its own shard, and ``latest.json`` moves last.

Layout under ``<out_dir>/checkpoints``::

    step_00000010/rank_00000.pt ...   one file per rank: model + optimizer shard, RNG, data position
    step_00000010/meta.json           written by rank 0 once every rank's file is on disk
    latest.json                       {"step", "world_size", "dir"}: replaced atomically, last

A reader trusts only ``latest.json``. Each shard is written to a temporary name, fsynced and renamed,
then all ranks meet at a barrier, and only then does rank 0 write ``meta.json`` and swing
``latest.json``. A run killed at any instant (kill -9 included) therefore leaves ``latest.json``
pointing at a complete checkpoint, or absent. Older checkpoints beyond ``keep`` are removed.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from core.errors import GrpoTuneError


def _err(msg: str, hint: str = "") -> GrpoTuneError:
    return GrpoTuneError(msg, hint, code="CHECKPOINT_ERROR")


def root(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "checkpoints"


def step_dir(out_dir: str | os.PathLike, step: int) -> Path:
    return root(out_dir) / f"step_{step:08d}"


def _atomic_bytes(path: Path, write: Callable[[Any], None]) -> None:
    """Write through ``write(fh)`` to a temporary file next to ``path``, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dfd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _atomic_json(path: Path, obj: dict) -> None:
    _atomic_bytes(path, lambda fh: fh.write((json.dumps(obj, indent=1) + "\n").encode()))


def rng_state() -> dict[str, Any]:
    """Every RNG a step may touch: Python, NumPy, torch CPU, CUDA, and megatron's CUDA tracker."""
    st: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
        try:
            from megatron.core import tensor_parallel

            st["megatron_tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
        except Exception:  # no tracker seeded (e.g. a test without megatron's groups)
            pass
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
    if "megatron_tracker" in st:
        from megatron.core import tensor_parallel

        tensor_parallel.get_cuda_rng_tracker().set_states(st["megatron_tracker"])


def save(out_dir: str | os.PathLike, step: int, state: dict[str, Any], *, rank: int, world_size: int,
         barrier: Callable[[], None] = lambda: None, keep: int = 2) -> Path:
    """Save this rank's ``state`` for ``step`` (collective: every rank calls it)."""
    d = step_dir(out_dir, step)
    try:
        _atomic_bytes(d / f"rank_{rank:05d}.pt", lambda fh: torch.save({**state, "rng": rng_state()}, fh))
    except OSError as exc:
        raise _err(f"cannot write checkpoint {d}: {exc}") from exc
    barrier()  # every shard is on disk before latest.json may point here
    if rank == 0:
        _atomic_json(d / "meta.json", {"step": step, "world_size": world_size})
        _atomic_json(root(out_dir) / "latest.json", {"step": step, "world_size": world_size, "dir": d.name})
        _prune(out_dir, keep, current=step)
    barrier()
    return d


def _prune(out_dir, keep: int, current: int) -> None:
    steps = sorted(int(p.name[5:]) for p in root(out_dir).glob("step_*") if p.name[5:].isdigit())
    for s in steps:
        if s < current and s not in steps[-keep:]:
            shutil.rmtree(step_dir(out_dir, s), ignore_errors=True)


def latest(out_dir: str | os.PathLike) -> dict | None:
    p = root(out_dir) / "latest.json"
    if not p.exists():
        return None
    try:
        meta = json.loads(p.read_text())
        int(meta["step"]), int(meta["world_size"])
        return meta
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _err(f"{p} is unreadable ({exc})", "delete the checkpoints folder to start over") from None


def load(out_dir: str | os.PathLike, *, rank: int, world_size: int, restore_rng: bool = True) -> tuple[int, dict] | None:
    """(step, this rank's state) of the latest complete checkpoint, or None when there is none."""
    meta = latest(out_dir)
    if meta is None:
        return None
    if int(meta["world_size"]) != world_size:
        raise _err(f"checkpoint written by {meta['world_size']} ranks, this run has {world_size}",
                   "resume with the same degrees")
    f = root(out_dir) / meta["dir"] / f"rank_{rank:05d}.pt"
    try:
        state = torch.load(f, map_location="cpu", weights_only=False)  # our own files: RNG tuples, numpy arrays
    except (OSError, RuntimeError, EOFError) as exc:
        raise _err(f"cannot read {f}: {exc}") from exc
    if restore_rng:
        set_rng_state(state["rng"])
    return int(meta["step"]), state
