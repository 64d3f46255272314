"""``grpo-tune models`` and ``grpo-tune hardware``: what presets exist. Each command calls its job of
:mod:`grpo_tune.jobs.catalog` once and prints the presets (a table, or JSON with ``--json``)."""

from __future__ import annotations

import json

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from grpo_tune.cli.options import Json
from grpo_tune.jobs.catalog import run_hardware, run_models


def models(json_out: Json = False) -> None:
    """List model presets with exact parameter counts."""
    rows = run_models()
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    console = Console()
    # Names never wrap or truncate (users copy them into --model); a narrow terminal drops the shape and
    # HF id columns instead (all of them are in --json).
    narrow = console.width < 130
    t = Table(title="Model presets", caption="HF ids and shapes: a wider terminal or --json" if narrow else None)
    t.add_column("name", no_wrap=True, min_width=max(len(r["name"]) for r in rows))
    if not narrow:
        for c in ("family", "layers", "hidden"):
            t.add_column(c, justify="left" if c == "family" else "right")
    t.add_column("total params", justify="right", no_wrap=True)
    t.add_column("active params", justify="right", no_wrap=True)
    if not narrow:
        t.add_column("HF id", no_wrap=True)
    for r in rows:
        shape = [] if narrow else [r["family"], str(r["layers"]), str(r["hidden"])]
        t.add_row(
            r["name"], *shape, f"{r['total_params']:,}", f"{r['active_params']:,}", *([] if narrow else [r["hf_id"]])
        )
    console.print(t)


def hardware(json_out: Json = False) -> None:
    """List hardware profiles."""
    specs = run_hardware()
    rows = [hw.to_dict() for hw in specs]
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    console = Console()
    narrow = console.width < 110  # 80 columns: the links and aliases go (--json has everything)
    t = (
        Table(title="Hardware profiles", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
        if narrow
        else Table(title="Hardware profiles")
    )
    cols = ["name", "aliases", "bf16 TF/s", "HBM GiB", "HBM TB/s", "GPUs/node", "intra GB/s", "inter GB/s"]
    cols += ["$/GPU-h", "profile"]
    if narrow:
        cols = [c for c in cols if c not in ("aliases", "intra GB/s", "inter GB/s")]
    for c in cols:
        t.add_column(c, no_wrap=c in ("name", "profile"))
    for hw in specs:
        cells = {
            "name": hw.name,
            "aliases": ",".join(hw.aliases),
            "bf16 TF/s": _tflops(hw.peak_flops_per_s()),
            "HBM GiB": f"{hw.hbm_bytes / 2**30:.1f}" + ("*" if hw.memory_is_host else ""),  # as the driver reports it
            "HBM TB/s": f"{hw.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
            "GPUs/node": str(hw.gpus_per_node),
            "intra GB/s": f"{hw.intra_node_bandwidth_bytes_per_s / 1e9:.0f}",
            "inter GB/s": f"{hw.inter_node_bandwidth_bytes_per_s / 1e9:.1f}",
            "$/GPU-h": "-" if hw.price_per_gpu_hour_usd is None else f"{hw.price_per_gpu_hour_usd:.2f}",
            "profile": hw.provenance,
        }
        t.add_row(*(cells[c] for c in cols))
    console.print(t)
    console.print(
        "profile: fitted (on cited measurements), transferred (from another profile by stated ratios) or "
        "spec-only; each profile's provenance_note says which (`grpo-tune hardware --json`)"
        + ("; * the host's RAM, shared by the ranks of a machine" if any(hw.memory_is_host for hw in specs) else ""),
        highlight=False,
    )


def _tflops(flops: float) -> str:
    """Peak FLOP/s in TFLOP/s: whole numbers for GPUs, significant digits below one (the cpu profile)."""
    return f"{flops / 1e12:.0f}" if flops >= 1e12 else f"{flops / 1e12:.2g}"


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("hardware")(hardware)
