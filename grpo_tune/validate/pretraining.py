"""Check the time model against published Megatron-LM measurements (``grpo-tune validate``).

The rows live in ``profiles/data/published.csv``, each with its paper and table. Rows marked
``fit`` are the ones the A100 efficiency curve was fitted on (:func:`fit_efficiency` redoes that
fit); ``holdout`` rows never enter a fit, so their error is the honest one.

Metrics, computed from the predicted iteration time exactly as each paper computes its own:
- ``tflops_per_gpu``: Narayanan et al. 2021 (arXiv 2104.04473) eq. 3,
  F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration (it assumes full recompute),
  divided by (iteration time x GPUs);
- ``iteration_s``: Korthikanti et al. 2022 (arXiv 2205.05198) Table 5, seconds per iteration;
- ``mfu_pct``: Korthikanti et al. 2022 eq. 7 model FLOPs, 72 B s l h^2 (1 + s/(6h) + V/(12 l h)),
  over (iteration time x GPUs x 312 TFLOP/s).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import PROFILES_DIR, HardwareSpec, ModelSpec, load_hardware
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate as validate_degrees
from grpo_tune.costmodel.timing import step_time

DATA_PATH = PROFILES_DIR / "data" / "published.csv"
METRICS = ("tflops_per_gpu", "iteration_s", "mfu_pct")
A100_PEAK_FLOPS = 312e12  # the peak both papers divide by (A100 datasheet, dense bf16/fp16)
FIT_KEYS = ("gemm_efficiency_max", "gemm_intensity_half", "attention_efficiency")
MEGATRON_2021_ATTENTION = 0.31
"""Efficiency of 2021/2022 Megatron-LM's unfused (masked-softmax, full s x s) attention on A100,
fitted with ``--refit`` on the four fit rows together with the GEMM curve. These rows ran that
kernel, so they are priced with ``attention_kernel = "unfused"`` (the profile itself states flash)."""


def megatron_2021(hw: HardwareSpec) -> HardwareSpec:
    """The profile as the published rows ran it: Megatron-LM's own stack (no RL host costs), unfused
    attention, same GEMM curve."""
    from grpo_tune.core.hardware import with_stack

    hw = with_stack(hw, "megatron-lm")
    return dataclasses.replace(hw, attention_kernel="unfused").with_efficiency(
        attention_efficiency=MEGATRON_2021_ATTENTION
    )


@dataclass(frozen=True)
class Row:
    id: str
    source: str
    table: str
    split: str
    params_b: float
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    tp: int
    pp: int
    vpp: int
    gpus: int
    gbs: int
    mbs: int
    recompute: str
    sequence_parallel: bool
    distributed_optimizer: bool
    metric: str
    published: float


_PLAN_COLUMNS = ("tp", "pp", "vpp", "mbs", "recompute", "sequence_parallel", "distributed_optimizer")
"""The columns that are Strategy fields of the same name."""
_INT = {"layers", "hidden", "heads", "vocab", "seq_len", "tp", "pp", "vpp", "gpus", "gbs", "mbs"}
_FLOAT = {"params_b", "published"}
_BOOL = {"sequence_parallel", "distributed_optimizer"}


def read_records(path: Path, required: list[str] | tuple[str, ...], what: str) -> list[dict[str, str]]:
    """The rows of a measurement CSV (``#`` lines are comments) as dicts, read under a size cap; an
    unreadable file, a missing column or a header without rows is a coded error naming ``what``."""
    from grpo_tune.core.specfiles import (
        read_spec_bytes,
    )  # a regular file under a size cap: /dev/zero or a FIFO hung here

    try:
        text = read_spec_bytes(path, "measurements CSV").decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file", hint=f"pass a CSV of {what}") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    try:  # csv's own limits (a 128 KiB field, a NUL) are the file's fault, not a bug
        reader = csv.DictReader(io.StringIO("\n".join(lines)))
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        records = list(reader)
    except csv.Error as exc:
        raise ConfigError(f"{path}: not a CSV ({exc})", hint=f"pass a CSV of {what}") from None
    if missing:
        raise ConfigError(
            f"{path}: missing column(s) {', '.join(sorted(missing))}",
            hint="the header names every column of profiles/data's measurement file",
        )
    if not records:
        raise ConfigError(f"{path}: no data rows, only a header", hint="add measurement rows under the header")
    return records


def load_rows(path: str | Path | None = None) -> list[Row]:
    """Read the measurement file (``#`` lines are comments); malformed rows are BAD_CONFIG errors."""
    path = Path(path) if path else DATA_PATH
    names = [f.name for f in dataclasses.fields(Row)]
    raws = read_records(path, names, "measurements")
    rows = []
    for i, raw in enumerate(raws, start=2):
        kw: dict[str, Any] = {}
        try:
            for n in names:
                v = (raw[n] or "").strip()
                kw[n] = int(v) if n in _INT else float(v) if n in _FLOAT else (v.lower() == "true") if n in _BOOL else v
                if (n in _INT or n in _FLOAT) and not 0 < kw[n] < float("inf"):  # nan, 0 and inf too
                    raise ValueError(f"{n} = {v!r} must be a finite number > 0")
        except (ValueError, csv.Error) as exc:
            raise ConfigError(f"{path}: data row {i - 1}: {exc}", hint="fix that row of the CSV") from None
        row = Row(**kw)
        if row.metric not in METRICS:
            raise ConfigError(
                f"{path}: row {row.id}: unknown metric {row.metric!r}", hint=f"use one of {', '.join(METRICS)}"
            )
        if row.split not in ("fit", "holdout"):
            raise ConfigError(f"{path}: row {row.id}: split must be fit or holdout")
        if not row.source:
            raise ConfigError(f"{path}: row {row.id} has no source")
        rows.append(row)
    return rows


def gpt_model(row: Row) -> ModelSpec:
    """A GPT-3 style model: MHA, GeLU MLP of 4h, tied embeddings."""
    return ModelSpec(
        name=f"gpt-{row.params_b:g}b",
        family="gpt",
        layers=row.layers,
        hidden=row.hidden,
        ffn_hidden=4 * row.hidden,
        heads=row.heads,
        kv_heads=row.heads,
        head_dim=row.hidden // row.heads,
        vocab=row.vocab,
        tied_embeddings=True,
        gated_mlp=False,
        max_seq_len=row.seq_len,
        source=row.source,
    )


def narayanan_flops(row: Row) -> float:
    """Narayanan et al. 2021 eq. 3: FLOPs per iteration with full activation recomputation."""
    b, s, l, h, v = row.gbs, row.seq_len, row.layers, row.hidden, row.vocab
    return 96.0 * b * s * l * h * h * (1 + s / (6.0 * h) + v / (16.0 * l * h))


def korthikanti_model_flops(row: Row) -> float:
    """Korthikanti et al. 2022 eq. 7: model FLOPs per iteration (no recompute counted)."""
    b, s, l, h, v = row.gbs, row.seq_len, row.layers, row.hidden, row.vocab
    return 72.0 * b * s * l * h * h * (1 + s / (6.0 * h) + v / (12.0 * l * h))


def predict_step_s(row: Row, hw: HardwareSpec, calibration: dict[str, float] | None = None) -> float:
    m = gpt_model(row)
    s = Strategy.of(**{k: getattr(row, k) for k in _PLAN_COLUMNS})
    s = validate_degrees(m, s, row.gpus, gpus_per_node=hw.gpus_per_node)
    wl = Workload(kind="pretrain", seq_len=row.seq_len, gbs=row.gbs)
    time, _, _ = step_time(m, hw, Cluster(gpus=row.gpus, gpus_per_node=hw.gpus_per_node), s, wl, cal=calibration)
    return time.step_s


def predict(row: Row, hw: HardwareSpec, calibration: dict[str, float] | None = None) -> float:
    step = predict_step_s(row, hw, calibration)
    if row.metric == "tflops_per_gpu":
        return narayanan_flops(row) / step / row.gpus / 1e12
    if row.metric == "mfu_pct":
        return 100.0 * korthikanti_model_flops(row) / step / row.gpus / A100_PEAK_FLOPS
    return step


def with_efficiency(hw: HardwareSpec, **eff: float) -> HardwareSpec:
    return hw.with_efficiency(**eff)


def fit_efficiency(rows: list[Row], hw: HardwareSpec) -> dict[str, float]:
    """Least-squares fit of the GEMM/attention efficiency parameters on the ``fit`` rows only
    (relative errors, scipy.optimize.least_squares)."""
    from scipy.optimize import least_squares

    fit_rows = [r for r in rows if r.split == "fit"]
    if not fit_rows:
        raise ConfigError("no rows marked split=fit to fit on")
    x0 = [getattr(hw.efficiency, k) for k in FIT_KEYS]

    def resid(x):
        h = with_efficiency(hw, **dict(zip(FIT_KEYS, x)))
        return [predict(r, h) / r.published - 1 for r in fit_rows]

    res = least_squares(resid, x0, bounds=([0.05, 0.0, 0.05], [1.0, 5000.0, 1.0]))
    return {k: float(round(v, 4)) for k, v in zip(FIT_KEYS, res.x)}


def run(
    *, hardware: str = "a100", path: str | Path | None = None, tolerance_pct: float = 10.0, refit: bool = False
) -> dict[str, Any]:
    """Predicted vs published for every row, the MAPE (all, fit, held-out) and whether it passes."""
    if not (tolerance_pct > 0):
        raise ConfigError(f"--tolerance must be > 0, got {tolerance_pct}")
    rows = load_rows(path)
    hw = megatron_2021(load_hardware(hardware))
    fitted = None
    if refit:
        fitted = fit_efficiency(rows, hw)
        hw = with_efficiency(hw, **fitted)
    out: list[dict[str, Any]] = []
    for r in rows:
        pred = predict(r, hw)
        out.append(
            {
                "id": r.id,
                "source": r.source,
                "table": r.table,
                "split": r.split,
                "metric": r.metric,
                "params_b": r.params_b,
                "tp": r.tp,
                "pp": r.pp,
                "gpus": r.gpus,
                "gbs": r.gbs,
                "recompute": r.recompute,
                "published": r.published,
                "predicted": pred,
                "error_pct": 100.0 * (pred / r.published - 1),
            }
        )

    def mape(split: str | None) -> float | None:
        errs = [abs(o["error_pct"]) for o in out if split is None or o["split"] == split]
        return sum(errs) / len(errs) if errs else None

    m_all, m_fit, m_hold = mape(None), mape("fit"), mape("holdout")
    passed = all(v is None or v <= tolerance_pct for v in (m_all, m_hold))
    return {
        "hardware": hw.name,
        "attention_kernel": hw.attention_kernel,
        "efficiency": {k: getattr(hw.efficiency, k) for k in FIT_KEYS},
        "refit": fitted,
        "rows": out,
        "mape_pct": {"all": m_all, "fit": m_fit, "holdout": m_hold},
        "tolerance_pct": tolerance_pct,
        "passed": passed,
    }
