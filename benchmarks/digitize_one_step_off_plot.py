"""Read the per-step series off the plot that verl's one-step-off doc publishes for its Megatron pair.

    python benchmarks/digitize_one_step_off_plot.py one_step_off_megatron.png \
        --out benchmarks/results/one_step_off_megatron_plot.csv

The plot is ``docs/one_step_off_megatron.png`` of github.com/eric-haibin-lin/verl-community (linked from
volcengine/verl ``docs/advance/one_step_off.md``, "One Step Off Megatron Performance"; 2852 x 1180 px, git blob
``BLOB`` below): six wandb panels of the two runs ``DAPO_7b_math_megatron_colocate`` (red) and
``DAPO_7b_math_megatron_4_12`` (blue), steps 1..100. The doc's table gives one value per phase per run; the plot
gives every step, which says what kind of value the table's is (docs/placement.md, "The one-step-off pair: what
the source publishes").

Two panels are read: ``timing_s/step`` (top left) and ``timing_s/generate_sequences`` (bottom left). Each panel's
axes are calibrated on its own tick labels (the pixel centres below were measured on the image: the horizontal
grid lines for the y labels, the centres of the x labels' glyphs); each run's line is the set of pixels of its
colour (red: R > 150, R - G > 60, G and B < 130; blue: B > 150, B - R > 60, R < 150) in the three pixel columns
around a step's x position. A step's value is the centre of its vertical run of line pixels, or, at a local
peak or trough (both neighbours' centres below or above, run taller than 6 px), the run's extreme less half the
line's width (1.5 px): the line's vertex. Resolution: one pixel is 2.35 s on the step panel and 1.45 s on the
generate_sequences panel.

Checked against the doc's own figures (tests/test_one_step_off_plot.py): the 100 steps sum to within 3% of the
table's total times (18h21m and 13h06m).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
from pathlib import Path

BLOB = "one_step_off_megatron.png in eric-haibin-lin/verl-community at refs/heads/main"

# panel: (left, top) of its 950 x 590 crop, y calibration ((pixel row, value), (pixel row, value)),
# x calibration ((pixel column, step), (pixel column, step)); rows/columns within the crop
PANELS = {
    "step": ((0, 0), ((221.5, 1000.0), (477.0, 400.0)), ((258.0, 20), (895.5, 100))),
    "generate_sequences": ((0, 590), ((173.0, 600.0), (448.5, 200.0)), ((246.0, 20), (893.5, 100))),
}
RUNS = {"red": "colocate", "blue": "one_step_off_4_12"}
LINE_HALF_WIDTH_PX = 1.5
PLOT_ROWS = (140, 515)  # the plotting area's rows within a crop (legend above, x axis below)


def _masks(px):
    r, g, b = px[:, :, 0], px[:, :, 1], px[:, :, 2]
    red = (r > 150) & (g < 130) & (b < 130) & (r - g > 60)
    blue = (b > 150) & (r < 150) & (b - r > 60)
    out = {}
    for name, m in (("red", red), ("blue", blue)):
        m = m.copy()
        m[: PLOT_ROWS[0], :] = False
        m[PLOT_ROWS[1] :, :] = False
        out[name] = m
    return out


def read_panel(img, panel: str, steps: range = range(1, 101)) -> dict[str, dict[int, float]]:
    """``{run: {step: seconds}}`` of one panel."""
    (x0, y0), ((ya, va), (yb, vb)), ((xa, sa), (xb, sb)) = PANELS[panel]
    import numpy as np

    px = np.asarray(img.convert("RGB")).astype(int)[y0 : y0 + 590, x0 : x0 + 950]
    masks = _masks(px)
    out: dict[str, dict[int, float]] = {}
    for colour, m in masks.items():
        centre, run = {}, {}
        for k in steps:
            c = int(round(xa + (k - sa) * (xb - xa) / (sb - sa)))
            ys = np.where(m[:, c - 1 : c + 2].any(axis=1))[0]
            if len(ys):
                centre[k], run[k] = float(ys.mean()), (int(ys.min()), int(ys.max()))
        vals = {}
        for k, y in centre.items():
            lo, hi = run[k]
            nb = [centre[j] for j in (k - 1, k + 1) if j in centre]
            if len(nb) == 2 and hi - lo > 6:
                if all(n > y for n in nb):
                    y = lo + LINE_HALF_WIDTH_PX  # a peak: the vertex is the top of the run
                elif all(n < y for n in nb):
                    y = hi - LINE_HALF_WIDTH_PX  # a trough
            vals[k] = va + (y - ya) * (vb - va) / (yb - ya)
        out[RUNS[colour]] = vals
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("png", type=Path, help="docs/one_step_off_megatron.png of eric-haibin-lin/verl-community")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from PIL import Image

    data = a.png.read_bytes()
    img = Image.open(a.png)
    if img.size != (2852, 1180):
        print(f"[BAD_INPUT] {a.png}: {img.size[0]} x {img.size[1]} px, not the 2852 x 1180 plot", file=sys.stderr)
        return 2
    if a.out.resolve() == a.png.resolve():
        print("[BAD_INPUT] --out would overwrite the input", file=sys.stderr)
        return 2
    sha = hashlib.sha256(data).hexdigest()
    rows = []
    for panel in PANELS:
        for run, vals in read_panel(img, panel).items():
            rows += [(panel, run, k, round(v, 1)) for k, v in sorted(vals.items())]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("w", newline="") as f:
        f.write(f"# digitized by benchmarks/digitize_one_step_off_plot.py from {BLOB} (sha256 {sha})\n")
        w = csv.writer(f)
        w.writerow(("panel", "run", "step", "seconds"))
        w.writerows(rows)
    for panel in PANELS:
        for run in RUNS.values():
            v = [s for p, r, _, s in rows if p == panel and r == run]
            print(f"{panel:20s} {run:18s} {len(v):3d} steps, sum {sum(v):9.0f} s")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
