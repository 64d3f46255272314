"""Sharded, atomic checkpoints: every rank saves its own shard, and ``latest.json`` moves last.

Layout under ``<out_dir>/checkpoints``::

    step_00000010/rank_00000.pt ...   one file per rank: model + optimizer shard, RNG, data position
    step_00000010/meta.json           written by rank 0 once every rank's file is on disk
    latest.json                       {"step", "world_size", "dir"}: replaced atomically, last

A reader trusts only ``latest.json``, and only a ``dir`` that names a ``step_NNNNNNNN`` folder inside
the checkpoint folder. Shards load with ``torch.load(weights_only=True)`` (tensors and plain Python
values only: RNG states are stored as such). :func:`verify` checks every shard's zip records against
their CRC-32 before any worker starts, and names the corrupt shard and the last intact checkpoint. Each shard is written to a temporary name, fsynced and renamed,
then all ranks meet at a barrier, and only then does rank 0 write ``meta.json`` and swing
``latest.json``. A run killed at any instant (kill -9 included) therefore leaves ``latest.json``
pointing at a complete checkpoint, or absent. Older checkpoints beyond ``keep`` are removed.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any, Callable

from grpo_tune.core.errors import GrpoTuneError

_STEP_DIR = re.compile(r"step_[0-9]{8}")


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
    """Every RNG a step may touch: Python, NumPy, torch CPU, CUDA, and megatron's CUDA tracker.
    NumPy's state is kept as plain values (a list of ints), so that the shard loads with weights_only."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    st: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
        try:
            from megatron.core import tensor_parallel

            st["megatron_tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
        except Exception:  # no tracker seeded (e.g. a test without megatron's groups)
            pass
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    import numpy as np
    import torch

    py = st["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, cached = st["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
    if "megatron_tracker" in st:
        from megatron.core import tensor_parallel

        tensor_parallel.get_cuda_rng_tracker().set_states(st["megatron_tracker"])


def save(
    out_dir: str | os.PathLike,
    step: int,
    state: dict[str, Any],
    *,
    rank: int,
    world_size: int,
    barrier: Callable[[], None] = lambda: None,
    keep: int = 2,
) -> Path:
    """Save this rank's ``state`` for ``step`` (collective: every rank calls it)."""
    import torch

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


def _shard(d: Path, rank: int) -> Path:
    return d / f"rank_{rank:05d}.pt"


def latest(out_dir: str | os.PathLike) -> dict | None:
    """``latest.json`` checked: step and world size are integers, ``dir`` names a step folder in this
    checkpoint folder (``"../../etc"`` or an absolute path is refused, never followed)."""
    from grpo_tune.core import safeio

    p = root(out_dir) / "latest.json"
    if not os.path.lexists(p):
        return None
    try:
        meta = json.loads(safeio.read_text(p, max_bytes=1 << 16))  # a FIFO or a link there is refused, not waited on
        int(meta["step"]), int(meta["world_size"])
        d = meta["dir"]
    except GrpoTuneError as exc:
        raise _err(exc.message, "delete the checkpoints folder's latest.json to start over") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _err(f"{p} is unreadable ({exc})", "delete the checkpoints folder to start over") from None
    if not isinstance(d, str) or not _STEP_DIR.fullmatch(d):
        raise _err(
            f"{p}: dir {d!r} is not a step_NNNNNNNN folder of {root(out_dir)}",
            "latest.json only ever names a folder next to it; delete it to start over",
        )
    return meta


# Globals that torch.save writes for tensors and state dicts (protocol 2 GLOBAL opcodes); anything else is
# checked against torch's own weights_only allowlist, which is what the workers' torch.load enforces.
_PLAIN_GLOBALS = re.compile(r"collections OrderedDict|torch [A-Za-z0-9]*Storage|torch\._utils _rebuild_[a-z0-9_]+")


def _pickle_globals(data: bytes) -> list[str]:
    """``module name`` of every global a pickle would import, read from its opcodes without unpickling.
    A global whose name is not spelled out (memo or extension lookups) is listed as ``?``."""
    import pickletools

    found, strings = [], []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            found.append(str(arg))
        elif op.name == "STACK_GLOBAL":
            found.append(" ".join(strings[-2:]) if len(strings) >= 2 else "?")
        elif op.name.startswith("EXT"):
            found.append("?")
        if isinstance(arg, str) and "UNICODE" in op.name:
            strings.append(arg)
        elif op.name != "MEMOIZE":
            strings = []
    return found


def _unsafe_global(data: bytes) -> str | None:
    """The first global of a shard's pickle that ``torch.load(weights_only=True)`` would refuse, or None."""
    names = [g for g in _pickle_globals(data) if not _PLAIN_GLOBALS.fullmatch(g)]
    if not names:
        return None
    try:  # the rare shard with other globals (dtypes, torch.Size): ask torch's own allowlist
        from torch._weights_only_unpickler import _get_allowed_globals

        allowed = set(_get_allowed_globals())
    except ImportError:  # pragma: no cover - the workers need torch anyway; they will refuse it themselves
        return None
    return next((g for g in names if g.replace(" ", ".") not in allowed), None)


def _bad_shard(f: Path) -> str | None:
    """Why a shard cannot be loaded (missing, truncated, a failed CRC-32, pickled code), or None when it is
    intact."""
    import stat

    try:
        st = os.lstat(f)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"not readable ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the reader forever, a link points elsewhere
        return "not a regular file (a link, FIFO or device)"
    try:
        with zipfile.ZipFile(f) as zf:
            broken = zf.testzip()  # reads every record and checks its CRC-32 (torch.save writes a zip)
            pkl = next((n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            bad_global = None if broken is not None or pkl is None else _unsafe_global(zf.read(pkl))
    except FileNotFoundError:
        return "missing"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, RuntimeError) as exc:
        return f"not a readable torch checkpoint ({exc})"
    if broken is not None:
        return f"record {broken} fails its CRC-32 check"
    if pkl is None:
        return "not a torch checkpoint (no data.pkl record)"
    if bad_global is not None:
        return f"it holds pickled code ({bad_global.replace(' ', '.')}), which is never loaded"
    return None


def _intact(out_dir, d: Path, world_size: int) -> bool:
    from grpo_tune.core import safeio

    try:
        meta = json.loads(safeio.read_text(d / "meta.json", max_bytes=1 << 16))
    except (OSError, ValueError, GrpoTuneError):
        return False
    return meta.get("world_size") == world_size and all(_bad_shard(_shard(d, r)) is None for r in range(world_size))


def last_intact(out_dir: str | os.PathLike, world_size: int, *, before: int | None = None) -> Path | None:
    """The newest step folder (older than ``before``) whose meta.json and every shard are intact."""
    steps = sorted((p for p in root(out_dir).glob("step_*") if _STEP_DIR.fullmatch(p.name)), reverse=True)
    for d in steps:
        if (before is None or int(d.name[5:]) < before) and _intact(out_dir, d, world_size):
            return d
    return None


def _corrupt(out_dir, f: Path, why: str, step: int, world_size: int) -> GrpoTuneError:
    good = last_intact(out_dir, world_size, before=step)
    if good is None:
        hint = f"no older intact checkpoint is left; delete {root(out_dir)} to start over"
    else:
        hint = (
            f"the last intact checkpoint is {good}: resume from it by writing "
            f'{{"step": {int(good.name[5:])}, "world_size": {world_size}, "dir": "{good.name}"}} '
            f"into {root(out_dir) / 'latest.json'}"
        )
    return _err(f"checkpoint shard {f} is corrupt: {why}", hint)


def verify(out_dir: str | os.PathLike, world_size: int) -> int | None:
    """Before any worker starts: the step of the latest checkpoint, every shard checked; None when there is none."""
    meta = latest(out_dir)
    if meta is None:
        return None
    if int(meta["world_size"]) != world_size:
        raise _err(
            f"the checkpoint in {root(out_dir)} was written by {meta['world_size']} ranks; this config has "
            f"{world_size}",
            "resume with the same degrees, or use another --out",
        )
    d = root(out_dir) / meta["dir"]
    for r in range(world_size):
        why = _bad_shard(_shard(d, r))
        if why is not None:
            raise _corrupt(out_dir, _shard(d, r), why, int(meta["step"]), world_size)
    return int(meta["step"])


def load(
    out_dir: str | os.PathLike, *, rank: int, world_size: int, restore_rng: bool = True
) -> tuple[int, dict] | None:
    """(step, this rank's state) of the latest complete checkpoint, or None when there is none."""
    import pickle

    import torch

    meta = latest(out_dir)
    if meta is None:
        return None
    if int(meta["world_size"]) != world_size:
        raise _err(
            f"checkpoint written by {meta['world_size']} ranks, this run has {world_size}",
            "resume with the same degrees",
        )
    f = _shard(root(out_dir) / meta["dir"], rank)
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)  # tensors and plain values only
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as exc:
        raise _corrupt(out_dir, f, str(exc).splitlines()[0], int(meta["step"]), world_size) from exc
    if restore_rng:
        set_rng_state(state["rng"])
    return int(meta["step"]), state
