"""`grpo-tune train` / `grpo-tune profile` before any process starts: dry-run summary, coded errors,
the torchrun command, the sbatch script. None of these tests starts a trainer process."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_tune.cli.main import main as cli_main
from grpo_tune.core.config import RunConfig, TrainerOptions, load, save
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload

ROOT = Path(__file__).resolve().parent.parent


def write_cfg(path: Path, *, model="tiny", gpus=2, gpn=2, strategy=None, workload=None, trainer=None) -> Path:
    cfg = RunConfig(
        model=load_model(model),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpn),
        strategy=Strategy.of(**(strategy or {"tp": 2})),
        workload=Workload(
            **(
                {"prompts": 4, "n": 4, "prompt_len": 16, "response_len": 8, "mini_batch": 2, "dtype": "fp32"}
                | (workload or {})
            )
        ),
        trainer=TrainerOptions(**({"steps": 2, "out_dir": str(path.parent / "run")} | (trainer or {}))),
    )
    save(cfg, path)
    return path


def edit(path: Path, section: str, **kw) -> Path:
    d = yaml.safe_load(path.read_text())
    d[section] = kw if section == "model" and "name" in kw else {**(d.get(section) or {}), **kw}
    path.write_text(yaml.safe_dump(d))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_dry_run_prints_the_summary_and_starts_nothing_without_torch(tmp_path):
    cfg = write_cfg(tmp_path / "c.yaml", strategy={"tp": 2}, gpus=2)
    code = (
        "import sys; from grpo_tune.cli.main import main; rc = main(['train', '--config', sys.argv[1], '--dry-run']);"
        "assert 'torch' not in sys.modules, 'dry-run imported torch'; sys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Parallel Config Summary" in r.stdout
    launch = "torch.distributed.run --nproc-per-node=2 --standalone -m grpo_tune.trainer.main"
    assert launch in r.stdout.replace("\n", " ")
    assert not (tmp_path / "run").exists()  # no output folder, no log: nothing started


def test_dry_run_json_has_degrees_micro_batches_and_memory(tmp_path, capsys):
    cfg = write_cfg(
        tmp_path / "c.yaml",
        gpus=4,
        gpn=4,
        strategy={"tp": 2, "mbs": 2},
        workload={"prompts": 8, "n": 4, "mini_batch": 4},
    )
    assert cli_main(["train", "--config", str(cfg), "--dry-run", "--json"]) == 0
    sm = json.loads(capsys.readouterr().out)
    assert sm["world_size"] == 4 and sm["dp"] == 2
    assert sm["roles"]["actor"]["tp"] == 2 and sm["roles"]["reference"]["tp"] == 2
    assert sm["roles"]["rollout"]["replicas"] == 4  # rollout_tp 1
    # 4 prompts x 4 = 16 sequences per mini-batch over dp 2 x mbs 2 -> 4 micro-batches
    assert sm["batch"]["micro_batches_per_mini_batch"] == 4 and sm["batch"]["mini_batches_per_step"] == 2
    if sm["memory"] is not None:
        assert {"rollout", "update"} <= set(sm["memory"]["phases"])
        assert all(v > 0 for v in sm["memory"]["phases"].values())


def test_dry_run_of_a_separate_plan_shows_both_pools(tmp_path, capsys):
    """A separate plan's summary counts the rollout replicas on the rollout pool, names the ranks of each pool and
    prices each pool's memory on its own GPUs (it used to price the plan as colocated on every GPU and fail with
    INVALID_DEGREES whenever the training layout did not divide the whole cluster)."""
    from grpo_tune.core.placement import Placement

    cfg_path = write_cfg(tmp_path / "c.yaml", gpus=4, gpn=4, strategy={"tp": 2, "pp": 1})
    d = yaml.safe_load(cfg_path.read_text())
    d["placement"] = Placement(mode="separate", rollout_gpus=2, staleness=1, stream=True).to_dict()
    cfg_path.write_text(yaml.safe_dump(d))
    assert cli_main(["train", "--config", str(cfg_path), "--dry-run", "--json"]) == 0
    sm = json.loads(capsys.readouterr().out)
    assert sm["world_size"] == 4 and sm["dp"] == 1
    assert sm["placement"]["train_gpus"] == 2 and sm["placement"]["rollout_gpus"] == 2
    assert sm["placement"]["staleness"] == 1 and sm["placement"]["stream"] is True
    assert sm["roles"]["rollout"]["replicas"] == 2 and sm["roles"]["rollout"]["gpus"] == 2  # rollout_tp 1
    assert sm["memory"] is not None, sm["memory_note"]
    assert {"rollout", "update"} <= set(sm["memory"]["phases"])
    assert cli_main(["train", "--config", str(cfg_path), "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "separate pools: ranks 0-1 train, 2-3 roll out; staleness 1" in out, out
    assert "each mini-batch trained as it arrives (streamed)" in out, out
    assert "tiny on 2 x cpu (training) + 2 x cpu (rollout)" in out, out
    assert "engine=auto, 2 replica(s)" in out and "on the 2 rollout GPUs" in out, out


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda p: edit(p, "strategy", dp=3), "INVALID_DEGREES"),  # 2 (tp) x 3 != 2 GPUs
        (lambda p: edit(p, "strategy", tp=4), "INVALID_DEGREES"),  # tp does not divide the 2 GPUs
        (lambda p: edit(p, "model", name="no-such-model"), "UNKNOWN_MODEL"),
        (lambda p: edit(p, "trainer", dataset="/nonexistent/prompts.jsonl"), "MISSING_DATASET"),
        (lambda p: edit(p, "workload", n=3), "BATCH_DIVISIBILITY"),  # mini-batch 2 x 3 = 6 over dp 1 x mbs 4
        (lambda p: edit(p, "workload", prompt_len=250), "BAD_CONFIG"),  # past tiny's 256 positions
        (lambda p: edit(p, "trainer", reward="nomodule_xyz:score"), "BAD_CONFIG"),
        (lambda p: edit(p, "trainer", lr_rate=0.1), "UNKNOWN_KEY"),
    ],
)
def test_bad_config_is_a_coded_error_before_any_process(tmp_path, mutate, code):
    cfg = write_cfg(tmp_path / "c.yaml", strategy={"tp": 2, "mbs": 4} if code == "BATCH_DIVISIBILITY" else {"tp": 2})
    mutate(cfg)
    r = run_cli("train", "--config", str(cfg))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"[{code}]" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "train.log").exists()


def test_profile_bad_config_exits_2(tmp_path):
    cfg = edit(write_cfg(tmp_path / "c.yaml"), "strategy", pp=3)
    r = run_cli("profile", "--config", str(cfg), "--steps", "2", "--json", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "[INVALID_DEGREES]" in r.stderr
    assert not (tmp_path / "p.json").exists()


def _gpu_plan(tmp_path: Path) -> Path:
    cfg = RunConfig(
        model=load_model("qwen2.5-7b"),
        hardware=load_hardware("h100"),
        cluster=Cluster(gpus=8, gpus_per_node=8),
        strategy=Strategy.of(tp=2, mbs=2),
        workload=Workload(prompts=64, n=4, mini_batch=16),
        trainer=TrainerOptions(steps=2, out_dir=str(tmp_path / "run")),
    )
    save(cfg, tmp_path / "best.yaml")
    return tmp_path / "best.yaml"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA GPUs")
@pytest.mark.parametrize("command", ["train", "profile"])
def test_a_gpu_plan_is_refused_where_there_are_no_gpus(tmp_path, command):
    """An H100 plan started on a CPU machine used to start 8 gloo workers that loaded the 7B model into RAM until
    the kernel killed them; it is refused before torchrun, and its dry run and sbatch script still work."""
    cfg = _gpu_plan(tmp_path)
    r = run_cli(command, "--config", str(cfg), *(["--json", str(tmp_path / "p.json")] if command == "profile" else []))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "[NO_GPU] this config is a plan for 8 x h100-sxm-80gb (8 rank(s) per node)" in r.stderr, r.stderr
    assert "0 CUDA GPU(s)" in r.stderr and "--hardware cpu" in r.stderr
    assert not (tmp_path / "run" / "train.log").exists()
    assert run_cli("train", "--config", str(cfg), "--dry-run").returncode == 0


def test_torchrun_command_single_and_multi_node(tmp_path):
    from grpo_tune.trainer import launch

    cfg = load(write_cfg(tmp_path / "c.yaml", gpus=8, gpn=4, strategy={"tp": 2, "pp": 2}))
    lay = launch.layout(cfg)
    assert (lay.nnodes, lay.nproc_per_node) == (2, 4)
    cmd = launch.torchrun_command("c.yaml", lay, node_rank=1, master_addr="10.0.0.1", master_port=29600)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for flag in ("--nproc-per-node=4", "--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29600"):
        assert flag in cmd
    assert cmd[-4:] == ["-m", "grpo_tune.trainer.main", "--config", "c.yaml"]
    # --nnodes overrides the node split; it must divide the world size
    assert launch.layout(cfg, nnodes=4).nproc_per_node == 2
    with pytest.raises(Exception) as e:
        launch.layout(cfg, nnodes=3)
    assert getattr(e.value, "code", None) == "BAD_CONFIG"
    with pytest.raises(Exception) as e:  # several nodes need node 0's address
        launch.torchrun_command("c.yaml", lay)
    assert getattr(e.value, "code", None) == "BAD_CONFIG"


def test_slurm_script(tmp_path):
    cfg = write_cfg(tmp_path / "c.yaml", gpus=8, gpn=4, strategy={"tp": 2, "pp": 2})
    out = tmp_path / "job.sbatch"
    assert cli_main(["train", "--config", str(cfg), "--slurm", str(out), "--steps", "5"]) == 0
    s = out.read_text()
    assert "#SBATCH --nodes=2" in s and "#SBATCH --gpus-per-node=4" in s and "#SBATCH --ntasks-per-node=1" in s
    assert 'PET_NODE_RANK="$SLURM_NODEID"' in s and "--nnodes=2 --nproc-per-node=4" in s
    assert f"-m grpo_tune.trainer.main --config {cfg.resolve()} --steps 5" in s
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0  # valid shell


@pytest.mark.parametrize("resume", [True, False])
def test_slurm_script_passes_no_resume_on(tmp_path, resume):
    """The sbatch job's workers get the same --no-resume as a local run's (it was dropped)."""
    cfg = write_cfg(tmp_path / "c.yaml")
    out = tmp_path / "job.sbatch"
    flag = [] if resume else ["--no-resume"]
    assert cli_main(["train", "--config", str(cfg), "--slurm", str(out), "--steps", "3", *flag]) == 0
    worker = shlex.split(out.read_text().rstrip().splitlines()[-1])
    assert worker == [
        "-m",
        "grpo_tune.trainer.main",
        "--config",
        str(cfg.resolve()),
        "--steps",
        "3",
        "--out",
        str((tmp_path / "run").resolve()),
        *flag,
    ]


def test_no_resume_refuses_to_overwrite_checkpoints(tmp_path):
    cfg = write_cfg(tmp_path / "c.yaml")
    ck = tmp_path / "run" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "latest.json").write_text(json.dumps({"step": 2, "world_size": 4, "dir": "step_00000002"}))
    r = run_cli("train", "--config", str(cfg), "--no-resume")
    assert r.returncode == 2 and "[BAD_CONFIG]" in r.stderr
    r = run_cli("train", "--config", str(cfg))  # resuming a 4-rank checkpoint with 2 ranks
    assert r.returncode == 2 and "[CHECKPOINT_ERROR]" in r.stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tp=st.integers(1, 5),
    pp=st.integers(1, 5),
    vpp=st.integers(1, 3),
    gpus=st.integers(1, 8),
    mbs=st.integers(1, 6),
    n=st.integers(1, 6),
    nnodes=st.one_of(st.none(), st.integers(0, 3)),
)
def test_any_degrees_give_a_summary_or_a_coded_error(tmp_path, capsys, tp, pp, vpp, gpus, mbs, n, nnodes):
    p = tmp_path / "h.yaml"
    d = yaml.safe_load(write_cfg(p).read_text())
    d["cluster"] = {"gpus": gpus, "gpus_per_node": 8}
    d["strategy"] = {"tp": tp, "pp": pp, "vpp": vpp, "mbs": mbs}
    d["workload"]["n"] = n
    p.write_text(yaml.safe_dump(d))
    argv = ["train", "--config", str(p), "--dry-run", "--json"] + ([] if nnodes is None else ["--nnodes", str(nnodes)])
    rc = cli_main(argv)
    out = capsys.readouterr()
    if rc == 0:
        sm = json.loads(out.out)
        r = sm["roles"]["actor"]
        assert r["tp"] * r["pp"] * r["dp"] == gpus == sm["nnodes"] * sm["nproc_per_node"]
        assert (sm["batch"]["sequences_per_mini_batch"]) % (r["dp"] * mbs) == 0
    else:
        assert rc == 2 and "[" in out.err and "Traceback" not in out.err


def test_progress_of_a_separate_run_shows_sample_ages_and_weight_versions(tmp_path):
    import io

    from rich.console import Console

    from grpo_tune.cli.train import Progress

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": k, "loss": 0.1, "sample_age": a, "weight_version": k - 1} for k, a in ((1, 0), (2, 1))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    buf = io.StringIO()
    prog = Progress(path, 2, Console(file=buf, width=200))
    prog.poll()
    prog.stop()
    lines = buf.getvalue().splitlines()
    assert "sample_age=0  weight_version=0" in lines[0] and "sample_age=1  weight_version=1" in lines[1], lines


def test_progress_follows_metrics_jsonl_live_and_plain(tmp_path):
    import io

    from rich.console import Console

    from grpo_tune.cli.train import Progress

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")  # the checkpoint's step, resumed after: not shown
    for terminal in (False, True):
        buf = io.StringIO()
        prog = Progress(path, 3, Console(file=buf, force_terminal=terminal, width=200), after=1)
        with open(path, "a") as fh:
            fh.write(json.dumps({"step": 2, "loss": -0.25, "reward_mean": 0.5, "kl": 0.01, "step_s": 1.5}) + "\n")
            fh.write('{"step": 3, "loss"')  # a line still being written
        prog.poll()
        assert [r["step"] for r in prog.rows] == [2]
        with open(path, "a") as fh:
            fh.write(": 0.125}\n")
        prog.poll()
        prog.stop()
        assert [r["step"] for r in prog.rows] == [2, 3]
        text = buf.getvalue()
        assert "reward_mean=0.500" in text if not terminal else "GRPO step 3/3" in text
        path.write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
