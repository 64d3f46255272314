"""report.md and its plots (matplotlib, Agg backend: no display needed).

Two plots for a search: the step-time breakdown of the top plans (stacked bars, one segment per
phase) and the Pareto front of throughput vs peak memory with the winner marked. ``compare``
gets one plot of the best plan per hardware, a placement search one of the step per split.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Protocol, Sequence

from grpo_tune.costmodel.estimate import Estimate
from grpo_tune.core.strategy import Strategy, layout_key

from grpo_tune.core.config import atomic_write
from grpo_tune.core.units import GiB


class SplitsResult(Protocol):
    """What :func:`plot_splits` needs from a placement search (``autotune.search.placement.PlacementResult`` is
    one): the priced splits and the best plan of each placement."""

    splits: list[dict[str, float]]

    @property
    def best_colocated(self) -> Estimate | None: ...

    @property
    def best_separate(self) -> Estimate | None: ...


PHASE_COLORS = {
    "rollout": "#4C72B0",
    "weight_sync": "#8172B2",
    "old_logprob": "#55A868",
    "ref_logprob": "#64B5CD",
    "update": "#C44E52",
    "offload": "#CCB974",
}


def plan_label(s: Strategy, *, rollout: bool = True) -> str:
    """Short plan name for tables and plot axes (``rollout`` False: without the rollout engine's knobs, for a
    pretraining step)."""
    parts = [f"tp{s.layout.tp}", f"pp{s.layout.pp}"]
    if s.layout.vpp > 1:
        parts.append(f"v{s.layout.vpp}")
    if s.layout.cp > 1:
        parts.append(f"cp{s.layout.cp}")
    if s.layout.ep > 1:
        parts.append(f"ep{s.layout.ep}/etp{s.layout.etp_}")
    parts.append(f"tok{s.batching.max_tokens_per_gpu}" if s.batching.max_tokens_per_gpu else f"mbs{s.batching.mbs}")
    parts.append({"none": "rc-", "selective": "rcS", "full": "rcF"}[s.memory.recompute])
    if s.memory.offload:
        parts.append("off:" + "".join(o[0] for o in s.memory.offload))
    if s.memory.cpu_optimizer:
        parts.append(f"cpuopt{s.memory.cpu_optimizer:g}")
    if rollout:
        parts.append(f"R{s.rollout.rollout_tp}@{s.rollout.gpu_memory_utilization:g}")
        parts.append(f"seqs{s.rollout.max_num_seqs}" + (" eager" if s.rollout.enforce_eager else ""))
    return " ".join(parts)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_png(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return atomic_write(path, buf.getvalue())


def phase_seconds(est: Estimate) -> dict[str, float]:
    return {} if est.time is None else {k: float(v) for k, v in est.time.phases.items()}


def plot_breakdown(plans: Sequence[Estimate], path: Path) -> Path:
    """Stacked bars of step time per phase, one bar per plan (best at the top)."""
    plt = _plt()
    plans = list(plans)[:10]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(plans) + 1.6))
    phases: list[str] = []
    for e in plans:
        for k in phase_seconds(e):
            if k not in phases:
                phases.append(k)
    y = list(range(len(plans)))[::-1]
    left = [0.0] * len(plans)
    for ph in phases:
        vals = [phase_seconds(e).get(ph, 0.0) for e in plans]
        ax.barh(y, vals, left=left, color=PHASE_COLORS.get(ph), label=ph, height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(y)
    ax.set_yticklabels([f"#{i + 1} {plan_label(e.strategy)}" for i, e in enumerate(plans)], fontsize=7)
    ax.set_xlabel("predicted step time (s)")
    ax.set_title("Step time by phase, top plans")
    if phases:
        ax.legend(fontsize=7, ncol=min(6, len(phases)), loc="lower center", bbox_to_anchor=(0.5, 1.06))
    return _save_png(fig, path)


def plot_pareto(points: Sequence[Estimate], front: Sequence[Estimate], winner: Estimate, path: Path) -> Path:
    """Throughput vs peak memory: every evaluated plan that fits, the front, and the winner."""
    from grpo_tune.costmodel.results import tokens_per_s_per_gpu

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(
        [e.peak_bytes / GiB for e in points],
        [tokens_per_s_per_gpu(e) for e in points],
        s=12,
        c="#999999",
        label="evaluated plans that fit",
    )
    fr = sorted(front, key=lambda e: e.peak_bytes)
    ax.plot(
        [e.peak_bytes / GiB for e in fr],
        [tokens_per_s_per_gpu(e) for e in fr],
        "-o",
        c="#4C72B0",
        ms=4,
        label="Pareto front",
    )
    ax.scatter(
        [winner.peak_bytes / GiB],
        [tokens_per_s_per_gpu(winner)],
        marker="*",
        s=220,
        c="#C44E52",
        zorder=5,
        label="winner",
    )
    ax.axvline(winner.capacity_bytes / GiB, ls="--", c="#555555", lw=1, label="capacity")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s per GPU (predicted)")
    ax.set_title("Throughput vs peak memory")
    ax.legend(fontsize=7)
    return _save_png(fig, path)


def plot_compare(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Best plan per hardware: tokens/s/GPU bars, with $ per million tokens written on them."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.8))
    names = [r["hardware"] for r in rows][::-1]
    vals = [r.get("tokens_per_s_per_gpu") or 0.0 for r in rows][::-1]
    colours = {"fitted": "#4C72B0", "transferred": "#DD8452", "spec-only": "#C44E52"}
    bars = ax.barh(
        names,
        vals,
        color=[colours.get(r.get("provenance", ""), "#4C72B0") if r.get("fits") else "#BBBBBB" for r in rows][::-1],
    )
    # the error band of each profile's class (fitted / transferred / spec-only): validate --grpo's cross-validated error
    band = [v * r.get("band_pct", 0.0) / 100 for v, r in zip(vals, rows[::-1])]
    ax.errorbar(vals, range(len(vals)), xerr=band, fmt="none", ecolor="black", capsize=3, lw=1)
    for b, r in zip(bars, rows[::-1]):
        if not r.get("fits"):
            txt = "no plan fits"
        else:
            cost = r.get("usd_per_million_tokens")
            txt = f"{r['step_s']:.1f} s/step" + ("" if cost is None else f", ${cost:.2f}/M tok")
            if r.get("provenance"):
                txt += f" ({r['provenance']} ±{r.get('band_pct', 0):.0f}%)"
        x = b.get_width() * (1 + r.get("band_pct", 0.0) / 100)  # past the error bar
        ax.text(x, b.get_y() + b.get_height() / 2, " " + txt, va="center", fontsize=8)
    ax.set_xlabel("tokens/s per GPU (predicted, best plan)")
    ax.set_title("Best plan per hardware")
    ax.margins(x=0.6 if any(r.get("band_pct") for r in rows) else 0.35)
    return _save_png(fig, path)


# ------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------


def batch_cell(s: Strategy) -> str:
    """``mbs 5`` for a fixed micro-batch, ``8k tok`` for dynamic batching's token cap per GPU (it replaces
    the micro-batch: verl's use_dynamic_bsz ignores ppo_micro_batch_size_per_gpu)."""
    cap = s.batching.max_tokens_per_gpu
    if not cap:
        return f"mbs {s.batching.mbs}"
    return (f"{cap // 1024}k" if cap % 1024 == 0 else f"{cap:,}") + " tok"


def _fmt_s(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def plans_table(plans: Sequence[Estimate]) -> list[str]:
    from grpo_tune.costmodel.results import step_s, tokens_per_s_per_gpu

    phases: list[str] = []
    for e in plans:
        for k in phase_seconds(e):
            if k not in phases:
                phases.append(k)
    head = ["#", "plan", "dp", "step s", *[f"{p} s" for p in phases], "tok/s/GPU", "MFU", "peak GiB", "peak phase"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, e in enumerate(plans):
        ph = phase_seconds(e)
        mfu = None if e.throughput is None else e.throughput.mfu
        lines.append(
            "| "
            + " | ".join(
                [
                    str(i + 1),
                    f"`{plan_label(e.strategy)}`",
                    str(e.strategy.layout.dp),
                    _fmt_s(step_s(e)),
                    *[_fmt_s(ph.get(p)) for p in phases],
                    f"{tokens_per_s_per_gpu(e):,.0f}",
                    "-" if mfu is None else f"{100 * mfu:.1f}%",
                    f"{e.peak_bytes / GiB:.1f}",
                    e.peak_phase,
                ]
            )
            + " |"
        )
    return lines


def runner_ups(ranked: Sequence[Estimate], k: int = 3) -> list[Estimate]:
    """The best plan of each of the next ``k`` layouts after the winner's (variants of the winner's
    layout differ in a knob, other layouts in how the model is split: both are worth a line)."""
    if not ranked:
        return []
    seen = {layout_key(ranked[0].strategy)}
    out: list[Estimate] = []
    for e in ranked[1:]:
        key = layout_key(e.strategy)
        if key not in seen:
            seen.add(key)
            out.append(e)
        if len(out) == k:
            break
    if not out:  # one layout only: its next variants
        out = list(ranked[1 : 1 + k])
    return out


def why_winner(best: Estimate, others: Sequence[Estimate], error_pct: float) -> list[str]:
    """One line per runner-up: the step-time gap and where it comes from, phase by phase (largest
    first), and whether the gap is within the model's stated error (then measure both: --refine)."""
    from grpo_tune.costmodel.results import step_s

    lines = []
    pb = phase_seconds(best)
    close = []
    for i, e in enumerate(others):
        po = phase_seconds(e)
        gap = step_s(e) - step_s(best)
        # phase order (not a set's, which varies with PYTHONHASHSEED) breaks ties between equal deltas
        phases = dict.fromkeys([*pb, *po])
        deltas = sorted(((po.get(k, 0.0) - pb.get(k, 0.0), k) for k in phases), key=lambda x: -abs(x[0]))
        parts = ", ".join(f"{k} {'+' if d >= 0 else '-'}{abs(d):.1f} s" for d, k in deltas if abs(d) >= 0.05)
        pct = 100.0 * gap / step_s(best) if step_s(best) else 0.0
        within = pct <= error_pct
        if within:
            close.append(e)
        lines.append(
            f"- vs `{plan_label(e.strategy)}`: {gap:+.1f} s per step ({pct:+.1f}%) for the runner-up"
            + (f" ({parts})" if parts else "")
            + (f"; within the model's stated error ({error_pct:g}%)" if within else "")
        )
    if close:
        lines.append(
            f"- {len(close)} runner-up(s) are within the model's stated error of the winner: the ranking "
            "between them is not settled by the model. Measure them: `grpo-tune search ... --refine`."
        )
    return lines


def _inputs_lines(best: Estimate, run_id: str | None) -> list[str]:
    """Title and the "Inputs" section."""
    m, c, w, hw = best.model, best.cluster, best.workload, best.hardware
    L = [f"# grpo-tune plan: {m.name} on {c.gpus} x {hw.name}", ""]
    if run_id:
        L += [f"Run `{run_id}`.", ""]
    L += [
        "## Inputs",
        "",
        f"- model: `{m.name}` ({best.params['total']:,} parameters, {best.params['active']:,} active)",
        f"- hardware: `{hw.name}`, {c.gpus} GPUs, {c.gpus_per_node} per node ({c.nnodes} node(s))",
    ]
    if w.kind == "grpo":
        from grpo_tune.costmodel.lengths import lengths_note, workload_line

        L.append(
            f"- workload: GRPO, {workload_line(w)}, mini-batch {w.mini_batch}, {w.ppo_epochs} PPO epoch(s), "
            f"KL {'on' if w.kl else 'off'}, {w.dtype}"
        )
        L.append(f"- lengths: {lengths_note(w)}")
        if not w.response_len_quantiles:
            from grpo_tune.costmodel.lengths import CLIP_FRACTION

            L.append(
                f"- response-length shape (assumed): {CLIP_FRACTION:.0%} truncated at the cap, so the longest of a "
                "batch of several hundred responses, which ends generation, is the cap; the rest a Beta(1, b) keeping "
                "the mean (docs/calibration.md); `--lengths FILE` replaces it with a measured histogram"
            )
    else:
        L.append(f"- workload: pretrain, sequence {w.seq_len}, global batch {w.gbs}")
    return L


def _batch_text(s: Strategy) -> str:
    """The winner's batching: a token cap is named as one (dynamic batching has no micro-batch size)."""
    if s.batching.max_tokens_per_gpu:
        lp = s.batching.log_prob_max_tokens_per_gpu
        return f"- dynamic batching, token cap {s.batching.max_tokens_per_gpu:,} per GPU" + (
            f" (log-prob passes {lp:,})" if lp not in (None, s.batching.max_tokens_per_gpu) else ""
        )
    return f"- micro-batch {s.batching.mbs}" + (
        f" (log-prob passes {s.batching.log_prob_mbs})" if s.batching.log_prob_mbs not in (None, s.batching.mbs) else ""
    )


def _winner_lines(best: Estimate) -> list[str]:
    """The "Winner" section: degrees, predicted figures and the per-phase table."""
    from grpo_tune.costmodel.results import step_s, tokens_per_s_per_gpu

    s = best.strategy
    L: list[str] = []
    mfu = None if best.throughput is None else best.throughput.mfu
    L += [
        "",
        "## Winner",
        "",
        f"`{plan_label(s)}`",
        "",
        f"- degrees: tp={s.layout.tp} pp={s.layout.pp} vpp={s.layout.vpp} cp={s.layout.cp}"
        + (f" ep={s.layout.ep} etp={s.layout.etp_}" if best.model.is_moe else "")
        + f" dp={s.layout.dp}"
        + (
            f" (first/last stage layers {s.layout.first_stage_layers}/{s.layout.last_stage_layers})"
            if s.layout.first_stage_layers or s.layout.last_stage_layers
            else ""
        ),
        _batch_text(s) + f", sequence parallel {'on' if s.layout.sp else 'off'}, recompute {s.memory.recompute}, "
        f"distributed optimizer {'on' if s.memory.distributed_optimizer else 'off'}, "
        f"offload {', '.join(s.memory.offload) or 'none'}",
        f"- rollout: TP {s.rollout.rollout_tp}, gpu_memory_utilization {s.rollout.gpu_memory_utilization}; "
        "the reference model "
        "uses the actor's degrees",
        f"- predicted step time {_fmt_s(step_s(best))} s, {tokens_per_s_per_gpu(best):,.0f} tokens/s/GPU"
        + ("" if mfu is None else f", MFU {100 * mfu:.1f}%"),
        f"- peak memory {best.peak_bytes / GiB:.1f} GiB ({best.peak_phase}) of {best.capacity_bytes / GiB:.1f} GiB "
        f"capacity (headroom {best.headroom_bytes / GiB:.1f} GiB)",
        "",
        "| phase | GiB per rank | seconds |",
        "|---|---|---|",
    ]
    ph = phase_seconds(best)
    for name, pm in best.memory.items():
        L.append(f"| {name} | {pm.total_bytes / GiB:.2f} | {_fmt_s(ph.get(name))} |")
    for name in ph:
        if name not in best.memory:
            L.append(f"| {name} | - | {_fmt_s(ph[name])} |")
    return L


def _measured_and_why_lines(best: Estimate, ranked: list[Estimate], measured: dict[str, Any] | None) -> list[str]:
    """The "Measured" and "Why the winner" sections (each only when it has content)."""
    L: list[str] = []
    if measured:
        L += ["", "## Measured", "", "| figure | value |", "|---|---|"]
        for k, v in measured.items():
            if not isinstance(v, (dict, list)):
                L.append(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
    others = runner_ups(ranked)
    if others:
        from grpo_tune.validate.grpo import STATED_ERROR_PCT

        L += [
            "",
            "## Why the winner",
            "",
            f"Seconds per step of each runner-up layout relative to the winner, by phase (positive: the runner-up "
            f"is slower there). The model's stated error is {STATED_ERROR_PCT:g}% (held-out step-time MAPE of "
            "`grpo-tune validate --grpo`).",
            "",
            *why_winner(best, others, STATED_ERROR_PCT),
        ]
    return L


def _plans_and_use_lines(
    ranked: list[Estimate],
    pareto: list[Estimate],
    stats: dict[str, Any] | None,
    files: dict[str, Path] | None,
    use: Sequence[str] = (),
    verl: bool = True,
) -> list[str]:
    """Top plans, Pareto front, search statistics, files and the "Use it" commands."""
    L: list[str] = []
    L += [
        "",
        "## Top plans",
        "",
        *plans_table(ranked[:10]),
        "",
        "![step time by phase](step_breakdown.png)",
        "",
        "## Pareto front (throughput vs peak memory)",
        "",
        *plans_table(pareto),
        "",
        "![throughput vs peak memory](pareto.png)",
        "",
    ]
    if stats:
        L += [
            "## Search",
            "",
            f"- valid candidates: {stats.get('candidates', 0):,}; cost-model calls: {stats.get('evaluated', 0):,}; "
            f"plans scored by combination: {stats.get('combined', 0):,}",
            f"- layouts: {stats.get('layouts', 0):,} ({stats.get('pruned_layouts', 0):,} pruned: even the most "
            "frugal variant overflows a training phase)",
            f"- time: {stats.get('seconds', 0):.2f} s",
            "",
        ]
    if files:
        L += ["## Files", ""]
        for k, p in files.items():
            L.append(f"- `{Path(p).name}`: {k}")
        L.append("")
    L += [
        "## Use it",
        "",
        "```bash",
        "grpo-tune train --config best.yaml    # megatron-core GRPO trainer",
        *(
            [
                "grpo-tune diagnose verl.sh            # check the verl launch",
                "bash verl.sh                          # verl 0.9.1",
            ]
            if verl
            else []
        ),
        *use,
        "```",
        "",
    ]
    return L


def write_report(
    run_dir: Path,
    best: Estimate,
    *,
    ranked: Sequence[Estimate] = (),
    pareto: Sequence[Estimate] = (),
    stats: dict[str, Any] | None = None,
    measured: dict[str, Any] | None = None,
    files: dict[str, Path] | None = None,
    run_id: str | None = None,
    use: Sequence[str] = (),
    verl: bool = True,
) -> dict[str, Path]:
    """Write report.md and its two PNGs into ``run_dir``; return their paths. ``use``: more "Use it" lines
    (another framework's launch); ``verl``: whether the folder has verl.sh."""
    run_dir = Path(run_dir)
    ranked = list(ranked) or [best]
    pareto = list(pareto) or [best]
    out = {
        "breakdown_png": plot_breakdown(ranked[:10], run_dir / "step_breakdown.png"),
        "pareto_png": plot_pareto(ranked, pareto, best, run_dir / "pareto.png"),
    }
    L = _inputs_lines(best, run_id)
    L += _winner_lines(best)
    kept = (stats or {}).get("defaults_kept") or []
    if kept:
        from grpo_tune.costmodel.results import DEFAULTS_NOISE as NOISE

        L += [
            "",
            "## verl's defaults kept",
            "",
            f"Where a knob's searched value changed the predicted step by less than {NOISE:.0%} (below the model's "
            "error), the plan keeps verl's default for it:",
            "",
            *[f"- {k}" for k in kept],
        ]
    L += _measured_and_why_lines(best, ranked, measured)
    L += _plans_and_use_lines(ranked, pareto, stats, files, use, verl)
    out["report"] = atomic_write(run_dir / "report.md", "\n".join(L))
    return out


CURVES_MAX = 8
"""Most staleness curves placement.png draws (its legend stays inside the figure)."""


def staleness_curves(
    splits: Sequence[dict[str, Any]], rel: float = 1e-3, most: int = CURVES_MAX
) -> list[tuple[str, list[tuple[int, float]]]]:
    """The curves of placement.png: (label, [(rollout GPUs, step)]) per staleness, ascending. Consecutive
    staleness values whose curves agree within ``rel`` at every split are one curve ("staleness 1-100": past
    the staleness that hides the generation, a larger one changes nothing); if more than ``most`` remain, the
    first, those at powers of two and the last are drawn."""
    per_k: dict[int, list[tuple[int, float]]] = {}
    for d in splits:
        per_k.setdefault(int(d["staleness"]), []).append((int(d["rollout_gpus"]), float(d["step_s"])))
    groups: list[tuple[int, int, list[tuple[int, float]]]] = []  # (first k, last k, first k's points)
    for k in sorted(per_k):
        pts = sorted(per_k[k])
        if groups:
            k0, _, ref = groups[-1]
            same = [x for x, _ in pts] == [x for x, _ in ref] and all(
                abs(y - y0) <= rel * max(abs(y0), 1e-12) for (_, y), (_, y0) in zip(pts, ref)
            )
            if same:
                groups[-1] = (k0, k, ref)
                continue
        groups.append((k, k, pts))
    if len(groups) > most:
        last = len(groups) - 1
        keep = sorted(i for i in range(last) if i & (i - 1) == 0)[: most - 1]  # 0, 1, 2, 4, 8, ...
        groups = [groups[i] for i in keep] + [groups[last]]
    return [(f"staleness {a}" if a == b else f"staleness {a}-{b}", pts) for a, b, pts in groups]


def plot_splits(res: SplitsResult, path: Path) -> Path:
    """placement.png: the step of each split the search priced, per staleness (the representative training
    plans), the colocated step as a line, the chosen separate plan marked."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, pts in staleness_curves(res.splits):
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"separate, {label}")
    c, b = res.best_colocated, res.best_separate
    if c is not None:
        ax.axhline(c.step_s, color="grey", linestyle="--", label=f"colocated {c.step_s:.1f} s")
    if b is not None and b.placement is not None:  # a separate plan always has its pools' figures
        ax.plot([b.placement["rollout_gpus"]], [b.step_s], marker="*", markersize=14, color="black", label="chosen")
    shown = b or c
    assert shown is not None  # a placement search that found nothing raised NoFeasiblePlanError
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # GPU counts
    ax.set_xlabel(f"rollout GPUs (of {shown.cluster.gpus})")
    ax.set_ylabel("seconds per step (steady state)")
    ax.set_title("Split of the cluster between rollout and training")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
