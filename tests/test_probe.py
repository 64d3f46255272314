"""grpo-tune probe-hardware: a real torchrun run over gloo that writes a loadable hardware profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_tune.core.errors import GrpoTuneError
from grpo_tune.core.specs import load_hardware

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_probe_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "probed.toml"
    r = _cli("probe-hardware", "--out", str(out), "--nproc", "2", "--quick", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    hw = load_hardware(str(out))
    assert hw.name == "probed"
    assert hw.source.startswith("measured by grpo-tune probe-hardware") and "gloo" in hw.source
    # plausible for any CPU that runs this suite: between 0.1 GFLOP/s and 10 TFLOP/s per core
    assert 1e8 < hw.bf16_dense_flops_per_s < 1e13
    assert 1e8 < hw.hbm_bandwidth_bytes_per_s < 1e12
    assert 1e5 < hw.intra_node_bandwidth_bytes_per_s < 1e12
    assert 0 < hw.efficiency.intra_node_latency_s < 1.0
    assert 0 < hw.efficiency.gemm_efficiency_max <= 1.0
    assert hw.efficiency.max_parallel_ranks == os.cpu_count()
    assert hw.reserved_memory_bytes > 50 * 2**20  # a process that imported torch holds at least this much
    text = out.read_text()
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"):
        assert f"# {coll} busbw:" in text
    # the search accepts it
    workload = "--prompts 8 --n 2 --prompt-len 16 --response-len 16 --mini-batch 8"
    r = _cli(
        "estimate", "--model", "tiny", "--gpus", "2", "--hardware", str(out), *workload.split(), "--json", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr


def test_bad_out_is_a_coded_error(tmp_path):
    r = _cli("probe-hardware", "--out", str(tmp_path / "x.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "[BAD_CONFIG]" in r.stderr and "hint:" in r.stderr


def test_bad_base_is_a_coded_error_before_launch(tmp_path):
    r = _cli("probe-hardware", "--out", str(tmp_path / "x.toml"), "--base", "h1000", cwd=tmp_path)
    assert r.returncode == 2 and "[UNKNOWN_HARDWARE]" in r.stderr
    assert not (tmp_path / "x.toml").exists()


@pytest.mark.gpu
def test_probe_on_gpu_uses_nccl(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "gpu.toml"
    r = _cli("probe-hardware", "--out", str(out), "--quick", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    hw = load_hardware(str(out))
    assert "backend nccl" in hw.source and "bfloat16" in hw.source
    assert hw.hbm_bytes == torch.cuda.get_device_properties(0).total_memory
    assert hw.bf16_dense_flops_per_s > 1e13  # any datacenter GPU of the last years does 10+ TFLOP/s bf16


# torchrun's summary when one rank aborted (as CI printed it once) and the other was stopped.
_CRASH = """\
[rank1]: terminate called after throwing an instance of 'gloo::IoException'
[rank1]:   what():  Connection closed by peer [127.0.0.1]:41234
E1130 13:35:05 failed (exitcode: -6) local_rank: 1 (pid: 29620) of binary: python
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 29620)
""" + "\n".join(f"  filler {i}" for i in range(20))


def _fake_runs(monkeypatch, tmp_path, outcomes):
    """Replace the torchrun subprocess with ``outcomes`` (rc, text, writes_profile), one per call."""
    import subprocess as sp

    from grpo_tune.jobs import probe

    calls = []
    profile = (ROOT / "grpo_tune" / "profiles" / "hardware" / "cpu.toml").read_text()

    def run(cmd, **kw):
        rc, text, writes = outcomes[len(calls)]
        calls.append(cmd)
        if writes:
            Path(cmd[cmd.index("--out") + 1]).write_text(profile)
        return sp.CompletedProcess(cmd, rc, stdout="", stderr=text)

    monkeypatch.setattr(probe.subprocess, "run", run)
    return probe, calls


def test_a_rank_killed_by_a_signal_is_probed_once_more(monkeypatch, tmp_path):
    probe, calls = _fake_runs(monkeypatch, tmp_path, [(1, _CRASH, False), (0, "", True)])
    hw = probe.run_probe(probe.ProbeRequest(out=tmp_path / "p.toml", nproc=2)).hardware
    assert len(calls) == 2 and hw.name == "cpu"


def test_a_second_crash_reports_the_ranks_own_error(monkeypatch, tmp_path):
    probe, calls = _fake_runs(monkeypatch, tmp_path, [(1, _CRASH, False), (1, _CRASH, False)])
    with pytest.raises(GrpoTuneError) as e:
        probe.run_probe(probe.ProbeRequest(out=tmp_path / "p.toml", nproc=2))
    assert len(calls) == 2 and e.value.code == "TRIAL_FAILED"
    assert "Connection closed by peer" in str(e.value)  # the cause, not only torchrun's tail


def test_an_ordinary_failure_is_not_retried(monkeypatch, tmp_path):
    probe, calls = _fake_runs(monkeypatch, tmp_path, [(1, "ValueError: bad shape\nexitcode  : 1", False)])
    with pytest.raises(GrpoTuneError, match="bad shape"):
        probe.run_probe(probe.ProbeRequest(out=tmp_path / "p.toml", nproc=2))
    assert len(calls) == 1
