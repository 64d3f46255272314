"""``grpo-tune probe-hardware --out FILE [--nproc N]``: measure this machine into a hardware profile.

Launches ``torchrun --standalone --nproc-per-node N -m grpo_tune.trainer.probe`` (NCCL on GPU, gloo on
CPU), then loads the written profile with ``core.specs.load_hardware`` to prove it is usable.
No torch import here: the probe runs in the subprocess.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.core.errors import ConfigError, GrpoTuneError


def _gpu_count() -> int:
    """GPUs visible to nvidia-smi (0 without one); avoids importing torch in autotune."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    n = sum(1 for ln in out.splitlines() if ln.startswith("GPU "))
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([v for v in vis.split(",") if v.strip()]))
    return n


def default_nproc() -> int:
    """Every GPU; on CPU one rank per core (at least 2, so that collectives run), at most 4."""
    g = _gpu_count()
    return g if g else max(2, min(4, os.cpu_count() or 2))


def probe_hardware(
    out: Path,
    *,
    nproc: int | None = None,
    base: str | None = None,
    name: str | None = None,
    quick: bool = False,
    timeout_s: float = 1800,
    console: Console | None = None,
):
    """Run the probe and return the loaded :class:`HardwareSpec`; raises a coded error on failure."""
    from grpo_tune.core.specs import load_hardware

    nproc = default_nproc() if nproc is None else nproc  # 0 is an error, not "default"
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    most = max(64, 4 * (os.cpu_count() or 1))  # one node's ranks: GPUs or cores, never a billion processes
    if nproc > most:
        raise ConfigError(
            f"--nproc {nproc} is more ranks than this machine can run (at most {most})",
            hint="the probe measures one node: use its GPU count, or leave --nproc out",
        )
    if out.suffix != ".toml":
        raise ConfigError(f"--out must end in .toml, got {out}", hint="e.g. --out cpu-probed.toml")
    from grpo_tune.frameworks.base.inputs import check_name
    from grpo_tune.rundir.outputs import check_output

    check_output(out, "--out", inputs={"--base": base})  # before the probe runs, not after; never over its --base
    if name is not None:
        check_name(name, "--name")
    if base is not None:
        load_hardware(base)  # a bad --base is the user's mistake: say so before launching
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "grpo_tune.trainer.probe",
        "--out",
        str(out),
    ]
    if base:
        cmd += ["--base", base]
    if name:
        cmd += ["--name", name]
    if quick:
        cmd += ["--quick"]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default with several ranks; say it explicitly
    root = Path(__file__).resolve().parents[2]  # the folder holding the grpo_tune package
    env["PYTHONPATH"] = os.pathsep.join([str(root), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    say = console or Console(stderr=True)
    say.print(f"probing with {nproc} rank(s): {' '.join(cmd[1:])}", highlight=False)
    # A rank killed by a signal (gloo's transport thread can abort when a peer closes a connection
    # under heavy load) is the machine's hiccup, not a bad measurement: the probe runs once more,
    # and says so. Any other failure, or a second crash, is reported with the ranks' own errors.
    for attempt in (1, 2):
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise GrpoTuneError(
                f"probe-hardware did not finish within {timeout_s:g} s",
                code="TRIAL_FAILED",
                hint="lower --nproc, or check that the ranks can reach each other",
            ) from None
        if proc.returncode == 0 and out.exists():
            return load_hardware(str(out.resolve())), proc.stdout
        text = proc.stdout + proc.stderr
        if attempt == 1 and _rank_killed_by_signal(text):
            say.print("a probe rank was killed by a signal; probing once more", highlight=False)
            continue
        raise GrpoTuneError(
            f"the probe failed (exit code {proc.returncode}):\n{_failure_excerpt(text)}",
            code="TRIAL_FAILED",
            hint="see the output above; `python -m grpo_tune.trainer.probe --help` lists the options",
        )
    raise AssertionError("unreachable")  # the loop returns or raises


_SIGNAL_EXIT = re.compile(r"exitcode\s*:\s*-\d+")
_ERROR_LINE = re.compile(r"error|terminate called|what\(\)|exception|abort", re.IGNORECASE)


def _rank_killed_by_signal(text: str) -> bool:
    """torchrun's failure summary names a worker whose exit code is negative (killed by a signal)."""
    return bool(_SIGNAL_EXIT.search(text))


def _failure_excerpt(text: str, *, head: int = 10, tail: int = 15) -> str:
    """The ranks' own error lines (the cause) and then torchrun's summary (the tail), without repeats."""
    lines = text.strip().splitlines()
    last = lines[-tail:]
    cause = [ln for ln in lines[:-tail] if _ERROR_LINE.search(ln)][:head]
    return "\n".join([*cause, *(["..."] if cause else []), *last])


def probe_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Hardware profile TOML to write.")],
    nproc: Annotated[
        Optional[int], typer.Option("--nproc", help="Ranks (default: every GPU; on CPU one per core, 2 to 4).")
    ] = None,
    base: Annotated[
        Optional[str],
        typer.Option("--base", help="Profile for what one machine cannot measure (inter-node bandwidth, price)."),
    ] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Profile name (default: the file's stem).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer shapes and message sizes.")] = False,
) -> None:
    """Measure GEMM FLOP/s, memory and collective bandwidth here and write a hardware profile."""
    console = Console()
    hw, log = probe_hardware(out, nproc=nproc, base=base, name=name, quick=quick, console=console)
    t = Table(title=f"{hw.name}: written to {out}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("peak GEMM FLOP/s per rank", f"{hw.bf16_dense_flops_per_s / 1e9:,.1f} G")
    t.add_row("memory bandwidth per rank", f"{hw.hbm_bandwidth_bytes_per_s / 1e9:,.2f} GB/s")
    t.add_row("intra-node bus bandwidth", f"{hw.intra_node_bandwidth_bytes_per_s / 1e9:,.3f} GB/s")
    t.add_row("intra-node latency", f"{hw.efficiency.intra_node_latency_s * 1e6:,.0f} us")
    for k in ("gemm_efficiency_max", "gemm_intensity_half", "max_parallel_ranks"):
        t.add_row(k, f"{getattr(hw.efficiency, k):.3g}")
    t.add_row("memory per rank", f"{hw.hbm_bytes / 2**30:,.1f} GiB")
    t.add_row("reserved per process", f"{hw.reserved_memory_bytes / 2**20:,.0f} MiB")
    console.print(t)
    console.print(log.strip(), highlight=False)
    console.print(f"use it: grpo-tune search --hardware {out} ...", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("probe-hardware")(probe_cmd)
