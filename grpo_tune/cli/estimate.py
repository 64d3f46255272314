"""``grpo-tune estimate``: the cost model's figures for one plan.

Parses the flags, calls :func:`grpo_tune.jobs.estimate.run_estimate` once, and prints a breakdown (or one
JSON object with ``--json``). A plan that cannot exist exits 2 with a coded error; a plan that
exists but does not fit exits 0 with ``fits: false`` and its violations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from grpo_tune.cli.options import Framework, Gpus, Hardware, Json, Model, inputs_from_flags, target_line
from grpo_tune.costmodel.estimate import Estimate
from grpo_tune.core.strategy import SYNC_BUCKET_MB
from grpo_tune.jobs.estimate import separate_memory_note, EstimateRequest, run_estimate
from grpo_tune.jobs.setup import prepare
from grpo_tune.cli.plan_options import flags_after, plan_flags, plan_options
from grpo_tune.cli.options import PLACEMENT_FLAGS, placement_flags
from grpo_tune.core.units import GiB


# Display names for the rollout engine's parts (JSON keys stay rollout_*).
_LABELS = {
    "rollout_weights": "vLLM weights",
    "rollout_activations": "vLLM activations",
    "rollout_kv_cache": "vLLM KV cache",
    "ref_weights": "ref weights",
    "sync_bucket": "sync bucket",
}


def _gib(x: float) -> str:
    return f"{x / GiB:,.2f}"


def print_estimate(est: Estimate, console: Console) -> None:
    """The human-readable breakdown: the plan, memory per phase, time per phase, the verdict."""
    _print_plan(est, console)
    _print_memory(est, console)
    _print_time(est, console)
    if est.violations:
        for viol in est.violations:
            console.print(f"[bold red][{viol.code}][/] {viol.message}", highlight=False)
    console.print("[bold green]fits[/]" if est.fits else "[bold red]does not fit[/]")


def _print_plan(est: Estimate, console: Console) -> None:
    s, m, c = est.strategy, est.model, est.cluster
    deg = (
        f"{s.layout_text()} sp={'on' if s.layout.sp else 'off'} recompute={s.memory.recompute} "
        f"dist-opt={'on' if s.memory.distributed_optimizer else 'off'} "
        f"offload={','.join(s.memory.offload) or 'none'} "
        f"rollout_tp={s.rollout.rollout_tp} "
        f"gpu_mem_util={s.rollout.gpu_memory_utilization} "
        f"max_tokens_per_gpu={s.batching.max_tokens_per_gpu or 'off'} cpu_optimizer={s.memory.cpu_optimizer or 'off'} "
        f"max_num_seqs={s.rollout.max_num_seqs} eager={'on' if s.rollout.enforce_eager else 'off'}"
        + ("" if s.rollout.sync_bucket_mb == SYNC_BUCKET_MB else f" sync_bucket_mb={s.rollout.sync_bucket_mb}")
    )
    hw = est.hardware
    from grpo_tune.core.specs import load_hardware

    rhw = est.placement.get("rollout_hardware") if est.placement else None
    console.print(target_line(m, hw, c, load_hardware(rhw) if rhw else None), highlight=False)
    console.print(deg, highlight=False)
    w = est.workload
    if w.kind == "grpo":
        console.print(
            f"workload: grpo, {w.prompts} prompts x n={w.n}, {w.prompt_len}+{w.response_len} tokens max, "
            f"{w.mean_prompt_len:,.0f}+{w.mean_response_len:,.0f} mean, "
            f"mini-batch {w.mini_batch}, {w.ppo_epochs} epoch(s), kl={'on' if w.kl else 'off'}",
            highlight=False,
        )
        from grpo_tune.costmodel.lengths import lengths_note

        console.print(f"lengths: {lengths_note(w)}", highlight=False)
    else:
        console.print(f"workload: pretrain, seq {w.seq_len}, global batch {w.gbs}", highlight=False)
    p = est.params
    console.print(
        f"params: total {p['total']:,}  active {p['active']:,}  per-rank max {p['per_rank_max']:,}", highlight=False
    )


def _print_memory(est: Estimate, console: Console) -> None:
    parts: list[str] = []
    for pm in est.memory.values():
        for k in pm.parts:
            if k not in parts:
                parts.append(k)
    # Parts down, phases across: five phases fit an 80-column terminal, a dozen parts do not.
    t = Table(title=f"GiB per rank (capacity {_gib(est.capacity_bytes)})", show_edge=False)
    t.add_column("part", no_wrap=True)
    for name in est.memory:
        t.add_column(name, justify="right")
    for k in parts:
        t.add_row(
            _LABELS.get(k, k.replace("_", " ")),
            *[_gib(pm.parts[k]) if k in pm.parts else "-" for pm in est.memory.values()],
        )
    t.add_row("[bold]total[/]", *[f"[bold]{_gib(pm.total_bytes)}[/]" for pm in est.memory.values()])
    # a phase fits when its bytes do and no OOM_RISK names it (a rollout pool whose KV cache holds no sequence)
    bad = {v.phase for v in est.violations if v.code == "OOM_RISK"}
    t.add_row(
        "fits",
        *[
            "[green]yes[/]" if pm.total_bytes <= est.capacity_bytes and pm.name not in bad else "[red]no[/]"
            for pm in est.memory.values()
        ],
    )
    console.print(t)
    ro = est.memory.get("rollout")
    if ro is not None and ro.info and "kv_cache_tokens" in ro.info:  # the CPU's native sampler has no KV cache
        i = ro.info
        console.print(
            f"rollout: KV cache {i['kv_cache_tokens']:,} tokens per replica "
            f"({i['kv_bytes_per_token']:,.0f} B/token), {i['max_concurrent_sequences']:,} concurrent sequences "
            f"x {i['rollout_replicas']} replicas",
            highlight=False,
        )
    if est.host_bytes_per_node:
        console.print(
            f"host memory for offloaded state: {_gib(est.host_bytes_per_node)} GiB per node "
            f"(of {_gib(est.hardware.host_memory_bytes)})",
            highlight=False,
        )
    console.print(
        f"peak {_gib(est.peak_bytes)} GiB in {est.peak_phase}, headroom {_gib(est.headroom_bytes)} GiB", highlight=False
    )


def _print_time(est: Estimate, console: Console) -> None:
    if est.time is not None:
        tt = Table(title="Time per step (s)")
        tt.add_column("phase")
        tt.add_column("seconds", justify="right")
        for k, v in est.time.phases.items():
            tt.add_row(k, f"{v:,.3f}")
        tt.add_row("[bold]step[/]", f"[bold]{est.time.step_s:,.3f}[/]")
        console.print(tt)
        x = est.details
        if "decode_step_s" in x:
            console.print(
                f"rollout: prefill {x['prefill_s']:,.2f} s, decode {x['decode_s']:,.2f} s at "
                f"{x['decode_concurrency']:,.0f} sequences per replica, {x['decode_step_s'] * 1e3:,.1f} ms "
                f"per step ({'HBM' if x['decode_memory_bound'] else 'compute'}-bound), expected longest "
                f"response {x['longest_response']:,.0f} tokens",
                highlight=False,
            )
        console.print(
            f"update: {x['micro_batches']:.0f} micro-batches per optimizer step, pipeline bubble "
            f"{100 * x['bubble_fraction']:.1f}%, exposed DP comm {x['dp_exposed_s']:,.3f} s, "
            f"optimizer {x['optimizer_s']:,.3f} s",
            highlight=False,
        )
    if est.throughput is not None:
        th = est.throughput.to_dict()
        console.print(
            "throughput: " + ", ".join(f"{k} {v:,.3g}" for k, v in th.items() if v is not None), highlight=False
        )


CalibrationFile = Annotated[
    Path | None,
    typer.Option(
        "--calibration", help="Calibration JSON (grpo-tune calibrate, search --refine) applied to the time model."
    ),
]


@flags_after("calibration", PLACEMENT_FLAGS)
@plan_options(degrees_after="gpus", workload_before="json_out")
def estimate(
    model: Model,
    hardware: Hardware = "h100",
    gpus: Gpus = 8,
    json_out: Json = False,
    calibration: CalibrationFile = None,
    framework: Framework = "verl",
    **plan: Any,
) -> None:
    """Memory per rank per GRPO phase (and time, where the time model is present) for one plan."""
    from grpo_tune.core.errors import ConfigError

    setup = prepare(framework, stack=plan.get("stack"), calibration=calibration)
    if len(setup.frameworks) > 1:
        raise ConfigError("--framework all prices one framework at a time", hint="give verl or nemo-rl")
    place = placement_flags(plan)
    plan["stack"] = setup.stack
    target, pins = inputs_from_flags(plan_flags(plan, model=model, hardware=hardware, gpus=gpus))
    ereq = EstimateRequest(target=target, pins=pins, setup=setup, place=place)
    est = run_estimate(ereq)
    mem_note = separate_memory_note(ereq)
    if json_out:
        doc = {**est.to_dict(), "stack": setup.stack_info(est.hardware.stack)}
        if mem_note:
            doc["rollout_memory_default"] = mem_note
        print(json.dumps(doc, indent=2))
        return
    print_estimate(est, Console())
    if mem_note:
        Console().print(mem_note, highlight=False)
    if line := setup.stack_line(est.hardware.stack):
        Console().print(line, highlight=False)
    if est.placement:
        print_pools(est, Console())


def print_pools(est: Estimate, console: Console) -> None:
    """The separate plan's pools: the split, each pool's seconds and busy fraction, the sync, cost."""
    f = est.placement
    if f is None:  # a colocated plan has one pool
        return
    sy = f["sync"]
    console.print(
        f"pools: rollout {f['rollout_gpus']} x {f['rollout_hardware']} ({f['rollout_gpus_per_node']}/node), "
        f"training {f['train_gpus']} x {est.hardware.name} ({f['train_gpus_per_node']}/node); "
        f"staleness {f['staleness']}, partial rollout {'on' if f['partial_rollout'] else 'off'}, "
        f"sync every {f['sync_interval']} step(s)",
        highlight=False,
    )
    console.print(
        f"steady state: generation {f['gen_s']:,.2f} s, training {f['train_s']:,.2f} s, sync {f['sync_s']:,.2f} s "
        f"({f['exposed_sync_s']:,.2f} s exposed) -> step {est.step_s:,.2f} s; busy: rollout "
        f"{100 * f['rollout_busy']:.0f}%, training {100 * f['train_busy']:.0f}%; "
        f"pipeline fill {f['fill_s']:,.1f} s once",
        highlight=False,
    )
    link = "intra-node link, shared nodes" if f["shared_nodes"] else "inter-node"
    console.print(
        f"sync: {sy['bytes_per_rollout_gpu'] / GiB:,.1f} GiB to every rollout GPU at "
        f"{sy['link_bytes_per_s'] / 1e9:,.0f} GB/s ({link}): "
        f"export {sy['export_s']:,.2f} s, transfer {sy['transfer_s']:,.2f} s, load {sy['copy_s']:,.2f} s, "
        f"per-tensor/bucket {sy['overhead_s']:,.2f} s"
        + (f", overlapped -{sy['overlap_s']:,.2f} s (double-buffered)" if sy.get("overlap_s") else ""),
        highlight=False,
    )
    if f.get("tokens_per_usd"):
        console.print(
            f"cost: {f['price_per_hour_usd']:,.2f} USD/h for both pools, {f['tokens_per_usd']:,.0f} tokens per USD",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)
