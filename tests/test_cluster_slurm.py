"""Refinement trials on a real single-node Slurm started here (marker ``cluster``: not in the default run).

Needs Debian's ``slurm-wlm`` and ``munge`` and root (slurmd runs jobs as their user). The fixture starts munged,
slurmctld and slurmd on free loopback ports with a configuration in a temporary folder (``SLURM_CONF``), and
stops them at the end. The configuration has this machine as a CPU node (partition ``debug``) and eight GPU
nodes of 8 GPUs that exist only on paper (partition ``gpu``, DOWN): ``sbatch --test-only`` checks a multi-node
GPU job against them (the scheduler accepts the job and names the nodes it would use, or refuses it), and a
real job runs on the CPU node.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm():
    for tool in ("slurmctld", "slurmd", "munged", "sbatch"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} not found: apt-get install -y slurm-wlm munge", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail(  # the group was asked for: it fails loudly rather than skip its jobs
            "a local slurmd must run as root (it starts jobs as their owner): run `pytest -m cluster` as root",
            pytrace=False,
        )
    base = Path(tempfile.mkdtemp(prefix="grpo-tune-slurm-"))
    os.chmod(base, 0o755)
    munge = base / "munge"
    munge.mkdir()
    shutil.chown(munge, "munge", "munge")
    key = munge / "munge.key"
    key.write_bytes(os.urandom(128))
    shutil.chown(key, "munge", "munge")
    os.chmod(key, 0o600)
    sock = munge / "munge.socket"
    r = subprocess.run(
        [
            "runuser",
            "-u",
            "munge",
            "--",
            "/usr/sbin/munged",
            f"--socket={sock}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'seed'}",
            f"--key-file={key}",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    host = socket.gethostname()
    cpus = os.cpu_count() or 1
    for d in ("state", "spool", "log"):
        (base / d).mkdir()
    conf = base / "slurm.conf"
    conf.write_text(
        f"""ClusterName=grpotest
SlurmctldHost={host}
SlurmUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={base / "state"}
SlurmdSpoolDir={base / "spool"}
SlurmctldPidFile={base / "slurmctld.pid"}
SlurmdPidFile={base / "slurmd.pid"}
SlurmctldLogFile={base / "log" / "ctld.log"}
SlurmdLogFile={base / "log" / "d.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName={host} CPUs={cpus} RealMemory=2000 State=UNKNOWN
NodeName=gpu[1-8] NodeAddr=127.0.0.1 CPUs=64 RealMemory=100000 Gres=gpu:8 State=DOWN Reason=on-paper
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=gpu Nodes=gpu[1-8] MaxTime=INFINITE State=UP
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["/usr/sbin/slurmctld", "-c"], env=env, check=True)
    subprocess.run(["/usr/sbin/slurmd"], env=env, check=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        s = subprocess.run(["sinfo", "-h", "-o", "%P %t %D"], env=env, capture_output=True, text=True)
        if "debug* idle 1" in s.stdout and "gpu down 8" in s.stdout:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"slurmd never became idle: {s.stdout} {s.stderr}")
    probe = ["sbatch", "--test-only", "-p", "gpu", "-N", "1", "--gpus-per-node=1", "--wrap", "true"]
    while time.monotonic() - t0 < 90:  # the controller takes a few seconds to count the paper nodes' GPUs
        if subprocess.run(probe, env=env, capture_output=True).returncode == 0:
            break
        time.sleep(1)
    else:
        pytest.fail("the gpu partition never accepted a one-GPU test job")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield base
    finally:
        for pidfile in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            try:
                os.kill(int((base / pidfile).read_text().split()[0]), 15)
            except (OSError, ValueError):
                pass
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        time.sleep(1)
        shutil.rmtree(base, ignore_errors=True)


def _trial_config(model: str, hardware: str, gpus: int, gpus_per_node: int | None, tmp: Path):
    from grpo_tune.jobs.inputs import plan_inputs
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.core.config import RunConfig, TrainerOptions, save

    m, hw, cl, wl = plan_inputs(
        model=model,
        hardware=hardware,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        workload="grpo",
        prompts=8,
        n=4,
        prompt_len=16,
        response_len=16,
        mini_batch=8,
        ppo_epochs=1,
        kl=True,
        seq_len=64,
        gbs=8,
    )
    best = search(m, hw, cl, wl).ranked[0]
    cfg = RunConfig(model=m, hardware=hw, cluster=cl, strategy=best.strategy, workload=wl, trainer=TrainerOptions())
    return cfg, save(cfg, tmp / "trial.yaml")


@pytest.mark.parametrize("nodes", [2, 8])
def test_a_multi_node_gpu_trial_job_is_accepted_by_slurm_sized_to_the_plan(tmp_path, slurm, nodes):
    from grpo_tune.autotune.refine import slurm as S

    cfg, path = _trial_config("tiny", "h100", 8 * nodes, 8, tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(
        S.job_script(
            path, cfg, steps=4, json_path=tmp_path / "p.json", timeout_s=300, job_name="t", log_path=tmp_path / "l"
        )
    )
    text = script.read_text()
    assert f"#SBATCH --nodes={nodes}\n" in text and "#SBATCH --gpus-per-node=8\n" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    r = subprocess.run(["sbatch", "--test-only", "-p", "gpu", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"using {nodes} processors" in r.stderr or "gpu[1-" in r.stderr, r.stderr
    # the check discriminates: one GPU more per node than the nodes have is refused by the scheduler
    over = text.replace("--gpus-per-node=8", "--gpus-per-node=9")
    bad = tmp_path / "over.sbatch"
    bad.write_text(over)
    r = subprocess.run(["sbatch", "--test-only", "-p", "gpu", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0


DRIVER = r"""
import sys
from grpo_tune.jobs.inputs import plan_inputs
from grpo_tune.autotune.search.driver import search
from grpo_tune.autotune.refine import RefineOptions, refine
from grpo_tune.core.config import TrainerOptions
m, hw, cl, wl = plan_inputs(model="tiny", hardware="cpu", gpus=int(sys.argv[2]), gpus_per_node=None, workload="grpo",
                            prompts=4, n=2, prompt_len=8, response_len=8, mini_batch=4, ppo_epochs=1, kl=True,
                            seq_len=16, gbs=4)
r = search(m, hw, cl, wl)
refine(r.ranked, m, hw, cl, wl, sys.argv[1], RefineOptions(
    trials=1, trial_steps=2, trial_timeout_s=400, emit=False, calibrate=False, progress=False, launcher="slurm",
    trainer=TrainerOptions(rollout_engine="megatron")))
"""


def test_a_refine_trial_runs_as_a_slurm_job_on_the_plans_ranks(tmp_path, slurm):
    import optuna

    gpus = min(2, os.cpu_count() or 1)
    drv = tmp_path / "driver.py"
    drv.write_text(DRIVER)
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, str(drv), str(out), str(gpus)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    names = optuna.get_all_study_names(f"sqlite:///{out / 'study.db'}")
    study = optuna.load_study(study_name=names[0], storage=f"sqlite:///{out / 'study.db'}")
    t = study.trials[-1]
    assert t.state.name == "COMPLETE", (t.user_attrs.get("reason"), r.stderr)
    tdir = out / "trials" / f"{t.number:04d}"
    job = (tdir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=1\n" in job and f"#SBATCH --cpus-per-task={gpus}\n" in job
    log = (tdir / "slurm.log").read_text()
    assert "profiling tiny" in log and f"{gpus} rank(s)" in log, log
    prof = json.loads((tdir / "profile.json").read_text())
    assert prof["status"] == "ok" and prof["world_size"] == gpus


def _run_folder(tmp: Path, *args: str) -> Path:
    from grpo_tune.cli.main import main

    assert main(["search", *args, "--out", str(tmp / "runs")]) == 0
    (run,) = [d for d in (tmp / "runs").iterdir() if d.is_dir()]
    return run


def test_the_cluster_launch_files_pass_slurms_own_option_parser(tmp_path, slurm):
    """verl.sbatch of `search --model qwen3-30b-a3b --gpus 64` (8 nodes of 8 GPUs) is accepted by the scheduler
    for the paper GPU nodes, and refused when it asks one GPU more per node; NeMo-RL's ray.sub wrapper submits
    with options sbatch accepts (a stand-in ray.sub: NeMo-RL's own is not vendored)."""
    run = _run_folder(tmp_path, "--model", "qwen3-30b-a3b", "--gpus", "64")
    script = run / "verl.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    r = subprocess.run(["sbatch", "--test-only", "-p", "gpu", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "gpu[1-8]" in r.stderr, r.stderr
    bad = tmp_path / "over.sbatch"
    bad.write_text(script.read_text().replace("--gpus-per-node=8", "--gpus-per-node=9"))
    r = subprocess.run(["sbatch", "--test-only", "-p", "gpu", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0

    nemo = _run_folder(tmp_path / "n", "--model", "qwen3-30b-a3b", "--gpus", "32", "--framework", "nemo-rl")
    co = tmp_path / "RL"
    (co / "examples/configs/recipes/llm").mkdir(parents=True)
    (co / "ray.sub").write_text("#!/bin/bash\n#SBATCH --exclusive\ntrue\n")
    r = subprocess.run(
        ["bash", str(nemo / "nemo_rl.ray_sub.sh"), "--test-only", "-p", "gpu"],
        cwd=co,
        env={**os.environ, "CONTAINER": "nvcr.io/example/nemo-rl:v0.7.0"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "gpu[" in r.stderr, r.stderr
