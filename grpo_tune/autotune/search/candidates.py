"""The candidate space of :func:`autotune.search.search`: layouts, train options, rollout options.

Generation yields only plans that :func:`core.strategy.validate` accepts (and that satisfy
verl's batch rules): the space is built from divisors, never filtered from a product.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator, Mapping, TypedDict, TypeVar

from grpo_tune.core.errors import InvalidDegreesError
from grpo_tune.core.hardware import NATIVE_ENGINE, plan_engine
from grpo_tune.core.knobs import knob, knobs, names
from grpo_tune.core.rules import check_batches, check_log_prob_batches, within_node
from grpo_tune.core.specs import HardwareSpec, ModelSpec
from grpo_tune.core.strategy import RECOMPUTE, Cluster, Strategy, Workload, divisors, validate
from grpo_tune.core.support import check_plan
from grpo_tune.costmodel.params import total_params

GMU_GRID = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""vLLM memory fractions tried; verl's perf guide suggests 0.5-0.7 without offload, 0.8-0.9 with."""
CAP_FACTORS = (1, 2, 4)
"""Dynamic-batching caps searched, in multiples of the longest sequence."""
MAX_NUM_SEQS_GRID = knob("max_num_seqs").values
"""vLLM max_num_seqs searched (the knob table's grid): verl's default and vLLM's own (V1, H100-class) default."""
MAX_MBS = 16
OFFLOAD_SETS: tuple[tuple[str, ...], ...] = ((), ("optimizer",), ("param", "grad"), ("param", "grad", "optimizer"))
"""Offload sets verl 0.9.1 can express: its ``param_offload`` frees parameters and gradient buffers
together and it has no ``grad_offload`` (verl_091_facts.md; frameworks/verl/table.py ``_offload_write``),
so param-only and grad-only sets would be priced but never run."""

CP_MIN_TOKENS = 4096
"""Tokens of one sequence each context-parallel rank must keep for search to propose CP > 1 (unpinned)."""

PASS_THROUGH = ("pinned", "grid")
"""The knobs' search roles whose pins reach every plan as given (the space generates the rest itself)."""

LAYOUT_KEYS = ("tp", "pp", "first_stage_layers", "last_stage_layers", "vpp", "cp", "ep", "etp")


class Degrees(TypedDict):
    """One layout of the space (``LAYOUT_KEYS``): the parallel degrees and the stage split, as
    ``Strategy.of`` takes them."""

    tp: int
    pp: int
    first_stage_layers: int | None
    last_stage_layers: int | None
    vpp: int
    cp: int
    ep: int
    etp: int | None


Knobs = dict[str, object]
"""Part of a plan by knob name (core/knobs.py), as ``Strategy.of`` takes it: a layout's train options
(micro-batches, recompute, optimizer, offload) or the rollout engine's grid knobs."""
Roll = tuple[int, float, Knobs]
"""One rollout option: (rollout_tp, gpu_memory_utilization, the engine's grid knobs)."""

_T = TypeVar("_T")
_AUTO: dict[str, tuple[object, ...]] = {k.name: k.pin.auto for k in knobs() if k.pin.auto}
"""Knobs whose pin ``auto`` searches a set of values (core/knobs.py Pin.auto): the rollout engine."""


def pinned(pins: Mapping[str, object], key: str, kind: type[_T]) -> _T | None:
    """The pinned value of ``key`` (the CLI's pin rules gave it the knob's type), None when unpinned."""
    v = pins.get(key)
    assert v is None or isinstance(v, kind), f"pin {key}={v!r} is not {kind.__name__}"
    return v


def pinned_number(pins: Mapping[str, object], key: str) -> float | None:
    """The pinned number of ``key`` (an int or a float, as given), None when unpinned."""
    v = pins.get(key)
    assert v is None or isinstance(v, (int, float)), f"pin {key}={v!r} is not a number"
    return v


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
    pins: dict[str, object] = field(default_factory=dict)
    allow_cross_node_tp: bool = False
    gmu_grid: tuple[float, ...] = GMU_GRID
    cpu_grid: tuple[float | None, ...] = (None,)
    """CPU-optimizer fractions searched when unpinned; search() adds 1.0 when a layout needs it to fit."""

    # -- layouts ---------------------------------------------------------------------------
    def _choices(self, key: str, default: list[_T]) -> list[_T]:
        """The pinned value of ``key`` alone (the CLI's pin rules gave it the knob's type), else ``default``; a pin
        ``auto`` of a knob whose row lists what auto searches (``--rollout-engine auto``) is those values."""
        if key not in self.pins:
            return default
        v = self.pins[key]
        if v == "auto" and key in _AUTO:
            return list(_AUTO[key])  # type: ignore[arg-type]
        return [v]  # type: ignore[list-item]

    def _pin(self, key: str, kind: type[_T]) -> _T | None:
        return pinned(self.pins, key, kind)

    def _pin_number(self, key: str) -> float | None:
        return pinned_number(self.pins, key)

    def layouts(self) -> list[Degrees]:
        m, gpus, gpn = self.model, self.cluster.gpus, self.cluster.gpus_per_node
        kv = m.heads if m.is_mla else m.kv_heads
        tps = [t for t in divisors(math.gcd(m.heads, kv)) if gpus % t == 0 and (t <= gpn or self.allow_cross_node_tp)]
        seq = self.workload.train_seq_len
        out = []
        for tp in self._choices("tp", tps):
            for pp in self._choices("pp", divisors(gpus // tp) if gpus % tp == 0 else []):
                if "first_stage_layers" in self.pins or "last_stage_layers" in self.pins:
                    splits = [(self._pin("first_stage_layers", int), self._pin("last_stage_layers", int))]
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
                        cps = (
                            [
                                c
                                for c in divisors(gpus // (tp * pp))
                                if c == 1 or (seq % (2 * c) == 0 and ("cp" in self.pins or seq // c >= CP_MIN_TOKENS))
                            ]
                            if gpus % (tp * pp) == 0
                            else []
                        )
                        for cp in self._choices("cp", cps):
                            if gpus % (tp * pp * cp):
                                continue
                            dp = gpus // (tp * pp * cp)
                            if not self._batch_ok(dp):
                                continue
                            for ep, etp in self._experts(tp, cp, dp):
                                out.append(
                                    Degrees(
                                        tp=tp,
                                        pp=pp,
                                        first_stage_layers=first,
                                        last_stage_layers=last,
                                        vpp=vpp,
                                        cp=cp,
                                        ep=ep,
                                        etp=etp,
                                    )
                                )
        # A layout with no micro-batch that divides its per-DP batch (a pinned --mbs), or whose batch a pinned
        # --log-prob-mbs does not split with dynamic batching off, has no plan.
        return [lay for lay in out if self._valid_layout(lay) and self.batch_options(lay)]

    def _experts(self, tp: int, cp: int, dp: int) -> list[tuple[int, int | None]]:
        m = self.model
        if not m.is_moe:
            etp = self.pins.get("etp")
            if self.pins.get("ep", 1) != 1 or (etp is not None and etp != tp):
                return []
            return [(1, None)]
        out: list[tuple[int, int | None]] = []
        # Megatron's MoE parallel folding: ep*etp must divide tp*cp*dp.
        for ep in self._choices("ep", divisors(m.experts)):
            for etp in self._choices("etp", divisors(tp)):
                if (tp * cp * dp) % (ep * etp) == 0:
                    out.append((ep, etp))
        return out

    def _batch_ok(self, dp: int) -> bool:
        # verl normalizes the mini-batch per DP rank (core/rules.py holds the rule).
        return not check_batches(self.workload, dp=dp)

    def _valid_layout(self, lay: Degrees) -> bool:
        try:
            validate(
                self.model,
                Strategy.of(**lay),
                self.cluster.gpus,
                gpus_per_node=self.cluster.gpus_per_node,
                allow_cross_node_tp=self.allow_cross_node_tp,
            )
        except InvalidDegreesError:
            return False
        return True

    # -- train options ---------------------------------------------------------------------
    def sequences_per_dp(self, lay: Degrees) -> int:
        dp = self.cluster.gpus // (lay["tp"] * lay["pp"] * lay["cp"])
        wl = self.workload
        return (wl.mini_batch * wl.n if wl.kind == "grpo" else wl.gbs) // dp

    def mbs_options(self, lay: Degrees) -> list[int]:
        per = self.sequences_per_dp(lay)
        opts = [b for b in range(1, min(per, MAX_MBS) + 1) if per % b == 0]
        # megatron's refusals shared with the trainer (core/support.py), e.g. the interleaving rule per mbs
        dp = self.cluster.gpus // (lay["tp"] * lay["pp"] * lay["cp"])
        opts = [b for b in opts if _plan_ok(self.model, self.workload, tuple(sorted(lay.items())), b, dp)]
        pinned = self._pin("mbs", int)
        if pinned is not None:
            return [pinned] if per and per % pinned == 0 else []
        return opts

    def recompute_options(self) -> list[str]:
        return self._choices("recompute", list(RECOMPUTE))

    def offload_options(self) -> list[tuple[str, ...]]:
        # where the ranks compute in the host's RAM (the cpu profile) offloading frees nothing: only if pinned
        return self._choices("offload", [()] if self.hardware.memory_is_host else list(OFFLOAD_SETS))

    def dist_opt_options(self) -> list[bool]:
        # The distributed optimizer moves the same bytes as a DP all-reduce (reduce-scatter +
        # all-gather; Megatron-LM docs/distrib_optimizer.md) and shards the optimizer state, so
        # it is always on unless the user pins it off.
        return self._choices("distributed_optimizer", [True])

    def cap_options(self) -> list[int]:
        """Dynamic-batching token caps (verl's ppo_max_token_len_per_gpu): 1, 2 and 4 x the longest
        sequence (verl asserts the cap holds it), or the pinned cap; none when pinned off."""
        if "max_tokens_per_gpu" in self.pins:
            cap = self._pin("max_tokens_per_gpu", int)
            return [cap] if cap else []
        if self.workload.kind != "grpo":
            return []
        return [k * self.workload.train_seq_len for k in CAP_FACTORS]

    def batch_options(self, lay: Degrees) -> list[Knobs]:
        """Fixed micro-batches (``mbs``) and dynamic batching (a token cap, mbs unused)."""
        mbs = self.mbs_options(lay)
        if not mbs:
            return []
        fixed: list[Knobs] = (
            [] if self.pins.get("max_tokens_per_gpu") or not self._log_prob_ok(lay) else [dict(mbs=b) for b in mbs]
        )
        return fixed + [dict(mbs=min(mbs), max_tokens_per_gpu=c) for c in self.cap_options()]

    def _log_prob_ok(self, lay: Degrees) -> bool:
        """A pinned log-prob micro-batch splits this layout's log-prob batch (verl asserts it with a fixed
        micro-batch; dynamic batching does not use it)."""
        lp = self._pin("log_prob_mbs", int)
        dp = self.cluster.gpus // (lay["tp"] * lay["pp"] * lay["cp"])
        return lp is None or not check_log_prob_batches(
            self.workload, dp=dp, log_prob_mbs=lp, pp=lay["pp"], vpp=lay["vpp"]
        )

    def cpu_options(self) -> list[float | None]:
        """Megatron's hybrid CPU optimizer: pinned, or off plus all-on when memory needs it (``cpu_grid``)."""
        if "cpu_optimizer" in self.pins:
            return [self._pin_number("cpu_optimizer")]
        return list(self.cpu_grid)

    def extra_options(self) -> list[tuple[tuple[str, ...], float | None]]:
        """(offload set, CPU-optimizer fraction) pairs."""
        return [(o, c) for o in self.offload_options() for c in self.cpu_options()]

    @property
    def native(self) -> bool:
        """The plans of this space sample with the trainer's own model: the pinned engine, or the platform's
        default (core.hardware.plan_engine: ``cpu``)."""
        return plan_engine(self.pins, self.hardware) == NATIVE_ENGINE

    def engine_options(self) -> list[Knobs]:
        """The knob table's grids (core/knobs.py), each pinned or tried in full: vLLM's max_num_seqs and
        eager mode (CUDA graphs cost memory, eager costs time per step). Without vLLM (the CPU trainer samples
        with Megatron, or a plain pretraining step) the rollout engine's grids change nothing and are not tried."""
        vllm = self.workload.kind == "grpo" and not self.native
        rows = [k for k in knobs(search="grid") if vllm or k.concern != "rollout"]
        if not rows:
            return [{}]
        grids = [self._choices(k.name, list(k.values)) for k in rows]
        return [dict(zip((k.name for k in rows), combo)) for combo in itertools.product(*grids)]

    def train_options(self, lay: Degrees) -> list[Knobs]:
        return [
            dict(**b, recompute=r, distributed_optimizer=d, **_extra(x))
            for b in self.batch_options(lay)
            for r in self.recompute_options()
            for d in self.dist_opt_options()
            for x in self.extra_options()
        ]

    # -- rollout options -------------------------------------------------------------------
    def rollout_options(self) -> list[tuple[int, float]]:
        m, gpus, gpn = self.model, self.cluster.gpus, self.cluster.gpus_per_node
        kv = m.heads if m.is_mla else m.kv_heads
        weights = 2 * total_params(m)  # bf16 rollout weights
        gmus = self._choices("gpu_memory_utilization", list(self.gmu_grid))
        if self.workload.kind != "grpo":  # plain pretraining has no rollout: one placeholder option
            return [(self._pin("rollout_tp", int) or 1, self._pin_number("gpu_memory_utilization") or 0.6)]
        ok = [t for t in divisors(gpus) if m.heads % t == 0 and (kv % t == 0 or t % kv == 0)]
        fit = [t for t in ok if weights / t < max(gmus) * self.hardware.hbm_bytes]
        if "rollout_tp" in self.pins:
            pinned = self._pin("rollout_tp", int)
            rtps = [pinned] if pinned in ok else []
        else:
            # vLLM TP within a node, unless the weights only fit across nodes; when they fit
            # nowhere, keep the largest TP so that the estimate says which phase overflows.
            rtps = [t for t in fit if within_node(t, gpus, gpn) or self.allow_cross_node_tp] or fit[:2] or ok[-1:]
        pairs = [(t, g) for t in rtps for g in gmus if weights / t < g * self.hardware.hbm_bytes]
        return pairs or [(t, max(gmus)) for t in rtps]

    def rolls(self) -> list[Roll]:
        """Every rollout option: (rollout_tp, gpu_memory_utilization, engine knobs)."""
        return [(t, g, eng) for t, g in self.rollout_options() for eng in self.engine_options()]

    def strategy(self, lay: Degrees, opt: Knobs, roll: Roll | tuple[int, float]) -> Strategy:
        eng: Knobs = roll[2] if len(roll) > 2 else {}
        # the pins of every knob the space does not generate pass through (core/knobs.py: "pinned", "grid")
        fixed = {
            k: self.pins[k] for k in names(search=PASS_THROUGH) if k in self.pins and k not in opt and k not in eng
        }
        if self.native and "engine" not in eng and "engine" not in fixed:
            eng = {**eng, "engine": NATIVE_ENGINE}
        return Strategy.of(**lay, **opt, **fixed, **eng, rollout_tp=roll[0], gpu_memory_utilization=roll[1])

    def candidate_count(self, layouts: list[Degrees] | None = None) -> int:
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
    return not check_plan(model, Strategy.of(**dict(lay), mbs=mbs, dp=dp), workload=workload)


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


def _extra(x: tuple[tuple[str, ...], float | None]) -> Knobs:
    """Strategy fields of an (offload, CPU-optimizer) option; the CPU optimizer as verl's examples
    run it (copies overlapped, precision-aware Adam)."""
    o, c = x
    if c is None:
        return dict(offload=o)
    return dict(offload=o, cpu_optimizer=c, overlap_cpu_optimizer=True, precision_aware_optimizer=True)
