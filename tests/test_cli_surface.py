"""The CLI's surface, pinned: the set of commands and each command's options.

A change here is a change of the public interface: update the table on purpose (and docs/commands.md).
"""

from __future__ import annotations

import typer.main

from grpo_tune.cli.main import app

# Degree, memory, rollout and workload flags shared by estimate, search and compare (cli/options.py).
PLAN = [
    "--cp",
    "--distributed-optimizer / --no-distributed-optimizer",
    "--ep",
    "--etp",
    "--first-stage-layers",
    "--gbs",
    "--gpu-memory-utilization",
    "--gpus -g",
    "--gpus-per-node",
    "--hardware",
    "--json",
    "--kl / --no-kl",
    "--last-stage-layers",
    "--mbs",
    "--mini-batch",
    "--model -m",
    "--n",
    "--offload",
    "--pp",
    "--ppo-epochs",
    "--prompt-len",
    "--prompts",
    "--recompute",
    "--response-len",
    "--rollout-tp",
    "--seq-len",
    "--sequence-parallel / --no-sequence-parallel",
    "--tp",
    "--vpp",
    "--workload",
    # issue 9: lengths, dynamic batching, the CPU optimizer and vLLM's knobs
    "--prompt-len-mean",
    "--response-len-mean",
    "--lengths",
    "--max-tokens-per-gpu",
    "--cpu-optimizer",
    "--max-num-seqs",
    "--enforce-eager / --no-enforce-eager",
    # the log-prob passes' own micro-batch (verl's log_prob_micro_batch_size_per_gpu)
    "--log-prob-mbs",
    # verl's weight-sync bucket (rollout.checkpoint_engine.update_weights_bucket_megabytes)
    "--sync-bucket-mb",
    # the software stack whose host and engine costs are priced (profiles/stacks)
    "--stack",
    # Megatron's use_precision_aware_optimizer, priced (10 B of state, no fp32 param copy)
    "--precision-aware-optimizer / --no-precision-aware-optimizer",
    # the rollout engine and the number formats (issue 37, docs/precision.md)
    "--rollout-engine",
    "--precision",
    "--rollout-precision",
    "--kv-cache-dtype",
]
# Placement: separate rollout and training pools (estimate and search; auto on search only).
PLACE = [
    "--placement",
    "--rollout-gpus",
    "--rollout-hardware",
    "--staleness",
    "--partial-rollout / --no-partial-rollout",
    "--stream / --no-stream",
]

# Flags of the commands that launch a run from a config (train and profile).
RUN = [
    "--config -c",
    "--json",
    "--master-addr",
    "--master-port",
    "--nnodes",
    "--node-rank",
    "--out",
    "--steps",
]

SURFACE = {
    "estimate": PLAN + PLACE + ["--calibration", "--framework"],
    "search": PLAN
    + PLACE
    + [
        "--all",
        "--allow-cross-node-tp",
        "--calibration",
        "--emit / --no-emit",
        "--framework",
        "--launcher",
        "--min-headroom",
        "--out",
        "--refine",
        "--storage",
        "--study-name",
        "--top",
        "--trial-steps",
        "--trial-timeout",
        "--trials",
    ],
    "compare": PLAN + PLACE + ["--calibration", "--framework", "--min-headroom", "--out"],
    "diagnose": ["--hardware", "--json", "--model -m", "OVERRIDES", "PATH"],
    "validate": ["--data", "--grpo", "--hardware", "--json", "--refit", "--tolerance"],
    "train": RUN + ["--dry-run", "--resume / --no-resume", "--set", "--slurm"],
    "profile": RUN + ["--timeout"],
    "probe-hardware": ["--base", "--name", "--nproc", "--out -o", "--quick"],
    "models": ["--json"],
    "hardware": ["--json"],
    "tune": [
        "--calibration",
        "--emit / --no-emit",
        "--hardware",
        "--ignore-unknown",
        "--json",
        "--keep",
        "--min-headroom",
        "--model -m",
        "--out",
        "--prompt-len-mean",
        "--response-len-mean",
        "--stack",
        "LAUNCH",
        "OVERRIDES",
        # pins as estimate spells them (issue 11: "--keep tp,pp or any estimate flag")
        "--tp",
        "--pp",
        "--vpp",
        "--cp",
        "--ep",
        "--etp",
        "--mbs",
        "--log-prob-mbs",
        "--recompute",
        "--offload",
        "--rollout-tp",
        "--gpu-memory-utilization",
        "--sync-bucket-mb",
    ]
    + PLACE,
    "calibrate": [
        "--from-log",
        "--hardware",
        "--json",
        "--launch",
        "--model -m",
        "--out",
        "--params",
        "--warmup",
        "EXTRA",
    ],
}


def surface() -> dict[str, list[str]]:
    root = typer.main.get_command(app)
    out = {}
    for name, cmd in root.commands.items():
        items = []
        for p in cmd.params:
            if p.param_type_name == "option":
                s = " ".join(sorted(p.opts))
                if p.secondary_opts:
                    s += " / " + " ".join(sorted(p.secondary_opts))
                items.append(s)
            else:
                items.append(p.name.upper())
        out[name] = sorted(items)
    return out


def test_commands_are_pinned():
    assert sorted(surface()) == sorted(SURFACE)


def test_options_are_pinned():
    got = surface()
    for name, want in SURFACE.items():
        assert got[name] == sorted(want), name


def test_search_takes_every_estimate_flag():
    """Any flag estimate takes pins that choice in search (and compare)."""
    got = surface()
    assert set(got["estimate"]) <= set(got["search"])
    assert set(got["estimate"]) <= set(got["compare"])


def test_every_command_has_help():
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():
        assert (cmd.help or "").strip(), name
        for p in cmd.params:
            if p.param_type_name == "option":
                assert (p.help or "").strip(), f"{name} {p.opts}"
