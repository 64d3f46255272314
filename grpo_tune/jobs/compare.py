"""``grpo-tune compare``'s work: the same search on each hardware profile, the rows, compare.json and its plot.

:func:`run_compare` takes a :class:`CompareRequest` and returns a :class:`CompareOutcome`; ``cli/compare.py``
prints it.
"""

from __future__ import annotations

import dataclasses

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from grpo_tune.core.errors import NoFeasiblePlanError
from grpo_tune.core.placement import PlacementAsk
from grpo_tune.core.strategy import Workload
from grpo_tune.jobs.inputs import WorkloadFlags, plan_inputs
from grpo_tune.jobs.setup import Setup
from grpo_tune.validate.grpo import BAND_PCT
from grpo_tune.validate.transfer import band_pct


@dataclass(frozen=True)
class CompareRequest:
    """What ``compare`` was asked: the model and cluster size, the profiles, the pins and workload flags."""

    model: str
    gpus: int
    hardware: list[str]
    workload: WorkloadFlags
    """The workload flags (``plan_inputs``' keywords)."""
    gpus_per_node: int | None = None
    pins: dict[str, object] = field(default_factory=dict)
    setup: Setup = Setup()
    place: PlacementAsk | None = None
    min_headroom: float = 0.0
    out: Path | None = None
    """The folder of compare.json and compare.png (None: runs/compare-<model>-<gpus>g-<time>)."""


@dataclass(frozen=True)
class CompareOutcome:
    """The rows (one per profile), the document written to compare.json, and where it went."""

    rows: list[dict[str, object]]
    doc: dict[str, object]
    out: Path
    png: Path
    workload: Workload
    """The workload every row is priced on."""


def run_compare(req: CompareRequest) -> CompareOutcome:
    """One search per hardware profile (and a placement search when asked); compare.png and compare.json."""
    from grpo_tune import frameworks as F
    from grpo_tune.core.config import atomic_write
    from grpo_tune.rundir.report import plot_compare

    pins = F.check_pins(req.setup.frameworks, req.pins)
    place = req.place
    if place is not None:  # issue 40: a stream no chosen framework runs is never priced
        place = dataclasses.replace(place, stream=place.stream_for(F.can_stream(req.setup.frameworks)))
    cal, cal_hw = None, None
    if req.setup.calibration is not None:
        cal = req.setup.load_calibration()
        cal_hw = json.loads(req.setup.calibration.read_text()).get("hardware")
    rows = compare_rows(
        model=req.model,
        gpus=req.gpus,
        hardware=req.hardware,
        gpus_per_node=req.gpus_per_node,
        pins=pins,
        workload_kw=req.workload,
        min_headroom=req.min_headroom,
        calibration=cal,
        calibration_hardware=cal_hw,
        place=place,
        stack=req.setup.stack,
    )
    out = req.out
    if out is None:
        from grpo_tune.core.specs import load_model

        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"compare-{load_model(req.model).name}-{req.gpus}g-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    png = plot_compare(rows, out / "compare.png")
    stack = req.setup.stack_info(str(rows[0]["stack"])) if rows and rows[0].get("stack") else None
    doc = {"model": req.model, "gpus": req.gpus, "stack": stack, "rows": rows, "png": str(png)}
    atomic_write(out / "compare.json", json.dumps(doc, indent=2, default=str) + "\n")
    _, _, _, wl = plan_inputs(
        model=req.model, hardware=req.hardware[0], gpus=req.gpus, gpus_per_node=req.gpus_per_node, **req.workload
    )
    return CompareOutcome(rows=rows, doc=doc, out=out, png=png, workload=wl)


def usd_per_million_tokens(price_per_gpu_hour: float | None, tokens_per_s_per_gpu: float) -> float | None:
    """$/GPU-hour / (3600 s/h x tokens/s/GPU) x 1e6."""
    if price_per_gpu_hour is None or tokens_per_s_per_gpu <= 0:
        return None
    return price_per_gpu_hour / (3600.0 * tokens_per_s_per_gpu) * 1e6


def compare_rows(
    *,
    model: str,
    gpus: int,
    hardware: list[str],
    gpus_per_node: int | None,
    pins: Mapping[str, object],
    workload_kw: WorkloadFlags,
    calibration: dict[str, float] | None = None,
    min_headroom: float = 0.0,
    calibration_hardware: str | None = None,
    place: PlacementAsk | None = None,
    stack: str | None = None,
) -> list[dict[str, object]]:
    """One row per hardware profile: the best plan's figures, or why none fits."""
    from grpo_tune.rundir.report import plan_label
    from grpo_tune.autotune.search.driver import search
    from grpo_tune.costmodel.results import step_s, tokens_per_s_per_gpu

    rows = []
    for name in hardware:
        m, hw, cluster, wl = plan_inputs(
            model=model, hardware=name, gpus=gpus, gpus_per_node=gpus_per_node, stack=stack, **workload_kw
        )
        row: dict[str, Any] = {
            "hardware": hw.name,
            "gpus": cluster.gpus,
            "gpus_per_node": cluster.gpus_per_node,
            "price_per_gpu_hour_usd": hw.price_per_gpu_hour_usd,
            "provenance": hw.provenance,
            "provenance_note": hw.provenance_note,
            "stack": hw.stack,
            # fitted: the refit cross-validated step error; transferred / spec-only: the measured transfer error
            # (leave one GPU type out, profiles/data/transfer_bands.toml)
            "band_pct": band_pct(hw.provenance, BAND_PCT["fitted"]),
        }
        try:
            # a calibration file is fitted on one hardware: it applies to that profile's row only
            cal = calibration if calibration_hardware in (None, hw.name) else None
            res = search(m, hw, cluster, wl, pins=dict(pins), top=1, calibration=cal, min_headroom=min_headroom)
            placed = None
            if place and (place.placement != "colocated" or place.pool_options):
                placed = _placed(m, hw, cluster, wl, pins, cal, min_headroom, place, res)
        except NoFeasiblePlanError as exc:
            row.update(fits=False, error=exc.to_dict())
            rows.append(row)
            continue
        b = res.best if placed is None else placed.best
        tps = tokens_per_s_per_gpu(b)
        f = b.placement
        # a separate plan: its split (rollout + training GPUs) and staleness before the training pool's plan
        split = f"{f['rollout_gpus']}+{f['train_gpus']} K{f['staleness']} " if f else ""
        row.update(
            fits=True,
            plan=split + plan_label(b.strategy, rollout=b.workload.kind == "grpo"),
            strategy=b.strategy.to_dict(),
            step_s=step_s(b),
            tokens_per_s_per_gpu=tps,
            mfu=None if b.throughput is None else b.throughput.mfu,
            usd_per_million_tokens=usd_per_million_tokens(hw.price_per_gpu_hour_usd, tps),
            peak_bytes=int(b.peak_bytes),
            peak_phase=b.peak_phase,
            capacity_bytes=int(b.capacity_bytes),
            headroom_bytes=int(b.headroom_bytes),
            search=res.stats(),
        )
        if b.placement:
            row["placement"] = dict(b.placement)
        rows.append(row)
    _flag_within_band(rows)
    return rows


def _placed(m, hw, cluster, wl, pins, cal, min_headroom, place, colocated):
    """The best plan of the placement asked for (auto: the better of colocated and separate pools)."""
    from grpo_tune.autotune.search.placement import search_placement

    return search_placement(
        m,
        hw,
        cluster,
        wl,
        placement=place.require_separate(),
        staleness=place.staleness,
        rollout_gpus=place.rollout_gpus,
        rollout_hardware=place.rollout_profile(),
        partial_rollout=place.partial_rollout,
        stream=place.stream,
        pins=pins,
        top=1,
        calibration=cal,
        min_headroom=min_headroom,
        colocated=colocated if place.placement == "auto" else None,
    )


def _flag_within_band(rows: list[dict[str, Any]]) -> None:
    """A less-known profile called faster than a better-known one by less than its error band gets a
    ``note`` saying the two are not told apart (the bands: BAND_PCT)."""
    rank = {"fitted": 0, "transferred": 1, "spec-only": 2}
    ok = [r for r in rows if r.get("fits")]
    for r in ok:
        for o in ok:
            if rank[r["provenance"]] > rank[o["provenance"]] and r["tokens_per_s_per_gpu"] > o["tokens_per_s_per_gpu"]:
                gain = 100.0 * (r["tokens_per_s_per_gpu"] / o["tokens_per_s_per_gpu"] - 1)
                if gain < r["band_pct"]:
                    r["note"] = (
                        f"{gain:.0f}% faster than {o['hardware']} ({o['provenance']}), inside its "
                        f"{r['provenance']} band of {r['band_pct']:.0f}%: not told apart"
                    )
