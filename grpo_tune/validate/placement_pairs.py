"""Separate pools against published speed-ups: ``grpo-tune validate --grpo`` scores each pair of
profiles/data/published_placement_pairs.csv.

A pair is two rows of published_grpo.csv, the same task run colocated and synchronous, then on separate
rollout and training pools (asynchronously). The colocated row is priced by the cost model as every row
is; the separate row by :func:`costmodel.pools.estimate_separate` with its pools and staleness. The
score is the predicted speed-up (colocated step / separate step) against the published one: a ratio, so a
pair whose runs do not publish the mean response length still counts, at one mean for both rows (equal work):
the pair's ``response_len_mean``, or, where that cell is empty, the colocated row's own (published_grpo.csv's
``response_len_mean``: solved there from the row's published old log-prob time when the source publishes none).
The predicted range over ``mean_low..mean_high`` (empty: half and twice the mean) is reported with it. Where the
separate row publishes per-pool phases they are reported next to the prediction.

A separate row's published step is the trainer's ``timing_s/step`` (verl's fully-async trainer: summed over the
``trigger_parameter_sync_step`` local updates of one parameter version; the parameter sync is timed apart, as
``timing_s/param_sync``), so with ``step_excludes_sync`` the separate step is scored without the sync that the
steady state exposes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import PROFILES_DIR

from grpo_tune.validate.pretraining import read_records
from grpo_tune.validate.grpo import GrpoRow, load_grpo_rows, plan

PAIRS_PATH = PROFILES_DIR / "data" / "published_placement_pairs.csv"
TOLERANCE_PCT = 15.0
"""A pair's predicted speed-up must be within this of the published one."""
_REQUIRED = ("id", "colocated", "separate", "published_speedup", "response_len_mean", "source")


def load_pairs(path: str | Path | None = None) -> list[dict[str, str]]:
    return read_records(Path(path) if path else PAIRS_PATH, _REQUIRED, "published placement pairs")


def pair_means(p: dict[str, str], col: GrpoRow) -> tuple[int, int, int]:
    """(mean, low, high) response length of a pair: its own ``response_len_mean`` or, empty, the colocated
    row's; ``mean_low``/``mean_high`` or, empty, half and twice the mean (at most the row's cap)."""

    def cell(d: dict[str, str], k: str) -> int | None:
        v = (d.get(k) or "").strip()
        if not v:
            return None
        try:
            return int(v)
        except ValueError:
            raise ConfigError(f"placement pair {p.get('id')}: {k} must be an integer, got {v!r}") from None

    mean = cell(p, "response_len_mean") or cell(col.raw, "response_len_mean")
    if not mean:
        raise ConfigError(
            f"placement pair {p.get('id')}: no response_len_mean, and its colocated row {col.id} states none",
            hint="give the pair a response_len_mean, or the colocated row one (with its assumption)",
        )
    cap = cell(col.raw, "response_len") or 2 * mean
    return mean, cell(p, "mean_low") or max(1, mean // 2), cell(p, "mean_high") or min(cap, 2 * mean)


def _with_mean(row: GrpoRow, mean: int) -> GrpoRow:
    return dataclasses.replace(row, raw={**row.raw, "response_len_mean": str(mean)})


def _flag(p: dict[str, str], key: str, default: bool) -> bool:
    v = (p.get(key) or "").strip().lower()
    if not v:
        return default
    if v not in ("true", "false"):
        raise ConfigError(f"placement pair {p.get('id')}: {key} must be true or false, got {v!r}")
    return v == "true"


def _steps(col: GrpoRow, sep: GrpoRow, p: dict[str, str], mean: int) -> tuple[Any, Any]:
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.costmodel.pools import estimate_separate

    m, hw, cluster, s, wl = plan(_with_mean(col, mean))
    c = estimate(model=m, hardware=hw, cluster=cluster, strategy=s, workload=wl)
    m2, hw2, cl2, s2, wl2 = plan(_with_mean(sep, mean))
    raw = sep.raw
    place = Placement(
        mode="separate",
        rollout_gpus=int(raw["rollout_gpus"]),
        staleness=int(raw.get("staleness") or 0),
        partial_rollout=_flag(p, "partial_rollout", False),
        recompute_logprobs=_flag(p, "recompute_logprobs", True),
    )
    knobs = pair_knobs(p, place, wl2)
    place = dataclasses.replace(place, stream=pair_streams(p, place, knobs))
    e = estimate_separate(model=m2, hardware=hw2, cluster=cl2, strategy=s2, workload=wl2, placement=place, knobs=knobs)
    return c, e


def pair_streams(p: dict[str, str], place: Placement, knobs: Any) -> bool:
    """Whether the separate run streamed its on-policy step: verl's fully-async trainer at staleness 0 (no
    ``staleness_threshold`` ahead) that fetches fewer than all of a step's mini-batches at a time
    (``require_batches`` x mini-batch < the step's prompts) trains each fetch as it arrives while the rollouter
    generates the rest of the step under the same weights (docs/placement.md, "Streaming within a step"). The
    one-step-off trainer and a whole-batch fetch do not."""
    return (
        not _flag(p, "one_step_off", False) and place.staleness == 0 and knobs.ahead <= 0 and knobs.fetch_fraction < 1
    )


def pair_knobs(p: dict[str, str], place: Placement, wl: Any) -> Any:
    """The separate run's asynchronous knobs (costmodel.pools.AsyncKnobs) from the pair's columns:
    ``one_step_off`` (verl's one-step-off trainer: each batch one synchronous generate call, overlapped one step),
    else verl's fully-async ``staleness_threshold`` (empty: the row's integer staleness) with its partial rollout,
    and ``require_batches`` (the trainer's fetch: require_batches x the row's mini-batch of its prompts per step)."""
    from grpo_tune.costmodel.pools import AsyncKnobs

    if _flag(p, "one_step_off", False):
        return AsyncKnobs(ahead=float(place.staleness), whole_batch=True)
    th = (p.get("staleness_threshold") or "").strip()
    rb = (p.get("require_batches") or "").strip()
    try:
        ahead = float(th) if th else float(place.staleness)
        fetch = int(rb) * wl.mini_batch / wl.prompts if rb else 1.0
    except ValueError:
        raise ConfigError(
            f"placement pair {p.get('id')}: staleness_threshold / require_batches must be numbers"
        ) from None
    return AsyncKnobs(ahead=ahead, no_drain=place.partial_rollout and ahead > 0, fetch_fraction=fetch)


BASES = ("step", "total")
"""What a pair's ``published_speedup`` is the ratio of: ``step``, the two runs' published step times; ``total``, their
wall-clock totals over the same ``steps`` steps (the sources' headline figures)."""


def pair_basis(p: dict[str, str]) -> tuple[str, int]:
    """(basis, steps) of a pair: ``step`` (steps 1) unless it says ``total`` with a positive ``steps``."""
    basis = (p.get("basis") or "step").strip()
    if basis not in BASES:
        raise ConfigError(f"placement pair {p.get('id')}: basis must be one of {', '.join(BASES)}, got {basis!r}")
    if basis == "step":
        return basis, 1
    v = (p.get("steps") or "").strip()
    if not v.isdigit() or int(v) < 1:
        raise ConfigError(
            f"placement pair {p.get('id')}: basis total needs the number of steps its totals span, got {v!r}",
            hint="set steps to the run length the published total times cover",
        )
    return basis, int(v)


def predicted_speedup(c: Any, e: Any, basis: str, steps: int, excludes_sync: bool) -> float:
    """The model's speed-up on the pair's basis. ``step``: colocated step / separate step as the source timed it
    (:func:`separate_step`). ``total``: the two runs' wall-clock over ``steps`` steps, ``steps x step`` for the
    colocated run and ``steps x step + fill`` for the separate one (its whole steady-state step, the weight sync
    included, and the first batch's generation, which the trainer waits for once: ``fill_s``). Validation and
    start-up are in both published totals and priced in neither."""
    if basis == "total":
        return float(steps * c.step_s / (steps * e.step_s + e.placement["fill_s"]))
    return float(c.step_s / separate_step(e, excludes_sync))


def separate_step(e: Any, excludes_sync: bool) -> float:
    """The separate plan's step as the source timed it: the steady state, less the sync it exposes when the
    source times the sync apart (``step_excludes_sync``)."""
    return float(e.step_s - (e.placement["exposed_sync_s"] if excludes_sync else 0.0))


PHASE_OF = {
    "step_s": "step",
    "gen_s": "rollout",
    "old_lp_s": "old_logprob",
    "ref_lp_s": "ref_logprob",
    "train_s": "update",
    "refit_s": "weight_sync",
}
"""published_grpo.csv's phase columns and the cost model's phase names."""


def per_pool(row: GrpoRow, est: Any, side: str, step_s: float | None = None) -> list[dict[str, Any]]:
    """Each phase the row publishes next to its prediction (a separate row's are the pools' own times; its step
    ``step_s`` as scored, when given)."""
    phases = dict(est.time.phases) if est.time else {}
    out = []
    for col, name in PHASE_OF.items():
        pub = row.published.get(col)
        if pub is None:
            continue
        pred = (step_s if step_s is not None else est.step_s) if name == "step" else phases.get(name)
        if name == "rollout" and pred is not None and (row.raw.get("gen_includes_refit") or "").lower() == "true":
            pred += phases.get("weight_sync", 0.0)  # the row's gen timer also timed the refit (validate/grpo.py)
        out.append({"row": row.id, "side": side, "phase": name, "published_s": pub, "predicted_s": pred})
    return out


def score_pairs(
    pairs_path: str | Path | None = None, rows_path: str | Path | None = None, tolerance_pct: float = TOLERANCE_PCT
) -> dict[str, Any]:
    """Every pair: published and predicted speed-up, the error, the range over the mean lengths, the pools."""
    rows = {r.id: r for r in load_grpo_rows(rows_path)}
    out = []
    for p in load_pairs(pairs_path):
        pid = p["id"]
        col, sep = rows.get(p["colocated"]), rows.get(p["separate"])
        if col is None or sep is None:
            raise ConfigError(
                f"placement pair {pid}: {p['colocated']} or {p['separate']} is not a row of published_grpo.csv"
            )
        if (sep.raw.get("placement") or "") != "separate":
            raise ConfigError(f"placement pair {pid}: row {sep.id} is not a separate-pool row")
        pub = float(p["published_speedup"])
        mean, low, high = pair_means(p, col)
        no_sync = _flag(p, "step_excludes_sync", False)
        basis, steps = pair_basis(p)
        c, e = _steps(col, sep, p, mean)
        pred = predicted_speedup(c, e, basis, steps, no_sync)
        lo_hi = [pred]  # the range spans the point too: the speed-up need not be monotonic in the mean
        for m_ in (low, high):
            c2, e2 = _steps(col, sep, p, m_)
            lo_hi.append(predicted_speedup(c2, e2, basis, steps, no_sync))
        f = e.placement
        step_reading = None
        if basis == "total" and (p.get("step_speedup") or "").strip():
            sp, spred = float(p["step_speedup"]), predicted_speedup(c, e, "step", 1, no_sync)
            step_reading = {"published": sp, "predicted": spred, "error_pct": 100.0 * (spred / sp - 1.0)}
        out.append(
            {
                "id": pid,
                "colocated": col.id,
                "separate": sep.id,
                "published_speedup": pub,
                "predicted_speedup": pred,
                "error_pct": 100.0 * (pred / pub - 1.0),
                "basis": basis,
                "steps": steps,
                "step_reading": step_reading,
                "range": [min(lo_hi), max(lo_hi)],
                "response_len_mean": mean,
                "mean_range": [low, high],
                "step_excludes_sync": no_sync,
                "prompt_len_mean": e.workload.mean_prompt_len,
                "per_pool": per_pool(col, c, "colocated") + per_pool(sep, e, "separate", separate_step(e, no_sync)),
                "published_step_s": {"colocated": col.published.get("step_s"), "separate": sep.published.get("step_s")},
                "predicted_step_s": {"colocated": c.step_s, "separate": separate_step(e, no_sync)},
                "pools": {
                    "rollout_gpus": f["rollout_gpus"],
                    "train_gpus": f["train_gpus"],
                    "staleness": f["staleness"],
                    "partial_rollout": f["partial_rollout"],
                    "recompute_logprobs": f["recompute_logprobs"],
                    "stream_units": f.get("stream_units", 0),
                    "gen_s": f["gen_s"],
                    "train_s": f["train_s"],
                    "sync_s": f["sync_s"],
                    "exposed_sync_s": f["exposed_sync_s"],
                    "rollout_busy": f["rollout_busy"],
                    "train_busy": f["train_busy"],
                },
                "published_phases_s": {k: v for k, v in sep.published.items() if k != "step_s"},
                "fits": bool(c.fits and e.fits),
            }
        )
    worst = max((abs(r["error_pct"]) for r in out), default=0.0)
    return {"pairs": out, "tolerance_pct": tolerance_pct, "worst_error_pct": worst, "passed": worst <= tolerance_pct}


ROLLOUT_RATIOS_PATH = PROFILES_DIR / "data" / "published_rollout_ratios.csv"
_RATIO_REQUIRED = ("id", "a_row", "a_kind", "a_s", "b_row", "b_kind", "b_s", "response_len_mean", "source")
_RATIO_OVERRIDES = ("rollout_tp", "gpu_memory_utilization", "max_num_seqs", "enforce_eager", "n", "response_len")


def _rollout_side_s(row: GrpoRow, kind: str, overrides: dict[str, str], mean: str) -> float:
    """Seconds of the row's generation priced by the rollout side alone: ``generate`` = vLLM's prefill + decode of
    the step's batch on the row's colocated GPUs (costmodel.rollout.rollout_s), ``pool`` = the separate row's rollout
    pool generating one step's batch in one synchronous call (verl's one-step-off trainer; placement.generation)."""
    from grpo_tune.core.placement import pools, rollout_strategy
    from grpo_tune.costmodel.pools import AsyncKnobs, generation
    from grpo_tune.costmodel.rollout import rollout_s
    from grpo_tune.costmodel.timing import check_calibration

    raw = {**row.raw, **{k: v for k, v in overrides.items() if v}, "response_len_mean": mean}
    m, hw, cluster, s, wl = plan(dataclasses.replace(row, raw=raw))
    cal = check_calibration(None)
    if kind == "generate":
        r = rollout_s(m, hw, cluster, s, wl, cal)
        return float(r["prefill_s"] + r["decode_s"])
    if kind == "pool":
        ps = pools(cluster, int(raw["rollout_gpus"]))
        one_step_off = AsyncKnobs(ahead=1.0, whole_batch=True)
        g = generation(m, hw, ps.rollout, rollout_strategy(s), wl, cal, partial=False, knobs=one_step_off)
        return float(g["gen_s"])
    raise ConfigError(f"rollout ratio check: kind must be generate or pool, got {kind!r}")


def score_rollout_ratios(path: str | Path | None = None, rows_path: str | Path | None = None) -> dict[str, Any]:
    """Every rollout-side ratio check (profiles/data/published_rollout_ratios.csv): the published ratio of two
    generation times against the rollout side's, printed per check and not in validate's pass/fail."""
    rows = {r.id: r for r in load_grpo_rows(rows_path)}
    out = []
    for c in read_records(Path(path) if path else ROLLOUT_RATIOS_PATH, _RATIO_REQUIRED, "rollout ratio checks"):
        a, b = rows.get(c["a_row"]), rows.get(c["b_row"])
        if a is None or b is None:
            raise ConfigError(f"rollout ratio check {c['id']}: {c['a_row']} or {c['b_row']} is not a published row")
        over = {k: (c.get(k) or "").strip() for k in _RATIO_OVERRIDES}
        try:
            pub = float(c["a_s"]) / float(c["b_s"])
        except (ValueError, ZeroDivisionError):
            raise ConfigError(f"rollout ratio check {c['id']}: a_s and b_s must be positive numbers") from None
        pa = _rollout_side_s(a, c["a_kind"], over, c["response_len_mean"])
        pb = _rollout_side_s(b, c["b_kind"], over, c["response_len_mean"])
        out.append(
            {
                "id": c["id"],
                "backend": a.raw.get("backend") or "",
                "timer": c.get("timer") or "",
                "published_ratio": pub,
                "predicted_ratio": pa / pb,
                "error_pct": 100.0 * (pa / pb / pub - 1.0),
                "published_s": [float(c["a_s"]), float(c["b_s"])],
                "predicted_s": [pa, pb],
                "response_len_mean": int(c["response_len_mean"]),
            }
        )
    return {"checks": out}
