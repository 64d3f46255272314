"""Start the trainer: checks that run before any process starts, the torchrun command, an sbatch script.

Torch-free on purpose: ``grpo-tune train`` and ``grpo-tune profile`` call :func:`preflight` and
:func:`torchrun_command` without importing torch, so a bad config fails in a second with a coded
error instead of after N process start-ups. Processes are started by torchrun
(``python -m torch.distributed.run``), never by a home-made launcher.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path

from grpo_tune.core.config import RunConfig, is_synthetic
from grpo_tune.core.errors import ConfigError, GrpoTuneError, MissingDependencyError, install_hint, try_import
from grpo_tune.core.ranks import RankLayout, layout


DEFAULT_MASTER_PORT = 29500
# megatron-core 0.16.1 TopKRouter load-balancing types (moe_router_load_balancing_type)
LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


def micro_batches(cfg: RunConfig) -> dict[str, int | str | None]:
    """Sequences per step / mini-batch per DP rank and micro-batches per mini-batch."""
    s, w = cfg.strategy, cfg.workload
    seqs = w.prompts * w.n
    mini = w.mini_batch * w.n
    return {
        "sequences_per_step": seqs,
        "sequences_per_mini_batch": mini,
        "mini_batches_per_step": w.prompts // w.mini_batch,
        "sequences_per_dp_rank": seqs // s.layout.dp,
        "mini_batch_per_dp_rank": mini // s.layout.dp,
        "micro_batches_per_mini_batch": mini // (s.layout.dp * s.batching.mbs),
        "log_prob_mbs": s.batching.log_prob_mbs_,
        "log_prob_micro_batches_per_dp_rank": -(-(seqs // s.layout.dp) // s.batching.log_prob_mbs_),
        "max_tokens_per_gpu": s.batching.max_tokens_per_gpu,
        "log_prob_max_tokens_per_gpu": s.batching.log_prob_max_tokens_per_gpu or s.batching.max_tokens_per_gpu,
        "packing": None if s.batching.max_tokens_per_gpu is None else PACKING_NOTE,
    }


PACKING_NOTE = (
    "token-budget micro-batches: sequences sorted by length and packed greedily under the budget, "
    "the same micro-batch count on every DP rank; with TransformerEngine on a GPU each micro-batch "
    "runs as one THD-packed row (PackedSeqParams), elsewhere (CPU, megatron's local spec) it is "
    "padded only to its own longest sequence"
)


def _check_gpus(cfg: RunConfig, lay: RankLayout) -> None:
    """A plan for GPUs needs a CUDA GPU per rank of this node: without them the workers would run it on the CPU
    (gloo), where a GPU-sized model is killed for memory long after the start."""
    if cfg.hardware.memory_is_host:  # a CPU profile: its ranks are processes
        return
    import torch

    per_node = lay.nproc_per_node or lay.world_size // lay.nnodes
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < per_node:
        raise GrpoTuneError(
            f"this config is a plan for {cfg.cluster.gpus} x {cfg.hardware.name} ({per_node} rank(s) per node), and "
            f"this machine has {have} CUDA GPU(s)",
            code="NO_GPU",
        )


def preflight(
    cfg: RunConfig,
    *,
    nnodes: int | None = None,
    node_rank: int = 0,
    resume_dir: str | os.PathLike | None = None,
    need_torch: bool = True,
) -> RankLayout:
    """Every check that can fail before a process starts; raises a coded :class:`GrpoTuneError`.

    ``cfg`` is a loaded (hence already degree-validated) RunConfig.
    """
    from grpo_tune.core.errors import InvalidDegreesError

    lay = layout(cfg, nnodes=nnodes)
    if not 0 <= node_rank < lay.nnodes:
        raise ConfigError(f"--node-rank {node_rank} is outside 0..{lay.nnodes - 1}")
    s, w, t, m = cfg.strategy, cfg.workload, cfg.trainer, cfg.model
    train_world = lay.world_size - (cfg.placement.rollout_gpus if cfg.placement.separate else 0)
    world = s.layout.model_parallel * (s.layout.dp or 1)
    if world != train_world:  # validate() guarantees it; kept as a guard
        raise InvalidDegreesError(f"tp*pp*cp*dp = {world} differs from the training world size {train_world}")
    if cfg.placement.separate:
        from .separate import check_separate

        check_separate(cfg)
    if w.kind != "grpo":
        raise ConfigError(
            f"the trainer runs GRPO workloads; workload.kind is {w.kind!r}", hint="set workload.kind: grpo"
        )
    from grpo_tune.core.support import first_refusal

    # every refusal the workers would make (core/support.py: the search applies the same rules)
    first_refusal(m, s, cfg.hardware, workload=w)
    if not is_synthetic(t.dataset) and not Path(t.dataset).is_file():
        raise GrpoTuneError(
            f"dataset {t.dataset!r} does not exist",
            code="MISSING_DATASET",
            hint="give a .jsonl/.parquet file with prompt and answer fields, or 'synthetic'",
        )
    if t.dataset.endswith(".parquet") and importlib.util.find_spec("pyarrow") is None:
        raise MissingDependencyError("reading a Parquet dataset needs pyarrow", hint="pip install pyarrow")
    _check_data_and_reward(t.dataset, t.reward, seed=t.seed)
    if t.moe_router_load_balancing_type not in LOAD_BALANCING_TYPES:
        raise ConfigError(
            f"trainer.moe_router_load_balancing_type {t.moe_router_load_balancing_type!r} is not one "
            f"of {', '.join(LOAD_BALANCING_TYPES)}",
            hint="megatron-core 0.16.1's router types",
        )
    if t.moe_aux_loss_coeff < 0:
        raise ConfigError(f"trainer.moe_aux_loss_coeff must be >= 0, got {t.moe_aux_loss_coeff}")
    if t.hf_checkpoint is not None:
        _check_hf_folder(Path(t.hf_checkpoint))
    if t.rollout_engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise MissingDependencyError(
            "trainer.rollout_engine is vllm, but vllm is not installed",
            hint=f"{install_hint('gpu')}, or set rollout_engine: megatron",
        )
    if t.steps < 1 or t.checkpoint_every < 1:
        raise ConfigError("trainer.steps and trainer.checkpoint_every must be >= 1")
    if (
        need_torch
        and s.memory.precision_aware_optimizer
        and not s.memory.cpu_optimizer
        and not cfg.hardware.memory_is_host
        and importlib.util.find_spec("transformer_engine") is None
    ):
        # megatron-core 0.16.1 OptimizerConfig: precision-aware state needs TE's FusedAdam (or the hybrid optimizer)
        raise MissingDependencyError(
            "strategy.precision_aware_optimizer needs TransformerEngine's FusedAdam on a GPU",
            hint="pip install transformer-engine, or set cpu_optimizer, or turn it off",
        )
    if need_torch:
        for mod, extra in (("torch", "train"), ("megatron.core", "train")):
            if importlib.util.find_spec(mod.split(".")[0]) is None:
                raise MissingDependencyError(f"{mod} is not installed", hint=install_hint(extra))
        _check_gpus(cfg, lay)
    if resume_dir is not None:
        check_resume(resume_dir, checkpoint_world(cfg, lay))
    return lay


def checkpoint_world(cfg: RunConfig, lay: RankLayout) -> int:
    """Ranks that write a checkpoint shard: every rank colocated; the training pool's with separate pools
    (the rollout pool's state is its weights, which the training pool's rank 0 checkpoints)."""
    return lay.world_size - (cfg.placement.rollout_gpus if cfg.placement.separate else 0)


def _check_hf_folder(p: Path) -> None:
    """What the workers read from ``trainer.hf_checkpoint`` (trainer/hf.py, trainer/tokenizer.py), checked here:
    a missing tokenizer.json or weights, or a truncated/garbage safetensors file, failed only in the workers."""
    hint = "point trainer.hf_checkpoint at a Hugging Face model folder, or remove it"
    if not (p / "config.json").is_file():
        raise GrpoTuneError(f"hf_checkpoint {str(p)!r} has no config.json", code="CHECKPOINT_ERROR", hint=hint)
    if not (p / "tokenizer.json").is_file():
        raise ConfigError(f"hf_checkpoint {str(p)!r} has no tokenizer.json", hint=hint)
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise GrpoTuneError(f"no *.safetensors in hf_checkpoint {str(p)!r}", code="CHECKPOINT_ERROR", hint=hint)
    for f in files:
        why = _safetensors_problem(f)
        if why is not None:
            raise GrpoTuneError(
                f"{f} is not a readable safetensors file: {why}",
                code="CHECKPOINT_ERROR",
                hint="download or export the checkpoint again",
            )


def _safetensors_problem(f: Path) -> str | None:
    """Why the workers' safetensors reader (trainer/hf.py, ``safe_open``) would refuse ``f``, found here by the
    same library: it reads the header and checks that the tensors' offsets fit the file, without loading them."""
    safe_open = try_import("safetensors", "train").safe_open
    try:
        with safe_open(str(f), framework="numpy") as fh:
            fh.keys()
    except Exception as exc:  # SafetensorError (header, offsets, truncation) or OSError
        return f"{type(exc).__name__}: {exc}"
    return None


def _check_data_and_reward(dataset: str, reward: str, *, seed: int) -> None:
    """Load the dataset and the reward exactly as the workers will, before any process starts: a bad JSON
    line, an empty file, a missing ``prompt``, a binary file or a reward module that fails to import is a
    coded error here, not a ChildFailedError after torchrun (math_format and
    ``path/file.py:function`` are accepted because the workers' loader accepts them)."""
    from grpo_tune.trainer.data import load_dataset
    from grpo_tune.trainer.reward import load_reward

    try:
        examples = load_dataset(dataset, seed=seed)
    except UnicodeDecodeError:
        raise ConfigError(f"dataset {dataset!r} is not UTF-8 text", hint="give a .jsonl or .parquet file") from None
    except OSError as exc:
        raise GrpoTuneError(
            f"dataset {dataset!r} cannot be read ({exc.strerror})",
            code="MISSING_DATASET",
            hint="check the path and its permissions",
        ) from None
    if not examples:
        raise GrpoTuneError(
            f"dataset {dataset!r} holds no examples",
            code="MISSING_DATASET",
            hint="give a .jsonl/.parquet file with prompt and answer fields, or 'synthetic'",
        )
    load_reward(reward)


def check_resume(out_dir: str | os.PathLike, world_size: int) -> int | None:
    """The step of the latest complete checkpoint in ``out_dir`` (None: fresh start). A world-size change,
    a ``latest.json`` pointing outside the folder or a corrupt shard is a CHECKPOINT_ERROR here, before
    any worker starts (trainer/checkpoint.py verify)."""
    from grpo_tune.trainer import checkpoint

    return checkpoint.verify(out_dir, world_size)


def torchrun_command(
    config: str | os.PathLike,
    lay: RankLayout,
    *,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    worker_args: list[str] = (),
    python: str | None = None,
) -> list[str]:
    """argv for ``torchrun`` running ``python -m grpo_tune.trainer.main --config CONFIG [worker_args]``.

    One node: ``--standalone`` (torchrun picks a free port, so parallel runs don't collide) unless a
    port is given. Several nodes: static rendezvous at ``master_addr:master_port`` with this node's rank,
    exactly torchrun's ``--nnodes --node-rank --master-addr --master-port``.
    """
    cmd = [python or sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={lay.nproc_per_node}"]
    if lay.nnodes == 1 and master_addr is None and master_port is None:
        cmd.append("--standalone")
    else:
        if lay.nnodes > 1 and master_addr is None:
            raise ConfigError(f"{lay.nnodes} nodes need --master-addr (the address of node 0)")
        cmd += [
            f"--nnodes={lay.nnodes}",
            f"--node-rank={node_rank}",
            f"--master-addr={master_addr or '127.0.0.1'}",
            f"--master-port={master_port or DEFAULT_MASTER_PORT}",
        ]
    cmd += ["-m", "grpo_tune.trainer.main", "--config", str(config), *worker_args]
    return cmd


def slurm_script(
    config: str | os.PathLike,
    lay: RankLayout,
    *,
    worker_args: list[str] = (),
    job_name: str = "grpo-tune",
    master_port: int = DEFAULT_MASTER_PORT,
    python: str = "python",
) -> str:
    """An sbatch script: one task per node, each running torchrun with the node's rank from Slurm.

    Every value is one shell-quoted word of the batch script; no user value is ever placed inside
    another quoted string (``bash -c '...'``). The node's rank reaches torchrun through its
    ``PET_NODE_RANK`` variable (torch/distributed/argparse_util.py: every torchrun option reads
    ``PET_<NAME>``), so that the per-node shell runs one constant line.
    """
    for value, what in ((str(config), "config path"), (job_name, "job name"), *((a, "argument") for a in worker_args)):
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ConfigError(f"{what} {value!r} holds a control character", hint="use printable characters only")
    q = shlex.quote
    torchrun = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={lay.nnodes}",
        f"--nproc-per-node={lay.nproc_per_node}",
    ]
    worker = ["-m", "grpo_tune.trainer.main", "--config", str(Path(config).resolve()), *worker_args]
    words = " ".join(map(q, torchrun)) + " \\\n  " + " ".join(map(q, worker))
    return f"""#!/bin/bash
#SBATCH --job-name={q(job_name)}
#SBATCH --nodes={lay.nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={lay.nproc_per_node}
#SBATCH --exclusive
# Written by `grpo-tune train --slurm`: {lay.world_size} ranks = {lay.nnodes} node(s) x {lay.nproc_per_node}.
set -euo pipefail
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export PET_MASTER_ADDR="$MASTER_ADDR" PET_MASTER_PORT={int(master_port)}
srun --ntasks-per-node=1 bash -c 'PET_NODE_RANK="$SLURM_NODEID" exec "$@"' grpo-tune-node \\
  {words}
"""


# Exit codes shared by `grpo-tune train`, `grpo-tune profile` and the workers (the profile JSON contract).
EXIT_OK, EXIT_BAD_CONFIG, EXIT_OOM, EXIT_ERROR = 0, 2, 3, 4


def failure_path(out_dir: str | os.PathLike, rank: int) -> Path:
    """Where a worker that fails records ``{"status": "oom"|"error", "message": ...}`` before exiting."""
    return Path(out_dir) / f"failure.rank{rank}.json"


def read_failures(out_dir: str | os.PathLike) -> list[dict]:
    from grpo_tune.core import safeio

    out = []
    for p in sorted(Path(out_dir).glob("failure.rank*.json")):
        try:
            rec = json.loads(safeio.read_text(p, max_bytes=1 << 20))
        except (OSError, ValueError, GrpoTuneError):
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def clear_failures(out_dir: str | os.PathLike) -> None:
    for p in Path(out_dir).glob("failure.rank*.json"):
        p.unlink(missing_ok=True)


def run_workers(
    cmd: list[str],
    out_dir: str | os.PathLike,
    *,
    poll=None,
    poll_every_s: float = 0.5,
    env: dict | None = None,
    deadline_s: float | None = None,
    pass_fds: tuple[int, ...] = (),
) -> int:
    """Run torchrun with its output in ``out_dir/train.log``; call ``poll()`` while it runs; return its exit code.

    torchrun runs in a process group of its own that this process owns (core.lifeline): a Ctrl-C at the
    terminal reaches this process only, which stops the group (SIGTERM, then SIGKILL) on every way out,
    exceptions and signals included. torchrun gets a parent-death signal, and a watchdog stops the group
    if this process is killed with SIGKILL; the workers, each in a session torchrun gives it, die with
    torchrun (``trainer.main``). ``deadline_s``: the group is stopped after that many seconds (returns
    124), even if this process is stuck. ``pass_fds``: descriptors torchrun keeps (the run folder's lock).
    """
    import subprocess
    import time

    from grpo_tune.core import lifeline, safeio

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the grpo_tune package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.monotonic()
    with safeio.open_append(out / "train.log") as log, lifeline.Watchdog() as wd:
        proc = lifeline.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=pass_fds)
        wd.guard(proc.pid, deadline_s=None if deadline_s is None else deadline_s + lifeline.GRACE_S)
        try:
            while proc.poll() is None:
                if poll is not None:
                    poll()
                if deadline_s is not None and time.monotonic() - t0 > deadline_s:
                    lifeline.stop_group(proc.pid, proc=proc)
                    return 124
                time.sleep(poll_every_s)
            if poll is not None:
                poll()
        finally:  # Ctrl-C, SIGTERM/SIGHUP/SIGQUIT (raised by cli.main), an error in poll(), or a clean end
            if proc.poll() is None or lifeline.group_alive(proc.pid):
                lifeline.stop_group(proc.pid, proc=proc)
            wd.release(proc.pid)
    return proc.returncode


def metric_steps(out_dir: str | os.PathLike) -> list[int]:
    """The steps logged in ``out_dir/metrics.jsonl`` (bounded read; a torn or foreign line is skipped)."""
    from grpo_tune.core import safeio

    p = Path(out_dir) / "metrics.jsonl"
    try:
        text = safeio.read_text(p)
    except FileNotFoundError:
        return []
    steps = []
    for line in text.splitlines():
        try:
            st = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(st, int) and not isinstance(st, bool):
            steps.append(st)
    return steps


def trim_metrics(out_dir: str | os.PathLike, done: int | None) -> None:
    """Keep only the metric lines of steps up to ``done`` (the checkpoint resumed from; None: none at all).

    A run killed after its last checkpoint, or before its first, logged steps that the rerun replays;
    without this they would be logged twice. Done here, before any worker starts, and again by the
    trainer itself when it resumes (for launches that do not go through the CLI)."""
    from grpo_tune.core import safeio
    from grpo_tune.core.config import atomic_write

    p = Path(out_dir) / "metrics.jsonl"
    try:
        text = safeio.read_text(p)
    except FileNotFoundError:
        return
    keep = []
    for line in text.splitlines():
        try:
            st = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # a torn last line from a kill
        if isinstance(st, int) and st <= (done or 0):
            keep.append(line)
    if len(keep) != len(text.splitlines()) or not text.endswith("\n") and text:
        atomic_write(p, "".join(k + "\n" for k in keep))


FAILURE_KINDS = ("no_space", "too_many_files", "host_oom", "cuda_oom")


def classify_failure(exc: BaseException) -> tuple[str | None, str]:
    """What a worker's failure was, when it is the machine's and not the plan's: (kind, one line naming the cause
    and the path), else (None, ""). Kinds: no space, too many open files, out of host memory, CUDA out of memory."""
    import errno

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # torch.save wraps the OSError of a full disk in a RuntimeError
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" writing {e.filename}" if e.filename else ""
            return "no_space", f"[WORKER_FAILED] no space left on the device{where} ({e.strerror})"
        if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
            where = f" opening {e.filename}" if e.filename else ""
            return "too_many_files", (
                f"[WORKER_FAILED] too many open files{where}: raise the limit (ulimit -n) or lower the data workers"
            )
        text = str(e)
        if type(e).__name__ == "OutOfMemoryError" or "CUDA out of memory" in text:
            return "cuda_oom", f"[WORKER_FAILED] CUDA out of memory: {text.splitlines()[0][:300] if text else ''}"
        if isinstance(e, MemoryError) or "bad_alloc" in text or "can't allocate memory" in text:
            return "host_oom", f"[WORKER_FAILED] out of host memory ({type(e).__name__}: {text[:200]})"
        if "No space left on device" in text:
            return "no_space", f"[WORKER_FAILED] no space left on the device: {text.splitlines()[0][:300]}"
        e = e.__cause__ or e.__context__
    return None, ""


def classified(out_dir: str | os.PathLike) -> dict | None:
    """The first failure record of a known machine cause (see :func:`classify_failure`), if any."""
    return next((f for f in read_failures(out_dir) if f.get("kind") in FAILURE_KINDS), None)


def worker_status(rc: int, out_dir: str | os.PathLike) -> tuple[str, str | None, int]:
    """(status, message, exit code) of a finished launch from torchrun's code and the workers' failure files."""
    fails = read_failures(out_dir)
    if rc == 0 and not fails:
        return "ok", None, EXIT_OK
    if any(f.get("status") == "oom" for f in fails):
        f = next(f for f in fails if f.get("status") == "oom")
        return "oom", f.get("message"), EXIT_OOM
    if fails:
        return "error", fails[0].get("message"), EXIT_ERROR
    if rc in (-9, 137):  # SIGKILL with no failure file: most often the kernel's OOM killer
        return "oom", f"a worker was killed (exit {rc}); likely out of host memory", EXIT_OOM
    return "error", f"torchrun exited with {rc}; see {Path(out_dir) / 'train.log'}", EXIT_ERROR


def log_tail(out_dir: str | os.PathLike, lines: int = 30) -> str:
    """The last ``lines`` lines of train.log (its last 1 MiB at most; a link or FIFO there reads as nothing)."""
    from grpo_tune.core import safeio

    p = Path(out_dir) / "train.log"
    try:
        size = os.lstat(p).st_size
        data = safeio.read_bytes(p, max_bytes=1 << 20, offset=max(0, size - (1 << 20)))
    except (OSError, GrpoTuneError):
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
