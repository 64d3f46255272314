"""`grpo-tune estimate`: coded errors exit 2 in one line, a non-fitting plan exits 0 with fits=false."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from grpo_tune.cli.main import main
from grpo_tune.costmodel.params import total_params
from grpo_tune.core.specs import load_model


def run(capsys, *args):
    rc = main(["estimate", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_has_the_contract_keys(capsys):
    rc, out, _ = run(capsys, "--model", "7b", "--gpus", "8", "--tp", "2", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["params"]["total"] == 7_615_616_512 == total_params(load_model("7b"))
    assert set(d["params"]) == {"total", "active", "per_rank_max"}
    assert set(d["memory"]["phases"]) == {"rollout", "weight_sync", "old_logprob", "ref_logprob", "update"}
    for ph in d["memory"]["phases"].values():
        parts = [v for k, v in ph.items() if k.endswith("_bytes") and k != "total_bytes"]
        assert abs(ph["total_bytes"] - sum(parts)) <= len(parts)  # each part truncated to an int
    assert d["memory"]["peak_bytes"] == max(p["total_bytes"] for p in d["memory"]["phases"].values())
    assert isinstance(d["fits"], bool) and isinstance(d["violations"], list)
    assert "time" in d and "throughput" in d
    assert d["hardware"] == "h100-sxm-80gb"  # the default
    assert d["workload"]["prompts"] == 1024 and d["workload"]["n"] == 5 and d["workload"]["kl"] is True


def test_flags_reach_the_strategy_and_workload(capsys):
    rc, out, _ = run(
        capsys,
        "--model",
        "30b-a3b",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--pp",
        "2",
        "--ep",
        "4",
        "--etp",
        "1",
        "--mbs",
        "2",
        "--recompute",
        "full",
        "--no-sequence-parallel",
        "--no-distributed-optimizer",
        "--offload",
        "param,grad,optimizer",
        "--rollout-tp",
        "4",
        "--gpu-memory-utilization",
        "0.8",
        "--prompts",
        "256",
        "--n",
        "8",
        "--prompt-len",
        "512",
        "--response-len",
        "2048",
        "--mini-batch",
        "64",
        "--ppo-epochs",
        "2",
        "--no-kl",
        "--hardware",
        "h200",
        "--gpus-per-node",
        "8",
        "--json",
    )
    assert rc == 0
    d = json.loads(out)
    s, w = d["strategy"], d["workload"]
    assert (s["tp"], s["pp"], s["ep"], s["etp"], s["dp"], s["mbs"]) == (2, 2, 4, 1, 4, 2)
    assert s["recompute"] == "full" and s["sequence_parallel"] is False and s["distributed_optimizer"] is False
    assert s["offload"] == ["param", "grad", "optimizer"]
    assert s["rollout_tp"] == 4 and s["gpu_memory_utilization"] == 0.8
    assert (w["prompts"], w["n"], w["prompt_len"], w["response_len"], w["mini_batch"], w["ppo_epochs"], w["kl"]) == (
        256,
        8,
        512,
        2048,
        64,
        2,
        False,
    )
    assert "ref_logprob" not in d["memory"]["phases"]
    assert d["hardware"] == "h200-141gb"


def test_pretrain_and_uneven_stages(capsys):
    rc, out, _ = run(
        capsys,
        "--model",
        "deepseek-v3",
        "--gpus",
        "256",
        "--tp",
        "8",
        "--pp",
        "16",
        "--ep",
        "16",
        "--etp",
        "1",
        "--first-stage-layers",
        "1",
        "--last-stage-layers",
        "4",
        "--workload",
        "pretrain",
        "--seq-len",
        "4096",
        "--gbs",
        "512",
        "--vpp",
        "1",
        "--cp",
        "1",
        "--json",
    )
    assert rc == 0
    d = json.loads(out)
    assert list(d["memory"]["phases"]) == ["update"]
    assert d["strategy"]["first_stage_layers"] == 1 and d["workload"]["seq_len"] == 4096


def test_not_fitting_is_exit_0_with_fits_false(capsys):
    rc, out, _ = run(capsys, "--model", "70b", "--gpus", "8", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["fits"] is False
    oom = [v for v in d["violations"] if v["code"] == "OOM_RISK"]
    assert oom and all("GiB" in v["message"] and v["bytes_over"] > 0 for v in oom)
    rc, out, _ = run(capsys, "--model", "70b", "--gpus", "8")
    assert rc == 0 and "does not fit" in out and "OOM_RISK" in out


@pytest.mark.parametrize(
    "args,code,words",
    [
        (["--model", "7b", "--tp", "3", "--gpus", "24"], "INVALID_DEGREES", "28 attention heads"),
        (["--model", "7b", "--pp", "3", "--gpus", "24"], "INVALID_DEGREES", "28 layers"),
        (["--model", "30b-a3b", "--ep", "3", "--gpus", "24"], "INVALID_DEGREES", "128 experts"),
        (["--model", "7b", "--tp", "4", "--pp", "4", "--gpus", "8"], "INVALID_DEGREES", "does not divide 8 GPUs"),
        (["--model", "qwen-7"], "UNKNOWN_MODEL", "close matches: qwen2-7b"),
        (["--model", "7b", "--hardware", "h1000"], "UNKNOWN_HARDWARE", "close matches: h100"),
        (["--model", "7b", "--recompute", "some"], "BAD_CONFIG", "--recompute"),
        (["--model", "7b", "--offload", "params"], "BAD_CONFIG", "--offload"),
        (["--model", "7b", "--gpu-memory-utilization", "1.5"], "BAD_CONFIG", "gpu_memory_utilization"),
        (["--model", "7b", "--prompts", "100", "--mini-batch", "30"], "BAD_CONFIG", "multiple of mini_batch"),
    ],
)
def test_user_errors_exit_2_with_one_coded_line(capsys, args, code, words):
    rc, out, err = run(capsys, *args)
    assert rc == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"[{code}]")
    assert words in err
    assert "Traceback" not in err and out == ""
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("hint:"))


def test_human_output_has_the_breakdown(capsys):
    rc, out, _ = run(capsys, "--model", "7b", "--gpus", "8", "--tp", "2", "--offload", "param,grad,optimizer")
    assert rc == 0
    for word in (
        "params: total 7,615,616,512",
        "rollout",
        "weight_sync",
        "update",
        "vLLM KV cache",
        "concurrent",
        "host memory",
        "fits",
    ):
        assert word in out, word


def test_console_script_exit_codes():
    exe = shutil.which("grpo-tune")
    cmd = [exe] if exe else [sys.executable, "-c", "from grpo_tune.cli.main import run; run()"]
    bad = subprocess.run(
        cmd + ["estimate", "--model", "7b", "--tp", "3", "--gpus", "24"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stderr.startswith("[INVALID_DEGREES]") and "Traceback" not in bad.stderr
    ok = subprocess.run(
        cmd + ["estimate", "--model", "70b", "--gpus", "8", "--json"], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["fits"] is False
