"""Flag values -> the typed target (model, hardware, cluster, workload) a command plans for."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from grpo_tune.core.errors import ConfigError
from grpo_tune.core.rules import check_lengths
from grpo_tune.core.specs import ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Workload
from grpo_tune.core.target import Target


def fit_default_lengths(m: ModelSpec, prompt_len: int, response_len: int) -> tuple[int, int, str | None]:
    """The default lengths (1024 + 1024) scaled to a model with fewer positions (``tiny`` has 256), and
    the sentence that says so; lengths the user chose are returned as given (a too-long choice stays an
    error). ``(prompt_len, response_len, note or None)``."""
    dp, dr = Workload().prompt_len, Workload().response_len
    if (prompt_len, response_len) != (dp, dr) or dp + dr <= m.max_seq_len:
        return prompt_len, response_len, None
    p = max(1, m.max_seq_len * dp // (dp + dr))
    r = max(1, m.max_seq_len - p)
    note = (
        f"default lengths {dp} + {dr} exceed {m.name}'s {m.max_seq_len} positions: using {p} + {r} "
        "(give --prompt-len / --response-len to choose)"
    )
    return p, r, note


class WorkloadFlags(TypedDict):
    """The workload flags of a command (as :func:`plan_inputs` takes them), typer's parsed values."""

    workload: str
    prompts: int
    n: int
    prompt_len: int
    response_len: int
    mini_batch: int
    ppo_epochs: int
    kl: bool
    seq_len: int
    gbs: int
    prompt_len_mean: NotRequired[int | None]
    response_len_mean: NotRequired[int | None]
    lengths: NotRequired[str | None]


def plan_inputs(
    *,
    model: str,
    hardware: str,
    gpus: int,
    gpus_per_node: int | None,
    workload: str,
    prompts: int,
    n: int,
    prompt_len: int,
    response_len: int,
    mini_batch: int,
    ppo_epochs: int,
    kl: bool,
    seq_len: int,
    gbs: int,
    prompt_len_mean: int | None = None,
    response_len_mean: int | None = None,
    lengths: str | None = None,
    stack: str | None = None,
) -> Target:
    m = load_model(model)
    hw = load_hardware(hardware, stack=stack)
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}")
    if gpus_per_node is not None and gpus_per_node < 1:  # 0 used to mean "the default"
        raise ConfigError(
            f"--gpus-per-node must be >= 1, got {gpus_per_node}", hint="leave it out to use the hardware profile's"
        )
    if mini_batch > prompts:  # it used to shrink silently to --prompts
        raise ConfigError(
            f"--mini-batch {mini_batch} exceeds --prompts {prompts}",
            hint="verl requires ppo_mini_batch_size <= data.train_batch_size",
        )
    cluster = Cluster(gpus=gpus, gpus_per_node=gpus_per_node or min(hw.gpus_per_node, gpus))
    if cluster.gpus_per_node < 1:
        raise ConfigError("--gpus-per-node must be >= 1")
    prompt_len, response_len, fitted = fit_default_lengths(m, prompt_len, response_len)
    stats: dict[str, Any] = {}
    if lengths:
        from grpo_tune.autotune.calibrate.lengths import read_lengths

        stats = read_lengths(lengths, model=m, prompt_len=prompt_len, response_len=response_len)
    if fitted:  # stated where the lengths are (search header, report.md, best.yaml)
        stats["lengths_source"] = "; ".join(filter(None, [fitted, stats.get("lengths_source")]))
    if prompt_len_mean is not None:
        stats["prompt_len_mean"] = prompt_len_mean
    if response_len_mean is not None:
        stats["response_len_mean"] = response_len_mean
        if lengths:  # an explicit mean replaces the file's histogram
            stats.pop("response_len_quantiles", None)
    if workload == "grpo":  # no mean given: a stated, typical distribution, not the worst case
        from grpo_tune.costmodel.lengths import assumed_means

        stats = assumed_means(stats, prompt_len=prompt_len, response_len=response_len)
    wl = Workload.from_dict(
        dict(
            kind=workload,
            prompts=prompts,
            n=n,
            prompt_len=prompt_len,
            response_len=response_len,
            mini_batch=min(mini_batch, prompts),
            ppo_epochs=ppo_epochs,
            kl=kl,
            seq_len=seq_len,
            gbs=gbs,
            **stats,
        ),
        where="workload",
    )
    for f in check_lengths(m, wl):  # train refuses it; refuse it here before any search or estimate
        raise f.to_error()
    return Target(m, hw, cluster, wl)
