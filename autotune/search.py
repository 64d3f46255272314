"""Candidate generation, ranking and the Pareto front.

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
from functools import lru_cache
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from core.errors import ConfigError, InvalidDegreesError, NoFeasiblePlanError
from costmodel.estimate import Estimate, estimate
from costmodel.params import total_params
from core.specs import HardwareSpec, ModelSpec
from core.rules import check_batches
from core.support import check_plan
from core.strategy import OFFLOAD, RECOMPUTE, Cluster, Strategy, Workload, divisors, validate

GMU_GRID = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CAP_FACTORS = (1, 2, 4)
"""Dynamic-batching caps searched, in multiples of the longest sequence."""
MAX_NUM_SEQS_GRID = (256, 1024)
"""vLLM max_num_seqs searched: verl's default and vLLM's own (V1, H100-class) default."""
"""vLLM memory fractions tried; verl's perf guide suggests 0.5-0.7 without offload, 0.8-0.9 with."""
MAX_MBS = 16
OFFLOAD_SETS: tuple[tuple[str, ...], ...] = ((), ("optimizer",), ("param", "grad"), ("param", "grad", "optimizer"))
"""Offload sets verl 0.9.1 can express: its ``param_offload`` frees parameters and gradient buffers
together and it has no ``grad_offload`` (verl_091_facts.md; autotune/verl_table.py ``_offload_write``),
so param-only and grad-only sets would be priced but never run."""
GiB = 1024 ** 3

CP_MIN_TOKENS = 4096
"""Tokens of one sequence each context-parallel rank must keep for search to propose CP > 1 (unpinned)."""

ENGINE_KEYS = ("max_tokens_per_gpu", "log_prob_max_tokens_per_gpu", "cpu_optimizer", "overlap_cpu_optimizer",
               "precision_aware_optimizer", "max_num_seqs", "max_num_batched_tokens", "enforce_eager",
               "chunked_prefill", "free_cache_engine")
"""Strategy fields passed through from the pins (the searched ones among them are set per plan)."""

LAYOUT_KEYS = ("tp", "pp", "first_stage_layers", "last_stage_layers", "vpp", "cp", "ep", "etp")


# ------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------

def stage_splits(layers: int, pp: int) -> list[tuple[int | None, int | None]]:
    """(first, last) stage layer counts for ``pp`` stages: even when pp divides the layers, else a
    few balanced uneven splits (Megatron's decoder_first/last_pipeline_num_layers). The last stage
    also holds the output layer and the loss, so splits giving it fewer layers come first."""
    if pp == 1:
        return [(None, None)]
    if pp > layers:
        return []
    if layers % pp == 0:
        return [(None, None)]
    found: set[tuple[int | None, int | None]] = set()
    for per in {layers // pp, -(-layers // pp)}:
        if per < 1:
            continue
        rest = layers - per * (pp - 2)  # first and last both set, pp-2 middle stages of `per`
        first = -(-rest // 2)
        if rest >= 2 and 1 <= rest - first <= first <= per + 1:
            found.add((first, rest - first))
        one = layers - per * (pp - 1)  # only the last (or only the first) stage differs
        if 1 <= one <= per + 1 and one != per:
            found.add((None, one))
            found.add((one, None))

    def key(fl):
        f, l_ = fl
        mid = pp - (f is not None) - (l_ is not None)
        rest = layers - (f or 0) - (l_ or 0)
        per = rest // mid if mid else 0
        stages = [x for x in (f, l_) if x is not None] + ([per] if mid else [])
        # A total order (set iteration order of tuples holding None varies between processes).
        return (max(stages), l_ if l_ is not None else per, f is None, f or 0, l_ or 0)

    return sorted(found, key=key)[:3]


@dataclass(frozen=True)
class Space:
    """The search space for one model, cluster and workload, with the user's pins applied."""

    model: ModelSpec
    hardware: HardwareSpec
    cluster: Cluster
    workload: Workload
    pins: dict[str, Any] = field(default_factory=dict)
    allow_cross_node_tp: bool = False
    gmu_grid: tuple[float, ...] = GMU_GRID
    cpu_grid: tuple[float | None, ...] = (None,)
    """CPU-optimizer fractions searched when unpinned; search() adds 1.0 when a layout needs it to fit."""

    # -- layouts ---------------------------------------------------------------------------
    def _choices(self, key: str, default: list) -> list:
        return [self.pins[key]] if key in self.pins else default

    def layouts(self) -> list[dict[str, Any]]:
        m, gpus, gpn = self.model, self.cluster.gpus, self.cluster.gpus_per_node
        kv = m.heads if m.is_mla else m.kv_heads
        tps = [t for t in divisors(math.gcd(m.heads, kv)) if gpus % t == 0
               and (t <= gpn or self.allow_cross_node_tp)]
        seq = self.workload.train_seq_len
        out = []
        for tp in self._choices("tp", tps):
            for pp in self._choices("pp", divisors(gpus // tp) if gpus % tp == 0 else []):
                if "first_stage_layers" in self.pins or "last_stage_layers" in self.pins:
                    splits = [(self.pins.get("first_stage_layers"), self.pins.get("last_stage_layers"))]
                else:
                    splits = stage_splits(m.layers, pp)
                for first, last in splits:
                    stages = _stages(m.layers, pp, first, last)
                    if stages is None:
                        continue
                    g = 0
                    for n in stages:
                        g = math.gcd(g, n)
                    vpps = [1] + ([v for v in divisors(g) if v > 1] if pp > 1 else [])
                    for vpp in self._choices("vpp", vpps):
                        # CP splits the sequence in 2*cp chunks (Megatron's load-balanced causal CP).
                        # Unless pinned, CP is for long sequences only (verl's perf guide: TP first,
                        # then PP, then CP for long sequences): each rank keeps >= CP_MIN_TOKENS.
                        cps = [c for c in divisors(gpus // (tp * pp))
                               if c == 1 or (seq % (2 * c) == 0 and ("cp" in self.pins or seq // c >= CP_MIN_TOKENS))] \
                            if gpus % (tp * pp) == 0 else []
                        for cp in self._choices("cp", cps):
                            if gpus % (tp * pp * cp):
                                continue
                            dp = gpus // (tp * pp * cp)
                            if not self._batch_ok(dp):
                                continue
                            for ep, etp in self._experts(tp, cp, dp):
                                out.append(dict(tp=tp, pp=pp, first_stage_layers=first, last_stage_layers=last,
                                                vpp=vpp, cp=cp, ep=ep, etp=etp))
        # A layout with no micro-batch that divides its per-DP batch (a pinned --mbs) has no plan.
        return [lay for lay in out if self._valid_layout(lay) and self.mbs_options(lay)]

    def _experts(self, tp: int, cp: int, dp: int) -> list[tuple[int, int | None]]:
        m = self.model
        if not m.is_moe:
            etp = self.pins.get("etp")
            if self.pins.get("ep", 1) != 1 or (etp is not None and etp != tp):
                return []
            return [(1, None)]
        out = []
        # Megatron's MoE parallel folding: ep*etp must divide tp*cp*dp.
        for ep in self._choices("ep", divisors(m.experts)):
            for etp in self._choices("etp", divisors(tp)):
                if (tp * cp * dp) % (ep * etp) == 0:
                    out.append((ep, etp))
        return out

    def _batch_ok(self, dp: int) -> bool:
        # verl normalizes the mini-batch per DP rank (core/rules.py holds the rule).
        return not check_batches(self.workload, dp=dp)

    def _valid_layout(self, lay: dict[str, Any]) -> bool:
        try:
            validate(self.model, Strategy(**lay), self.cluster.gpus, gpus_per_node=self.cluster.gpus_per_node,
                     allow_cross_node_tp=self.allow_cross_node_tp)
        except InvalidDegreesError:
            return False
        return True

    # -- train options ---------------------------------------------------------------------
    def sequences_per_dp(self, lay: dict[str, Any]) -> int:
        dp = self.cluster.gpus // (lay["tp"] * lay["pp"] * lay["cp"])
        wl = self.workload
        return (wl.mini_batch * wl.n if wl.kind == "grpo" else wl.gbs) // dp

    def mbs_options(self, lay: dict[str, Any]) -> list[int]:
        per = self.sequences_per_dp(lay)
        opts = [b for b in range(1, min(per, MAX_MBS) + 1) if per % b == 0]
        # megatron's refusals shared with the trainer (core/support.py), e.g. the interleaving rule per mbs
        dp = self.cluster.gpus // (lay["tp"] * lay["pp"] * lay["cp"])
        opts = [b for b in opts if _plan_ok(self.model, self.workload, tuple(sorted(lay.items())), b, dp)]
        if "mbs" in self.pins:
            return [self.pins["mbs"]] if per and per % self.pins["mbs"] == 0 else []
        return opts

    def recompute_options(self) -> list[str]:
        return self._choices("recompute", list(RECOMPUTE))

    def offload_options(self) -> list[tuple[str, ...]]:
        return self._choices("offload", list(OFFLOAD_SETS))

    def dist_opt_options(self) -> list[bool]:
        # The distributed optimizer moves the same bytes as a DP all-reduce (reduce-scatter +
        # all-gather; Megatron-LM docs/distrib_optimizer.md) and shards the optimizer state, so
        # it is always on unless the user pins it off.
        return self._choices("distributed_optimizer", [True])

    def cap_options(self) -> list[int]:
        """Dynamic-batching token caps (verl's ppo_max_token_len_per_gpu): 1, 2 and 4 x the longest
        sequence (verl asserts the cap holds it), or the pinned cap; none when pinned off."""
        if "max_tokens_per_gpu" in self.pins:
            cap = self.pins["max_tokens_per_gpu"]
            return [cap] if cap else []
        if self.workload.kind != "grpo":
            return []
        return [k * self.workload.train_seq_len for k in CAP_FACTORS]

    def batch_options(self, lay: dict[str, Any]) -> list[dict[str, Any]]:
        """Fixed micro-batches (``mbs``) and dynamic batching (a token cap, mbs unused)."""
        mbs = self.mbs_options(lay)
        if not mbs:
            return []
        fixed = [] if self.pins.get("max_tokens_per_gpu") else [dict(mbs=b) for b in mbs]
        return fixed + [dict(mbs=min(mbs), max_tokens_per_gpu=c) for c in self.cap_options()]

    def cpu_options(self) -> list[float | None]:
        """Megatron's hybrid CPU optimizer: pinned, or off plus all-on when memory needs it (``cpu_grid``)."""
        if "cpu_optimizer" in self.pins:
            return [self.pins["cpu_optimizer"]]
        return list(self.cpu_grid)

    def extra_options(self) -> list[tuple[tuple[str, ...], float | None]]:
        """(offload set, CPU-optimizer fraction) pairs."""
        return [(o, c) for o in self.offload_options() for c in self.cpu_options()]

    def engine_options(self) -> list[dict[str, Any]]:
        """vLLM's max_num_seqs and eager mode (CUDA graphs cost memory, eager costs time per step)."""
        if self.workload.kind != "grpo" or self.hardware.native_rollout:
            return [{}]  # no vLLM: its knobs change nothing (the CPU trainer samples with Megatron)
        seqs = self._choices("max_num_seqs", list(MAX_NUM_SEQS_GRID))
        eager = self._choices("enforce_eager", [False, True])
        return [dict(max_num_seqs=n, enforce_eager=e) for n in seqs for e in eager]

    def train_options(self, lay: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(**b, recompute=r, distributed_optimizer=d, **_extra(x))
                for b in self.batch_options(lay) for r in self.recompute_options()
                for d in self.dist_opt_options() for x in self.extra_options()]

    # -- rollout options -------------------------------------------------------------------
    def rollout_options(self) -> list[tuple[int, float]]:
        m, gpus, gpn = self.model, self.cluster.gpus, self.cluster.gpus_per_node
        kv = m.heads if m.is_mla else m.kv_heads
        weights = 2 * total_params(m)  # bf16 rollout weights
        gmus = self._choices("gpu_memory_utilization", list(self.gmu_grid))
        if self.workload.kind != "grpo":  # plain pretraining has no rollout: one placeholder option
            return [(self.pins.get("rollout_tp", 1), self.pins.get("gpu_memory_utilization", 0.6))]
        ok = [t for t in divisors(gpus) if m.heads % t == 0 and (kv % t == 0 or t % kv == 0)]
        fit = [t for t in ok if weights / t < max(gmus) * self.hardware.hbm_bytes]
        if "rollout_tp" in self.pins:
            rtps = [self.pins["rollout_tp"]] if self.pins["rollout_tp"] in ok else []
        else:
            # vLLM TP within a node, unless the weights only fit across nodes; when they fit
            # nowhere, keep the largest TP so that the estimate says which phase overflows.
            rtps = [t for t in fit if t <= gpn or self.allow_cross_node_tp] or fit[:2] or ok[-1:]
        pairs = [(t, g) for t in rtps for g in gmus if weights / t < g * self.hardware.hbm_bytes]
        return pairs or [(t, max(gmus)) for t in rtps]

    def rolls(self) -> list[tuple]:
        """Every rollout option: (rollout_tp, gpu_memory_utilization, engine knobs)."""
        return [(t, g, eng) for t, g in self.rollout_options() for eng in self.engine_options()]

    def strategy(self, lay: dict[str, Any], opt: dict[str, Any], roll: tuple) -> Strategy:
        eng = roll[2] if len(roll) > 2 else {}
        fixed = {k: self.pins[k] for k in ENGINE_KEYS if k in self.pins and k not in opt and k not in eng}
        return Strategy(**lay, **opt, **fixed, **eng, rollout_tp=roll[0], gpu_memory_utilization=roll[1],
                        sequence_parallel=self.pins.get("sequence_parallel"))

    def candidate_count(self, layouts: list[dict[str, Any]] | None = None) -> int:
        layouts = self.layouts() if layouts is None else layouts
        per = len(self.recompute_options()) * len(self.dist_opt_options()) * len(self.extra_options())
        return sum(len(self.batch_options(lay)) for lay in layouts) * per * len(self.rolls())

    def candidates(self) -> Iterator[Strategy]:
        """Every plan of the space (the full product; use :func:`search` to rank it)."""
        rolls = self.rolls()
        for lay in self.layouts():
            for opt in self.train_options(lay):
                for roll in rolls:
                    yield self.strategy(lay, opt, roll)


@lru_cache(maxsize=65536)
def _plan_ok(model: ModelSpec, workload: Workload, lay: tuple, mbs: int, dp: int) -> bool:
    """No shared megatron refusal (core.support.check_plan) for this layout and micro-batch size;
    cached because the search asks for a layout's options several times."""
    return not check_plan(model, Strategy(**dict(lay), mbs=mbs, dp=dp), workload=workload)


def _stages(layers: int, pp: int, first: int | None, last: int | None) -> list[int] | None:
    if pp == 1:
        return None if first is not None or last is not None else [layers]
    mid = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if rest < 0 or (mid and (rest % mid or rest // mid < 1)) or (not mid and rest) or min(first or 1, last or 1) < 1:
        return None
    per = rest // mid if mid else 0
    return ([first] if first is not None else []) + [per] * mid + ([last] if last is not None else [])


# ------------------------------------------------------------------------------------------------
# Ranking
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

    @property
    def best(self) -> Estimate:
        return self.ranked[0]

    def stats(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "evaluated": self.evaluated, "combined": self.combined,
                "layouts": self.layouts, "pruned_layouts": self.pruned_layouts, "seconds": round(self.seconds, 3),
                "combination_error": round(self.combination_error, 6)}


def step_s(est: Estimate) -> float:
    return math.inf if est.time is None else float(est.time.step_s)


def tokens_per_s_per_gpu(est: Estimate) -> float:
    if est.throughput is not None:
        return float(est.throughput.tokens_per_s_per_gpu)
    s = step_s(est)
    wl = est.workload
    return 0.0 if not math.isfinite(s) else wl.sequences * wl.train_seq_len / s / est.cluster.gpus


def rank_key(est: Estimate) -> tuple[float, float]:
    """Faster first; step times equal to 3 significant figures are ties (the cost model is not
    more precise than that: `grpo-tune validate`'s error is a few %), and among ties more memory
    headroom comes first."""
    t = step_s(est)
    return (float(f"{t:.3g}") if math.isfinite(t) else math.inf, -est.headroom_bytes)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated in (throughput: higher better, peak: lower better),
    sorted by throughput, highest first."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], points[i][1]))
    front, best_peak = [], math.inf
    for i in order:
        if points[i][1] < best_peak:
            front.append(i)
            best_peak = points[i][1]
    return front


def _pareto_arrays(thr: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """:func:`pareto_front` for arrays: sort by throughput (desc) then peak (asc) and keep each
    point whose peak is below every peak before it."""
    order = np.lexsort((peak, -thr))
    p = peak[order]
    prev = np.minimum.accumulate(np.concatenate(([np.inf], p[:-1])))
    return order[p < prev]


class _Evaluator:
    """Calls the cost model and turns an Estimate into flat per-phase vectors."""

    def __init__(self, space: Space, calibration: dict[str, float] | None):
        self.space = space
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
            est = self.cache[s] = estimate(model=sp.model, hardware=sp.hardware, cluster=sp.cluster, strategy=s,
                                           workload=sp.workload, calibration=self.calibration)
        return est

    def vector(self, est: Estimate) -> tuple[np.ndarray, np.ndarray]:
        if self.mem_keys is None:
            self.mem_keys = list(est.memory)
            self.time_keys = [] if est.time is None else list(est.time.phases)
            self.capacity = est.capacity_bytes
        mem = np.array([est.memory[k].total_bytes if k in est.memory else 0.0 for k in self.mem_keys])
        tm = np.array([est.time.phases.get(k, 0.0) for k in self.time_keys]) if est.time else np.zeros(0)
        return mem, tm

    def train_phase_mask(self) -> np.ndarray:
        return np.array([k not in ("rollout", "weight_sync") for k in self.mem_keys])


def search(model: ModelSpec, hardware: HardwareSpec, cluster: Cluster, workload: Workload, *,
           pins: dict[str, Any] | None = None, top: int = 10, calibration: dict[str, float] | None = None,
           allow_cross_node_tp: bool = False, exact: int | None = None, keep_layouts: int = 48,
           min_headroom: float = 0.0, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Rank the valid plans for ``model`` on ``cluster``; raise NO_FEASIBLE_PLAN when none fits.

    ``pins`` are strategy fields the user fixed (see :func:`autotune.options.strategy_pins`).
    ``exact`` is how many of the best combined plans are re-evaluated exactly (default 4 x top,
    at least 40). ``keep_layouts`` is how many layouts (ordered by the screening call) get the
    full train-option grid; with fewer layouts than that, the search is exhaustive over the
    factored space. ``min_headroom`` is a fraction of HBM that every phase must leave free (a
    margin for allocator fragmentation and for the memory model's own error); plans that fit
    only without it are not ranked. ``progress(done, total)`` is called as layouts are evaluated.
    """
    if not 0.0 <= min_headroom < 0.5:
        raise ConfigError(f"min_headroom must be a fraction in [0, 0.5), got {min_headroom!r}")
    margin = min_headroom * hardware.hbm_bytes
    t0 = time.perf_counter()
    space = Space(model, hardware, cluster, workload, dict(pins or {}), allow_cross_node_tp)
    layouts = space.layouts()
    rolls = space.rolls()
    if not layouts or not rolls:
        _explain_empty(space, layouts, rolls)
    ev = _Evaluator(space, calibration)

    # Rollout deltas: one train plan, every rollout option.
    lay0 = layouts[0]
    opt0 = _frugal(space, lay0)
    roll0 = rolls[0]
    base0 = ev(space.strategy(lay0, opt0, roll0))
    b_mem, b_tm = ev.vector(base0)
    r_mem, r_tm = [], []
    for roll in rolls:
        m_, t_ = ev.vector(ev(space.strategy(lay0, opt0, roll)))
        r_mem.append(m_ - b_mem)
        r_tm.append(t_ - b_tm)
    R_mem, R_tm = np.array(r_mem), np.array(r_tm)  # (n_roll, phases)
    train_mask = ev.train_phase_mask()
    cap = ev.capacity - margin

    screened, pruned = _screen(space, ev, layouts, roll0, train_mask, cap, keep_layouts, progress)
    if pruned and "cpu_optimizer" not in space.pins and space.cpu_grid == (None,):
        # Some layouts overflow even frugally: search Megatron's CPU optimizer too (where memory needs it).
        space = dataclasses.replace(space, cpu_grid=(None, 1.0))
        ev.space = space
        screened, pruned = _screen(space, ev, layouts, roll0, train_mask, cap, keep_layouts, None)
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

    T_mem, T_tm = np.array(rows_mem), np.array(rows_tm)  # (n_train, phases)
    mem = T_mem[:, None, :] + R_mem[None, :, :]  # (n_train, n_roll, phases)
    over = (mem - cap).max(axis=2)
    peak = mem.max(axis=2)
    step = (T_tm.sum(axis=1)[:, None] + R_tm.sum(axis=1)[None, :]) if T_tm.size else np.zeros_like(peak)
    combined = int(peak.size)
    fits = over <= 0.01 * cap  # margin: the exact pass decides

    def plan(flat: int) -> Strategy:
        i, j = divmod(int(flat), len(rolls))
        li, opt = rows_id[i]
        return space.strategy(layouts[li], opt, rolls[j])

    exact = exact or max(40, 4 * top)
    ranked, err = _exact_pass(ev, plan, fits, step, peak, exact, margin, probe_err)
    if not ranked:
        flat = int(np.argmin(over))
        raise _no_fit_from(ev(plan(flat)), space, margin)
    ranked.sort(key=rank_key)
    uniq, keys = [], set()
    for e in ranked:
        k = tuple(sorted(e.strategy.to_dict().items(), key=lambda kv: kv[0]).__repr__())
        if k not in keys:
            keys.add(k)
            uniq.append(e)
    pts = [(tokens_per_s_per_gpu(e), e.peak_bytes) for e in uniq]
    pareto = [uniq[i] for i in pareto_front(pts)]
    return SearchResult(ranked=uniq, pareto=pareto, candidates=n_candidates, evaluated=ev.calls, combined=combined,
                        layouts=len(layouts), pruned_layouts=pruned, seconds=time.perf_counter() - t0,
                        combination_error=err)


def _exact_pass(ev: "_Evaluator", plan: Callable[[int], Strategy], fits: np.ndarray, step: np.ndarray,
                peak: np.ndarray, exact: int, margin: float, err: float) -> tuple[list[Estimate], float]:
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


def _screen(space: Space, ev: "_Evaluator", layouts: list, roll0: tuple, train_mask: np.ndarray, cap: float,
            keep_layouts: int, progress) -> tuple[list[tuple[float, int]], int]:
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


def _grid(space: Space, ev: "_Evaluator", layouts: list, shortlist: list[int], roll0: tuple, progress, n_lay: int,
          total_work: int) -> tuple[list, list, list, float]:
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
        b0 = (0, frugal["recompute"], frugal["distributed_optimizer"])
        for sets in groups.values():
            base_x = min(sets, key=lambda x: (len(x[0]), x[1] or 0.0))
            grid = {}
            for bi, b in enumerate(batches):
                for r in space.recompute_options():
                    for d in space.dist_opt_options():
                        grid[(bi, r, d)] = ev.vector(ev(space.strategy(
                            lay, dict(**b, recompute=r, distributed_optimizer=d, **_extra(base_x)), roll0)))
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
                far_x = max(sets, key=lambda x: (len(x[0]), x[1] or 0.0))
                fm, ft = ev.vector(ev(space.strategy(lay, opt(far_b, far_x), roll0)))
                cm, ct = grid[far_b][0] + offs[far_x][0], grid[far_b][1] + offs[far_x][1]
                probe_err = max(probe_err, _rel(float(ct.sum()), float(ft.sum())), _rel(float(cm.max()), float(fm.max())))
            for key, (gm, gt) in grid.items():
                for x, (dm, dt) in offs.items():
                    rows_mem.append(gm + dm)
                    rows_tm.append(gt + dt)
                    rows_id.append((li, opt(key, x)))
    return rows_mem, rows_tm, rows_id, probe_err


def _rel(approx: float, exact: float) -> float:
    if not math.isfinite(exact) or exact == 0:
        return 0.0
    return abs(float(approx) - exact) / abs(exact)


def _extra(x: tuple[tuple[str, ...], float | None]) -> dict[str, Any]:
    """Strategy fields of an (offload, CPU-optimizer) option; the CPU optimizer as verl's examples
    run it (copies overlapped, precision-aware Adam)."""
    o, c = x
    if c is None:
        return dict(offload=o)
    return dict(offload=o, cpu_optimizer=c, overlap_cpu_optimizer=True, precision_aware_optimizer=True)


def _frugal(space: Space, lay: dict[str, Any]) -> dict[str, Any] | None:
    """The least memory-hungry train options of a layout: smallest batch, most recompute, most
    offload, the most CPU optimizer."""
    batches = space.batch_options(lay)
    if not batches:
        return None
    rc = space.recompute_options()
    x = max(space.extra_options(), key=lambda x: (len(x[0]), x[1] or 0.0))
    return dict(**batches[0], recompute=max(rc, key=RECOMPUTE.index), distributed_optimizer=space.dist_opt_options()[0],
                **_extra(x))


def _representative(space: Space, lay: dict[str, Any]) -> dict[str, Any]:
    batches = space.batch_options(lay)
    rc = space.recompute_options()
    x = min(space.extra_options(), key=lambda x: (len(x[0]), x[1] or 0.0))
    return dict(**batches[len(batches) // 2], recompute="selective" if "selective" in rc else rc[0],
                distributed_optimizer=space.dist_opt_options()[0], **_extra(x))


def _explain_empty(space: Space, layouts: list, rolls: list) -> None:
    pins = space.pins
    if not rolls:
        rt = pins.get("rollout_tp")
        if rt is not None:
            validate(space.model, Strategy(rollout_tp=rt, tp=1), space.cluster.gpus)  # raises the specific reason
        raise InvalidDegreesError(f"no rollout TP fits {space.model.name}'s weights on {space.cluster.gpus} GPUs",
                                  "use more GPUs or a GPU with more memory")
    train = {k: pins[k] for k in LAYOUT_KEYS if k in pins}
    if train:
        # Let the validator name the reason for the pinned degrees (raises a coded error).
        s = Strategy(**train, rollout_tp=pins.get("rollout_tp", 1))
        validate(space.model, s, space.cluster.gpus, gpus_per_node=space.cluster.gpus_per_node,
                 allow_cross_node_tp=space.allow_cross_node_tp)
    wl = space.workload
    mbs = f" and micro-batch {pins['mbs']} dividing the per-DP batch" if "mbs" in pins else ""
    raise InvalidDegreesError(
        f"no parallel layout of {space.model.name} on {space.cluster.gpus} GPUs satisfies the pins "
        f"{pins or '{}'} and verl's batch rule ((mini_batch*n) % dp == 0 with mini_batch={wl.mini_batch}, "
        f"n={wl.n}){mbs}", "relax a pinned degree, or choose a GPU count / mini-batch that divide evenly")


def _no_fit(space: Space, ev: _Evaluator, layouts: list, rolls: list, margin: float = 0.0) -> NoFeasiblePlanError:
    best, best_over = None, math.inf
    for lay in layouts:
        fr = _frugal(space, lay)
        if fr is None:
            continue
        for roll in rolls[-1:]:
            est = ev(space.strategy(lay, fr, roll))
            over = est.peak_bytes - est.capacity_bytes
            if over < best_over:
                best, best_over = est, over
    if best is None:
        return NoFeasiblePlanError(f"no plan with a valid micro-batch for {space.model.name} on {space.cluster.gpus} GPUs",
                                   "change --mini-batch or --n so that mini_batch*n splits over data-parallel ranks")
    return _no_fit_from(best, space, margin)


def _no_fit_from(est: Estimate, space: Space, margin: float = 0.0) -> NoFeasiblePlanError:
    phase = max(est.memory.values(), key=lambda p: p.total_bytes - est.capacity_bytes)
    need, cap = phase.total_bytes, est.capacity_bytes
    s = est.strategy
    gpus = space.cluster.gpus
    more = 1 << max(1, math.ceil(2 * need / cap * gpus) - 1).bit_length()  # a power of two, ~2x the bytes
    more = max(more, 2 * gpus)
    tips = [f"more GPUs (e.g. --gpus {more})"]
    if phase.name == "rollout":
        tips += [f"shorter responses (--response-len {max(1, space.workload.response_len // 2)})",
                 "a lower --gpu-memory-utilization or a larger --rollout-tp"]
    if len(s.offload) < len(OFFLOAD):
        tips.append("offload (--offload param,grad,optimizer)")
    else:
        tips.append("offload is already on in the closest plan")
    if phase.name != "rollout":
        tips.append(f"shorter sequences (--response-len {max(1, space.workload.response_len // 2)})")
    tips.append("a GPU with more memory (--hardware h200)")
    if margin > 0 and need <= cap:
        tips.insert(0, f"a smaller safety margin (--min-headroom; {margin / GiB:.1f} GiB asked, this plan leaves "
                       f"{(cap - need) / GiB:.1f} GiB)")
    return NoFeasiblePlanError(
        f"no plan for {space.model.name} fits on {gpus} x {space.hardware.name}: the closest "
        f"(tp={s.tp} pp={s.pp} cp={s.cp} ep={s.ep} recompute={s.recompute} offload={','.join(s.offload) or 'none'} "
        f"rollout_tp={s.rollout_tp}) needs {need / GiB:.1f} GiB in the tightest phase '{phase.name}' "
        + (f"> {(cap - margin) / GiB:.1f} GiB ({cap / GiB:.1f} GiB capacity less a {margin / GiB:.1f} GiB "
           "safety margin)" if margin else f"> {cap / GiB:.1f} GiB capacity"),
        "try " + "; ".join(tips))
