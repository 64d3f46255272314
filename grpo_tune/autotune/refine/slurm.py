"""Refinement trials launched the way a cluster launches them: one Slurm job per trial, sized to its plan.

``--launcher slurm``: each trial's ``grpo-tune profile`` runs as ``sbatch --wait`` of a job script asking for
the plan's nodes and, per node, its GPUs (CPU plans: one CPU per rank), with one task per node; ``srun`` starts
the profile command once per node with the node's rank, and node 0's address as the rendezvous. The trial's
timeout is the job's ``--time`` limit too, and a trial that is stopped (timeout, Ctrl-C, a killed worker)
is cancelled with ``scancel``.

Every value is one shell-quoted word; no value is placed inside another quoted string.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

from grpo_tune.core.errors import ConfigError

LAUNCHERS = ("local", "slurm")
MASTER_PORT = 29500


def sizing(cfg) -> dict[str, int | bool]:
    """Nodes, ranks per node and whether they are GPUs, from the trial's config (the trainer's own layout)."""
    from grpo_tune.core.ranks import layout

    lay = layout(cfg)
    gpu = cfg.hardware.name != "cpu"
    return {"nodes": lay.nnodes, "per_node": lay.nproc_per_node, "gpu": gpu, "world_size": lay.world_size}


def job_script(
    config: str | os.PathLike,
    cfg,
    *,
    steps: int,
    json_path: str | os.PathLike,
    timeout_s: float,
    job_name: str,
    log_path: str | os.PathLike,
    python: str | None = None,
) -> str:
    """The sbatch script of one trial (see the module doc)."""
    for value, what in ((str(config), "config path"), (job_name, "job name"), (str(json_path), "JSON path")):
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ConfigError(f"{what} {value!r} holds a control character", hint="use printable characters only")
    sz = sizing(cfg)
    q = shlex.quote
    minutes = max(1, math.ceil(timeout_s / 60) + 1)
    res = (
        f"#SBATCH --gpus-per-node={sz['per_node']}\n"
        if sz["gpu"]
        else f"#SBATCH --cpus-per-task={sz['per_node']}\n"  # a CPU plan: one core per rank
    )
    profile = [
        python or sys.executable,
        "-c",
        "from grpo_tune.cli.main import run; run()",
        "profile",
        "--config",
        str(Path(config).resolve()),
        "--steps",
        str(int(steps)),
        "--json",
        str(Path(json_path).resolve()),
        f"--nnodes={sz['nodes']}",
        f"--master-port={MASTER_PORT}",
        "--timeout",
        repr(float(timeout_s)),
    ]
    return f"""#!/bin/bash
#SBATCH --job-name={q(job_name)}
#SBATCH --nodes={sz["nodes"]}
#SBATCH --ntasks-per-node=1
{res}#SBATCH --time={minutes}
#SBATCH --output={q(str(Path(log_path).resolve()))}
#SBATCH --exclusive
# Written by `grpo-tune search --refine --launcher slurm`: {sz["world_size"]} ranks = {sz["nodes"]} node(s) x \
{sz["per_node"]} {"GPU(s)" if sz["gpu"] else "CPU rank(s)"}.
set -euo pipefail
GRPO_TUNE_MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export GRPO_TUNE_MASTER
srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\
  bash -c 'exec "$@" --node-rank="$SLURM_NODEID" --master-addr="$GRPO_TUNE_MASTER"' grpo-tune-trial \\
  {" ".join(map(q, profile))}
"""


def submit_command(script: str | os.PathLike) -> list[str]:
    """``sbatch --wait``: returns when the job ends, with the job's exit code."""
    return ["sbatch", "--wait", "--parsable", str(script)]


def cancel_command(job_name: str) -> list[str]:
    return ["scancel", "--name", job_name, "--user", str(os.getuid())]


def cancel(job_name: str) -> None:
    """Cancel this user's jobs of that name (a stopped trial's job); quiet when there is none or no Slurm."""
    try:
        subprocess.run(
            cancel_command(job_name),
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        pass


def check_available() -> None:
    """``--launcher slurm`` needs sbatch on PATH (checked before any trial)."""
    import shutil

    from grpo_tune.core.errors import MissingDependencyError

    for tool in ("sbatch", "scancel"):
        if shutil.which(tool) is None:
            raise MissingDependencyError(
                f"--launcher slurm: {tool} is not on PATH",
                hint="run on a Slurm login node (or apt-get install slurm-client), or use --launcher local",
            )
