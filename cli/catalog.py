"""``grpo-tune models`` and ``grpo-tune hardware``: what presets exist."""
from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from autotune.options import Json
from costmodel.params import active_params, total_params
from core.specs import list_hardware, list_models, load_hardware, load_model


def models(json_out: Json = False) -> None:
    """List model presets with exact parameter counts."""
    rows = []
    for name in list_models():
        m = load_model(name)
        rows.append({"name": m.name, "family": m.family, "layers": m.layers, "hidden": m.hidden,
                     "total_params": total_params(m), "active_params": active_params(m), "hf_id": m.hf_id})
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="Model presets")
    for c in ("name", "family", "layers", "hidden", "total params", "active params", "HF id"):
        t.add_column(c, justify="right" if "params" in c or c in ("layers", "hidden") else "left")
    for r in rows:
        t.add_row(r["name"], r["family"], str(r["layers"]), str(r["hidden"]), f"{r['total_params']:,}",
                  f"{r['active_params']:,}", r["hf_id"])
    Console().print(t)


def hardware(json_out: Json = False) -> None:
    """List hardware profiles."""
    rows = [load_hardware(n).to_dict() for n in list_hardware()]
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="Hardware profiles")
    for c in ("name", "aliases", "bf16 TFLOP/s", "HBM GB", "HBM TB/s", "GPUs/node", "intra GB/s", "inter GB/s", "$/GPU-h"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["name"], ",".join(r["aliases"]), f"{r['bf16_dense_flops_per_s'] / 1e12:.0f}", f"{r['hbm_bytes'] / 1e9:.0f}",
                  f"{r['hbm_bandwidth_bytes_per_s'] / 1e12:.2f}", str(r["gpus_per_node"]),
                  f"{r['intra_node_bandwidth_bytes_per_s'] / 1e9:.0f}", f"{r['inter_node_bandwidth_bytes_per_s'] / 1e9:.1f}",
                  "-" if r["price_per_gpu_hour_usd"] is None else f"{r['price_per_gpu_hour_usd']:.2f}")
    Console().print(t)


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("hardware")(hardware)
