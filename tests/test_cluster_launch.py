"""The cluster launch files of a run folder: a Slurm script that starts Ray and runs the launch, NeMo-RL's ray.sub
submitted with the plan's nodes, and KubeRay RayJobs, sized from the plan.

What is checked here (no Slurm, no Kubernetes): each RayJob against KubeRay v1.7.0's own CRD schema with strict
field validation, plus the operator's own checks on names and replicas (tests/_kuberay.py); each script with
``bash -n``, then run for real with stand-ins for Slurm's and Ray's commands on PATH, which record what they are
asked to start. Slurm's own option parser (``sbatch --test-only``) checks the same scripts in
tests/test_cluster_slurm.py (marker ``cluster``).
"""

from __future__ import annotations

import copy
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from grpo_tune.cli.main import main

from _kuberay import errors as rayjob_errors

ROOT = Path(__file__).resolve().parents[1]


def _search(tmp_path: Path, *args: str, out: Path | None = None) -> Path:
    out = out or tmp_path / "runs"
    assert main(["search", *args, "--out", str(out)]) == 0
    (run,) = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")]
    return run


@pytest.fixture(scope="module")
def moe64(tmp_path_factory) -> Path:
    """The run folder of `grpo-tune search --model qwen3-30b-a3b --gpus 64` (8 nodes of 8 H100)."""
    return _search(tmp_path_factory.mktemp("moe64"), "--model", "qwen3-30b-a3b", "--gpus", "64")


def _rayjob(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _workers(job: dict) -> list[dict]:
    return job["spec"]["rayClusterSpec"]["workerGroupSpecs"]


def _gpus(group: dict) -> object:
    (c,) = group["template"]["spec"]["containers"]
    return c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")


def test_the_64_gpu_search_folder_holds_a_slurm_script_and_a_rayjob_that_validate(moe64):
    sbatch, job_path = moe64 / "verl.sbatch", moe64 / "verl.rayjob.yaml"
    text = sbatch.read_text()
    for line in ("#SBATCH --nodes=8", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=1"):
        assert f"\n{line}\n" in text, line
    assert sbatch.stat().st_mode & stat.S_IXUSR
    r = subprocess.run(["bash", "-n", str(sbatch)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    job = _rayjob(job_path)
    assert job["kind"] == "RayJob" and rayjob_errors(job) == []
    (group,) = _workers(job)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (8, 8, 8)  # one pod per node
    assert _gpus(group) == 8 and group["rayStartParams"]["num-gpus"] == "8"
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0" and _gpus(head) is None
    assert shlex.split(job["spec"]["entrypoint"]) == ["bash", str(moe64.resolve() / "verl.sh")]
    # the launch the cluster runs is the plan's: 8 nodes of 8 GPUs
    verl = (moe64 / "verl.sh").read_text()
    assert "trainer.nnodes=8 " in verl and "trainer.n_gpus_per_node=8 " in verl
    report = (moe64 / "report.md").read_text()
    assert "`verl.sbatch`" in report and "sbatch verl.sbatch" in report
    assert "kubectl apply -f verl.rayjob.yaml" in report


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda j: _workers(j)[0].__setitem__("replicas", "8"), "replicas"),  # a string where the CRD says integer
        (lambda j: j["spec"]["rayClusterSpec"].__setitem__("workerGroupSpec", []), "workerGroupSpec"),  # a typo
        (lambda j: _workers(j)[0].pop("minReplicas"), "minReplicas"),
        (lambda j: j.__setitem__("apiVersion", "ray.io/v1alpha2"), "apiVersion"),
        (lambda j: j["metadata"].__setitem__("name", "x" * 48), "47"),  # the operator's own limit
        (lambda j: j["metadata"].__setitem__("name", "qwen2.5-7b"), "DNS-1035"),
        (lambda j: _workers(j)[0].__setitem__("maxReplicas", 7), "greater than maxReplicas"),
    ],
)
def test_the_rayjob_check_refuses_what_kubernetes_or_kuberay_would(moe64, mutate, why):
    """The validation can fail: each of these edits of the emitted RayJob is refused, with the reason."""
    job = copy.deepcopy(_rayjob(moe64 / "verl.rayjob.yaml"))
    mutate(job)
    errs = rayjob_errors(job)
    assert errs and any(why in e for e in errs), errs


# --- the scripts run, with Slurm's and Ray's commands replaced by recorders -------------------------------------

SHIMS = {
    # scontrol show hostnames LIST: the job's nodes n1..nN
    "scontrol": 'for ((i = 1; i <= ${FAKE_NODES:-8}; i++)); do echo "n$i"; done\n',
    # srun ... CMD: records its words; hostname answers an IPv6 and an IPv4 address; `ray start` blocks like Ray
    "srun": """printf '%s\\n' "srun $*" >> "$FAKE_LOG"
for a in "$@"; do
  case $a in
    hostname) echo "fe80::1 10.1.2.3"; exit 0 ;;
    ray) echo "ray-up $*" >> "$FAKE_LOG"; echo $$ >> "$FAKE_PIDS"; exec /bin/sleep 60 ;;
    bash) shift_to_bash=1 ;;
  esac
done
while [[ $# -gt 0 && $1 != bash ]]; do shift; done
exec "$@"
""",
    # python3 -c '...cluster_resources...': the GPUs of the Ray nodes started so far; python3 -m verl...: recorded
    "python3": """if [[ $1 == -c ]]; then
  echo $(( $(grep -c '^ray-up' "$FAKE_LOG" || true) * ${FAKE_GPUS:-8} )); exit 0
fi
printf '%s\\n' "python3 $*" >> "$FAKE_LOG"
""",
    "sleep": "exit 0\n",  # the script's polling waits return at once
}


def _shims(tmp: Path) -> dict[str, str]:
    bin_ = tmp / "bin"
    bin_.mkdir()
    for name, body in SHIMS.items():
        (bin_ / name).write_text("#!/bin/bash\n" + body)
        (bin_ / name).chmod(0o755)
    log, pids = tmp / "calls.log", tmp / "pids"
    log.touch()
    pids.touch()
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "FAKE_LOG": str(log), "FAKE_PIDS": str(pids)}


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _all_gone(pids: list[int], within_s: float = 10.0) -> bool:
    """SIGTERM is delivered at once but acted on a moment later: wait (bounded) for the processes to end."""
    import time

    t0 = time.monotonic()
    while any(_alive(p) for p in pids):
        if time.monotonic() - t0 > within_s:
            return False
        time.sleep(0.05)
    return True


def test_the_slurm_script_starts_ray_on_every_node_then_the_launch_on_the_head(moe64, tmp_path):
    env = _shims(tmp_path)
    env.update(SLURM_JOB_NUM_NODES="8", SLURM_JOB_NODELIST="n[1-8]", HOME=str(tmp_path))
    r = subprocess.run(
        ["bash", str(moe64 / "verl.sbatch"), "trainer.total_training_steps=3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    calls = Path(env["FAKE_LOG"]).read_text().splitlines()
    ray = [c for c in calls if c.startswith("ray-up")]
    assert len(ray) == 8
    assert "--head" in ray[0] and "-w n1 " in ray[0] and "--num-gpus=8" in ray[0]
    assert sorted(c.split("-w ")[1].split()[0] for c in ray[1:]) == sorted(f"n{i}" for i in range(2, 9))
    assert all("--address=10.1.2.3:6379" in c and "--num-gpus=8" in c for c in ray[1:])  # the IPv4 address
    (driver,) = [c for c in calls if c.startswith("srun --overlap")]
    assert f"-w n1 bash {moe64.resolve() / 'verl.sh'} trainer.total_training_steps=3" in driver
    (verl,) = [c for c in calls if c.startswith("python3 -m verl.trainer.main_ppo")]
    assert " trainer.nnodes=8 " in verl and verl.endswith(" trainer.total_training_steps=3")
    # the Ray steps end with the script (its EXIT trap), none outlives it
    pids = [int(p) for p in Path(env["FAKE_PIDS"]).read_text().split()]
    assert len(pids) == 8 and _all_gone(pids)


def test_the_slurm_script_refuses_an_allocation_of_other_nodes_and_waits_bounded(moe64, tmp_path):
    env = _shims(tmp_path)
    env.update(SLURM_JOB_NUM_NODES="4", SLURM_JOB_NODELIST="n[1-4]")
    r = subprocess.run(["bash", str(moe64 / "verl.sbatch")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "runs on 8 node(s); the job has 4" in r.stderr
    # nodes whose GPUs never show up in Ray: the wait ends at RAY_WAIT_S, with the reason
    env.update(SLURM_JOB_NUM_NODES="8", FAKE_GPUS="0", RAY_WAIT_S="1")
    r = subprocess.run(["bash", str(moe64 / "verl.sbatch")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "did not start within 1 s" in r.stderr
    assert "python3 -m verl" not in Path(env["FAKE_LOG"]).read_text()


HOSTILE = 'it\'s a "run" $(touch PWNED) `id` ;x'


def test_every_value_is_quoted_even_in_a_hostile_folder(tmp_path):
    out = tmp_path / HOSTILE
    run = _search(tmp_path, "--model", "7b", "--gpus", "16", out=out)
    sbatch = run / "verl.sbatch"
    assert subprocess.run(["bash", "-n", str(sbatch)]).returncode == 0
    lines = "\n".join(ln for ln in sbatch.read_text().splitlines() if ln.startswith(("DEFAULT_RUN_DIR=", "LAUNCH=")))
    got = subprocess.run(
        ["bash", "-c", lines + '\nprintf "%s|%s" "$DEFAULT_RUN_DIR" "$LAUNCH"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert got.stdout == f"{run.resolve()}|verl.sh" and not (tmp_path / "PWNED").exists()
    job = _rayjob(run / "verl.rayjob.yaml")
    assert rayjob_errors(job) == []
    assert shlex.split(job["spec"]["entrypoint"]) == ["bash", str(run.resolve() / "verl.sh")]
    (mount,) = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == str(out.resolve())


def test_separate_pools_on_nodes_of_their_own_are_two_worker_groups(tmp_path):
    run = _search(
        tmp_path, "--model", "7b", "--gpus", "16", "--placement", "separate", "--rollout-gpus", "8", "--staleness", "1"
    )
    job = _rayjob(run / "verl.rayjob.yaml")
    assert rayjob_errors(job) == []
    got = {g["groupName"]: (g["replicas"], _gpus(g)) for g in _workers(job)}
    assert got == {"rollout": (1, 8), "training": (1, 8)}
    text = (run / "verl.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in text and "separate pools on nodes of their own" in text


def test_a_cpu_plan_gets_no_cluster_files(tmp_path):
    cpu = ("--hardware", "cpu", "--prompts", "16", "--mini-batch", "16")
    run = _search(tmp_path, "--model", "tiny", "--gpus", "1", *cpu)
    names = {p.name for p in run.iterdir()}
    assert "verl.sh" in names and not {"verl.sbatch", "verl.rayjob.yaml"} & names


def test_tune_runs_the_users_edited_launch_on_the_cluster(tmp_path):
    launch = tmp_path / "my run.sh"
    launch.write_text((ROOT / "examples/qwen2-7b-grpo-megatron.sh").read_text())
    assert main(["tune", str(launch), "--hardware", "h100", "--out", str(tmp_path / "runs")]) == 0
    (run,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    assert "\nLAUNCH=tuned.sh\n" in (run / "verl.sbatch").read_text()
    job = _rayjob(run / "verl.rayjob.yaml")
    assert rayjob_errors(job) == [] and shlex.split(job["spec"]["entrypoint"])[1] == str(run.resolve() / "tuned.sh")


# --- NeMo-RL: its own ray.sub -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nemo32(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("nemo32")
    return _search(tmp, "--model", "qwen3-30b-a3b", "--gpus", "32", "--framework", "nemo-rl")


def _checkout(tmp: Path) -> Path:
    """A stand-in NeMo-RL checkout: ray.sub and the recipe folder."""
    co = tmp / "RL"
    (co / "examples/configs/recipes/llm").mkdir(parents=True)
    (co / "ray.sub").write_text("#!/bin/bash\n#SBATCH --exclusive\n")
    return co


def test_the_nemo_rl_folder_submits_ray_sub_with_the_plans_nodes(nemo32, tmp_path):
    script, job_path = nemo32 / "nemo_rl.ray_sub.sh", nemo32 / "nemo_rl.rayjob.yaml"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    co = _checkout(tmp_path)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "sbatch").write_text(
        '#!/bin/bash\nprintf "%s\\n" "$*" "$COMMAND" "$CONTAINER" "$MOUNTS" "$GPUS_PER_NODE" > "$FAKE_LOG"\n'
    )
    (bin_ / "sbatch").chmod(0o755)
    log = tmp_path / "sbatch.log"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "FAKE_LOG": str(log), "CONTAINER": "img:1"}
    argv = ["bash", str(script), "-A", "acct", "-p", "batch"]
    r = subprocess.run(argv, cwd=co, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    args, command, container, mounts, gpn = log.read_text().splitlines()
    recipe = f"examples/configs/recipes/llm/grpo-tune-{nemo32.name}.yaml"
    assert args.startswith("--nodes=4 --gres=gpu:8 --job-name=") and args.endswith(" -A acct -p batch ray.sub")
    assert command == f"uv run examples/run_grpo.py --config {recipe}" and (container, gpn) == ("img:1", "8")
    assert mounts == f"{co}:{co},{nemo32.resolve()}:{nemo32.resolve()}"
    assert (co / recipe).read_bytes() == (nemo32 / "nemo_rl.yaml").read_bytes()
    assert "num_nodes: 4" in (nemo32 / "nemo_rl.yaml").read_text()  # the recipe's cluster.num_nodes = --nodes
    # a different file already at the recipe's place is the user's: refused, left as it was
    (co / recipe).write_text("mine\n")
    r = subprocess.run(["bash", str(script)], cwd=co, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "not replaced" in r.stderr and (co / recipe).read_text() == "mine\n"
    # outside a checkout, or without the container ray.sub needs: refused before sbatch
    log.unlink()
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "NeMo-RL checkout" in r.stderr
    r = subprocess.run(["bash", str(script)], cwd=co, env={**env, "CONTAINER": ""}, capture_output=True, text=True)
    assert r.returncode != 0 and "CONTAINER" in r.stderr and not log.exists()
    job = _rayjob(job_path)
    assert rayjob_errors(job) == []
    (group,) = _workers(job)
    assert group["replicas"] == 4 and _gpus(group) == 8
    entry = job["spec"]["entrypoint"]
    assert entry.startswith("cd /opt/nemo-rl && cp ") and entry.endswith(f"--config {recipe}")
