"""The search: factored evaluation of the candidate space (search/candidates.py), ranking (search/rank.py).

Generation yields only plans that :func:`core.strategy.validate` accepts (and that satisfy
verl's batch rules): the space is built from divisors, never filtered from a product.

A plan splits in three: the *layout* (tp, pp with its first/last stage split, vpp, cp, ep, etp),
the *train options* (mbs, recompute, distributed optimizer, offload) and the *rollout* options
(rollout_tp, gpu_memory_utilization). Evaluating the full product would take minutes for a large
MoE model, so the search factors it (see :func:`search`):

1. layouts whose most frugal variant (smallest mbs, full recompute, every offload) does not fit
   the training phases are dropped: memory only grows with mbs, with less recompute and with less
   offload;
2. per surviving layout, the mbs x recompute x optimizer-offload grid and the param/grad offload
   subsets are evaluated apart, and the rollout options once for the whole space; each phase's
   memory and time is then the base value plus the deltas (the cost model sums parts per phase,
   so the deltas add; :attr:`SearchResult.combination_error` reports how exactly);
3. the best combinations by that sum (and the Pareto points) are evaluated exactly with
   :func:`costmodel.estimate.estimate`, and ranked on the exact figures.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from grpo_tune.core.errors import ConfigError, GrpoTuneError, InvalidDegreesError, NoFeasiblePlanError
from grpo_tune.costmodel.estimate import Estimate, estimate
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import OFFLOAD, RECOMPUTE, Cluster, Strategy, Workload, validate
from grpo_tune.core.support import trainer_only
from grpo_tune.core.units import GiB

from grpo_tune.autotune.search.log_prob import with_log_prob_mbs
from grpo_tune.autotune.search.rank import _pareto_arrays, pareto_front, rank_key
from grpo_tune.costmodel.results import step_s, tokens_per_s_per_gpu
from grpo_tune.autotune.search.candidates import (
    LAYOUT_KEYS,
    Degrees,
    Knobs,
    Roll,
    Space,
    _extra,
)


# ------------------------------------------------------------------------------------------------


@dataclass
class SearchResult:
    ranked: list[Estimate]
    """Plans that fit, best first (exact estimates): step time, then memory headroom."""
    pareto: list[Estimate]
    """Throughput vs peak memory front among the plans that fit (exact estimates), fastest first."""
    candidates: int
    """Size of the valid space (layouts x train options x rollout options)."""
    evaluated: int
    """Calls to the cost model."""
    combined: int
    """Plans scored by combining evaluated components."""
    layouts: int
    pruned_layouts: int
    seconds: float
    combination_error: float = 0.0
    """Largest relative gap between a combined figure (step time, peak memory) and the exact
    estimate, over the plans evaluated exactly; 0 when the cost model is additive as assumed."""
    defaults_kept: list[str] = field(default_factory=list)
    """One note per knob of the winner moved back to the framework's default within the model's noise
    (:func:`autotune.search.defaults.with_defaults`, which the search job applies: then ``ranked[0]`` is that plan, and
    may be up to 1% slower than ``ranked[1]``)."""

    @property
    def best(self) -> Estimate:
        return self.ranked[0]

    def stats(self) -> dict[str, object]:
        """The counters as they are and the two figures rounded, for the run folder and ``--json``."""
        counts = {k: getattr(self, k) for k in ("candidates", "evaluated", "combined", "layouts", "pruned_layouts")}
        out = {**counts, "seconds": round(self.seconds, 3), "combination_error": round(self.combination_error, 6)}
        return {**out, "defaults_kept": list(self.defaults_kept)} if self.defaults_kept else out


class _Evaluator:
    """Calls the cost model and turns an Estimate into flat per-phase vectors."""

    def __init__(
        self, space: Space, calibration: dict[str, float] | None, price: Callable[..., Estimate] | None = None
    ):
        self.space = space
        self.price = price or estimate  # looked up per search (tests replace the module's estimate)
        self.calibration = calibration
        self.calls = 0
        self.cache: dict[Strategy, Estimate] = {}
        self.mem_keys: list[str] | None = None
        self.time_keys: list[str] | None = None
        self.capacity = 0.0

    def __call__(self, s: Strategy) -> Estimate:
        est = self.cache.get(s)
        if est is None:
            self.calls += 1
            sp = self.space
            est = self.cache[s] = self.price(
                model=sp.model,
                hardware=sp.hardware,
                cluster=sp.cluster,
                strategy=s,
                workload=sp.workload,
                calibration=self.calibration,
            )
        return est

    def vector(self, est: Estimate) -> tuple[np.ndarray, np.ndarray]:
        if self.mem_keys is None or self.time_keys is None:  # both are set together, on the first call
            self.mem_keys = list(est.memory)
            self.time_keys = [] if est.time is None else list(est.time.phases)
            self.capacity = est.capacity_bytes
        mem = np.array([est.memory[k].total_bytes if k in est.memory else 0.0 for k in self.mem_keys])
        tm = np.array([est.time.phases.get(k, 0.0) for k in self.time_keys]) if est.time else np.zeros(0)
        return mem, tm

    def train_phase_mask(self) -> np.ndarray:
        assert self.mem_keys is not None, "vector() sets the phase keys; call it first"
        return np.array([k not in ("rollout", "weight_sync") for k in self.mem_keys])


def _trainer_runs(space: Space) -> list[Degrees]:
    """The space's layouts that grpo-tune's own trainer runs (core.support.trainer_only: no CP, the
    model families it builds): the search never emits a plan ``train`` would refuse. A pin or a model
    that only the trainer refuses is a coded error here; ``grpo-tune estimate`` still prices it for verl."""
    pinned = trainer_only(space.model, Strategy.of(cp=space.pins.get("cp", 1)))
    if pinned:
        f = pinned[0]
        raise GrpoTuneError(
            f"{f.message}: search emits only plans `grpo-tune train` runs",
            code=f.code,
            hint=f"{f.hint}; `grpo-tune estimate` prices the plan for verl",
        )
    return [lay for lay in space.layouts() if not trainer_only(space.model, Strategy.of(**lay))]


def search(
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    workload: Workload,
    *,
    pins: dict[str, object] | None = None,
    top: int = 10,
    calibration: dict[str, float] | None = None,
    allow_cross_node_tp: bool = False,
    exact: int | None = None,
    keep_layouts: int = 48,
    min_headroom: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    log_prob_mbs_max: int | None = None,
    _price: Callable[..., Estimate] | None = None,
) -> SearchResult:
    """Rank the valid plans for ``model`` on ``cluster``; raise NO_FEASIBLE_PLAN when none fits.

    ``pins`` are strategy fields the user fixed (see :func:`cli.options.strategy_pins`).
    ``exact`` is how many of the best combined plans are re-evaluated exactly (default 4 x top,
    at least 40). ``keep_layouts`` is how many layouts (ordered by the screening call) get the
    full train-option grid; with fewer layouts than that, the search is exhaustive over the
    factored space. ``min_headroom`` is a fraction of HBM that every phase must leave free (a
    margin for allocator fragmentation and for the memory model's own error); plans that fit
    only without it are not ranked. ``progress(done, total)`` is called as layouts are evaluated.
    ``log_prob_mbs_max``: each ranked plan (log_prob_mbs unpinned) takes the log-prob micro-batch up to it that
    ranks best (autotune/search/log_prob.py; tune passes a launch's that overflows); None: it follows mbs.
    ``_price``: the cost model the plans are priced with (autotune.search.placement passes the training pool's).
    """
    if not 0.0 <= min_headroom < 0.5:
        raise ConfigError(f"min_headroom must be a fraction in [0, 0.5), got {min_headroom!r}")
    margin = min_headroom * hardware.rank_memory_bytes(cluster.ranks_per_node)
    t0 = time.perf_counter()
    space = Space(model, hardware, cluster, workload, dict(pins or {}), allow_cross_node_tp)
    layouts = _trainer_runs(space)
    rolls = space.rolls()
    if not layouts or not rolls:
        _explain_empty(space, layouts, rolls)
    ev = _Evaluator(space, calibration, _price)

    roll0 = rolls[0]
    R_mem, R_tm = _rollout_deltas(space, ev, layouts[0], rolls)  # (n_roll, phases)
    train_mask = ev.train_phase_mask()
    cap = ev.capacity - margin

    space, screened, pruned = _screen_or_cpu_optimizer(
        space, ev, layouts, roll0, train_mask, cap, keep_layouts, progress
    )
    n_candidates = space.candidate_count(layouts)
    shortlist = [li for _, li in screened[:keep_layouts]]
    n_lay = len(layouts)
    total_work = n_lay + min(n_lay, keep_layouts)
    rows_mem, rows_tm, rows_id, probe_err = _grid(space, ev, layouts, shortlist, roll0, progress, n_lay, total_work)
    if progress:
        progress(total_work, total_work)

    if not rows_id:
        # No layout fits even frugally: report the closest frugal plan.
        raise _no_fit(space, ev, layouts, rolls, margin)

    rows = (rows_mem, rows_tm, rows_id)
    exact = exact or max(40, 4 * top)
    ranked, err, combined = _combine_and_rank(
        space, ev, layouts, rolls, rows, (R_mem, R_tm), cap, exact, margin, probe_err
    )
    if log_prob_mbs_max:
        ranked = [
            with_log_prob_mbs(e, ev, lambda x: x.fits and x.headroom_bytes >= margin, log_prob_mbs_max) for e in ranked
        ]
    uniq = _unique_ranked(ranked)
    return SearchResult(
        ranked=uniq,
        pareto=[uniq[i] for i in pareto_front([(tokens_per_s_per_gpu(e), e.peak_bytes) for e in uniq])],
        candidates=n_candidates,
        evaluated=ev.calls,
        combined=combined,
        layouts=len(layouts),
        pruned_layouts=pruned,
        seconds=time.perf_counter() - t0,
        combination_error=err,
    )


def _screen_or_cpu_optimizer(space, ev, layouts, roll0, train_mask, cap, keep_layouts, progress):
    """:func:`_screen`; when some layouts overflow even frugally, screen again with Megatron's CPU optimizer in
    the space too (where memory needs it). Returns (the space searched, screened layouts, pruned count)."""
    screened, pruned = _screen(space, ev, layouts, roll0, train_mask, cap, keep_layouts, progress)
    if pruned and "cpu_optimizer" not in space.pins and space.cpu_grid == (None,) and not space.hardware.memory_is_host:
        space = dataclasses.replace(space, cpu_grid=(None, 1.0))
        ev.space = space
        screened, pruned = _screen(space, ev, layouts, roll0, train_mask, cap, keep_layouts, None)
    return space, screened, pruned


def _combine_and_rank(space, ev, layouts, rolls, rows, deltas, cap, exact, margin, probe_err):
    """Every train row x rollout option by broadcasting (memory and time are additive per phase),
    then the best ``exact`` combined plans re-evaluated exactly; NO_FEASIBLE_PLAN if none fits.
    Returns (ranked estimates, the combination's largest error, the number of combined plans)."""
    rows_mem, rows_tm, rows_id = rows
    R_mem, R_tm = deltas
    T_mem, T_tm = np.array(rows_mem), np.array(rows_tm)  # (n_train, phases)
    mem = T_mem[:, None, :] + R_mem[None, :, :]  # (n_train, n_roll, phases)
    over = (mem - cap).max(axis=2)
    peak = mem.max(axis=2)
    step = (T_tm.sum(axis=1)[:, None] + R_tm.sum(axis=1)[None, :]) if T_tm.size else np.zeros_like(peak)
    fits = over <= 0.01 * cap  # margin: the exact pass decides

    def plan(flat: int) -> Strategy:
        i, j = divmod(int(flat), len(rolls))
        li, opt = rows_id[i]
        return space.strategy(layouts[li], opt, rolls[j])

    ranked, err = _exact_pass(ev, plan, fits, step, peak, exact, margin, probe_err)
    if not ranked:
        flat = int(np.argmin(over))
        raise _no_fit_from(ev(plan(flat)), space, margin)
    return ranked, err, int(peak.size)


def _rollout_deltas(space: Space, ev: "_Evaluator", lay0: Degrees, rolls: list[Roll]) -> tuple[np.ndarray, np.ndarray]:
    """Rollout deltas: one (frugal) train plan, every rollout option, minus the first option's figures."""
    opt0 = _frugal(space, lay0)
    # Not narrowed before: a first layout without batch options failed here too (a TypeError then).
    assert opt0 is not None, "the first layout has no batch options"
    base0 = ev(space.strategy(lay0, opt0, rolls[0]))
    b_mem, b_tm = ev.vector(base0)
    r_mem, r_tm = [], []
    for roll in rolls:
        m_, t_ = ev.vector(ev(space.strategy(lay0, opt0, roll)))
        r_mem.append(m_ - b_mem)
        r_tm.append(t_ - b_tm)
    return np.array(r_mem), np.array(r_tm)


def _unique_ranked(ranked: list[Estimate]) -> list[Estimate]:
    """``ranked`` sorted by :func:`rank_key`, each strategy once (the first, best, copy)."""
    ranked.sort(key=rank_key)
    uniq, keys = [], set()
    for e in ranked:
        k = tuple(sorted(e.strategy.to_dict().items(), key=lambda kv: kv[0]).__repr__())
        if k not in keys:
            keys.add(k)
            uniq.append(e)
    return uniq


def _exact_pass(
    ev: "_Evaluator",
    plan: Callable[[int], Strategy],
    fits: np.ndarray,
    step: np.ndarray,
    peak: np.ndarray,
    exact: int,
    margin: float,
    err: float,
) -> tuple[list[Estimate], float]:
    """Evaluate exactly the best combined plans and the combined Pareto points; ``err`` grows to the
    largest relative gap seen between combined and exact figures (which widens the pass up to 8x)."""
    ranked: list[Estimate] = []
    seen: set = set()
    if not fits.any():
        return ranked, err
    key = np.where(fits, step, np.inf).ravel()
    # If the cost model stops being additive the way the factoring assumes, the combined
    # order is only approximate: evaluate a wider head exactly (up to 8x).
    n_max = min(8 * exact, int(fits.sum()))
    order = np.argpartition(key, n_max - 1)[:n_max] if n_max < key.size else np.arange(key.size)
    order = order[np.argsort(key[order], kind="stable")]
    for i, flat in enumerate(order):
        if i >= exact and err <= 0.01:
            break
        est = ev(plan(flat))
        seen.add(int(flat))
        err = max(err, _rel(step.flat[flat], step_s(est)), _rel(peak.flat[flat], est.peak_bytes))
        if est.fits and est.headroom_bytes >= margin:
            ranked.append(est)
    # Pareto candidates by the combined figures, then exact.
    fi = np.flatnonzero(fits.ravel())
    front = [int(fi[k]) for k in _pareto_arrays(-step.ravel()[fi], peak.ravel()[fi])]
    if len(front) > 40:
        front = [front[k] for k in np.linspace(0, len(front) - 1, 40).round().astype(int)]
    for flat in front:
        if flat not in seen:
            est = ev(plan(flat))
            seen.add(flat)
            if est.fits and est.headroom_bytes >= margin:
                ranked.append(est)
    return ranked, err


def _screen(
    space: Space,
    ev: "_Evaluator",
    layouts: list,
    roll0: tuple,
    train_mask: np.ndarray,
    cap: float,
    keep_layouts: int,
    progress,
) -> tuple[list[tuple[float, int]], int]:
    """Two calls per layout: the frugal variant bounds memory from below (prune); a representative
    variant (no offload, selective recompute, a middle batch) orders the layouts."""
    screened: list[tuple[float, int]] = []
    pruned = 0
    n_lay = len(layouts)
    total_work = n_lay + min(n_lay, keep_layouts)
    for li, lay in enumerate(layouts):
        if progress and li % 64 == 0:
            progress(li, total_work)
        frugal = _frugal(space, lay)
        if frugal is None:
            pruned += 1
            continue
        fm, _ = ev.vector(ev(space.strategy(lay, frugal, roll0)))
        if np.any(fm[train_mask] > cap):
            pruned += 1  # even the most frugal variant overflows a training phase
            continue
        if n_lay <= keep_layouts:
            screened.append((0.0, li))
            continue
        _, rt = ev.vector(ev(space.strategy(lay, _representative(space, lay), roll0)))
        screened.append((float(rt.sum()), li))
    screened.sort()
    return screened, pruned


def _grid(
    space: Space,
    ev: "_Evaluator",
    layouts: list,
    shortlist: list[int],
    roll0: tuple,
    progress,
    n_lay: int,
    total_work: int,
) -> tuple[list, list, list, float]:
    """The batch x recompute x optimizer grid per shortlisted layout, with the (offload, CPU
    optimizer) options as deltas on it. Grouped by optimizer offload, so that each group's deltas
    stay close to additive."""
    groups: dict[bool, list[tuple[tuple[str, ...], float | None]]] = {}
    for x in space.extra_options():
        groups.setdefault("optimizer" in x[0], []).append(x)
    rows_mem, rows_tm, rows_id = [], [], []
    probe_err = 0.0
    for k, li in enumerate(shortlist):
        if progress:
            progress(n_lay + k, total_work)
        lay = layouts[li]
        batches = space.batch_options(lay)
        frugal = _frugal(space, lay)
        assert frugal is not None, "the screen keeps only layouts with batch options"
        b0 = (0, frugal["recompute"], frugal["distributed_optimizer"])
        for sets in groups.values():
            base_x = min(sets, key=_offload_weight)
            grid: dict[tuple[int, object, object], tuple[np.ndarray, np.ndarray]] = {}
            for bi, b in enumerate(batches):
                for r in space.recompute_options():
                    for d in space.dist_opt_options():
                        grid[(bi, r, d)] = ev.vector(
                            ev(
                                space.strategy(
                                    lay, dict(**b, recompute=r, distributed_optimizer=d, **_extra(base_x)), roll0
                                )
                            )
                        )
            gm0, gt0 = grid[b0]

            def opt(key, x):
                return dict(**batches[key[0]], recompute=key[1], distributed_optimizer=key[2], **_extra(x))

            offs = {}
            for x in sets:
                if x == base_x:
                    offs[x] = (0.0, 0.0)
                    continue
                om, ot = ev.vector(ev(space.strategy(lay, opt(b0, x), roll0)))
                offs[x] = (om - gm0, ot - gt0)
            if len(offs) > 1:
                # Additivity probe: the far corner (largest batch, other recompute, most offload)
                # evaluated exactly against its combined value.
                far_b = max(grid, key=lambda key: (key[0], key[1] != b0[1]))
                far_x = max(sets, key=_offload_weight)
                fm, ft = ev.vector(ev(space.strategy(lay, opt(far_b, far_x), roll0)))
                cm, ct = grid[far_b][0] + offs[far_x][0], grid[far_b][1] + offs[far_x][1]
                probe_err = max(
                    probe_err, _rel(float(ct.sum()), float(ft.sum())), _rel(float(cm.max()), float(fm.max()))
                )
            host_ok: dict[tuple[object, object], bool] = {}  # (distributed optimizer, x): the host holds x
            for key, (gm, gt) in grid.items():
                for x, (dm, dt) in offs.items():
                    if (key[2], x) not in host_ok:  # the host's share depends on these alone, not the batch
                        est = ev(space.strategy(lay, opt((b0[0], b0[1], key[2]), x), roll0))
                        host_ok[(key[2], x)] = _host_over(est, space) <= 0
                    if not host_ok[(key[2], x)]:
                        continue  # its offloaded state overruns the host: no batch or recompute changes that
                    rows_mem.append(gm + dm)
                    rows_tm.append(gt + dt)
                    rows_id.append((li, opt(key, x)))
    return rows_mem, rows_tm, rows_id, probe_err


def _rel(approx: float, exact: float) -> float:
    if not math.isfinite(exact) or exact == 0:
        return 0.0
    return abs(float(approx) - exact) / abs(exact)


def _offload_weight(x: tuple[tuple[str, ...], float | None]) -> tuple[int, float]:
    """How much an (offload set, CPU-optimizer fraction) option moves off the GPU, to order the options by."""
    return len(x[0]), x[1] or 0.0


def _frugal(space: Space, lay: Degrees) -> Knobs | None:
    """The least memory-hungry train options of a layout: smallest batch, most recompute, most
    offload, the most CPU optimizer."""
    batches = space.batch_options(lay)
    if not batches:
        return None
    rc = space.recompute_options()
    x = max(space.extra_options(), key=_offload_weight)
    return dict(
        **batches[0],
        recompute=max(rc, key=RECOMPUTE.index),
        distributed_optimizer=space.dist_opt_options()[0],
        **_extra(x),
    )


def _representative(space: Space, lay: Degrees) -> Knobs:
    batches = space.batch_options(lay)
    rc = space.recompute_options()
    x = min(space.extra_options(), key=_offload_weight)
    return dict(
        **batches[len(batches) // 2],
        recompute="selective" if "selective" in rc else rc[0],
        distributed_optimizer=space.dist_opt_options()[0],
        **_extra(x),
    )


def _explain_empty(space: Space, layouts: list, rolls: list) -> None:
    pins = space.pins
    if not rolls:
        rt = pins.get("rollout_tp")
        if rt is not None:
            validate(space.model, Strategy.of(rollout_tp=rt, tp=1), space.cluster.gpus)  # raises the specific reason
        raise InvalidDegreesError(
            f"no rollout TP fits {space.model.name}'s weights on {space.cluster.gpus} GPUs",
            "use more GPUs or a GPU with more memory",
        )
    train = {k: pins[k] for k in LAYOUT_KEYS if k in pins}
    if train:
        # Let the validator name the reason for the pinned degrees (raises a coded error).
        s = Strategy.of(**train, rollout_tp=pins.get("rollout_tp", 1))
        validate(
            space.model,
            s,
            space.cluster.gpus,
            gpus_per_node=space.cluster.gpus_per_node,
            allow_cross_node_tp=space.allow_cross_node_tp,
        )
    wl = space.workload
    from grpo_tune.core.rules import check_lengths

    too_long = check_lengths(space.model, wl)  # no layout runs sequences past the model's positions
    if too_long:
        raise ConfigError(too_long[0].message, too_long[0].hint)
    mbs = f" and micro-batch {pins['mbs']} dividing the per-DP batch" if "mbs" in pins else ""
    raise InvalidDegreesError(
        f"no parallel layout of {space.model.name} on {space.cluster.gpus} GPUs satisfies the pins "
        f"{pins or '{}'} and verl's batch rule ((mini_batch*n) % dp == 0 with mini_batch={wl.mini_batch}, "
        f"n={wl.n}){mbs}",
        "relax a pinned degree, or choose a GPU count / mini-batch that divide evenly",
    )


def _no_fit(space: Space, ev: _Evaluator, layouts: list, rolls: list, margin: float = 0.0) -> NoFeasiblePlanError:
    best, best_over = None, math.inf
    for lay in layouts:
        fr = _frugal(space, lay)
        if fr is None:
            continue
        # the frugal plan, and the same without offload: what the frugal plan offloads may not fit the host
        for knobs in (fr, {**fr, **_extra(min(space.extra_options(), key=_offload_weight))}):
            est = ev(space.strategy(lay, knobs, rolls[-1]))
            over = max(est.peak_bytes - est.capacity_bytes, _host_over(est, space))
            if over < best_over:
                best, best_over = est, over
    if best is None:
        return NoFeasiblePlanError(
            f"no plan with a valid micro-batch for {space.model.name} on {space.cluster.gpus} GPUs",
            "change --mini-batch or --n so that mini_batch*n splits over data-parallel ranks",
        )
    return _no_fit_from(best, space, margin)


def _no_fit_shared(est: Estimate, space: Space, phase: str, need: float, cap: float, margin: float):
    """NO_FEASIBLE_PLAN where the ranks compute in the node's RAM (the cpu profile): each rank has its share."""
    s, hw, cl = est.strategy, space.hardware, space.cluster
    ranks = cl.ranks_per_node
    tips = [
        f"more machines (--gpus {2 * cl.nnodes * ranks} --gpus-per-node {ranks}: each holds half as much)",
        f"shorter sequences (--response-len {max(1, space.workload.response_len // 2)})",
        "a smaller model",
        "a profile of a machine with more RAM (`grpo-tune probe-hardware` writes this one's)",
    ]
    return NoFeasiblePlanError(
        f"no plan for {space.model.name} fits on {cl.gpus} x {hw.name}: the closest (tp={s.layout.tp} "
        f"pp={s.layout.pp} cp={s.layout.cp} ep={s.layout.ep} recompute={s.memory.recompute}) needs "
        f"{need / GiB:.1f} GiB per rank in the tightest phase '{phase}' > {(cap - margin) / GiB:.1f} GiB, its "
        f"share of the {hw.hbm_bytes / GiB:.1f} GiB of RAM among the {ranks} ranks of a machine"
        + (f", less a {margin / GiB:.1f} GiB safety margin" if margin else ""),
        "try " + "; ".join(tips),
    )


def _host_over(est: Estimate, space: Space) -> float:
    """Bytes by which the offloaded state of ``est`` overruns a node's host memory (negative: it fits)."""
    return est.host_bytes_per_node - space.hardware.host_memory_bytes


def _no_fit_from(est: Estimate, space: Space, margin: float = 0.0) -> NoFeasiblePlanError:
    phase = max(est.memory.values(), key=lambda p: p.total_bytes - est.capacity_bytes)
    need, cap = phase.total_bytes, est.capacity_bytes
    s = est.strategy
    gpus = space.cluster.gpus
    if need <= cap - margin and _host_over(est, space) > 0:  # the GPUs hold it; the host cannot hold its offload
        per_node = space.cluster.ranks_per_node
        return NoFeasiblePlanError(
            f"no plan for {space.model.name} fits on {gpus} x {space.hardware.name}: the closest "
            f"(tp={s.layout.tp} pp={s.layout.pp} cp={s.layout.cp} ep={s.layout.ep} recompute={s.memory.recompute} "
            f"offload={','.join(s.memory.offload) or 'none'}) needs {need / GiB:.1f} GiB per GPU, which fits, but "
            f"its offloaded state needs {est.host_bytes_per_node / GiB:.1f} GiB of host memory per node (its "
            f"{per_node} ranks) > {space.hardware.host_memory_bytes / GiB:.1f} GiB",
            f"try more nodes (e.g. --gpus {2 * gpus}: each node offloads a smaller share); fewer ranks per node "
            "(--gpus-per-node); a host with more memory (a hardware profile with a larger host_memory_bytes)",
        )
    if space.hardware.memory_is_host:  # the ranks share the node's RAM: more of them per node make it worse
        return _no_fit_shared(est, space, phase.name, need, cap, margin)
    more = 1 << max(1, math.ceil(2 * need / cap * gpus) - 1).bit_length()  # a power of two, ~2x the bytes
    more = max(more, 2 * gpus)
    tips = [f"more GPUs (e.g. --gpus {more})"]
    if phase.name == "rollout":
        tips += [
            f"shorter responses (--response-len {max(1, space.workload.response_len // 2)})",
            "a lower --gpu-memory-utilization or a larger --rollout-tp",
        ]
    if len(s.memory.offload) < len(OFFLOAD):
        tips.append("offload (--offload param,grad,optimizer)")
    else:
        tips.append("offload is already on in the closest plan")
    if phase.name != "rollout":
        tips.append(f"shorter sequences (--response-len {max(1, space.workload.response_len // 2)})")
    tips.append("a GPU with more memory (--hardware h200)")
    if margin > 0 and need <= cap:
        tips.insert(
            0,
            f"a smaller safety margin (--min-headroom; {margin / GiB:.1f} GiB asked, this plan leaves "
            f"{(cap - need) / GiB:.1f} GiB)",
        )
    return NoFeasiblePlanError(
        f"no plan for {space.model.name} fits on {gpus} x {space.hardware.name}: the closest "
        f"(tp={s.layout.tp} pp={s.layout.pp} cp={s.layout.cp} ep={s.layout.ep} recompute={s.memory.recompute} "
        f"offload={','.join(s.memory.offload) or 'none'} "
        f"rollout_tp={s.rollout.rollout_tp}) needs {need / GiB:.1f} GiB in the tightest phase '{phase.name}' "
        + (
            f"> {(cap - margin) / GiB:.1f} GiB ({cap / GiB:.1f} GiB capacity less a {margin / GiB:.1f} GiB "
            "safety margin)"
            if margin
            else f"> {cap / GiB:.1f} GiB capacity"
        ),
        "try " + "; ".join(tips),
    )
