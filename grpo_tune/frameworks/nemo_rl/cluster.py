"""NeMo-RL's cluster launch files: its own ``ray.sub`` submitted with the plan's nodes, and a KubeRay RayJob.

NeMo-RL starts Ray on Slurm with the ``ray.sub`` batch script at the root of its checkout; its documented use
(NVIDIA-NeMo/RL docs/cluster.md, "Batched Job Submission", and the environment variables listed there) is, run
from the checkout's root::

    COMMAND="uv run ./examples/run_grpo.py ..." CONTAINER=IMAGE MOUNTS="$PWD:$PWD" \\
        sbatch --nodes=N --account=A --job-name=J --partition=P --time=T --gres=gpu:8 ray.sub

with ``GPUS_PER_NODE`` (default 8) the GPUs each Ray node claims (ray.sub checks it against the partition's GRES).
The head shares the first node with ray-worker-0, so ``--nodes`` is the recipe's ``cluster.num_nodes``.
``ray.sub``'s own ``#SBATCH`` lines name placeholder ``ACCOUNT`` and ``PARTITION``: the user's options win.

In the RayJob the driver runs in NeMo-RL's container, whose checkout is ``/opt/nemo-rl`` (its docker/Dockerfile:
``COPY . /opt/nemo-rl``, ``WORKDIR /opt/nemo-rl``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from grpo_tune.core.config import RunConfig
from grpo_tune.frameworks.base import cluster
from grpo_tune.frameworks.base.inputs import check_name

from . import snapshot as snap
from .recipe import RECIPE_DIR

IMAGE_CHECKOUT = "/opt/nemo-rl"


def _run_command(run: Path, run_id: str, tuned: bool) -> tuple[list[str], str | None]:
    """(the driver's words, run from the checkout's root; the checkout path the recipe is copied to, or None).

    nemo_rl.yaml names its base config relative to NeMo-RL's recipe folder, so it runs from a copy there;
    tune's tuned.yaml names the user's recipe relative to the run folder, so it runs in place."""
    if tuned:
        return ["uv", "run", "examples/run_grpo.py", "--config", str(run / "tuned.yaml")], None
    target = f"{RECIPE_DIR}/grpo-tune-{run_id}.yaml"
    return ["uv", "run", "examples/run_grpo.py", "--config", target], target


def ray_sub_script(cfg: RunConfig, run_dir: Path, *, tuned: bool, release: str) -> str:
    """``nemo_rl.ray_sub.sh``: run from a NeMo-RL checkout, it places the recipe and submits ``ray.sub`` with the
    plan's nodes and GPUs per node; its arguments go to sbatch (account, partition, time)."""
    groups, notes = cluster.node_groups(cfg)
    nodes = sum(g.nodes for g in groups)
    gpn = groups[0].gpus_per_node
    run = Path(run_dir).resolve()
    run_id = Path(run_dir).name
    job = f"grpo-tune-{run_id}"
    for value, what in ((str(run), "run folder"), (job, "job name")):
        check_name(value, what)
    words, target = _run_command(run, run_id, tuned)
    q = shlex.quote
    recipe = "tuned.yaml" if tuned else "nemo_rl.yaml"
    head = [
        f"NeMo-RL {release} on {nodes} Slurm node(s) x {gpn} GPUs ({cfg.hardware.name}) through NeMo-RL's own",
        "ray.sub, as NVIDIA-NeMo/RL docs/cluster.md (Batched Job Submission) submits it. Emitted by grpo-tune.",
        *notes,
        "",
        f"Run it from the root of a NeMo-RL {snap.TAG} checkout (ray.sub's working directory):",
        f"  CONTAINER=IMAGE bash {q(str(run / 'nemo_rl.ray_sub.sh'))} -A ACCOUNT -p PARTITION -t 4:0:0",
        "its arguments go to sbatch (ray.sub's own #SBATCH lines name placeholder ACCOUNT and PARTITION).",
        "MOUNTS defaults to the checkout and the run folder; HF_HOME, HF_TOKEN, WANDB_API_KEY pass through.",
        *(
            ["tuned.yaml inherits from your recipe by a path relative to the run folder: MOUNTS must hold it too."]
            if tuned
            else []
        ),
    ]
    place = (
        ""
        if target is None
        else f"""RECIPE={q(target)}
if [[ -e "$RECIPE" ]] && ! cmp -s "$RUN_DIR/nemo_rl.yaml" "$RECIPE"; then
  echo "$RECIPE exists and differs from this run's recipe: not replaced" >&2
  exit 2
fi
cp -- "$RUN_DIR/nemo_rl.yaml" "$RECIPE"
"""
    )
    return f"""#!/usr/bin/env bash
{cluster.comment_lines(head)}
set -euo pipefail

RUN_DIR={q(str(run))}
NODES={q(str(nodes))}
GPUS_PER_NODE={q(str(gpn))}
if [[ ! -f ray.sub || ! -d {q(RECIPE_DIR)} ]]; then
  echo "run it from the root of a NeMo-RL checkout: no ray.sub in $PWD" >&2
  exit 2
fi
if [[ ! -f "$RUN_DIR/"{q(recipe)} ]]; then
  echo "$RUN_DIR/{recipe} not found" >&2
  exit 2
fi
: "${{CONTAINER:?set CONTAINER to the NeMo-RL {release} container image (ray.sub needs it)}}"
{place}
COMMAND={q(shlex.join(words))} \\
CONTAINER="$CONTAINER" \\
MOUNTS="${{MOUNTS:-$PWD:$PWD,$RUN_DIR:$RUN_DIR}}" \\
GPUS_PER_NODE="$GPUS_PER_NODE" \\
  sbatch --nodes="$NODES" --gres="gpu:$GPUS_PER_NODE" --job-name={q(job)} "$@" ray.sub
"""


def files(cfg: RunConfig, run_dir: Path, names: Sequence[str], release: str) -> list[tuple[str, str, str, str, bool]]:
    """(key, file name, label, text, executable) of NeMo-RL's cluster files for this run folder."""
    if cluster.is_cpu(cfg):
        return []
    tuned = "tuned.yaml" in names
    run = Path(run_dir).resolve()
    words, target = _run_command(run, Path(run_dir).name, tuned)
    recipe = "tuned.yaml" if tuned else "nemo_rl.yaml"
    steps = [] if target is None else ["cp", str(run / "nemo_rl.yaml"), target]
    entry = f"cd {shlex.quote(IMAGE_CHECKOUT)} && " + (f"{shlex.join(steps)} && " if steps else "") + shlex.join(words)
    job = cluster.rayjob_yaml(
        cfg,
        run_dir,
        framework=f"NeMo-RL {release}",
        key="nemo-rl",
        entrypoint=entry,
        image="replace-with-your-nemo-rl-0.7.0-image",
        notes=[f"The driver runs {recipe} from NeMo-RL's checkout in its image, {IMAGE_CHECKOUT}."],
    )
    return [
        (
            "nemo_rl_slurm",
            "nemo_rl.ray_sub.sh",
            f"NeMo-RL's ray.sub submitted with the plan's nodes ({recipe})",
            ray_sub_script(cfg, run_dir, tuned=tuned, release=release),
            True,
        ),
        ("nemo_rl_rayjob", "nemo_rl.rayjob.yaml", f"KubeRay RayJob running {recipe}", job, False),
    ]
