"""Fit verdicts on configurations verl ships and configurations verl's users reported as OOM.

The settings are data (tests/fixtures/fit_verdicts.yaml), read from verl's shipped example scripts
(verl-project/verl, formerly volcengine/verl, GitHub snapshot b178a3cd, the paths cited per case; verl
0.9.1 defaults where a script sets nothing) and from the issues' texts (cited by number). Where a source
is silent the assumption is stated next to the value.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_tune.cli.options import MIN_HEADROOM_DEFAULT
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload
from grpo_tune.costmodel.estimate import estimate

CASES_PATH = Path(__file__).parent / "fixtures" / "fit_verdicts.yaml"


def _cases(section: str) -> dict[str, tuple]:
    """``{name: (model, hardware, gpus, strategy fields, workload fields)}`` from the sourced case table."""
    out = {}
    for name, c in yaml.safe_load(CASES_PATH.read_text())[section].items():
        strategy = {k: tuple(v) if k == "offload" else v for k, v in c["strategy"].items()}
        out[name] = (c["model"], c["hardware"], c["gpus"], strategy, c["workload"])
    return out


SHIPPED = _cases("shipped")
REPORTED_OOM = _cases("reported_oom")

# Reported OOMs predicted not to fit outright: a phase's bytes exceed the GPU (an OOM_RISK violation with
# a phase), whatever else is wrong with the plan. verl#3124 is not here (it fits by less than the margin).
OUTRIGHT_OOM = ("verl#3364", "verl#5003", "verl#388", "verl#1649 (gmu 0.9)", "verl#2935")


def _est(case):
    model, hw, gpus, strategy, workload = case
    return estimate(
        model=load_model(model),
        hardware=load_hardware(hw),
        cluster=Cluster(gpus=gpus),
        strategy=Strategy.of(**strategy),
        workload=Workload(**workload),
    )


RENDITIONS = {
    "qwen3moe-30b_megatron_96gb": "qwen3moe-30b-megatron-96gb.sh",
    "qwen3-235b_megatron_96gb": "qwen3-235b-megatron-96gb.sh",
}
"""Fixture cases with our rendition of the upstream script in examples/verl-upstream/."""


@pytest.mark.parametrize("name", sorted(RENDITIONS))
def test_fixture_knobs_equal_the_upstream_rendition(name):
    """A fixture says what its source says: every strategy and workload knob of the case equals what the
    rendition of the upstream script reads as (frameworks.read_plan, verl 0.9.1 defaults where the script
    is silent), so no setting is added to make a case pass."""
    from grpo_tune.frameworks import read_plan

    model, hw, gpus, strategy, workload = SHIPPED[name]
    root = Path(__file__).resolve().parent.parent
    p = read_plan(root / "examples" / "verl-upstream" / RENDITIONS[name], model=model, hardware=hw)
    assert p.cluster.gpus == gpus and p.model.name == load_model(model).name
    for k, v in strategy.items():
        assert p.strategy.knob(k) == v, k
    for k, v in workload.items():
        assert getattr(p.workload, k) == v, k


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_verl_shipped_examples_fit(name):
    e = _est(SHIPPED[name])
    assert e.fits, [v.message for v in e.violations]


def test_the_shipped_examples_need_their_memory_settings():
    """DeepSeek-V3 on 96 H20 fits because of the CPU optimizer and the token cap it ships with."""
    model, hw, gpus, s, wl = SHIPPED["deepseek671b_math_megatron_96gb"]
    no_cpu = {**s, "cpu_optimizer": None, "overlap_cpu_optimizer": False, "precision_aware_optimizer": False}
    assert not _est((model, hw, gpus, no_cpu, wl)).fits
    model, hw, gpus, s, wl = SHIPPED["qwen3moe-30b_megatron_96gb"]
    wide = {**s, "max_tokens_per_gpu": 8 * s["max_tokens_per_gpu"]}
    assert (
        _est((model, hw, gpus, wide, wl)).memory["update"].parts["activations"]
        > _est(SHIPPED["qwen3moe-30b_megatron_96gb"]).memory["update"].parts["activations"]
    )


_H20_GAP = pytest.mark.xfail(
    strict=True,
    reason="with H20's capacity as the driver reports it (97,871 MiB, not 96e9 B) the optimizer step is "
    "priced at 84.8 of 92.6 GiB: the reported OOM is ~8 GiB the memory model does not explain yet (it passed "
    "only on the wrong, decimal capacity)",
)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=_H20_GAP) if n.startswith("verl#3124") else n for n in sorted(REPORTED_OOM)]
)
def test_reported_ooms_are_not_proposed(name):
    """Predicted not to fit, or (verl#3124) to fit by less than the search's safety margin, so the
    search never proposes it: the optimizer step there needs 84.4 of 86.4 GiB (state + Adam's
    temporaries + vLLM's sleeping CUDA graphs; the issue's traceback is in that step)."""
    e = _est(REPORTED_OOM[name])
    hbm = load_hardware(REPORTED_OOM[name][1]).hbm_bytes
    assert not e.fits or e.headroom_bytes < MIN_HEADROOM_DEFAULT * hbm, (e.peak_bytes, e.capacity_bytes)
    if name.startswith("verl#3124"):
        assert e.peak_phase == "update" and e.memory["update"].parts["optimizer"] > 0


@pytest.mark.parametrize("name", OUTRIGHT_OOM)
def test_reported_oom_does_not_fit_outright(name):
    """A memory phase overflows the GPU (not only a batch-split complaint)."""
    e = _est(REPORTED_OOM[name])
    over = [v for v in e.violations if v.code == "OOM_RISK" and v.phase != "host"]
    assert not e.fits and over, (e.peak_bytes, e.capacity_bytes, [v.message for v in e.violations])


def test_three_reported_ooms_do_not_fit_outright():
    """Issue 9: at least three OOMs from verl's issues, each cited by number, predicted not to fit."""
    out = {n for n in OUTRIGHT_OOM if any(v.code == "OOM_RISK" for v in _est(REPORTED_OOM[n]).violations)}
    assert len({n.split(" ")[0] for n in out}) >= 3, out


def test_verl2935_verdict_rests_on_the_micro_batch():
    """The assumption behind verl#2935's verdict, pinned: one 32k sequence per micro-batch fits."""
    model, hw, gpus, s, wl = REPORTED_OOM["verl#2935"]
    e = _est((model, hw, gpus, {**s, "mbs": 1}, wl))
    assert e.fits and e.peak_phase == "update", (e.peak_bytes, e.capacity_bytes)
