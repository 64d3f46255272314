"""MLA + DeepSeek-style MoE (tiny-mla-moe: low-rank query, shared expert, one dense first layer,
sigmoid routing with an expert bias, group-limited top-k) under TP2, PP2 and EP2: the same losses,
log-probs, grad norms and sampled tokens as one process (real torchrun, CPU, fp32, 1e-5), and
each rank's parameter count equal to ``costmodel.params.per_stage_params``.

The router's expert bias counts as a parameter on both sides (megatron keeps it as a buffer; it
is a tensor of the HF checkpoint, which the cost model counts)."""

import math

import pytest

from grpo_tune.core.specs import load_model
from grpo_tune.core.strategy import Strategy, validate
from grpo_tune.costmodel.params import per_stage_params, total_params
from trainer_harness import run_config, torchrun_json

pytestmark = pytest.mark.slow

STEPS, TOL = 3, 1e-5
MODEL = "tiny-mla-moe"
TWO = [
    {"model": MODEL, "strategy": {"tp": 2}},
    {"model": MODEL, "strategy": {"pp": 2}},
    {"model": MODEL, "strategy": {"ep": 2}},
]


def _run(nproc, layouts):
    return torchrun_json("layouts", nproc=nproc, spec={"layouts": layouts, "steps": STEPS, "generate": 6}, timeout=400)[
        "results"
    ]


@pytest.fixture(scope="module")
def reference():
    return _run(1, [{"model": MODEL, "strategy": {}}])[0]


def test_reference_learns_and_counts(reference):
    assert reference["losses"][-1] < reference["losses"][0] - 0.1, reference["losses"]
    assert reference["param_counts"] == [total_params(load_model(MODEL))]


def test_mla_moe_parity_and_param_counts_two_processes(reference):
    m = load_model(MODEL)
    for r in _run(2, TWO):
        for a, b in zip(reference["losses"], r["losses"]):
            assert math.isfinite(b) and abs(a - b) < TOL, (r["strategy"], reference["losses"], r["losses"])
        assert abs(reference["logprob_sum"] - r["logprob_sum"]) < TOL * abs(reference["logprob_sum"])
        assert r["responses"] == reference["responses"], r["strategy"]
        for a, b in zip(reference["grad_norms"], r["grad_norms"]):
            assert abs(a - b) < 1e-4 * a, (r["strategy"], reference["grad_norms"], r["grad_norms"])
        stages = per_stage_params(m, validate(m, Strategy.from_dict(r["strategy"]), 2))
        for count, coord in zip(r["param_counts"], r["coords"]):
            assert count == stages[coord["pp_rank"]].total, (r["strategy"], coord, count, [p.total for p in stages])


def task_roundtrip(spec: dict) -> dict:
    """Random init under TP2 -> export (DeepSeek-V3 names) -> import under PP2 and EP2: the same
    log-probs; the EP2 engine's export is bit-identical to the first."""
    import torch
    import torch.distributed as dist

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.engine import Engine

    parallel.init_distributed()
    world = dist.get_world_size()
    out = []
    ids = torch.tensor([[3, 17, 42, 5, 77, 8, 13, 90, 21, 2, 64, 30], [11, 0, 95, 44, 6, 19, 58, 71, 25, 33, 4, 88]])
    m = load_model(MODEL)
    for lay in spec["layouts"]:
        cfg = run_config(m, lay["strategy"], world, hf_checkpoint=lay.get("ckpt"), seed=7)
        parallel.reinit(cfg.strategy)
        eng = Engine(cfg, trainable=False)
        lp, _ = eng.logprobs(ids, micro_batch_size=1)
        if lay.get("export"):
            eng.export_hf(lay["export"])
        out.append(lp.tolist())
        del eng
    parallel.destroy()
    return {"logprobs": out}


def test_deepseek_hf_export_import_round_trips(tmp_path):
    import json

    import torch
    from safetensors.torch import load_file

    from grpo_tune.trainer.hf import hf_shapes

    a, b = tmp_path / "a", tmp_path / "b"
    r = torchrun_json(
        "test_trainer_mla_moe:task_roundtrip",
        nproc=2,
        spec={
            "layouts": [
                {"strategy": {"tp": 2}, "export": str(a)},
                {"strategy": {"pp": 2}, "ckpt": str(a)},
                {"strategy": {"ep": 2}, "ckpt": str(a), "export": str(b)},
            ]
        },
        timeout=400,
    )["logprobs"]
    assert torch.allclose(torch.tensor(r[1]), torch.tensor(r[0]), atol=1e-5)
    assert torch.allclose(torch.tensor(r[2]), torch.tensor(r[0]), atol=1e-5)
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert set(ta) == set(tb) == set(hf_shapes(load_model(MODEL)))
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in ta and "model.layers.0.mlp.gate_proj.weight" in ta
    assert "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in ta
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["first_k_dense_replace"] == 1
    assert (cfg["n_group"], cfg["topk_group"], cfg["scoring_func"]) == (4, 2, "sigmoid")
