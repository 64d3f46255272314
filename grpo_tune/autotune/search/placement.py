"""Search over placement: colocated, separate pools, or the better of the two (``--placement auto``).

A separate plan has three parts that price apart and meet only in the step's composition
(costmodel.pools.compose_step): the training pool's plan, the rollout pool's engine, and the
split (how many GPUs roll out). The search therefore:

1. prices the generation of every split with its fastest fitting rollout engine (cheap: the
   rollout time depends only on the pool's GPUs and the engine's knobs);
2. prices the training pool of every split with one representative training plan, scaled from a
   full training-pool search at one pool size, and keeps the splits whose composed step is best
   for some staleness <= K (and their neighbours);
3. runs the full training-pool search (autotune.search.driver with the training pool's pricing: no vLLM
   on its GPUs) on those splits only, and composes each exactly (estimate_separate).

Staleness is searched from 0 up to the user's ``--staleness K``; among steps within 0.5% the
smaller staleness wins (fresher samples at no cost).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, TypedDict

from grpo_tune.core.choices import PlacementMode
from grpo_tune.core.errors import ConfigError, GrpoTuneError, InvalidDegreesError
from grpo_tune.core.hardware import NATIVE_ENGINE, plan_engine
from grpo_tune.core.rules import within_node
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import Cluster, Strategy, Workload, divisors
from grpo_tune.core import placement as CP
from grpo_tune.costmodel import pools as P
from grpo_tune.costmodel import weight_sync as WS
from grpo_tune.costmodel.estimate import Estimate
from grpo_tune.costmodel.params import total_params
from grpo_tune.costmodel.streaming import TIE_REL, StreamShape, cheaper_stream
from grpo_tune.costmodel.timing_base import check_calibration

from .candidates import pinned, pinned_number

if TYPE_CHECKING:
    from .driver import SearchResult

PLACEMENT_CHOICES = (*PlacementMode.values(), "auto")
"""``--placement`` on search: a placement mode (core.choices.PlacementMode), or the better of the two."""
ROLLOUT_GMU_GRID = (0.6, 0.7, 0.8, 0.9)
"""vLLM memory fractions on a rollout-pool GPU (no training state there: up to 0.9)."""
ROLLOUT_SEQS_GRID = (256, 1024)
KEEP_SPLITS = 3
"""Splits (best by the repriced training plans) composed exactly per staleness."""
REPRICE = 24
"""The reference training-pool search's best plans repriced on the other pool sizes."""
TRAIN_KEEP_LAYOUTS = 12
TRAIN_EXACT = 24
"""Plans a training-pool search evaluates exactly (autotune.search.driver's exact)."""
"""Layouts a training-pool search gives the full option grid (autotune.search.driver's keep_layouts)."""
TIE = 0.005
"""Steps within this fraction are ties: the smaller staleness (then the larger training pool) wins."""


class EngineOption(TypedDict):
    """One vLLM engine a rollout pool can run (the rollout knobs :func:`rollout_options` varies)."""

    rollout_tp: int
    gpu_memory_utilization: float
    max_num_seqs: int
    enforce_eager: bool


class _SearchKw(TypedDict, total=False):
    """The options every search of :func:`search_placement` passes on to ``autotune.search.driver.search``."""

    top: int
    calibration: dict[str, float] | None
    allow_cross_node_tp: bool
    min_headroom: float
    keep_layouts: int
    exact: int


_TRAIN_PINS = dict(rollout_tp=1, gpu_memory_utilization=0.9, max_num_seqs=256, enforce_eager=True)
"""The rollout knobs of a training-pool search: one value each (there is no vLLM on that pool)."""


@dataclass
class PlacementResult:
    """The best plan of each placement searched and the overall winner."""

    best: Estimate
    colocated: SearchResult | None = None
    """The colocated search (None when not searched)."""
    separate: list[Estimate] = field(default_factory=list)
    """Separate plans composed exactly, best first (one per split and staleness kept)."""
    splits: list[dict[str, float]] = field(default_factory=list)
    """Per split and staleness: the representative step (step 2 of the search), for the curve."""
    seconds: float = 0.0
    train_searches: int = 0
    stream: bool | None = False
    """The stream asked for: True forced, False off, None each staleness-0 split the cheaper of the two."""

    @property
    def best_separate(self) -> Estimate | None:
        return self.separate[0] if self.separate else None

    @property
    def best_colocated(self) -> Estimate | None:
        return None if self.colocated is None else self.colocated.best

    def speedup(self) -> float | None:
        """Colocated step over the best separate step (None without both)."""
        c, s = self.best_colocated, self.best_separate
        if c is None or s is None or not c.step_s or not s.step_s:
            return None
        return c.step_s / s.step_s


def check_request(
    mode: str,
    staleness: int,
    rollout_gpus: int | None,
    partial: bool | None,
    cluster: Cluster,
    rollout_hw: HardwareSpec | None,
) -> None:
    if mode not in PLACEMENT_CHOICES:
        raise ConfigError(f"--placement must be one of {', '.join(PLACEMENT_CHOICES)}, got {mode!r}")
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ConfigError(f"--staleness must be an integer >= 0, got {staleness!r}")
    if mode == "colocated" and (rollout_gpus or staleness or partial or rollout_hw is not None):
        raise ConfigError(
            "--rollout-gpus, --rollout-hardware, --staleness and --partial-rollout need separate pools",
            hint="add --placement separate (or auto on search)",
        )
    if partial and staleness < 1:
        raise ConfigError("--partial-rollout needs --staleness >= 1", hint="give --staleness 1, or drop it")
    if cluster.gpus < 2 and mode == "separate":  # auto on one GPU: the colocated plan, the only one there is
        raise ConfigError("separate pools need at least 2 GPUs", hint="give --gpus 2 or more")
    if rollout_gpus is not None:
        CP.pools(cluster, rollout_gpus)  # a coded error for a split verl cannot express


def rollout_options(m: ModelSpec, hw: HardwareSpec, roll: Cluster, pins: Mapping[str, object]) -> list[EngineOption]:
    """vLLM engines a rollout pool can run: TP within one of its nodes dividing its GPUs and the heads, memory
    fractions up to 0.9, max_num_seqs and CUDA graphs (the pins fix any of them). On a profile that samples
    with the trainer's own model (``cpu``) the pool's forward-only engine has only its TP."""
    kv = m.heads if m.is_mla else m.kv_heads
    weights = 2 * total_params(m)
    gmu, tp = pinned_number(pins, "gpu_memory_utilization"), pinned(pins, "rollout_tp", int)
    n_seqs, eager_pin = pinned(pins, "max_num_seqs", int), pinned(pins, "enforce_eager", bool)
    gmus = [gmu] if gmu is not None else list(ROLLOUT_GMU_GRID)
    if tp is not None:
        tps = [tp]
    else:
        ok = [t for t in divisors(roll.gpus) if m.heads % t == 0 and (kv % t == 0 or t % kv == 0)]
        fit = [t for t in ok if weights / t < max(gmus) * hw.hbm_bytes]
        # vLLM TP within a node (every replica's GPUs on one node), unless the weights only fit across nodes (as
        # the colocated space does)
        tps = [t for t in fit if within_node(t, roll.gpus, roll.gpus_per_node)] or fit[:2]
    if plan_engine(pins, hw) == NATIVE_ENGINE:  # the trainer's own sampler (the cpu default): only its TP is a knob
        d = Strategy().rollout  # the vLLM knobs keep their defaults (nothing reads them there)
        return [
            EngineOption(
                rollout_tp=t,
                gpu_memory_utilization=d.gpu_memory_utilization if gmu is None else gmu,
                max_num_seqs=d.max_num_seqs if n_seqs is None else n_seqs,
                enforce_eager=d.enforce_eager if eager_pin is None else eager_pin,
            )
            for t in tps
        ]
    seqs = [n_seqs] if n_seqs is not None else list(ROLLOUT_SEQS_GRID)
    eager = [eager_pin] if eager_pin is not None else [False, True]
    return [
        EngineOption(rollout_tp=t, gpu_memory_utilization=g, max_num_seqs=n, enforce_eager=e)
        for t in tps
        for g in gmus
        if weights / t < g * hw.hbm_bytes
        for n in seqs
        for e in eager
    ]


_ENGINE_BASE = ("max_num_batched_tokens", "chunked_prefill")
"""The pinned engine knobs a rollout pool's strategy starts from (the rest are each option's)."""


def _pool_base(pins: Mapping[str, object], hw: HardwareSpec) -> Strategy:
    """A rollout pool's strategy before its options: the pinned :data:`_ENGINE_BASE` knobs, on the trainer's own
    sampler where the plan's engine is it (the pool's platform's default, core.hardware.plan_engine)."""
    native = {"engine": NATIVE_ENGINE} if plan_engine(pins, hw) == NATIVE_ENGINE else {}
    return Strategy.of(**{k: v for k, v in pins.items() if k in _ENGINE_BASE}, **native)


def rollout_memory_default(frameworks: Sequence[str] = ()) -> float:
    """The vLLM memory fraction of a separate rollout pool where the plan sets none: the first of ``frameworks`` that
    states its own for that mode, else the default framework's (frameworks.separate_memory: verl 0.9.1's 0.5,
    NeMo-RL 0.7.0's 0.8)."""
    from grpo_tune import frameworks as F

    return F.separate_memory(tuple(frameworks) or (F.DEFAULT,))[0]


def best_rollout(
    m: ModelSpec,
    hw: HardwareSpec,
    roll: Cluster,
    wl: Workload,
    pins: Mapping[str, object],
    cal: dict[str, float],
    partial: bool,
    knobs: P.AsyncKnobs | None = None,
    memory_default: float | None = None,
) -> tuple[EngineOption, float] | None:
    """The fastest rollout engine that fits the pool: (knobs, generation seconds), or None. ``knobs``: how far the
    pool runs ahead (costmodel.pools.AsyncKnobs; None: the synchronous batch, or partial rollout at one batch
    ahead). Among engines that price the same generation (the KV cache does not bind, so a larger vLLM memory
    fraction buys nothing) the one whose fraction is nearest ``memory_default`` wins, then the smaller:
    ``memory_default`` is the framework's own fraction for a separate rollout pool (None: the default framework's,
    :func:`rollout_memory_default`)."""
    best: tuple[tuple[float, float, float], EngineOption, float] | None = None
    base = _pool_base(pins, hw)
    want = rollout_memory_default() if memory_default is None else memory_default
    for opt in rollout_options(m, hw, roll, pins):
        s = CP.rollout_strategy(base.replace(**opt))
        _, viol = P.rollout_memory(m, hw, roll, s, wl)
        if viol:
            continue
        g = P.generation(m, hw, roll, s, wl, cal, partial=partial, knobs=knobs)["gen_s"]
        gmu = opt.get("gpu_memory_utilization", 0.0)
        key = (round(g, 6), round(abs(gmu - want), 9), gmu)  # ties: the fraction nearest the framework's, the smaller
        if best is None or key < best[0]:
            best = (key, opt, g)
    return None if best is None else (best[1], best[2])


def choose_split(
    candidates: list[int],
    gen_s: Callable[[int], float],
    train_s: Callable[[int], float],
    sync_s: Callable[[int], float],
    staleness: int,
    sync_interval: int = 1,
    stream: Callable[[int, float, float], StreamShape] | None = None,
) -> list[tuple[float, int]]:
    """Every candidate rollout pool size with its composed step, best first (exact over the candidates:
    ties go to the larger training pool). ``train_s(r)`` prices the training pool left by ``r`` rollout GPUs;
    an infinite time marks a split with no plan. ``stream(r, gen_s, train_s)``: compose_step's streaming
    arguments of a split (staleness 0 only; costmodel.streaming)."""
    out = []
    for r in candidates:
        g, t = gen_s(r), train_s(r)
        if not (math.isfinite(g) and math.isfinite(t)):
            continue
        kw = stream(r, g, t) if stream is not None and staleness == 0 else {}
        out.append((P.compose_step(g, t, sync_s(r), staleness, sync_interval, **kw)["step_s"], r))
    out.sort()
    return out


def search_placement(
    model: ModelSpec,
    hardware: HardwareSpec,
    cluster: Cluster,
    workload: Workload,
    *,
    placement: str = "colocated",
    staleness: int = 0,
    rollout_gpus: int | None = None,
    rollout_hardware: HardwareSpec | None = None,
    partial_rollout: bool | None = None,
    recompute_logprobs: bool = True,
    stream: bool | None = False,
    pins: Mapping[str, object] | None = None,
    top: int = 10,
    calibration: dict[str, float] | None = None,
    allow_cross_node_tp: bool = False,
    min_headroom: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    colocated: SearchResult | None = None,
    rollout_memory: float | None = None,
    ahead: float | None = None,
    min_staleness: int = 0,
) -> PlacementResult:
    """The best plan of each placement asked for. ``colocated``: an already-run colocated SearchResult.
    ``rollout_memory``: the framework's own vLLM memory fraction for a separate rollout pool, which wins among
    engines that price the same (:func:`best_rollout`; None: the default framework's, :func:`rollout_memory_default`).
    ``recompute_logprobs``: the separate plans' (Placement.recompute_logprobs; not searched: it is the
    algorithm's choice, as the staleness is). ``stream``: the staleness-0 splits stream (True), run in sequence
    (False), or each takes the cheaper of the two (None; costmodel.streaming.cheaper_stream).
    ``ahead``: a launch's own run-ahead where it is a fraction (verl's fully-async ``staleness_threshold``,
    LaunchPlan.ahead): staleness ``ceil(ahead)`` is priced at it, as the launch itself is (tune keeps a user's
    fraction); every other staleness at its integer. ``min_staleness``: the smallest staleness searched (tune on a
    launch whose staleness the user did not ask to change searches only the launch's)."""
    from grpo_tune.autotune.search.driver import search

    t0 = time.perf_counter()
    pins = dict(pins or {})
    check_request(placement, staleness, rollout_gpus, partial_rollout, cluster, rollout_hardware)
    if workload.kind != "grpo" and placement != "colocated":
        raise ConfigError("separate pools are for GRPO (there is no rollout in pretraining)", hint="drop --placement")
    res = PlacementResult(best=None, stream=stream)  # type: ignore[arg-type]
    kw = _SearchKw(top=top, calibration=calibration, allow_cross_node_tp=allow_cross_node_tp, min_headroom=min_headroom)
    if placement in ("colocated", "auto"):
        res.colocated = colocated or search(model, hardware, cluster, workload, pins=pins, progress=progress, **kw)
    if placement == "separate" or (placement == "auto" and cluster.gpus >= 2):
        try:
            res.separate, res.splits, res.train_searches = _separate(
                model,
                hardware,
                cluster,
                workload,
                staleness,
                rollout_gpus,
                rollout_hardware,
                partial_rollout,
                pins,
                kw,
                colocated_train_s=_train_part(res.best_colocated),
                colocated_seeds=None if res.colocated is None else res.colocated.ranked,
                recompute_logprobs=recompute_logprobs,
                stream=stream,
                memory_default=rollout_memory,
                ahead=ahead,
                min_staleness=min_staleness,
            )
        except GrpoTuneError:
            if placement == "separate":
                raise
            res.separate = []  # auto: no separate plan fits; the colocated one stands
    cands = [e for e in (res.best_colocated, res.best_separate) if e is not None]
    if not cands:
        raise InvalidDegreesError(
            f"no separate-pool plan fits {model.name} on {cluster.gpus} GPUs", "try --placement colocated"
        )
    res.best = min(cands, key=lambda e: (e.step_s, 0 if not e.placement else 1))
    res.seconds = time.perf_counter() - t0
    return res


def _train_pins(pins: dict[str, object]) -> dict[str, object]:
    rollout = ("rollout_tp", "gpu_memory_utilization", "max_num_seqs", "enforce_eager", "free_cache_engine")
    return {**{k: v for k, v in pins.items() if k not in rollout}, **_TRAIN_PINS}


def _separate(
    m,
    hw,
    cluster,
    wl,
    K,
    pinned_r,
    hw_r,
    partial_flag,
    pins,
    kw,
    colocated_train_s=None,
    colocated_seeds=None,
    recompute_logprobs=True,
    stream=False,
    memory_default=None,
    ahead=None,
    min_staleness=0,
):
    from grpo_tune.autotune.search.driver import search

    hw_r = hw_r or hw
    cal = check_calibration(kw["calibration"])
    cands = [pinned_r] if pinned_r else CP.split_candidates(cluster)
    stale = range(min(min_staleness, K), K + 1)
    partial_for = {k: bool(partial_flag) and k >= 1 for k in stale}
    # a launch's fractional run-ahead prices its own staleness (ceil): that level is fed `ahead` batches, not k
    frac_k = math.ceil(ahead) if ahead is not None and ahead > 0 and not float(ahead).is_integer() else None

    def knobs_at(k: int) -> P.AsyncKnobs | None:
        """The launch's own knobs at its staleness (as LaunchPlan.async_knobs prices it); None: k's integer."""
        if k != frac_k:
            return None
        return P.AsyncKnobs(ahead=float(ahead), no_drain=partial_for[k])

    # 1. generation per split and staleness: the pool is a server fed k batches ahead (costmodel.pools.generation),
    # so k changes its concurrency only while the feed binds: beyond k_sat (where (1 + k) x its sequences per replica
    # reach the largest max_num_seqs of the grid) every k prices the same, and is computed once
    pool_of = {r: CP.pools(cluster, r) for r in cands}
    seq_cap = max([int(pins["max_num_seqs"])] if "max_num_seqs" in pins else list(ROLLOUT_SEQS_GRID))
    gens: dict[tuple[int, float], tuple[EngineOption, float] | None] = {}

    def gkey(r: int, k: int) -> tuple[int, float]:
        if k <= 0:
            return (r, 0)
        per = wl.prompts * wl.n / max(1, pool_of[r].rollout.gpus)  # the fewest sequences a replica gets (TP 1)
        k_sat = max(1, math.ceil(seq_cap / max(per, 1e-9)) - 1)
        kn = knobs_at(k)
        return (r, min(k if kn is None else kn.ahead, k_sat))

    def gen_of(r: int, k: int) -> tuple[EngineOption, float] | None:
        key = gkey(r, k)
        if key not in gens:
            kk = key[1]
            kn = P.AsyncKnobs(ahead=float(kk), no_drain=partial_for[k] and kk > 0)
            gens[key] = best_rollout(m, hw_r, pool_of[r].rollout, wl, pins, cal, partial_for[k], kn, memory_default)
        return gens[key]

    def wait_of(r: int, k: int) -> float:
        """The trainer's wait for its first fetch after a sync (costmodel.pools.first_fetch_wait): 0 at an
        integer staleness, the part a fraction's run-ahead does not hold at the launch's."""
        kn, g = knobs_at(k), gen_of(r, k)
        return 0.0 if kn is None or g is None else P.first_fetch_wait(g[1], kn)

    cands = [r for r in cands if any(gen_of(r, k) is not None for k in stale)]
    if not cands:
        raise InvalidDegreesError(
            f"no rollout pool of {m.name} fits on {cluster.gpus} x {hw_r.name}", "use more GPUs or a larger rollout TP"
        )
    # 2. the training pool: a full search at one size (the split the colocated plan's training time balances
    # best, else the middle one), its best plans repriced on every other pool size
    tpins = _train_pins(pins)
    tsearch: dict[tuple[int, int], SearchResult | None] = {}
    tkw = dict(kw, top=3, keep_layouts=TRAIN_KEEP_LAYOUTS, exact=TRAIN_EXACT)
    why: list[GrpoTuneError] = []  # why a training pool has no plan (said when no split has one)

    def full(r: int):
        tc = pool_of[r].train
        key = (tc.gpus, tc.gpus_per_node)
        if key not in tsearch:
            try:
                tsearch[key] = search(m, hw, tc, wl, pins=tpins, _price=P.train_pool, **tkw)
            except GrpoTuneError as exc:
                tsearch[key] = None
                why.append(exc)
        return tsearch[key]

    sync0 = _sync_proxy(m, hw, hw_r, pool_of, cal, cands, gen_of, stale)
    ref_r = _reference_split(cands, pool_of, gen_of, colocated_train_s, cluster, sync0, K)
    ref = full(ref_r)
    seeds = ([] if ref is None else ref.ranked[:REPRICE]) + list(colocated_seeds or [])[:REPRICE]
    work = None if ref is None else ref.best.step_s * pool_of[ref_r].train.gpus
    trains: dict[int, list[Estimate]] = {}

    def repriced(r: int, *, search_if_none: bool = False) -> list[Estimate]:
        tc = pool_of[r].train
        if r not in trains or (search_if_none and not trains[r] and (tc.gpus, tc.gpus_per_node) not in tsearch):
            if (tc.gpus, tc.gpus_per_node) in tsearch or search_if_none:
                f = full(r)
                got = [] if f is None else f.ranked[:3]
            else:
                got = _reprice(m, hw, tc, wl, seeds, kw["calibration"], kw["min_headroom"], kw["allow_cross_node_tp"])
            trains[r] = got
        return trains[r]

    def train_time(r: int) -> float:
        got = repriced(r)
        if got:
            return got[0].step_s or math.inf
        return math.inf if work is None else work / pool_of[r].train.gpus  # the work spread over the pool

    def stream_kw(r: int, g: float, t: float) -> StreamShape:
        # the split's units arrive as its best engine generates them; the training pool's serial part follows the
        # reference plan's phases (the repriced plans share its layout's proportions)
        got = gens[(r, False)]
        tr = repriced(r)
        if got is None or not tr or tr[0].time is None:
            return {}
        opt, _ = got
        rs = CP.rollout_strategy(_pool_base(pins, hw_r).replace(**opt))
        pl = CP.Placement(mode="separate", rollout_gpus=r, stream=True, recompute_logprobs=recompute_logprobs)
        phases = dict(tr[0].time.phases)
        if not recompute_logprobs:
            phases.pop("old_logprob", None)
        shape = P.stream_shape(m, hw_r, pool_of[r].rollout, rs, wl, cal, g, phases, t, pl, tr[0])
        if stream is None and shape and P.compose_step(g, t, 0.0, 0, **shape)["step_s"] > (g + t) * (1 + TIE_REL):
            return {}  # auto: in sequence (the stream's PP bubbles or a native pool's waves cost more than it overlaps)
        return shape

    splits = []
    keep: set[int] = set()
    _order0: list[tuple[float, int]] = []
    for k in stale:
        order = choose_split(
            cands,
            lambda r, k=k: math.inf if gen_of(r, k) is None else gen_of(r, k)[1],
            train_time if knobs_at(k) is None else (lambda r, k=k: train_time(r) + wait_of(r, k)),
            lambda r: sync0.get(r, 0.0),
            k,
            stream=stream_kw if stream is not False else None,
        )
        for step, r in order:
            splits.append({"rollout_gpus": r, "staleness": k, "step_s": step})
        keep.update(r for _, r in order[:KEEP_SPLITS])
        _order0 = order if k == K else _order0
    if pinned_r:
        keep = {pinned_r}
    if not keep:  # no split has a training plan (every pool's search failed): say why, as the colocated search does
        if why:
            raise GrpoTuneError(
                f"no training pool of a separate plan has a plan: {why[-1].message}", why[-1].hint, code=why[-1].code
            )
        raise InvalidDegreesError(
            f"no separate-pool plan fits {m.name} on {cluster.gpus} GPUs", "try --placement colocated"
        )
    # 3. exact: each kept split composed per staleness with its best training plans
    out: list[Estimate] = []
    if not any(repriced(r) for r in keep):  # none repriced: search the best kept split's pool in full
        best_r = (
            min(keep, key=lambda r: next((st for st, rr in _order0 if rr == r), math.inf)) if _order0 else min(keep)
        )
        repriced(best_r, search_if_none=True)
    for r in sorted(keep):
        # a kept split that no repriced plan fits (its pool's DP does not divide the batch, say) ranked on the
        # reference work spread over its GPUs: its own pool is searched in full before it is composed
        tr = repriced(r, search_if_none=True)
        for k in stale:
            g = gen_of(r, k)
            if g is None or not tr:
                continue
            opt, _ = g
            pl = CP.Placement(
                mode="separate",
                rollout_gpus=r,
                rollout_hardware=None if hw_r is hw else hw_r.name,
                staleness=k,
                partial_rollout=partial_for[k],
                recompute_logprobs=recompute_logprobs,
                stream=stream is not False and k == 0,
            )
            best_e = None
            for te in tr[:3]:

                def price(on: bool, te=te, pl=pl, opt=opt) -> Estimate:
                    return P.estimate_separate(
                        model=m,
                        hardware=hw,
                        cluster=cluster,
                        strategy=te.strategy.replace(**opt),
                        workload=wl,
                        placement=dataclasses.replace(pl, stream=on),
                        rollout_hardware=hw_r,
                        calibration=kw["calibration"],
                        train=te,
                        knobs=knobs_at(pl.staleness),
                    )

                try:
                    e = cheaper_stream(price) if stream is None and pl.stream else price(pl.stream)
                except GrpoTuneError:
                    continue
                if e.fits and (best_e is None or e.step_s < best_e.step_s):
                    best_e = e
            if best_e is not None:
                out.append(best_e)
    if not out:
        raise InvalidDegreesError(
            f"no separate-pool plan fits {m.name} on {cluster.gpus} GPUs", "try --placement colocated"
        )
    out.sort(key=_rank)
    return out, splits, len([v for v in tsearch.values() if v is not None])


def _reprice(
    m, hw, tc: Cluster, wl, seeds: list[Estimate], calibration, min_headroom: float, allow_cross_node_tp: bool = False
) -> list[Estimate]:
    """The reference search's best training plans on another pool size (dp follows the GPUs), fastest first: only
    those whose degrees the search itself would propose on that pool (a TP group within one of its nodes, the
    rules megatron shares with the trainer)."""
    from grpo_tune.core.strategy import validate
    from grpo_tune.core.support import check_plan

    out, seen = [], set()
    margin = min_headroom * hw.rank_memory_bytes(tc.ranks_per_node)
    for e in seeds:
        s = e.strategy.replace(dp=None)
        if s in seen:
            continue
        seen.add(s)
        try:
            s = validate(m, s, tc.gpus, gpus_per_node=tc.gpus_per_node, allow_cross_node_tp=allow_cross_node_tp)
        except GrpoTuneError:
            continue
        if check_plan(m, s, workload=wl):
            continue
        try:
            t = P.train_pool(model=m, hardware=hw, cluster=tc, strategy=s, workload=wl, calibration=calibration)
        except GrpoTuneError:
            continue
        if t.fits and t.headroom_bytes >= margin and not any(v.code == "BATCH_DIVISIBILITY" for v in t.violations):
            out.append(t)
    out.sort(key=lambda t: t.step_s or math.inf)
    return out


def _rank(e: Estimate) -> tuple[float, int, int]:
    """Step (steps within TIE are equal), then the smaller staleness, then the larger training pool."""
    step = e.step_s or math.inf
    bucket = round(math.log(step) / math.log1p(TIE)) if step > 0 and math.isfinite(step) else 10**9
    f = e.placement
    assert f is not None, "ranked among separate-pool plans"
    return (bucket, int(f["staleness"]), int(f["rollout_gpus"]))


def _reference_split(cands, pool_of, gen_of, colocated_train_s, cluster, sync0, K) -> int:
    """The split whose training pool is searched in full: the one the colocated plan's training time (spread
    over the training pool's GPUs) balances best at staleness K; without it, the middle candidate."""
    ok = [r for r in cands if gen_of(r, K) is not None] or cands
    if colocated_train_s is None:
        return ok[len(ok) // 2]
    work = colocated_train_s * cluster.gpus
    order = choose_split(
        ok,
        lambda r: gen_of(r, K)[1] if gen_of(r, K) else math.inf,
        lambda r: work / pool_of[r].train.gpus,
        lambda r: sync0.get(r, 0.0),
        K,
    )
    return order[0][1] if order else ok[len(ok) // 2]


def _sync_proxy(m, hw, hw_r, pool_of, cal, cands, gen_of, stale) -> dict[int, float]:
    """The sync's transfer + copy + per-tensor parts per split (the training side's export is left out:
    it depends on the training plan, not on the split)."""
    out = {}
    for r in cands:
        g = next((v for v in (gen_of(r, k) for k in stale) if v), None)
        if g is None:
            continue
        s = Strategy.of(rollout_tp=g[0]["rollout_tp"])
        sy = WS.cross_pool_sync(m, hw, hw_r, pool_of[r], s, cal)
        out[r] = sy["sync_s"] - sy["export_s"]
    return out


def _train_part(e: Estimate | None) -> float | None:
    """Seconds of a colocated plan's training-pool phases (the log-prob passes, the update, offload)."""
    if e is None or e.time is None:
        return None
    return sum(e.time.phases.get(k, 0.0) for k in P.TRAIN_PHASES)
