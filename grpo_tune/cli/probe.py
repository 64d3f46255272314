"""``grpo-tune probe-hardware --out FILE [--nproc N]``: measure this machine into a hardware profile.

Parses the flags, calls :func:`grpo_tune.jobs.probe.run_probe` once (torchrun over the probe; no torch import
here) and prints the profile's figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.jobs.probe import ProbeRequest, run_probe


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
    req = ProbeRequest(out=out, nproc=nproc, base=base, name=name, quick=quick)
    res = run_probe(req, say=lambda line: console.print(line, highlight=False))
    hw, log = res.hardware, res.log
    t = Table(title=f"{hw.name}: written to {out}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("peak GEMM FLOP/s per rank", f"{hw.peak_flops_per_s() / 1e9:,.1f} G")
    t.add_row("memory bandwidth per rank", f"{hw.hbm_bandwidth_bytes_per_s / 1e9:,.2f} GB/s")
    t.add_row("intra-node bus bandwidth", f"{hw.intra_node_bandwidth_bytes_per_s / 1e9:,.3f} GB/s")
    t.add_row("intra-node latency", f"{hw.efficiency.intra_node_latency_s * 1e6:,.0f} us")
    for k in ("gemm_efficiency_max", "gemm_intensity_half", "max_parallel_ranks"):
        t.add_row(k, f"{getattr(hw.efficiency, k):.3g}")
    if hw.memory_is_host:
        t.add_row("memory (every rank's share of it)", f"{hw.hbm_bytes / 2**30:,.1f} GiB")
    else:
        t.add_row("memory per rank", f"{hw.hbm_bytes / 2**30:,.1f} GiB")
    t.add_row("reserved per process", f"{hw.reserved_memory_bytes / 2**20:,.0f} MiB")
    console.print(t)
    console.print(log.strip(), highlight=False)
    console.print(f"use it: grpo-tune search --hardware {out} ...", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("probe-hardware")(probe_cmd)
