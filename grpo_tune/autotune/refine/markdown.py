"""The refinement's part of report.md: Optuna history and a predicted-vs-measured scatter (PNG).

:func:`append_report` adds a ``## Refinement`` section to the run folder's report.md (written by
search's emitter just before) and writes ``refine_history.png`` and ``refine_scatter.png``.
"""

from __future__ import annotations

import shlex

import math
from pathlib import Path
from typing import Any

from grpo_tune.rundir.report import _plt, _save_png
from grpo_tune.core.config import atomic_write
from grpo_tune.core.errors import GrpoTuneError

STATE_STYLE = {"COMPLETE": ("o", "#4C72B0"), "PRUNED": ("x", "#CCB974"), "FAIL": ("X", "#C44E52")}


def plot_history(records, path: Path) -> Path:
    """Measured tokens/s per trial number, the best so far as a step line, failures on the axis."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    done = [r for r in records if r.state == "COMPLETE" and r.measured_tokens_per_s]
    ax.scatter(
        [r.number for r in done],
        [r.measured_tokens_per_s for r in done],
        color=STATE_STYLE["COMPLETE"][1],
        label="completed",
        zorder=3,
    )
    best, xs, ys = -math.inf, [], []
    for r in sorted(done, key=lambda r: r.number):
        best = max(best, r.measured_tokens_per_s)
        xs.append(r.number)
        ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="#55A868", label="best so far")
    floor = min((r.measured_tokens_per_s for r in done), default=1.0) * 0.9
    for state in ("FAIL", "PRUNED"):
        rs = [r for r in records if r.state == state and r.ran]
        if rs:
            mk, col = STATE_STYLE[state]
            ax.scatter(
                [r.number for r in rs],
                [floor] * len(rs),
                marker=mk,
                color=col,
                label=f"{state.lower()} (ran)",
                zorder=3,
            )
    skipped = [r for r in records if r.state == "PRUNED" and not r.ran]
    if skipped:
        ax.scatter(
            [r.number for r in skipped], [floor] * len(skipped), marker="|", color="#999999", label="skipped (not run)"
        )
    ax.set_xlabel("trial")
    ax.set_ylabel("measured tokens/s")
    ax.set_title("Optuna history")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


def plot_scatter(records, calibration, path: Path) -> Path:
    """Predicted vs measured step time (log-log) with y = x; after calibration too when fitted."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.6))
    done = [r for r in records if r.state == "COMPLETE" and r.measured_step_s and r.predicted_step_s]
    meas = [r.measured_step_s for r in done]
    ax.scatter(meas, [r.predicted_step_s for r in done], color="#4C72B0", label="cost model", zorder=3)
    allv = meas + [r.predicted_step_s for r in done]
    if calibration is not None:
        pts = calibration.points
        ax.scatter(
            [p["measured_step_s"] for p in pts],
            [p["predicted_after_s"] for p in pts],
            marker="^",
            color="#C44E52",
            label="after calibration",
            zorder=3,
        )
        allv += [p["predicted_after_s"] for p in pts]
    for r in done:
        ax.annotate(f"#{r.number}", (r.measured_step_s, r.predicted_step_s), fontsize=7, alpha=0.7)
    if allv:
        lo, hi = min(allv) * 0.8, max(allv) * 1.25
        ax.plot([lo, hi], [lo, hi], color="#999999", lw=1, label="y = x")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step s")
    ax.set_ylabel("predicted step s")
    ax.set_title("Predicted vs measured")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save_png(fig, path)


def code(text: str) -> str:
    """``text`` as one Markdown code span, whatever it holds: the fence is longer than any run of backticks in it,
    so backticks, ``|``, ``<b>`` or ``$(...)`` in a study name or path show as written and break nothing."""
    import re

    text = " ".join(str(text).split())  # a newline would end the list item
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or run else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _f(x: Any, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def section(result) -> list[str]:
    """Markdown lines of the refinement section."""
    recs = result.records
    ran = [r for r in recs if r.ran]
    L = [
        "",
        "## Refinement (real profiling runs)",
        "",
        (
            f"- Optuna study {code(result.study_name)} in {code(result.storage)}; "
            f"{len(ran)} profiled trial(s), {len(result.completed)} completed, "
            f"{sum(1 for r in recs if r.state == 'PRUNED' and not r.ran)} skipped without running."
        ),
        f"- Open it: {code('pip install optuna-dashboard && optuna-dashboard ' + shlex.quote(result.storage))}.",
    ]
    if result.winner_measured:
        w = result.winner_measured
        L.append(
            f"- Winner: trial #{w['trial']}, measured {w['tokens_per_s']:,.1f} tokens/s "
            f"({w['step_s']:.3g} s/step), {w['speedup_vs_median_trial']:.2f}x the median trial "
            f"({w['median_trial_tokens_per_s']:,.1f} tokens/s)."
        )
    L.append(f"- Spearman rank correlation, predicted vs measured step time: {_f(result.spearman_step_s, '{:.3f}')}")
    from grpo_tune.autotune.refine.results import noise_lines

    L += [f"- {line[0].upper()}{line[1:]}." for line in noise_lines(result)]
    cal = result.calibration
    if cal is not None:
        L.append(
            f"- Calibration ({cal.before['n']} trials, `calibration.json`): MAPE {cal.before['mape_pct']:.1f}% -> "
            f"{cal.after['mape_pct']:.1f}%, Spearman {_f(cal.before['spearman'], '{:.3f}')} -> "
            f"{_f(cal.after['spearman'], '{:.3f}')}. Use it: `grpo-tune search ... --calibration calibration.json`."
        )
        L += [f"- **Calibration warning:** {w}." for w in cal.warnings]
        moved = {k: v for k, v in cal.params.items() if abs(v - cal.base.get(k, v)) > 1e-9 * max(1.0, abs(v))}
        if moved:
            L.append(
                "- Fitted parameters: " + ", ".join(f"`{k}` {cal.base[k]:.3g} -> {v:.3g}" for k, v in moved.items())
            )
    L += [
        "",
        "| trial | state | plan | predicted step s | measured step s | tokens/s | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        plan = r.plan or "-"
        if r.strategy:
            from grpo_tune.rundir.report import plan_label
            from grpo_tune.core.strategy import Strategy

            try:
                plan = plan_label(Strategy.from_dict(r.strategy))
            except (GrpoTuneError, TypeError, ValueError, KeyError):  # a record from an older schema: show the key
                plan = r.plan or "-"
        reason = (r.reason or "").replace("|", "/")
        state = r.state + (" (repeat)" if r.repeat and r.ran else "")
        L.append(
            f"| {r.number} | {state} | `{plan}` | {_f(r.predicted_step_s)} | {_f(r.measured_step_s)} | "
            f"{_f(r.measured_tokens_per_s, '{:,.1f}')} | {reason[:160]} |"
        )
    L += ["", "![Optuna history](refine_history.png)", "", "![predicted vs measured](refine_scatter.png)", ""]
    return L


def append_report(run_dir: Path, result) -> dict[str, Path]:
    run_dir = Path(run_dir)
    out = {
        "history_png": plot_history(result.records, run_dir / "refine_history.png"),
        "scatter_png": plot_scatter(result.records, result.calibration, run_dir / "refine_scatter.png"),
    }
    rep = run_dir / "report.md"
    text = rep.read_text() if rep.exists() else f"# grpo-tune refinement: {result.study_name}\n"
    marker = "\n## Refinement (real profiling runs)"
    if marker in text:  # a resumed study replaces its old section
        text = text[: text.index(marker)]
    out["report"] = atomic_write(rep, text.rstrip("\n") + "\n" + "\n".join(section(result)))
    return out
