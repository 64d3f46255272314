"""Measured transfer error: how far a hardware profile's prices land when none of its GPU's rows were fitted.

A ``transferred`` profile (B200, GB200, H800, H20, A100, L40S) takes its time-model parameters from another GPU: the
GEMM curve from H200's sweep scaled by the ridge point (peak FLOP/s over HBM bytes/s), decode efficiency and the stack
costs from fits on other GPUs' rows. Its error band (what ``compare`` prints under it) is measured here by doing
exactly that to the GPUs we have rows for, one at a time:

- **GRPO, leave one GPU type out** (:func:`leave_gpu_out`): the bounded fit of validate/grpo.py is redone without any
  row of that GPU (a parameter that fewer than two of the remaining rows move keeps its prior, as in the refit
  cross-validation), and that GPU's rows are priced at the refit. Every H100 row is NeMo-RL and every H20 row verl,
  so leaving a GPU out also leaves its stack's own rows out: the error counts the stack's costs unfitted as well,
  which is what a new GPU with a new release meets.
- **Pretraining, the GEMM curve transferred** (:func:`gemm_transfer`): A100's Megatron-LM rows
  (profiles/data/published.csv, Narayanan et al. 2021) priced with H200's curve scaled by A100's ridge point, the
  rule every transferred profile's curve follows, in place of A100's own fit.

The band is the largest of the per-GPU mean absolute step errors (a band should contain the truth on every GPU
we could check, not on their average). It is recorded in :data:`BANDS_PATH` so ``compare`` stays fast; regenerate it
with ``python -m grpo_tune.validate.transfer --write`` (a few minutes: one refit per GPU type).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from grpo_tune.core.specs import PROFILES_DIR, load_hardware

BANDS_PATH = PROFILES_DIR / "data" / "transfer_bands.toml"
REGENERATE = "python -m grpo_tune.validate.transfer --write"
GEMM_SOURCE = "h200-141gb"
"""The profile whose GEMM sweep every transferred curve is scaled from (docs/calibration.md)."""
SPEC_ONLY_FACTOR = 1.5
"""A spec-only profile has no fitted parameter at all: half again the transferred band (a stated assumption)."""


def _ridge(name: str) -> float:
    hw = load_hardware(name)
    return hw.peak_flops_per_s() / hw.hbm_bandwidth_bytes_per_s


def leave_gpu_out(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Per GPU type with scored GRPO rows: its rows priced at a fit redone without them. Returns hardware name ->
    {rows, step_rows, step_mape_pct, phase_mape_pct {phase: MAPE}, errors {row id: {figure: error %}}, fitted
    (the parameters the fold fitted)}."""
    from grpo_tune.validate import grpo as G

    rows = G.load_grpo_rows(path)
    scored = [r for r in rows if G._scored(r)]
    mv = G.movers(scored)
    out: dict[str, dict[str, Any]] = {}
    for gpu in sorted({load_hardware(r.raw["hardware"]).name for r in scored}):
        held = [r for r in scored if load_hardware(r.raw["hardware"]).name == gpu]
        train = [r for r in scored if r not in held]
        ids = {r.id for r in train}
        free = [p for p in G.PRIORS if len([i for i in mv[p] if i in ids]) >= 2]
        x = G._fit_params(train, free) if train else {p: p.value for p in G.PRIORS}
        errs: dict[str, dict[str, float]] = {}
        for r in held:
            pred = G._predict_at(r, x)
            errs[r.id] = {k: float(100.0 * (pred[k] / v - 1)) for k, v in r.published.items()}
        figures: dict[str, list[float]] = {}
        for e in errs.values():
            for k, v in e.items():
                figures.setdefault(k, []).append(abs(v))
        mape = {k: sum(v) / len(v) for k, v in figures.items()}
        out[gpu] = {
            "rows": len(held),
            "step_rows": len(figures.get("step_s", [])),
            "step_mape_pct": mape.get("step_s"),
            "phase_mape_pct": {k: v for k, v in mape.items() if k != "step_s"},
            "errors": errs,
            "fitted": sorted(f"{p.on}:{p.key}" for p in free),
        }
    return out


def gemm_transfer(hardware: str = "a100") -> dict[str, Any]:
    """``hardware``'s published Megatron-LM rows priced with the GEMM curve transferred from :data:`GEMM_SOURCE` by
    the ridge point (as every transferred profile's curve is), against the same rows priced with its own fitted
    curve."""
    from grpo_tune.validate import pretraining as PT

    src = load_hardware(GEMM_SOURCE).efficiency
    own = PT.megatron_2021(load_hardware(hardware))
    moved = own.with_efficiency(
        gemm_efficiency_max=src.gemm_efficiency_max,
        gemm_intensity_half=src.gemm_intensity_half * _ridge(hardware) / _ridge(GEMM_SOURCE),
    )
    rows = PT.load_rows()
    errs = {r.id: 100.0 * (PT.predict(r, moved) / r.published - 1) for r in rows}
    own_errs = {r.id: 100.0 * (PT.predict(r, own) / r.published - 1) for r in rows}
    return {
        "hardware": own.name,
        "rows": len(rows),
        "mape_pct": sum(abs(v) for v in errs.values()) / len(errs),
        "own_fit_mape_pct": sum(abs(v) for v in own_errs.values()) / len(own_errs),
        "gemm_intensity_half": moved.efficiency.gemm_intensity_half,
        "errors": errs,
    }


def compute(path: str | Path | None = None) -> dict[str, Any]:
    """Every measured transfer error and the band they give (the largest per-GPU step MAPE)."""
    logo = leave_gpu_out(path)
    gemm = gemm_transfer()
    steps = {g: v["step_mape_pct"] for g, v in logo.items() if v["step_mape_pct"] is not None}
    steps[f"{gemm['hardware']} (pretraining, GEMM curve)"] = gemm["mape_pct"]
    worst = max(steps, key=lambda k: steps[k])
    band = steps[worst]
    return {
        "leave_gpu_out": logo,
        "gemm_transfer": gemm,
        "step_mape_pct": steps,
        "band": {"transferred_pct": band, "spec_only_pct": SPEC_ONLY_FACTOR * band, "set_by": worst},
    }


def render(res: dict[str, Any]) -> str:
    """The recorded table (TOML) for :data:`BANDS_PATH`."""
    lines = [
        "# Error bands of transferred and spec-only hardware profiles, as `grpo-tune compare` prints them, measured by",
        "# grpo_tune/validate/transfer.py (leave one GPU type out of the GRPO fit; A100's pretraining rows priced with",
        "# the GEMM curve transferred from H200 by the ridge point). Regenerated by:",
        f"#   {REGENERATE}",
        "# (a test checks the recorded figures against a fresh run: tests/test_transfer_bands.py, marked slow).",
        "",
        "[band]",
        f"transferred_pct = {res['band']['transferred_pct']:.1f}   # the largest per-GPU step MAPE below",
        f"spec_only_pct = {res['band']['spec_only_pct']:.1f}   # {SPEC_ONLY_FACTOR} x transferred: no parameter of"
        " such a profile is fitted (a stated assumption)",
        f'set_by = "{res["band"]["set_by"]}"',
        "",
    ]
    for gpu, v in res["leave_gpu_out"].items():
        lines.append(f'[leave_gpu_out."{gpu}"]')
        lines.append(f"rows = {v['rows']}")
        lines.append(f"step_rows = {v['step_rows']}")
        if v["step_mape_pct"] is not None:
            lines.append(f"step_mape_pct = {v['step_mape_pct']:.1f}")
        for k, m in sorted(v["phase_mape_pct"].items()):
            lines.append(f"{k}_mape_pct = {m:.1f}")
        lines.append("")
    g = res["gemm_transfer"]
    lines += [
        f'[gemm_transfer."{g["hardware"]}"]',
        f"rows = {g['rows']}",
        f"mape_pct = {g['mape_pct']:.1f}   # the transferred curve (gemm_intensity_half "
        f"{g['gemm_intensity_half']:.1f})",
        f"own_fit_mape_pct = {g['own_fit_mape_pct']:.1f}   # the profile's own fitted curve, for reference",
        "",
    ]
    return "\n".join(lines)


def recorded(path: Path | None = None) -> dict[str, Any]:
    """The recorded table (:data:`BANDS_PATH`), read once per process."""
    return _read(str(path or BANDS_PATH))


_CACHE: dict[str, dict[str, Any]] = {}


def _read(p: str) -> dict[str, Any]:
    if p not in _CACHE:
        import tomllib

        with open(p, "rb") as f:
            _CACHE[p] = tomllib.load(f)
    return _CACHE[p]


def band_pct(provenance: str, fitted_pct: float) -> float:
    """The error band ``compare`` prints for a profile of this provenance: ``fitted``, the refit cross-validated
    step error (``fitted_pct``: validate/grpo.py BAND_PCT); ``transferred`` and ``spec-only``, the recorded measured
    transfer error (never below the fitted band)."""
    if provenance == "fitted":
        return fitted_pct
    b = recorded()["band"]
    v = float(b["transferred_pct"] if provenance == "transferred" else b["spec_only_pct"])
    return max(v, fitted_pct) if math.isfinite(v) else fitted_pct


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    res = compute()
    text = render(res)
    if "--write" in args:
        from grpo_tune.core.config import atomic_write

        atomic_write(BANDS_PATH, text + "\n")
        print(f"wrote {BANDS_PATH}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
