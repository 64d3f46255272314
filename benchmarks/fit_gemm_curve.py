"""Refit the Hopper GEMM efficiency curve from the committed H200 sweep and compare with the profiles.

    python benchmarks/fit_gemm_curve.py [--csv profiles/data/h200_gemm.csv] [--min-m 2048] [--json]

The curve is costmodel.timing_base.gemm_efficiency's ``e_max * I / (I + I_half)``, with
I = 1/(1/m + 1/k + 1/n) the GEMM's arithmetic intensity and the efficiency measured as
``tflops / peak`` (the profile's ``bf16_dense_flops_per_s``, 989.4 TFLOP/s dense BF16 for H100/H200).
The fit is least squares on the relative error ``predicted / measured - 1`` (a 10% miss weighs the
same on a small GEMM as on a large one), over the sweep's ``gemm`` rows with m >= --min-m (the token
counts of training micro-batches and prefill; below that the decode-shaped GEMMs are bandwidth-bound
and priced by the roofline instead). That loss is what reproduces the committed constants (0.7932,
353.7, 6.9% mean error, commit 711d1d6); least squares on log efficiency would give 0.771 / 275.
For a fixed I_half the residuals are linear in e_max, so e_max has a closed form and only I_half is
searched (golden section on log I_half). Pure Python: no torch, numpy or scipy.
The sweep itself was measured by benchmarks/gpu_gemm_sweep.py on one H200 (see the CSV's header).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV_DEFAULT = ROOT / "grpo_tune" / "profiles" / "data" / "h200_gemm.csv"
PROFILES = ("h100-sxm-80gb", "h200-141gb")


@dataclass(frozen=True)
class Fit:
    efficiency_max: float
    intensity_half: float
    rows: int
    mean_abs_error: float
    """Mean |predicted / measured - 1| over the fitted rows."""


def read_gemm_rows(path: Path, min_m: int) -> list[tuple[float, float]]:
    """(intensity, TFLOP/s) of each ``gemm`` row with m >= min_m; '#' lines are the file's header."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if not ln.lstrip().startswith("#")]
    out = []
    for r in csv.DictReader(lines):
        if r["kind"] != "gemm" or int(r["m"]) < min_m:
            continue
        m, n, k = (float(r[c]) for c in ("m", "n", "k"))
        out.append((1.0 / (1.0 / m + 1.0 / n + 1.0 / k), float(r["tflops"])))
    return out


def _best_scale(rows: list[tuple[float, float]], peak_tflops: float, i_half: float) -> tuple[float, float]:
    """(e_max, sum of squared relative errors) for a fixed I_half: the residual e_max * x_j - 1,
    x_j = curve_j / measured_j, is linear in e_max, so e_max = sum(x) / sum(x^2)."""
    x = [peak_tflops * i / (i + i_half) / t for i, t in rows]
    e = sum(x) / sum(v * v for v in x)
    return e, sum((e * v - 1) ** 2 for v in x)


def fit(rows: list[tuple[float, float]], peak_tflops: float) -> Fit:
    if len(rows) < 2:
        raise ValueError("need at least two GEMM rows to fit two constants")
    lo, hi = math.log(1e-2), math.log(1e6)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):  # golden section on log I_half (one minimum on this sweep: scipy agrees)
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if _best_scale(rows, peak_tflops, math.exp(a))[1] < _best_scale(rows, peak_tflops, math.exp(b))[1]:
            hi = b
        else:
            lo = a
    i_half = math.exp((lo + hi) / 2)
    e_max = _best_scale(rows, peak_tflops, i_half)[0]
    err = sum(abs(peak_tflops * e_max * i / (i + i_half) / t - 1) for i, t in rows) / len(rows)
    return Fit(e_max, i_half, len(rows), err)


def committed(profile: str) -> tuple[float, float, float]:
    """(gemm_efficiency_max, gemm_intensity_half, peak TFLOP/s) of a hardware profile."""
    with open(ROOT / "grpo_tune" / "profiles" / "hardware" / f"{profile}.toml", "rb") as f:
        d = tomllib.load(f)
    e = d["efficiency"]
    return float(e["gemm_efficiency_max"]), float(e["gemm_intensity_half"]), float(d["bf16_dense_flops_per_s"]) / 1e12


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, default=CSV_DEFAULT)
    p.add_argument("--min-m", type=int, default=2048, help="fit only GEMMs with at least this many rows (tokens)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = read_gemm_rows(a.csv, a.min_m)
    fits = {prof: (fit(rows, committed(prof)[2]), committed(prof)) for prof in PROFILES}
    if a.json:
        report = {
            prof: {
                "fitted": asdict(f),
                "committed": {"efficiency_max": e_c, "intensity_half": i_c, "peak_tflops": peak},
                "diff": {"efficiency_max": f.efficiency_max - e_c, "intensity_half": f.intensity_half - i_c},
            }
            for prof, (f, (e_c, i_c, peak)) in fits.items()
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"{a.csv.name}: {len(rows)} GEMM rows with m >= {a.min_m}; curve e_max * I / (I + I_half)")
    print(f"{'profile':16s} {'':10s} {'e_max':>8s} {'I_half':>8s} {'mean |err|':>10s}")
    for prof, (f, (e_c, i_c, _)) in fits.items():
        print(f"{prof:16s} {'fitted':10s} {f.efficiency_max:8.4f} {f.intensity_half:8.1f} {f.mean_abs_error:9.1%}")
        print(f"{'':16s} {'committed':10s} {e_c:8.4f} {i_c:8.1f}")
        de, di = f.efficiency_max - e_c, f.intensity_half - i_c
        print(f"{'':16s} {'diff':10s} {de:+8.4f} {di:+8.1f}   ({de / e_c:+.2%}, {di / i_c:+.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
