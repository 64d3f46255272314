"""Where the ranks compute in the host's RAM (the ``cpu`` profile, ``memory_is_host``), every rank of a machine
has its share of it, and the search keeps the machine's ranks and what they offload inside it; where the GPUs
hold a plan but the host cannot hold what it offloads, the search says so and looks past such plans."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_tune.autotune.search.driver import search
from grpo_tune.core.errors import NoFeasiblePlanError
from grpo_tune.core.placement import Placement
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.core.units import GiB
from grpo_tune.costmodel import pools as P
from grpo_tune.costmodel.estimate import estimate

CPU = load_hardware("cpu")
WL = Workload(prompts=8, n=4, prompt_len=8, response_len=6, mini_batch=4, kl=False, dtype="fp32")


def test_the_cpu_profile_shares_its_ram_among_a_machines_ranks():
    assert CPU.memory_is_host
    for gpus, ranks in ((1, 1), (4, 4), (8, 8), (16, 8)):  # 16 ranks: two machines of 8
        e = estimate(
            model=load_model("tiny"),
            hardware=CPU,
            cluster=Cluster(gpus=gpus, gpus_per_node=8),
            strategy=Strategy.of(mbs=8),
            workload=WL,
        )
        assert e.capacity_bytes == pytest.approx(CPU.hbm_bytes / ranks - CPU.reserved_memory_bytes)
    # a GPU's memory is its own, whatever the node holds
    h100 = load_hardware("h100")
    assert h100.rank_memory_bytes(8) == h100.rank_memory_bytes(1) == h100.hbm_bytes


def test_a_cpu_search_keeps_the_machines_ranks_inside_its_ram():
    # qwen2.5-0.5b in fp32 on 4 ranks of one 24 GiB machine: before the ranks shared it, each was given all of
    # it and the search proposed plans whose 4 ranks together needed several times the machine
    m = load_model("qwen2.5-0.5b")
    cl = Cluster(gpus=4, gpus_per_node=4)
    wl = Workload(prompts=16, n=4, prompt_len=256, response_len=256, mini_batch=16, dtype="fp32")
    res = search(m, CPU, cl, wl, top=5)
    for e in res.ranked:
        assert cl.ranks_per_node * (e.peak_bytes + CPU.reserved_memory_bytes) <= CPU.hbm_bytes
        assert not e.strategy.memory.offload and not e.strategy.memory.cpu_optimizer  # nothing to offload to


def test_a_cpu_plan_that_overruns_the_machine_names_each_ranks_share():
    with pytest.raises(NoFeasiblePlanError) as ei:
        search(load_model("7b"), CPU, Cluster(gpus=8, gpus_per_node=8), Workload(prompts=64, n=4, mini_batch=64))
    msg, hint = str(ei.value), ei.value.hint or ""
    assert "its share of the 24.0 GiB of RAM among the 8 ranks of a machine" in msg, msg
    assert "more machines (--gpus 16 --gpus-per-node 8" in hint and "h200" not in hint and "offload" not in hint


def test_a_pinned_offload_on_the_cpu_profile_counts_against_the_same_ram():
    m = load_model("qwen2.5-0.5b")
    cl = Cluster(gpus=2, gpus_per_node=2)
    wl = Workload(prompts=16, n=4, prompt_len=256, response_len=256, mini_batch=16, dtype="fp32")
    kw = dict(model=m, hardware=CPU, cluster=cl, workload=wl)
    base = estimate(strategy=Strategy.of(mbs=1), **kw)
    off = estimate(strategy=Strategy.of(mbs=1, offload=("param", "grad", "optimizer")), **kw)
    assert off.peak_bytes < base.peak_bytes and off.host_bytes_per_node > 0
    small = dataclasses.replace(CPU, hbm_bytes=2 * (off.peak_bytes + CPU.reserved_memory_bytes) + 1.0)
    small = dataclasses.replace(small, host_memory_bytes=small.hbm_bytes)
    e = estimate(strategy=Strategy.of(mbs=1, offload=("param", "grad", "optimizer")), **{**kw, "hardware": small})
    # each rank's own bytes fit its share, but what they offload lands in the same RAM
    assert e.peak_bytes <= e.capacity_bytes
    assert any("share its RAM" in v.message for v in e.violations), [v.message for v in e.violations]
    assert not e.fits


def test_separate_pools_on_one_machine_share_its_ram():
    m, cl = load_model("tiny"), Cluster(gpus=4, gpus_per_node=4)
    s = Strategy.of(mbs=8, recompute="none", rollout_tp=1, engine="megatron")  # the cpu trainer's own sampler
    pl = Placement(mode="separate", rollout_gpus=2, staleness=1)
    e = P.estimate_separate(model=m, hardware=CPU, cluster=cl, strategy=s, workload=WL, placement=pl)
    assert e.fits
    share = CPU.rank_capacity_bytes(4)  # 2 training + 2 rollout ranks on the one machine
    assert e.placement["train_capacity_bytes"] == pytest.approx(share)
    assert e.placement["rollout_capacity_bytes"] == pytest.approx(share)
    tight = dataclasses.replace(CPU, hbm_bytes=4 * (e.peak_bytes + CPU.reserved_memory_bytes) - 1.0)
    e2 = P.estimate_separate(model=m, hardware=tight, cluster=cl, strategy=s, workload=WL, placement=pl)
    assert not e2.fits and any("ranks of both pools" in v.message for v in e2.violations)


def _small_host(gib: float):
    """The cpu profile as if its ranks had their own memory, on a host of ``gib`` GiB."""
    return dataclasses.replace(CPU, memory_is_host=False, host_memory_bytes=gib * GiB)


def test_the_search_looks_past_plans_whose_offload_the_host_cannot_hold():
    # each rank holds 7b at tp4 pp2 without offload (about 20 of 23.7 GiB), but the fastest plans offload
    # and CPU-optimise on this profile, whose 24 GiB host cannot hold 8 ranks' offloaded state: the exact pass
    # used to find only those and say no plan fits
    res = search(
        load_model("7b"),
        _small_host(24),
        Cluster(gpus=8, gpus_per_node=8),
        Workload(prompts=64, n=4, mini_batch=64),
        pins={"engine": "megatron"},  # the cpu trainer's own sampler (with its own memory, the platform would say vLLM)
    )
    assert res.best.fits
    assert res.best.host_bytes_per_node <= 24 * GiB


def test_no_feasible_plan_names_the_host_when_the_gpus_hold_the_plan():
    # offload pinned: every plan offloads, each rank holds its part (8.4 GiB), and the 16 GiB host cannot hold
    # what the 8 ranks offload; the message used to say "needs 8.4 GiB > 22.5 GiB" and stop there
    with pytest.raises(NoFeasiblePlanError) as ei:
        search(
            load_model("7b"),
            _small_host(16),
            Cluster(gpus=8, gpus_per_node=8),
            Workload(prompts=64, n=4, mini_batch=64),
            pins={"offload": ("param", "grad")},
        )
    msg = str(ei.value)
    assert "GiB per GPU, which fits, but its offloaded state needs" in msg, msg
    assert "GiB of host memory per node (its 8 ranks) > 16.0 GiB" in msg, msg
