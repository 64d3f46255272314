"""Every plan the search can emit, for every model preset, is accepted by the trainer's pre-start
check (what ``train --dry-run`` and ``profile`` run) or refused with a coded reason from
``core.support.check_supported``, the torch-free rule set the search side can apply too.

Plans: the ranked and Pareto plans of ``autotune.search.search`` plus every layout x batching
(fixed mbs or token budget) x optimizer (distributed, CPU optimizer) choice of the valid space (``autotune.search.driver.Space``) for each preset on H100s (tiny
presets on the ``cpu`` profile), and CP plans of a long-context workload. For the first accepted
plans of each preset the megatron-core ``TransformerConfig`` the workers build must construct (its ``__post_init__`` holds megatron's own refusals), so a plan that passes the
pre-start check is not refused later by megatron's config checks. No process is started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_tune.autotune.search.candidates import Space, _extra
from grpo_tune.autotune.search.driver import search
from grpo_tune.core.config import RunConfig, TrainerOptions
from grpo_tune.core.errors import GrpoTuneError, NoFeasiblePlanError
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Workload, validate
from grpo_tune.core.support import check_plan, check_supported
from grpo_tune.trainer.launch import preflight

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted(p.stem for p in (ROOT / "grpo_tune" / "profiles" / "models").glob("*.toml"))
GPU_STEPS = (8, 64, 256, 512)
PREFLIGHT_SAMPLE = 400  # plans of the sweep that go through the whole pre-start check
BUILD = 12  # accepted plans per preset whose megatron TransformerConfig is built


def _plans(m, hw, w, pins=None):
    from grpo_tune.costmodel.params import total_params

    big = total_params(m)
    # start near the smallest cluster that fits (each infeasible search costs a second on big models)
    start = 0 if big < 20e9 else 1 if big < 150e9 else 3 if big > 400e9 else 2
    for gpus in GPU_STEPS[start:]:
        cluster = Cluster(gpus=gpus, gpus_per_node=8)
        try:
            res = search(m, hw, cluster, w, pins=pins, top=10)
        except NoFeasiblePlanError:
            continue
        plans = [e.strategy for e in res.ranked] + [e.strategy for e in res.pareto]
        global SEARCHED
        SEARCHED = len(plans)
        # every layout x micro-batch x optimizer choice of the space (the other options, recompute and
        # offload, never meet a trainer rule); one rollout option, which the trainer checks do not read
        space = Space(m, hw, cluster, w, dict(pins or {}))
        roll = space.rollout_options()[0]
        for lay in space.layouts():
            for b in space.batch_options(lay):  # fixed mbs and token budgets (dynamic batching)
                for d in space.dist_opt_options():
                    for c in space.cpu_options():  # Megatron's CPU optimizer on/off
                        opt = dict(
                            **b, recompute=space.recompute_options()[0], distributed_optimizer=d, **_extra(((), c))
                        )
                        plans.append(validate(m, space.strategy(lay, opt, roll), gpus))
        return cluster, plans
    pytest.fail(f"no GPU count in {GPU_STEPS} gives {m.name} a feasible plan")


SEARCHED = 0  # set by _plans: how many leading plans came from search() itself


def _check(m, hw, cluster, w, plans, *, build_config: bool = True) -> tuple[int, set[str]]:
    from grpo_tune.trainer.model import transformer_config

    accepted, codes, built = 0, set(), set()
    # the whole pre-start check on the search's own plans and an even sample of the sweep (its
    # plan-independent parts, dataset and reward lookups, cost a few ms); the shared rule set on all
    stride = max(1, len(plans) // PREFLIGHT_SAMPLE)
    for i, s in enumerate(plans):
        if i >= SEARCHED and i % stride:
            shared = check_supported(m, s, hw, workload=w)
            assert not check_plan(m, s, workload=w), (m.name, s, shared)  # the search applies these
            if shared:
                codes.update(f.code for f in shared)
            else:
                accepted += 1
            continue
        cfg = RunConfig(
            model=m, hardware=hw, cluster=cluster, strategy=s, workload=w, trainer=TrainerOptions(rollout_engine="auto")
        )
        shared = check_supported(m, s, hw, workload=w)
        try:
            preflight(cfg, need_torch=False)
        except GrpoTuneError as exc:
            assert shared, f"{m.name}: preflight refused a plan the shared check accepts: {exc} ({s})"
            assert (exc.code, exc.message) == (shared[0].code, shared[0].message), (exc, shared[0])
            codes.add(exc.code)
            # the search itself applies every rule but the trainer-only ones (CP, model family)
            assert not check_plan(m, s, workload=w), (m.name, s, exc)
            continue
        assert not shared, (m.name, s, shared)
        accepted += 1
        if s in built:
            continue
        built.add(s)
        if build_config and len(built) <= BUILD:
            transformer_config(m, s, dtype=w.dtype)  # megatron's own checks: must not raise
    return accepted, codes


@pytest.mark.parametrize("preset", PRESETS)
def test_every_emitted_plan_is_accepted_or_refused_with_a_shared_code(preset):
    pytest.importorskip("megatron.core")
    m = load_model(preset)
    hw = load_hardware("cpu" if preset.startswith("tiny") else "h100")
    w = (
        Workload(prompts=32, n=4, prompt_len=96, response_len=96, mini_batch=16)
        if preset.startswith("tiny")
        else Workload()
    )
    cluster, plans = _plans(m, hw, w)
    accepted, codes = _check(m, hw, cluster, w, plans)
    assert plans and accepted + 0 >= 0
    # what the trainer builds today: every family of the presets, so every plan of this workload runs
    assert accepted == len(plans), (preset, codes)


def test_context_parallel_plans_are_refused_with_the_shared_code():
    m, hw = load_model("qwen2.5-7b"), load_hardware("h100")
    w = Workload(prompt_len=16384, response_len=16384, prompts=64, n=8, mini_batch=16)
    # the search applies the trainer's refusal itself: a pinned CP is refused there, with the same code
    with pytest.raises(GrpoTuneError) as exc:
        search(m, hw, Cluster(gpus=8), w, pins={"cp": 2})
    assert exc.value.code == "TRAINER_UNSUPPORTED"
    # unpinned, the long workload would qualify for CP; what the search emits is all runnable
    res = search(m, hw, Cluster(gpus=8), w, top=10)
    plans = [e.strategy for e in res.ranked + res.pareto]
    assert plans and all(s.layout.cp == 1 and not check_supported(m, s, hw, workload=w) for s in plans)


def test_shared_check_is_what_the_refusals_say():
    from grpo_tune.core.strategy import Strategy

    m = load_model("tiny-mla-moe")
    assert check_supported(m, Strategy()) == []
    assert [e.code for e in check_supported(m, Strategy.of(cp=2))] == ["TRAINER_UNSUPPORTED"]
    assert [e.code for e in check_supported(m, Strategy.of(tp=2, ep=2, sequence_parallel=False))] == [
        "TRAINER_UNSUPPORTED"
    ]
    assert [e.code for e in check_supported(m, Strategy.of(cpu_optimizer=0.5, distributed_optimizer=False))] == [
        "TRAINER_UNSUPPORTED"
    ]
    w = Workload(prompt_len=100, response_len=100)
    assert [e.code for e in check_supported(m, Strategy.of(max_tokens_per_gpu=150, dp=1), workload=w)] == [
        "BATCH_DIVISIBILITY"
    ]
    assert check_supported(m, Strategy.of(max_tokens_per_gpu=200, dp=1), workload=w) == []
