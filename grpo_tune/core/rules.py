"""The degree and batch rules, written once: each returns findings instead of raising.

Callers decide what a finding means: :func:`core.strategy.validate` raises the first error as
:class:`~core.errors.InvalidDegreesError`, the trainer's preflight raises the first batch error,
search drops a candidate with any error, and diagnose reports them all.

Sources: megatron-core's ``parallel_state.initialize_model_parallel`` (world size = tp*pp*cp*dp;
MoE parallel folding, ep*etp dividing tp*cp*dp, arXiv 2504.14960), megatron-core's interleaved
schedule in ``pipeline_parallel/schedules.py`` (micro-batches a multiple of pp), verl 0.9.1's
actor config (``ppo_mini_batch_size`` counts prompts, is multiplied by ``rollout.n`` and divided by
the DP size, then split into ``ppo_micro_batch_size_per_gpu`` micro-batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from .errors import GrpoTuneError

if TYPE_CHECKING:  # annotations only: core/strategy.py imports this module
    from .specs import ModelSpec
    from .strategy import Strategy, Workload


class Severity(StrEnum):
    """How bad a finding is, most severe first."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One broken rule: a stable code (core/errors.py CODES), what is wrong and what to do."""

    code: str
    message: str
    hint: str = ""
    severity: Severity = Severity.ERROR

    def to_error(self) -> GrpoTuneError:
        """The coded error a caller that stops at this finding raises."""
        return GrpoTuneError(self.message, hint=self.hint, code=self.code)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.ERROR]


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, by trial division up to sqrt(n) (a billion GPUs: 31,623 steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def within_node(tp: int, gpus: int, gpus_per_node: int) -> bool:
    """Every group of ``tp`` consecutive ranks of ``gpus`` lies on one node of ``gpus_per_node``: ranks fill a node
    before the next (torchrun, Slurm, verl's Ray pools) and TP groups are consecutive ranks, so on more than one
    node ``tp`` must divide the node."""
    return tp <= gpus_per_node and (gpus <= gpus_per_node or gpus_per_node % tp == 0)


def _err(message: str, hint: str = "", code: str = "INVALID_DEGREES") -> Finding:
    return Finding(code, message, hint)


def check_degrees(
    model: ModelSpec, s: Strategy, gpus: int, *, gpus_per_node: int | None = None, allow_cross_node_tp: bool = False
) -> list[Finding]:
    """Every reason the degrees of ``s`` cannot exist for ``model`` on ``gpus`` GPUs, in a fixed order.

    Codes: ``INVALID_DEGREES``, ``EXPERT_IMBALANCE`` (ep does not divide the experts) and
    ``EXPERT_DEGREES`` (ep*etp does not divide tp*cp*dp). A check that needs an earlier one to
    hold (dp needs tp*pp*cp to divide the GPUs) is skipped when that one failed.
    """
    lay = s.layout
    eng = s.rollout
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        return [_err(f"GPU count must be a positive integer, got {gpus!r}")]
    out: list[Finding] = []
    mp = lay.tp * lay.pp * lay.cp
    dp: int | None = None
    if gpus % mp:
        out.append(
            _err(
                f"tp*pp*cp = {lay.tp}*{lay.pp}*{lay.cp} = {mp} does not divide {gpus} GPUs",
                "choose degrees whose product divides the GPU count",
            )
        )
    else:
        dp = gpus // mp
        if lay.dp is not None and lay.dp != dp:
            out.append(
                _err(
                    f"tp*pp*cp*dp = {mp * lay.dp} differs from the {gpus} GPUs",
                    f"with tp={lay.tp} pp={lay.pp} cp={lay.cp}, dp must be {dp}",
                )
            )
    if model.heads % lay.tp:
        out.append(
            _err(
                f"tp={lay.tp} does not divide the {model.heads} attention heads of {model.name}",
                f"use a tp among {', '.join(map(str, divisors(model.heads)))}",
            )
        )
    kv = model.heads if model.is_mla else model.kv_heads
    if kv % lay.tp:
        out.append(
            _err(
                f"tp={lay.tp} does not divide the {kv} key/value heads of {model.name} "
                "(Megatron splits query groups evenly)",
                f"use a tp among {', '.join(map(str, divisors(kv)))}",
            )
        )
    if gpus_per_node and lay.tp > gpus_per_node and not allow_cross_node_tp:
        out.append(
            _err(
                f"tp={lay.tp} spans nodes of {gpus_per_node} GPUs",
                "keep tp <= GPUs per node, or allow it explicitly",
            )
        )
    elif gpus_per_node and not within_node(lay.tp, gpus, gpus_per_node) and not allow_cross_node_tp:
        out.append(
            _err(
                f"tp={lay.tp} does not divide the {gpus_per_node} GPUs per node: a TP group would span two nodes",
                f"use a tp among {', '.join(map(str, divisors(gpus_per_node)))}, or allow it explicitly",
            )
        )
    out += _check_stages(model, s)
    etp = lay.etp_
    if model.is_moe:
        if model.experts % lay.ep:
            out.append(
                _err(
                    f"ep={lay.ep} does not divide the {model.experts} experts of {model.name}",
                    f"use an ep among {', '.join(map(str, divisors(model.experts)))}",
                    "EXPERT_IMBALANCE",
                )
            )
        if dp is not None and (lay.tp * lay.cp * dp) % (lay.ep * etp):
            out.append(
                _err(
                    f"ep*etp = {lay.ep}*{etp} does not divide tp*cp*dp = {lay.tp * lay.cp * dp} "
                    "(Megatron's MoE parallel folding)",
                    "lower ep or etp",
                    "EXPERT_DEGREES",
                )
            )
    elif lay.ep > 1 or (lay.etp is not None and lay.etp != lay.tp):
        out.append(_err(f"{model.name} is dense: ep/etp apply to MoE models only"))
    if gpus % eng.rollout_tp:
        out.append(_err(f"rollout_tp={eng.rollout_tp} does not divide {gpus} GPUs"))
    if model.heads % eng.rollout_tp:
        out.append(_err(f"rollout_tp={eng.rollout_tp} does not divide the {model.heads} attention heads"))
    if kv % eng.rollout_tp and eng.rollout_tp % kv:
        out.append(_err(f"rollout_tp={eng.rollout_tp} neither divides nor is a multiple of the {kv} KV heads"))
    return out


def stage_layers(model: ModelSpec, s: Strategy) -> list[int]:
    """Layers on each pipeline stage (Megatron's uneven first/last stage rule)."""
    lay = s.layout
    if lay.pp == 1:
        return [model.layers]
    first, last = lay.first_stage_layers, lay.last_stage_layers
    if first is None and last is None:
        return [model.layers // lay.pp] * lay.pp
    middle = lay.pp - (first is not None) - (last is not None)
    rest = model.layers - (first or 0) - (last or 0)
    per = rest // middle if middle else 0
    out = [per] * lay.pp
    if first is not None:
        out[0] = first
    if last is not None:
        out[-1] = last
    return out


def _check_stages(model: ModelSpec, s: Strategy) -> list[Finding]:
    """Pipeline stages: uneven first/last stages, pp dividing the layers, vpp dividing each stage."""
    lay = s.layout
    out: list[Finding] = []
    if lay.first_stage_layers is not None or lay.last_stage_layers is not None:
        if lay.pp == 1:
            out.append(_err("uneven first/last stage layers need pp > 1"))
        else:
            stages = stage_layers(model, s)
            middle = lay.pp - (lay.first_stage_layers is not None) - (lay.last_stage_layers is not None)
            rest = model.layers - (lay.first_stage_layers or 0) - (lay.last_stage_layers or 0)
            if rest < 0 or (middle and rest % middle) or (not middle and rest) or min(stages) < 1:
                out.append(
                    _err(
                        f"first/last stage layers ({lay.first_stage_layers}/{lay.last_stage_layers}) leave "
                        f"{rest} layers that do not split evenly over {middle} middle stages of "
                        f"{model.name}'s {model.layers}"
                    )
                )
    elif model.layers % lay.pp:
        out.append(
            _err(
                f"pp={lay.pp} does not divide the {model.layers} layers of {model.name}",
                "use --first-stage-layers/--last-stage-layers for uneven stages, or another pp",
            )
        )
    if lay.vpp > 1:
        if lay.pp == 1:
            out.append(_err("vpp > 1 needs pp > 1"))
        else:
            stages = stage_layers(model, s)
            if any(n % lay.vpp for n in stages):
                out.append(_err(f"vpp={lay.vpp} does not divide the layers per stage {stages}"))
    return out


def micro_batches(sequences: int, *, dp: int, mbs: int) -> int:
    """Micro-batches each DP rank runs for ``sequences`` sequences (at least one; the last may be short)."""
    return max(1, -(-sequences // (dp * mbs)))


def check_batches(w: Workload, *, dp: int, mbs: int | None = None, pp: int = 1, vpp: int = 1) -> list[Finding]:
    """Every reason the workload's batches do not split over ``dp`` ranks (and ``mbs``-sequence micro-batches).

    GRPO (verl): the mini-batch's ``mini_batch * n`` sequences split over dp ranks (and then into
    micro-batches of ``mbs``), and so do the step's ``prompts * n``. Pretraining: the global batch.
    With ``vpp > 1`` megatron-core's interleaved schedule needs the micro-batches per mini-batch
    to be a multiple of pp. Code: ``BATCH_DIVISIBILITY``.
    """
    code = "BATCH_DIVISIBILITY"
    out: list[Finding] = []
    if w.kind == "grpo":
        mini = w.mini_batch * w.n
        if mbs is not None and mini % (dp * mbs):
            out.append(
                Finding(
                    code,
                    f"a mini-batch of {w.mini_batch} prompts x n={w.n} = {mini} sequences "
                    f"does not split over dp={dp} x mbs={mbs}",
                    "choose mini_batch * n divisible by dp * mbs",
                )
            )
        elif mbs is None and mini % dp:
            out.append(
                Finding(
                    code,
                    f"a mini-batch of {w.mini_batch} prompts x n={w.n} = {mini} sequences does not split over dp={dp}",
                    "choose mini_batch * n divisible by dp",
                )
            )
        if (w.prompts * w.n) % dp:
            out.append(
                Finding(
                    code,
                    f"a step's {w.prompts} prompts x n={w.n} = {w.prompts * w.n} sequences do not split over dp={dp}",
                    "choose prompts * n divisible by dp",
                )
            )
    else:
        mini = w.gbs
        if w.gbs % (dp * (mbs or 1)):
            out.append(
                Finding(
                    code,
                    f"the global batch of {w.gbs} sequences does not split over dp={dp}"
                    + (f" x mbs={mbs}" if mbs else ""),
                    "choose gbs divisible by dp * mbs",
                )
            )
    if vpp > 1 and mbs is not None and not out:
        # megatron-core's interleaved schedule (schedules.py): micro-batches >= pp, and the remainder
        # modulo the group size (= pp) must be 0 or >= pp, i.e. 0.
        k = mini // (dp * mbs)
        if k < pp or k % pp:
            out.append(
                Finding(
                    code,
                    f"vpp={vpp} needs micro-batches per mini-batch ({k}) to be a multiple of pp={pp}",
                    "raise mini_batch or lower mbs",
                )
            )
    return out


def check_log_prob_batches(w: Workload, *, dp: int, log_prob_mbs: int, pp: int = 1, vpp: int = 1) -> list[Finding]:
    """Every reason the log-prob passes' batch does not split into ``log_prob_mbs``-sequence micro-batches.

    verl 0.9.1 runs old and ref log-probs on the whole step batch of a DP rank, ``prompts * n / dp``
    sequences (engine_workers.py ``infer_batch``); ``prepare_micro_batches`` (workers/engine/utils.py)
    asserts that count divisible by ``micro_batch_size_per_gpu``, and the Megatron engine
    (transformer_impl.py) asserts the micro-batch count divisible by ``microbatch_group_size_per_vp_stage``
    (megatron-core's default: pp) with ``vpp > 1``. Only for a fixed micro-batch (no token cap).
    With ``log_prob_mbs == mbs`` :func:`check_batches` implies both. Code: ``BATCH_DIVISIBILITY``.
    """
    if w.kind != "grpo" or (w.prompts * w.n) % dp:
        return []  # check_batches reports the DP split
    per_rank = w.prompts * w.n // dp
    if per_rank % log_prob_mbs:
        return [
            Finding(
                "BATCH_DIVISIBILITY",
                f"a step's {per_rank} sequences per DP rank (prompts x n / dp={dp}) do not split "
                f"into log-prob micro-batches of {log_prob_mbs}",
                "choose a log-prob micro-batch that divides prompts * n / dp",
            )
        ]
    k = per_rank // log_prob_mbs
    if vpp > 1 and k % pp:
        return [
            Finding(
                "BATCH_DIVISIBILITY",
                f"vpp={vpp} needs the log-prob micro-batches per DP rank ({k}) to be a multiple of pp={pp}",
                "choose a log-prob micro-batch that leaves a multiple of pp micro-batches",
            )
        ]
    return []


def check_lengths(model: ModelSpec, w: Workload) -> list[Finding]:
    """A sequence longer than the model's positions (HF ``max_position_embeddings``): a GRPO prompt + response,
    or a pretraining ``seq_len``. Positions past it were never trained (the GRPO trainer refuses them), so search
    and estimate refuse them too. Code: ``BAD_CONFIG``."""
    if w.kind == "grpo":
        longest = w.prompt_len + w.response_len
        what, flags = (
            f"prompt_len + response_len = {longest}",
            "the prompt / response lengths (--prompt-len, --response-len)",
        )
        together = " together"
    else:
        longest = w.seq_len
        what, flags, together = f"seq_len = {longest}", "the sequence length (--seq-len)", ""
    if longest <= model.max_seq_len:
        return []
    return [
        Finding(
            "BAD_CONFIG",
            f"{what} exceeds {model.name}'s max_seq_len {model.max_seq_len}",
            f"shorten {flags} to at most {model.max_seq_len} tokens{together}, or give the model more positions "
            "(a config.json with a larger max_position_embeddings; in a verl launch "
            "+actor_rollout_ref.model.override_config.max_position_embeddings=N, in a NeMo-RL recipe "
            "policy.hf_config_overrides.max_position_embeddings: N)",
        )
    ]
