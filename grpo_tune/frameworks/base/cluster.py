"""Cluster launch files: what starts a framework's launch where its users run it, on Ray.

verl and NeMo-RL both run as one driver process on a Ray cluster that spans the job's nodes. A run folder gets,
next to the framework's own launch (verl.sh, nemo_rl.yaml):

- a Slurm batch script that starts Ray on the allocation and runs the launch on its head node
  (:func:`ray_slurm_script`; NeMo-RL brings its own, ``ray.sub``, which its framework invokes instead);
- a KubeRay ``RayJob`` (:func:`rayjob_yaml`), which has the operator create the Ray cluster, run the launch as
  the job's entrypoint and delete the cluster when it ends.

Both are sized from the plan: :func:`node_groups` gives its nodes per pool and GPUs per node. Every value is
quoted for the shell (``shlex.quote``) or written by the YAML emitter; nothing a user named ever lands inside
another quoted string. The head/worker layout is stated in each file:

- Slurm: the Ray head runs on the first node and holds that node's GPUs, a Ray worker on each other node, as in
  verl's own example (volcengine/verl ``examples/slurm/ray_on_slurm.slurm``) and NeMo-RL's ``ray.sub``;
- KubeRay: a head pod with no GPU (the Ray control plane and the driver) and one worker pod per node of the plan,
  so worker replicas = the plan's nodes; a separate-pool plan on nodes of their own gets one worker group per
  pool (``rollout``, ``training``), so that each can be placed on its own node pool.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpo_tune.core.config import RunConfig
from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.frameworks.base.inputs import check_name, comment_safe

RAY_PORT = 6379
RAY_WAIT_S = 600
"""Seconds the Slurm script waits for every node's GPUs to join the Ray cluster (``RAY_WAIT_S`` overrides)."""

VERL_SLURM_EXAMPLE = (
    "volcengine/verl examples/slurm/ray_on_slurm.slurm (commit a31a8f251faacb38404fa0af7603c00f64a667bb)"
)
RUNS_CLAIM = "grpo-tune-runs"
"""The PersistentVolumeClaim the RayJob mounts at the run folder's parent: a shared volume holding runs/."""
MAX_RAYJOB_NAME = 47
"""KubeRay v1.7.0 refuses a RayJob name longer than 47 characters (utils.MaxRayJobNameLength: 53 - 6) or not a
DNS-1035 label (ray-operator/controllers/ray/utils/validation.go, ValidateRayJobMetadata)."""


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one kind in a plan: all of a colocated plan's, or one pool of a separate plan."""

    name: str
    """``gpu`` (every node), ``rollout`` or ``training``: a KubeRay worker group's name."""
    nodes: int
    gpus_per_node: int
    hardware: str


def is_cpu(cfg: RunConfig) -> bool:
    """A CPU plan (the trainer's gloo runs): no Ray cluster of GPUs to start."""
    return cfg.hardware.name == "cpu"


def node_groups(cfg: RunConfig) -> tuple[list[NodeGroup], list[str]]:
    """The plan's nodes per pool, and what the files must say about them (one comment line each)."""
    from grpo_tune.core.placement import pools

    c, hw, p = cfg.cluster, cfg.hardware.name, cfg.placement
    gpn = c.ranks_per_node
    if not p.separate:
        return [NodeGroup("gpu", c.nnodes, gpn, hw)], []
    hw_r = p.rollout_hardware or hw
    try:
        ps = pools(c, p.rollout_gpus)
    except GrpoTuneError:  # a split the framework's own rules place (pools() states verl's): one group of nodes
        return [NodeGroup("gpu", c.nnodes, gpn, hw)], [f"separate pools: {p.rollout_gpus} rollout GPUs of {c.gpus}"]
    if ps.shared_nodes:
        note = (
            f"separate pools on the same {c.nnodes} node(s): {ps.rollout.gpus_per_node} rollout + "
            f"{ps.train.gpus_per_node} training GPUs on each node ({p.rollout_gpus} + {c.gpus - p.rollout_gpus})"
        )
        return [NodeGroup("gpu", c.nnodes, gpn, hw)], [note]
    groups = [
        NodeGroup("rollout", ps.rollout.nnodes, ps.rollout.gpus_per_node, hw_r),
        NodeGroup("training", ps.train.nnodes, ps.train.gpus_per_node, hw),
    ]
    notes = [
        f"separate pools on nodes of their own: rollout {ps.rollout.nnodes} node(s) x {gpn} GPUs ({hw_r}), "
        f"training {ps.train.nnodes} node(s) x {gpn} GPUs ({hw}); the framework places each pool on Ray's GPUs"
    ]
    if hw_r != hw:
        notes.append(
            f"the rollout pool is {hw_r}, the training pool {hw}: one Slurm allocation of one partition cannot "
            "hold both (a heterogeneous job is not written here); the RayJob's two worker groups can be placed on "
            "two node pools (add a nodeSelector to each)"
        )
    return groups, notes


def _check(*values: tuple[str, str]) -> None:
    for value, what in values:
        check_name(value, what)


def comment_lines(lines: Sequence[str], width: int = 110) -> str:
    """Comment lines, each wrapped at ``width`` (a path or URL longer than that stays whole; an indented line, a
    command to copy, is never wrapped)."""
    import textwrap

    out = []
    for ln in lines:
        keep = not ln or ln.startswith("  ")
        wrapped = [ln] if keep else textwrap.wrap(ln, width - 2, break_long_words=False, break_on_hyphens=False)
        out += [comment_safe(f"# {w}" if w else "#") for w in wrapped]
    return "\n".join(out)


def ray_slurm_script(
    cfg: RunConfig,
    run_dir: Path,
    *,
    name: str,
    launch: str,
    framework: str,
    needs: str,
) -> str:
    """A Slurm batch script: Ray on every node of the allocation (the head on the first), a bounded wait until the
    cluster holds the plan's GPUs, then ``bash RUN_DIR/launch "$@"`` on the head node (the script's arguments go to
    the launch: verl.sh passes them on to Hydra as more overrides).

    ``name``: the script's own file name in the run folder; ``needs``: what the nodes' environment must provide."""
    groups, notes = node_groups(cfg)
    nodes = sum(g.nodes for g in groups)
    gpn = groups[0].gpus_per_node
    run = str(Path(run_dir).resolve())
    job = f"grpo-tune-{Path(run_dir).name}"
    _check((run, "run folder"), (job, "job name"), (launch, "launch"))
    q = shlex.quote
    head = [
        f"{framework} on Ray on {nodes} Slurm node(s) x {gpn} GPUs ({cfg.hardware.name}), then {launch} on the",
        "head node. Emitted by grpo-tune, after verl's own Ray-on-Slurm example",
        f"({VERL_SLURM_EXAMPLE}):",
        "the Ray head on the first node and a Ray worker on each other node, each node giving Ray its GPUs.",
        *notes,
        "",
        "Submit (site options such as -p PARTITION -A ACCOUNT -t TIME on the command line; arguments after",
        "the script go to the launch):",
        f"  sbatch {q(str(Path(run) / name))}",
        f"Needs: {needs},",
        "active in the shell that submits (srun passes the environment on), and the run folder at the same",
        "path on every node (a shared file system; GRPO_TUNE_RUN_DIR=... points elsewhere).",
    ]
    return f"""#!/bin/bash
#SBATCH --job-name={q(job)}
#SBATCH --nodes={q(str(nodes))}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={q(str(gpn))}
#SBATCH --exclusive
{comment_lines(head)}
set -euo pipefail

DEFAULT_RUN_DIR={q(run)}
RUN_DIR=${{GRPO_TUNE_RUN_DIR:-$DEFAULT_RUN_DIR}}
LAUNCH={q(launch)}
NODES={q(str(nodes))}
GPUS_PER_NODE={q(str(gpn))}
RAY_PORT=${{RAY_PORT:-{RAY_PORT}}}
RAY_WAIT_S=${{RAY_WAIT_S:-{RAY_WAIT_S}}}

if [[ "${{SLURM_JOB_NUM_NODES:-}}" != "$NODES" ]]; then
  echo "this plan runs on $NODES node(s); the job has ${{SLURM_JOB_NUM_NODES:-none}} (sbatch it as written)" >&2
  exit 2
fi
if [[ ! -f "$RUN_DIR/$LAUNCH" ]]; then
  echo "$RUN_DIR/$LAUNCH not found: the run folder must be on a file system every node sees" >&2
  exit 2
fi
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${{nodes[0]}}
read -ra addrs <<<"$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address)"
head_ip=${{addrs[0]}}
for a in "${{addrs[@]}}"; do  # the first IPv4 address, when the node also has IPv6 ones
  if [[ $a =~ ^[0-9]+(\\.[0-9]+){{3}}$ ]]; then head_ip=$a; break; fi
done
export RAY_ADDRESS="$head_ip:$RAY_PORT"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # the Ray steps end with the job's script

echo "Ray head on $head_node ($RAY_ADDRESS), $((NODES - 1)) worker node(s), $GPUS_PER_NODE GPUs each"
srun --nodes=1 --ntasks=1 -w "$head_node" \\
  ray start --head --node-ip-address="$head_ip" --port="$RAY_PORT" --num-gpus="$GPUS_PER_NODE" --block &
gpus_up() {{
  python3 -c 'import ray; ray.init(logging_level="ERROR"); print(int(ray.cluster_resources().get("GPU", 0)))' \\
    2>/dev/null || echo 0
}}
deadline=$((SECONDS + RAY_WAIT_S))
until [[ "$(gpus_up)" -ge "$GPUS_PER_NODE" ]]; do
  if ((SECONDS >= deadline)); then echo "the Ray head did not start within $RAY_WAIT_S s" >&2; exit 1; fi
  sleep 5
done
for ((i = 1; i < NODES; i++)); do
  srun --nodes=1 --ntasks=1 -w "${{nodes[$i]}}" \\
    ray start --address="$RAY_ADDRESS" --num-gpus="$GPUS_PER_NODE" --block &
done
want=$((NODES * GPUS_PER_NODE))
until [[ "$(gpus_up)" -ge "$want" ]]; do
  if ((SECONDS >= deadline)); then echo "Ray did not reach $want GPUs within $RAY_WAIT_S s" >&2; exit 1; fi
  sleep 5
done

echo "Ray holds $want GPUs; starting $LAUNCH on $head_node"
srun --overlap --nodes=1 --ntasks=1 -w "$head_node" bash "$RUN_DIR/$LAUNCH" "$@"
"""


def rayjob_name(run_id: str, framework: str) -> str:
    """A RayJob name KubeRay accepts (a DNS-1035 label of at most 47 characters) that names the run: lower case,
    other characters as ``-``, shortened with a hash of the whole when too long."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"{framework}-{run_id}".lower()).strip("-")
    if not base or not base[0].isalpha():
        base = f"g-{base}".rstrip("-")
    if len(base) <= MAX_RAYJOB_NAME:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    return f"{base[: MAX_RAYJOB_NAME - 9].rstrip('-')}-{digest}"


def rayjob_yaml(
    cfg: RunConfig,
    run_dir: Path,
    *,
    framework: str,
    key: str,
    entrypoint: str,
    image: str,
    notes: Sequence[str] = (),
) -> str:
    """A KubeRay ``RayJob`` (ray.io/v1) that creates the plan's Ray cluster, runs ``entrypoint`` (a shell line whose
    words are already quoted) as the job's driver and deletes the cluster when it ends."""
    groups, pool_notes = node_groups(cfg)
    run = Path(run_dir).resolve()
    _check((str(run), "run folder"), (image, "image"), (entrypoint, "entrypoint"))
    mount = str(run.parent)
    volumes = [{"name": "runs", "persistentVolumeClaim": {"claimName": RUNS_CLAIM}}]
    mounts = [{"name": "runs", "mountPath": mount}]

    def container(name: str, gpus: int) -> dict:
        c: dict = {"name": name, "image": image, "volumeMounts": mounts}
        if gpus:
            c["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
        else:
            c["resources"] = {"limits": {"cpu": "8", "memory": "64Gi"}, "requests": {"cpu": "8", "memory": "64Gi"}}
        return c

    workers = [
        {
            "groupName": g.name,
            "replicas": g.nodes,
            "minReplicas": g.nodes,
            "maxReplicas": g.nodes,
            "rayStartParams": {"num-gpus": str(g.gpus_per_node)},
            "template": {"spec": {"containers": [container("ray-worker", g.gpus_per_node)], "volumes": volumes}},
        }
        for g in groups
    ]
    doc: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": rayjob_name(Path(run_dir).name, key)},
        "spec": {
            "entrypoint": entrypoint,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {"num-gpus": "0", "dashboard-host": "0.0.0.0"},
                    "template": {"spec": {"containers": [container("ray-head", 0)], "volumes": volumes}},
                },
                "workerGroupSpecs": workers,
            },
        },
    }
    nodes = sum(g.nodes for g in groups)
    gpn = groups[0].gpus_per_node
    name = doc["metadata"]["name"]
    head = [
        f"{framework} as a KubeRay RayJob (ray.io/v1; checked against KubeRay v1.7.0's CRD schema).",
        f"Worker pods = the plan's {nodes} node(s), each with {gpn} GPUs (nvidia.com/gpu); the head pod has no",
        "GPU (rayStartParams num-gpus 0): it holds the Ray control plane and the driver, no GPU actor.",
        *pool_notes,
        *notes,
        f"The PersistentVolumeClaim {RUNS_CLAIM!r} (a shared volume holding the run folders; change",
        "claimName to yours) is mounted in every pod at",
        f"  {mount}",
        "so that the entrypoint finds the run folder that grpo-tune filled.",
        f"image {image!r} is a placeholder for an image with {framework} and Ray; set",
        "spec.rayClusterSpec.rayVersion to its Ray version, and the pods' cpu/memory to your nodes.",
        f"Run:  kubectl apply -f THIS_FILE; kubectl get rayjob {name}; kubectl logs -f job/{name}",
    ]
    body = yaml.dump(doc, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=1000)
    return comment_lines(head) + "\n" + body


class _NoAliases(yaml.SafeDumper):
    """Every mapping written out in full (no ``&id001`` anchors: kubectl reads them, people less easily)."""

    def ignore_aliases(self, data: object) -> bool:
        return True
