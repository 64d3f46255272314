"""Bounds on the numbers a user can hand grpo-tune: a count far past any real cluster or batch is refused with a
code and a hint before anything walks it (``rules.divisors`` walks to the square root of a GPU count; 2**40 GPUs
took 12.7 s, 2**63 minutes).

Each bound sits orders of magnitude above what is run today, so that no real launch meets it: the largest
published GPU clusters hold ~10**5 GPUs, a node ~10**2, a GRPO step ~10**4 prompts, a context window ~10**6 tokens.
The same bounds hold for command-line flags, verl launches and NeMo-RL recipes: the flags through the CLI's integer
type, launches and recipes through :class:`~grpo_tune.core.strategy.Cluster` and the workload's checks.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ConfigError

MAX_GPUS = 1 << 20
"""GPUs in one run (1,048,576)."""
MAX_GPUS_PER_NODE = 1 << 10
"""GPUs (or ranks) per node (1,024)."""
MAX_BATCH = 1 << 24
"""Prompts, responses per prompt, mini-batches, micro-batches, sequences in flight (16,777,216)."""
MAX_TOKENS = 1 << 26
"""Tokens of a prompt, a response, a sequence, a micro-batch (67,108,864)."""
MAX_STEPS = 1 << 30
"""Epochs, trials, steps (1,073,741,824)."""
MAX_INT = 1 << 40
"""Any other integer flag (bucket sizes in MB, seeds, ...): 2**40."""

BY_FLAG: dict[str, int] = {
    "gpus": MAX_GPUS,
    "rollout_gpus": MAX_GPUS,
    "nproc": MAX_GPUS,
    "nodes": MAX_GPUS,
    "nnodes": MAX_GPUS,
    "gpus_per_node": MAX_GPUS_PER_NODE,
    "nproc_per_node": MAX_GPUS_PER_NODE,
    "rollout_gpus_per_node": MAX_GPUS_PER_NODE,
    "tp": MAX_GPUS,
    "pp": MAX_GPUS,
    "vpp": MAX_GPUS,
    "cp": MAX_GPUS,
    "ep": MAX_GPUS,
    "etp": MAX_GPUS,
    "rollout_tp": MAX_GPUS,
    "prompts": MAX_BATCH,
    "n": MAX_BATCH,
    "mini_batch": MAX_BATCH,
    "gbs": MAX_BATCH,
    "mbs": MAX_BATCH,
    "log_prob_mbs": MAX_BATCH,
    "max_num_seqs": MAX_BATCH,
    "prompt_len": MAX_TOKENS,
    "response_len": MAX_TOKENS,
    "prompt_len_mean": MAX_TOKENS,
    "response_len_mean": MAX_TOKENS,
    "seq_len": MAX_TOKENS,
    "max_tokens_per_gpu": MAX_TOKENS,
    "ppo_epochs": MAX_STEPS,
    "trials": MAX_STEPS,
    "trial_steps": MAX_STEPS,
    "steps": MAX_STEPS,
}
"""A command-line option's parameter name -> its bound (others: :data:`MAX_INT`)."""
OWN_CHECK = frozenset({"top", "warmup", "seq_len"})
"""Options refused by a check of their own before any work, with a sharper message (``--top`` between 1 and 1,000;
``--warmup`` against the log's steps; ``--seq-len`` against the model's positions): the CLI's sweep leaves them."""

_WHAT = {
    MAX_GPUS: "GPUs",
    MAX_GPUS_PER_NODE: "GPUs per node",
    MAX_BATCH: "a batch count",
    MAX_TOKENS: "a token count",
    MAX_STEPS: "a count of steps",
    MAX_INT: "an integer option",
}


def check(name: str, value: object, bound: int, *, where: str = "") -> None:
    """Refuse ``value`` above ``bound`` (``BAD_CONFIG``, exit 2), naming the bound; other values pass untouched
    (their own checks say what is wrong with zero, a negative or a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= bound:
        return
    what = _WHAT.get(bound, "a count")
    raise ConfigError(
        f"{where + ': ' if where else ''}{name}={value} is above grpo-tune's bound of {bound:,} for {what}",
        hint=f"give a value of at most {bound:,} (the bound is far above any real cluster or batch: "
        "a larger number is a typo or a unit mix-up)",
    )


def bound_of_key(key: str) -> int:
    """The bound of a framework key by what its name counts (verl's and NeMo-RL's spellings): nodes and GPUs,
    GPUs per node, tokens and lengths, batch sizes and counts of prompts; any other integer :data:`MAX_INT`."""
    leaf = key.rsplit(".", 1)[-1].lower()
    if leaf.endswith("per_node"):
        return MAX_GPUS_PER_NODE
    if leaf in ("nnodes", "num_nodes") or leaf.endswith(("_parallel_size", "model_parallel_size")):
        return MAX_GPUS
    if "length" in leaf or "token" in leaf or leaf.endswith("_len"):
        return MAX_TOKENS
    if "batch" in leaf or "prompts" in leaf or "generations" in leaf or leaf in ("n", "max_num_seqs"):
        return MAX_BATCH
    if "epoch" in leaf or "steps" in leaf:
        return MAX_STEPS
    return MAX_INT


def check_keys(values: Iterable[tuple[str, object]], *, where: str = "") -> None:
    """Every integer value of a launch or recipe, refused above its key's bound (:func:`bound_of_key`): what
    diagnose reads is held to the bounds tune and search hold it to."""
    for key, value in values:
        check(key, value, bound_of_key(key), where=where)
