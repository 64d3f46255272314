"""``grpo-tune validate --grpo``: the GRPO step against published runs (profiles/data/published_grpo.csv).

Each row is a run that verl or NeMo-RL published with its step time and, where given, the time of
each phase. The cost model prices the row's plan (its model, GPUs, degrees, lengths and engine
settings as the row states them, with the row's assumptions where the source is silent) and the
result is compared per step and per phase. Rows marked ``fit`` are the ones the Hopper RL
efficiency was fitted on (:func:`fit`); ``holdout`` rows never enter a fit; ``excluded`` rows
(FSDP2/DTensor backends, or runs that do not publish a setting the price needs) are printed and
not scored. The published step includes work the model does not price (reward, advantages,
data loading), which is part of the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import PROFILES_DIR, HardwareSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel.estimate import Estimate, estimate

from .validate import read_records

GRPO_DATA_PATH = PROFILES_DIR / "data" / "published_grpo.csv"
PHASES = ("gen_s", "train_s", "old_lp_s", "ref_lp_s", "refit_s")
TOLERANCE_PCT = 15.0
"""Held-out step-time MAPE above which ``validate --grpo`` exits 1 (issue 9's target; its goal is 10%)."""

STATED_ERROR_PCT = 12.1
"""The model's stated error: the held-out step-time MAPE that ``validate --grpo`` prints for the shipped
rows (a test keeps the two equal). The report calls plans closer than this indistinguishable."""

_REQUIRED = ("id", "split", "framework", "backend", "source", "model", "hardware", "gpus", "step_s", "assumptions")


@dataclass(frozen=True)
class GrpoRow:
    """One measurement row: the validated id and split, the published figures, and every column as read
    (``raw``: the plan, backend, source, lp_combined, ...)."""

    id: str
    split: str
    raw: dict[str, str]
    published: dict[str, float]
    """step_s and the published phases (seconds)."""


def load_grpo_rows(path: str | Path | None = None) -> list[GrpoRow]:
    path = Path(path) if path else GRPO_DATA_PATH
    records = read_records(path, _REQUIRED, "published GRPO runs")
    rows = []
    for raw in records:
        rid = (raw.get("id") or "").strip()
        if raw.get("split") not in ("fit", "holdout", "excluded"):
            raise ConfigError(f"{path}: row {rid}: split must be fit, holdout or excluded")
        if not (raw.get("source") or "").strip():
            raise ConfigError(f"{path}: row {rid} has no source")
        pub: dict[str, float] = {}
        for k in ("step_s", *PHASES):
            v = (raw.get(k) or "").strip()
            if v:
                try:
                    pub[k] = float(v)
                except ValueError:
                    raise ConfigError(f"{path}: row {rid}: {k} is not a number ({v!r})") from None
                if not (math.isfinite(pub[k]) and pub[k] > 0):  # inf passed `> 0`: an infinite error, MAPE inf
                    raise ConfigError(f"{path}: row {rid}: {k} must be a finite number > 0, got {v!r}")
        if "step_s" not in pub:
            raise ConfigError(f"{path}: row {rid} has no step_s")
        rows.append(
            GrpoRow(
                id=rid,
                split=raw["split"],
                raw=dict(raw),
                published=pub,
            )
        )
    return rows


def _i(raw: dict[str, str], k: str) -> int | None:
    v = (raw.get(k) or "").strip()
    if not v:
        return None
    f = float(v)  # "8" and "8.0" are 8; inf, nan and 2.5 are the file's mistake (plan() codes the ValueError)
    if not (math.isfinite(f) and f == int(f)):
        raise ValueError(f"{k} = {v!r} is not an integer")
    return int(f)


def _ones(raw: dict[str, str], *keys: str) -> dict[str, Any]:
    """The columns ``keys`` as ints, an empty (or 0) cell read as 1."""
    return {k: _i(raw, k) or 1 for k in keys}


def plan(row: GrpoRow, hw: HardwareSpec | None = None) -> tuple[Any, HardwareSpec, Cluster, Strategy, Workload]:
    """The row's model, hardware, cluster, strategy and workload."""
    r = row.raw
    try:
        m = load_model(r["model"])
        hw = hw or load_hardware(r["hardware"])
        gpus = _i(r, "gpus") or 0
        cluster = Cluster(gpus=gpus, gpus_per_node=_i(r, "gpus_per_node") or hw.gpus_per_node)
        off = tuple(o for o in (r.get("offload") or "").split(",") if o)
        cpu = (r.get("cpu_optimizer") or "").strip()
        s = Strategy(
            **_ones(r, "tp", "pp", "cp", "ep", "rollout_tp", "mbs"),
            etp=_i(r, "etp"),
            last_stage_layers=_i(r, "last_stage_layers"),
            gpu_memory_utilization=float(r.get("gpu_memory_utilization") or 0.6),
            recompute=r.get("recompute") or "selective",
            offload=off,
            max_tokens_per_gpu=_i(r, "max_tokens_per_gpu"),
            log_prob_max_tokens_per_gpu=_i(r, "log_prob_max_tokens_per_gpu"),
            cpu_optimizer=float(cpu) if cpu else None,
            overlap_cpu_optimizer=bool(cpu),
            precision_aware_optimizer=bool(cpu),
            enforce_eager=(r.get("enforce_eager") or "").lower() == "true",
            max_num_seqs=_i(r, "max_num_seqs") or 256,
        )
        wl = Workload(
            **_ones(r, "prompts", "n", "mini_batch", "prompt_len", "response_len"),
            prompt_len_mean=_i(r, "prompt_len_mean"),
            response_len_mean=_i(r, "response_len_mean"),
            kl=(r.get("kl") or "").lower() == "true",
        )
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"published GRPO row {row.id}: bad value ({exc})") from None
    return m, hw, cluster, s, wl


def predict(row: GrpoRow, hw: HardwareSpec | None = None) -> tuple[dict[str, float], Estimate]:
    """Predicted seconds in the row's terms: step and each published phase."""
    m, hw, cluster, s, wl = plan(row, hw)
    est = estimate(model=m, hardware=hw, cluster=cluster, strategy=s, workload=wl)
    t = est.time
    assert t is not None
    lp_combined = (row.raw.get("lp_combined") or "").lower() == "true"  # NeMo-RL publishes old + reference together
    lp = t["old_logprob"] + (t["ref_logprob"] if lp_combined else 0.0)
    return {
        "step_s": t.step_s,
        "gen_s": t["rollout"],
        "train_s": t["update"] + t["offload"],
        "old_lp_s": lp,
        "ref_lp_s": t["ref_logprob"],
        "refit_s": t["weight_sync"],
    }, est


FIT_KEYS = ("rl_compute_scale", "moe_layer_overhead_s", "decode_efficiency", "vllm_wake_s", "sync_tensor_overhead_s")
FIT_BOUNDS = ((0.2, 0.0, 0.1, 0.0, 0.0), (1.5, 0.05, 2.0, 60.0, 0.01))
HOPPER = ("h100-sxm-80gb", "h200-141gb", "h800-sxm-80gb", "h20-96gb")


def _with(hw: HardwareSpec, x: dict[str, float]) -> HardwareSpec:
    return hw.with_efficiency(**x) if hw.name in HOPPER else hw


def fit(rows: list[GrpoRow]) -> dict[str, float]:
    """Least squares of the log ratio predicted/published over every published phase of the
    ``fit`` rows (scipy.optimize.least_squares), for the Hopper RL parameters in FIT_KEYS."""
    import math

    from scipy.optimize import least_squares

    fit_rows = [r for r in rows if r.split == "fit"]
    if not fit_rows:
        raise ConfigError("no published GRPO rows marked split=fit to fit on")
    hws = {r.id: load_hardware(r.raw["hardware"]) for r in fit_rows}
    x0 = [getattr(hws[fit_rows[0].id].efficiency, k) for k in FIT_KEYS]

    def resid(x):
        out = []
        for r in fit_rows:
            pred, _ = predict(r, _with(hws[r.id], dict(zip(FIT_KEYS, x))))
            for k in PHASES:
                if k in r.published:
                    out.append(math.log(max(pred[k], 1e-6) / r.published[k]))
        return out

    res = least_squares(resid, x0, bounds=FIT_BOUNDS)
    return {k: float(f"{v:.4g}") for k, v in zip(FIT_KEYS, res.x)}


def run_grpo(
    *, path: str | Path | None = None, tolerance_pct: float = TOLERANCE_PCT, refit: bool = False
) -> dict[str, Any]:
    """Predicted vs published per row (step and phases), step and per-phase MAPE on the held-out
    rows (and the fit rows), and whether the held-out step MAPE is within the tolerance."""
    if not (tolerance_pct > 0):
        raise ConfigError(f"--tolerance must be > 0, got {tolerance_pct}")
    rows = load_grpo_rows(path)
    fitted = fit(rows) if refit else None
    out = []
    for r in rows:
        entry: dict[str, Any] = {
            "id": r.id,
            "split": r.split,
            "backend": r.raw.get("backend", ""),
            "source": r.raw["source"],
            "assumptions": r.raw.get("assumptions", ""),
            "published": r.published,
        }
        if r.split != "excluded":
            hw = load_hardware(r.raw["hardware"])
            pred, est = predict(r, _with(hw, fitted) if fitted else hw)
            entry.update(
                predicted={k: pred[k] for k in r.published},
                fits=est.fits,
                error_pct={k: 100.0 * (pred[k] / v - 1) for k, v in r.published.items()},
            )
        out.append(entry)

    def mape(split: str, key: str) -> float | None:
        errs = [abs(o["error_pct"][key]) for o in out if o["split"] == split and key in o.get("error_pct", {})]
        return sum(errs) / len(errs) if errs else None

    keys = ("step_s", *PHASES)
    m = {split: {k: mape(split, k) for k in keys} for split in ("fit", "holdout")}
    hold = m["holdout"]["step_s"]
    if hold is None:  # the report's one figure; printing None crashed the command
        raise ConfigError(
            f"{path or GRPO_DATA_PATH}: no held-out row with a step time to score",
            hint="mark at least one row's split as holdout",
        )
    return {
        "rows": out,
        "mape_pct": m,
        "tolerance_pct": tolerance_pct,
        "refit": fitted,
        "passed": hold is not None and hold <= tolerance_pct,
    }
