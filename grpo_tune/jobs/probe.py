"""``grpo-tune probe-hardware``'s work: measure this machine into a hardware profile.

:func:`run_probe` launches ``torchrun --standalone --nproc-per-node N -m grpo_tune.trainer.probe`` (NCCL on GPU,
gloo on CPU), then loads the written profile with ``core.specs.load_hardware`` to prove it is usable, and returns
a :class:`ProbeOutcome`; ``cli/probe.py`` prints it. No torch import here: the probe runs in the subprocess.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from grpo_tune.core.errors import ConfigError, GrpoTuneError

if TYPE_CHECKING:
    from grpo_tune.core.specs import HardwareSpec


@dataclass(frozen=True)
class ProbeRequest:
    """What ``probe-hardware`` was asked: the profile to write, the ranks, what to take from another profile."""

    out: Path
    nproc: int | None = None
    """Ranks (None: every GPU; on CPU one per core, 2 to 4)."""
    base: str | None = None
    """The profile for what one machine cannot measure (inter-node bandwidth, price)."""
    name: str | None = None
    """The profile's name (None: the file's stem)."""
    quick: bool = False
    timeout_s: float = 1800


@dataclass(frozen=True)
class ProbeOutcome:
    """The profile written, loaded back, and the probe's own report of what it measured."""

    hardware: HardwareSpec
    log: str


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


def run_probe(req: ProbeRequest, *, say: Callable[[str], None] | None = None) -> ProbeOutcome:
    """Run the probe and return the loaded profile with the probe's own report; raises a coded error on failure.
    ``say`` is told what runs (the command, a second try)."""
    from grpo_tune.core.specs import load_hardware

    out, base, name, timeout_s = req.out, req.base, req.name, req.timeout_s
    nproc = default_nproc() if req.nproc is None else req.nproc  # 0 is an error, not "default"
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
    if req.quick:
        cmd += ["--quick"]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default with several ranks; say it explicitly
    root = Path(__file__).resolve().parents[2]  # the folder holding the grpo_tune package
    env["PYTHONPATH"] = os.pathsep.join([str(root), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    tell = say or (lambda line: None)
    tell(f"probing with {nproc} rank(s): {' '.join(cmd[1:])}")
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
            return ProbeOutcome(hardware=load_hardware(str(out.resolve())), log=proc.stdout)
        text = proc.stdout + proc.stderr
        if attempt == 1 and _rank_killed_by_signal(text):
            tell("a probe rank was killed by a signal; probing once more")
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
