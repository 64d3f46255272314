"""Memory model: Korthikanti's activation formulas, Megatron's model-state rule, rollout KV, offload."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_tune.core.errors import InvalidDegreesError
from _inputs import gpt_spec
from grpo_tune.costmodel.estimate import estimate
from grpo_tune.costmodel.memory import (
    in_flight_microbatches,
    kv_bytes_per_token,
    kv_cache_capacity,
    layer_activation_bytes,
    layer_coeffs,
    model_state_bytes_per_param,
    paper_layer_activation_bytes,
    phase_memory,
    rollout_weight_bytes,
    rollout_working_bytes,
    train_activation_bytes,
)
from grpo_tune.costmodel.params import per_stage_params
from grpo_tune.core.specs import ModelSpec, load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate

H100 = load_hardware("h100")


def gpt3(a: int, h: int, L: int) -> ModelSpec:
    """A GPT-3-style model as in Korthikanti Table 3: MHA, GeLU MLP of 4h, vocab 51200."""
    return gpt_spec(h, a, L, tied=False)


# Korthikanti et al. 2022 (arXiv 2205.05198), Table 3 (s = 2048, t = 8 for all four).
TABLE3 = {"22B": (64, 6144, 48), "175B": (96, 12288, 96), "530B": (128, 20480, 105), "1T": (160, 25600, 128)}
S = 2048


# ---------------------------------------------------------------------------------------------
# Korthikanti: per-layer formulas
# ---------------------------------------------------------------------------------------------


def test_paper_closed_forms_by_hand():
    s, b, h, a = 2048, 1, 12288, 96
    assert 5 * a * s / h == 80  # the paper's "5as/h = 80" for GPT-3 175B (sec. 5)
    assert paper_layer_activation_bytes(s, b, h, a, 1) == s * b * h * (34 + 80)  # eq. 1
    assert paper_layer_activation_bytes(s, b, h, a, 8, sp=True, recompute="selective") == 106_954_752  # 34sbh/t
    assert paper_layer_activation_bytes(s, b, h, a, 8, sp=False) == s * b * h * (10 + 24 / 8 + 80 / 8)  # eq. 2
    assert paper_layer_activation_bytes(s, b, h, a, 8, recompute="full") == 2 * s * b * h
    # Selective recompute drops 70% of GPT-3's and 65% of MT-NLG's activations (sec. 5).
    for (a_, h_), saved in (((96, 12288), 0.70), ((128, 20480), 0.65)):
        full = paper_layer_activation_bytes(S, 1, h_, a_, 1)
        sel = paper_layer_activation_bytes(S, 1, h_, a_, 1, recompute="selective")
        assert 1 - sel / full == pytest.approx(saved, abs=0.01)


@pytest.mark.parametrize("size", sorted(TABLE3))
@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("rc", ["none", "selective", "full"])
def test_per_tensor_bookkeeping_reproduces_the_paper_exactly(size, t, sp, rc):
    """The per-tensor code, with the paper switch, gives Table 2's formulas to the byte."""
    a, h, L = TABLE3[size]
    m = gpt3(a, h, L)
    for b in (1, 4):
        c = layer_coeffs(m, False, t, t, sp and t > 1, flash=False, paper=True)
        got = layer_activation_bytes(c, S, S, b, rc)
        want = paper_layer_activation_bytes(S, b, h, a, t, sp=sp and t > 1, recompute=rc)
        assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_our_variant_is_the_paper_without_dropout(sp):
    """Without dropout (GRPO runs with dropout 0): minus the two 1-byte masks and 3 of the 5 B per score."""
    a, h, L = TABLE3["175B"]
    m, t, b = gpt3(a, h, L), 8, 2
    paper = layer_activation_bytes(layer_coeffs(m, False, t, t, sp, flash=False, paper=True), S, S, b, "none")
    ours = layer_activation_bytes(layer_coeffs(m, False, t, t, sp, flash=False), S, S, b, "none")
    d_sp = t if sp else 1
    assert paper - ours == pytest.approx(2 * S * b * h / d_sp + 3 * a * S * S * b / t, rel=1e-12)


def test_swiglu_gqa_flash_variant_per_tensor():
    """Qwen2.5-7B, tp=2 with SP: norms/inputs 8h/t, Q K V O 2(2q + 2kv)/t, SwiGLU 6f/t, LSE 4a/t."""
    m = load_model("qwen2.5-7b")
    c = layer_coeffs(m, False, 2, 2, True, flash=True)
    h, q, kv, f, a = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim, m.ffn_hidden, m.heads
    assert c.linear == pytest.approx((8 * h + 4 * q + 4 * kv + 6 * f + 4 * a) / 2)
    assert c.quad == 0.0
    assert c.layer_input == 2 * h / 2


def fig7(size: str) -> dict[str, float]:
    """Korthikanti Fig. 7: memory as a fraction of the tensor-parallel baseline (eq. 2), t = 8."""
    a, h, _ = TABLE3[size]
    base = paper_layer_activation_bytes(S, 1, h, a, 8)
    return {
        "sp": paper_layer_activation_bytes(S, 1, h, a, 8, sp=True) / base,
        "selective": paper_layer_activation_bytes(S, 1, h, a, 8, recompute="selective") / base,
        "both": paper_layer_activation_bytes(S, 1, h, a, 8, sp=True, recompute="selective") / base,
        "full": paper_layer_activation_bytes(S, 1, h, a, 8, recompute="full") / base,
    }


def test_fig7_ratios():
    """What Fig. 7 shows for the four Table 3 models: each technique alone roughly halves the
    activation memory of the tensor-parallel baseline, together they cut it ~5x (to about 20%),
    and the two techniques' savings grow alike as the model grows. Tolerance: alone within
    45-70%, together within 15-21%, as read off the figure."""
    rows = {k: fig7(k) for k in ("22B", "175B", "530B", "1T")}
    for r in rows.values():
        assert 0.45 <= r["sp"] <= 0.70
        assert 0.45 <= r["selective"] <= 0.70
        assert 0.15 <= r["both"] <= 0.21
        assert r["full"] < r["both"]
    gaps = [abs(rows[k]["sp"] - rows[k]["selective"]) for k in ("22B", "175B", "530B")]
    assert gaps[0] > gaps[1] > gaps[2]
    # the exact bars from the equations (Table 3 shapes): 22B 66.8/49.4/16.1 %, 175B 62.0/56.5/18.5 %
    assert rows["22B"]["sp"] == pytest.approx(17.583 / 26.333, abs=1e-3)
    assert rows["175B"]["both"] == pytest.approx(4.25 / 23, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Pipeline: micro-batches in flight
# ---------------------------------------------------------------------------------------------


def test_in_flight_1f1b_and_interleaved():
    assert [in_flight_microbatches(4, 1, i, 64) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(4, 1, 0, 2) == 2  # fewer micro-batches than stages
    for p, v in ((4, 2), (8, 3), (16, 4)):
        # Korthikanti sec. 4.2.3: the first stage holds p micro-batches x (1 + (p-1)/(p v))
        assert in_flight_microbatches(p, v, 0, 1000) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_first_stage_holds_all_layers_worth_of_activations():
    """1F1B: L/p layers x p micro-batches = L layers (Korthikanti eq. 5, independent of p)."""
    m = load_model("llama-3.1-70b")
    per_layer = layer_activation_bytes(layer_coeffs(m, False, 8, 8, True), 4096, 4096, 1, "selective")
    for pp in (1, 2, 4, 8):
        s = validate(m, Strategy.of(tp=8, pp=pp), 8 * pp)
        acts = train_activation_bytes(m, s, seq_len=4096, mbs=1, microbatches=64)
        assert acts[0] == pytest.approx(m.layers * per_layer)
        assert acts == sorted(acts, reverse=True)


def test_cp_divides_the_sequence_and_recompute_orders():
    m = load_model("qwen2.5-7b")
    s1 = validate(m, Strategy.of(tp=2), 8)
    s2 = validate(m, Strategy.of(tp=2, cp=2), 8)
    a1 = train_activation_bytes(m, s1, seq_len=8192, mbs=1, microbatches=8)[0]
    a2 = train_activation_bytes(m, s2, seq_len=8192, mbs=1, microbatches=8)[0]
    assert a2 == pytest.approx(a1 / 2)
    cpu = load_hardware("cpu")  # no flash attention there: the score matrix is stored
    w = Workload(kind="pretrain", seq_len=2048, gbs=64)
    got = {
        rc: phase_memory(m, cpu, Cluster(gpus=8), validate(m, Strategy.of(tp=2, recompute=rc), 8), w)[0][
            "update"
        ].parts["activations"]
        for rc in ("none", "selective", "full")
    }
    assert got["none"] > got["selective"] > got["full"] > 0


# ---------------------------------------------------------------------------------------------
# Model state: Megatron's rule
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dist", [True, False])
@pytest.mark.parametrize("gpus,kw", [(8, dict(tp=2)), (16, dict(tp=2, cp=2)), (16, dict(tp=4, pp=2))])
def test_dense_model_state_follows_megatrons_rule(dist, gpus, kw):
    """docs/source/api-guide/dist_optimizer.md: bf16 param + fp32 grads = 18 B/param, or 6 + 12/d
    with the distributed optimizer, d = DP x CP (Megatron shards over the DP group with CP)."""
    m = load_model("qwen2.5-7b")
    s = validate(m, Strategy.of(distributed_optimizer=dist, **kw), gpus)
    d = s.layout.dp * s.layout.cp
    assert model_state_bytes_per_param(d, dist) == (6 + 12 / d if dist else 18)
    mem, _, _ = phase_memory(m, H100, Cluster(gpus=gpus), s, Workload())
    upd = mem["update"].parts
    state = upd["weights"] + upd["grads"] + upd["optimizer"]
    # the worst stage (by its phase total) is the one reported: its params follow the rule
    rule = [p.total * model_state_bytes_per_param(d, dist) for p in per_stage_params(m, s)]
    assert any(state == pytest.approx(r, rel=1e-12) for r in rule)


def test_all_rows_of_megatrons_table():
    # dist_optimizer.md: fp16 param/fp16 grads 20 or 4 + 16/d; bf16/fp32 grads 18 or 6 + 12/d;
    # fp32 16 or 8 + 8/d.
    for d in (1, 2, 8, 64):
        assert model_state_bytes_per_param(d, True, "fp16") == pytest.approx(4 + 16 / d)
        assert model_state_bytes_per_param(d, True, "bf16") == pytest.approx(6 + 12 / d)
        assert model_state_bytes_per_param(d, True, "fp32") == pytest.approx(8 + 8 / d)
    assert [model_state_bytes_per_param(4, False, k) for k in ("fp16", "bf16", "fp32")] == [20, 18, 16]


def test_cpu_profile_counts_fp32_like_the_trainer():
    m = load_model("tiny")
    s = validate(m, Strategy.of(tp=2), 2)
    st = max(p.total for p in per_stage_params(m, s))
    mem, _, _ = phase_memory(m, load_hardware("cpu"), Cluster(gpus=2), s, Workload(kind="pretrain", seq_len=64, gbs=8))
    upd = mem["update"].parts
    assert upd["weights"] == 4 * st and upd["grads"] == 4 * st
    assert upd["optimizer"] == pytest.approx(8 * st)  # m and v only: the fp32 params are the master copy


def test_moe_optimizer_shards_experts_over_expert_dp():
    m = load_model("qwen3-30b-a3b")
    s = validate(m, Strategy.of(tp=2, ep=8, etp=1), 16)  # dp=8, expert-DP = 2*1*8/(8*1) = 2
    mem, _, _ = phase_memory(m, H100, Cluster(gpus=16), s, Workload())
    st = per_stage_params(m, s)[0]
    assert mem["update"].parts["optimizer"] == pytest.approx(12 * (st.dense / 8 + st.expert / 2))
    assert mem["update"].parts["grads"] == 4 * st.total


# ---------------------------------------------------------------------------------------------
# Rollout, offload, violations
# ---------------------------------------------------------------------------------------------


def test_kv_bytes_per_token():
    # 2 (K,V) x layers x kv heads x head_dim x 2 B: Qwen2.5-7B 56 KiB, Llama-3.1-8B 128 KiB per token.
    assert kv_bytes_per_token(load_model("qwen2.5-7b"), 1) == 2 * 28 * 4 * 128 * 2 == 57344
    assert kv_bytes_per_token(load_model("llama-3.1-8b"), 1) == 131072
    assert kv_bytes_per_token(load_model("llama-3.1-8b"), 4) == 131072 / 4
    # rollout_tp 8 > 4 KV heads: each rank keeps one replicated head
    assert kv_bytes_per_token(load_model("qwen2.5-7b"), 8) == 57344 / 4
    # MLA caches the latent (512 + 64) per layer, whole on every rank (DeepSeek-V2 sec. 2.1.2)
    assert kv_bytes_per_token(load_model("deepseek-v3"), 8) == 61 * 576 * 2


def test_kv_capacity_and_concurrency():
    m = load_model("qwen2.5-7b")
    s = validate(m, Strategy.of(tp=2, rollout_tp=2, gpu_memory_utilization=0.6), 8)
    w = Workload()
    k = kv_cache_capacity(m, H100, s, w, 8)
    assert k.weights_bytes == pytest.approx(2 * per_stage_params(m, Strategy.of(tp=2))[0].total)
    assert k.kv_bytes == pytest.approx(0.6 * H100.hbm_bytes - k.weights_bytes - k.working_bytes)
    assert k.tokens == int(k.kv_bytes // (57344 / 2))
    assert k.sequences == k.tokens // 2048 and k.sequences > 100
    assert k.replicas == 4
    # more memory for vLLM, more sequences; a larger rollout TP, smaller weights per rank
    assert kv_cache_capacity(m, H100, s.replace(gpu_memory_utilization=0.8), w, 8).sequences > k.sequences
    assert rollout_weight_bytes(m, 4) < rollout_weight_bytes(m, 2)
    mem, _, _ = phase_memory(m, H100, Cluster(gpus=8), s, w)
    assert mem["rollout"].info["max_concurrent_sequences"] == k.sequences


def test_moe_expert_activations():
    m = load_model("qwen3-30b-a3b")
    h, f, k = m.hidden, m.expert_ffn_hidden, m.top_k
    # tp=etp=4 with SP: each rank keeps T*k/4 pair inputs gathered over ETP (h each) and 3f/4 of each
    # pair's MLP; the router's fp32 probabilities over E experts, split by SP.
    c = layer_coeffs(m, True, 4, 4, True)
    dense_part = 2 * (4 * h / 4 + (2 * 4096 + 2 * 512) / 4) + 4 * m.heads / 4
    assert c.linear == pytest.approx(dense_part + 2 * k * (4 * h + 3 * f) / 4 + 4 * m.experts / 4)
    # the vLLM working set holds every token on every rank: more rollout TP, less per rank
    assert rollout_working_bytes(m, 4) < rollout_working_bytes(m, 2) < rollout_working_bytes(m, 1)


def test_rollout_budget_below_weights_is_an_oom_risk():
    m = load_model("llama-3.1-70b")
    e = estimate(
        model=m,
        hardware=H100,
        cluster=Cluster(gpus=8),
        strategy=Strategy.of(tp=8, rollout_tp=1, gpu_memory_utilization=0.5),
        workload=Workload(),
    )
    assert not e.fits
    ro = [v for v in e.violations if v.phase == "rollout" and "KV cache" in v.message]
    assert ro and ro[0].code == "OOM_RISK" and ro[0].bytes_over > 0
    assert e.memory["rollout"].parts["rollout_kv_cache"] == 0


def test_offload_moves_state_to_the_host_and_checks_it():
    m = load_model("qwen2.5-7b")
    w = Workload()
    s = validate(m, Strategy.of(tp=2, offload=("param", "grad", "optimizer")), 8)
    mem, host, viol = phase_memory(m, H100, Cluster(gpus=8), s, w)
    on = phase_memory(m, H100, Cluster(gpus=8), validate(m, Strategy.of(tp=2), 8), w)[0]
    ro = mem["rollout"].parts
    assert ro["weights"] == ro["grads"] == ro["optimizer"] == ro["ref_weights"] == 0
    assert mem["rollout"].total_bytes < on["rollout"].total_bytes
    assert mem["old_logprob"].parts["weights"] > 0  # the phase that needs them has them
    upd = on["update"].parts
    # actor + reference weights and the optimizer; verl 0.9.1 frees gradient buffers rather than
    # copying them to the host (verl/utils/megatron_utils.py offload_megatron_model_to_cpu)
    per_rank = 2 * upd["weights"] + upd["optimizer"]
    assert host == pytest.approx(8 * per_rank)
    assert not [v for v in viol if v.phase == "host"]
    small = dataclasses.replace(H100, host_memory_bytes=host / 2)
    _, _, viol = phase_memory(m, small, Cluster(gpus=8), s, w)
    hv = [v for v in viol if v.phase == "host"]
    assert hv and hv[0].code == "OOM_RISK" and hv[0].bytes_over == pytest.approx(host / 2)


def test_plan_that_does_not_fit_is_data():
    m = load_model("llama-3.1-70b")
    e = estimate(
        model=m, hardware=H100, cluster=Cluster(gpus=8), strategy=Strategy.of(tp=1), workload=Workload(kind="pretrain")
    )
    assert list(e.memory) == ["update"]
    assert not e.fits
    v = [v for v in e.violations if v.phase == "update"][0]
    assert v.code == "OOM_RISK" and v.bytes_over == pytest.approx(e.memory["update"].total_bytes - e.capacity_bytes)
    d = e.to_dict()
    assert d["fits"] is False and d["violations"][0]["code"] == "OOM_RISK"
    assert set(d["memory"]["phases"]["update"]) >= {"total_bytes", "weights_bytes", "activations_bytes"}


def test_grpo_phases_and_reference_model():
    m = load_model("qwen2.5-7b")
    s = validate(m, Strategy.of(tp=2), 8)
    mem, _, _ = phase_memory(m, H100, Cluster(gpus=8), s, Workload(kl=True))
    assert list(mem) == ["rollout", "weight_sync", "old_logprob", "ref_logprob", "update"]
    assert mem["ref_logprob"].parts["ref_weights"] == mem["update"].parts["weights"]
    nokl, _, _ = phase_memory(m, H100, Cluster(gpus=8), s, Workload(kl=False))
    assert "ref_logprob" not in nokl and "ref_weights" not in nokl["update"].parts
    # forward-only log-prob holds far less than training's 1F1B activations
    assert mem["old_logprob"].parts["activations"] < mem["update"].parts["activations"]


# ---------------------------------------------------------------------------------------------
# Property: any valid plan gives a well-formed estimate; only coded errors otherwise
# ---------------------------------------------------------------------------------------------

MODELS = ["tiny", "tiny-moe", "qwen2.5-0.5b", "qwen2.5-7b", "llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3"]
POW2 = st.sampled_from([1, 2, 4, 8, 16])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(MODELS),
    gpus=st.sampled_from([1, 2, 4, 8, 16, 64, 256]),
    tp=POW2,
    pp=POW2,
    cp=st.sampled_from([1, 2]),
    ep=POW2,
    mbs=st.sampled_from([1, 2, 4]),
    rc=st.sampled_from(["none", "selective", "full"]),
    off=st.sets(st.sampled_from(["param", "grad", "optimizer"])),
    rtp=POW2,
    util=st.floats(0.1, 0.95),
    kind=st.sampled_from(["grpo", "pretrain"]),
)
def test_estimate_is_well_formed(name, gpus, tp, pp, cp, ep, mbs, rc, off, rtp, util, kind):
    m = load_model(name)
    s = Strategy.of(
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep if m.is_moe else 1,
        etp=1 if m.is_moe else None,
        mbs=mbs,
        recompute=rc,
        offload=tuple(sorted(off)),
        rollout_tp=rtp,
        gpu_memory_utilization=util,
    )
    try:
        e = estimate(model=m, hardware=H100, cluster=Cluster(gpus=gpus), strategy=s, workload=Workload(kind=kind))
    except InvalidDegreesError:
        return
    assert e.strategy.layout.tp * e.strategy.layout.pp * e.strategy.layout.cp * e.strategy.layout.dp == gpus
    for pm in e.memory.values():
        assert all(v >= 0 for v in pm.parts.values()), pm
    assert e.peak_bytes == max(pm.total_bytes for pm in e.memory.values())
    over = {name for name, pm in e.memory.items() if pm.total_bytes > e.capacity_bytes}
    assert over <= {v.phase for v in e.violations if v.code == "OOM_RISK"}
    assert e.fits == (not any(v.code == "OOM_RISK" for v in e.violations))


# ---------------------------------------------------------------------------------------------
# Measured: what autograd really keeps in a megatron-core layer (CPU, the trainer's local spec)
# ---------------------------------------------------------------------------------------------

# The 1-layer GPT that the autograd check builds (in the script below) and prices (in the test), spelled once.
_CHK_SPEC = {
    "name": "chk",
    "family": "llama",
    "layers": 1,
    "hidden": 256,
    "ffn_hidden": 768,
    "heads": 8,
    "kv_heads": 2,
    "head_dim": 32,
    "vocab": 64,
    "max_seq_len": 512,
}

_SAVED_SCRIPT = r"""
import dataclasses, json, os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import warnings; warnings.filterwarnings("ignore")
import torch
from grpo_tune.trainer import compat, parallel, model as tm
from grpo_tune.core.specs import ModelSpec
from grpo_tune.core.strategy import Strategy, validate
compat.enable()
seq, b = 128, 4

def saved(m, rc):
    s = validate(m, Strategy.of(recompute=rc), 1)
    parallel.init(s)
    net = tm.build_chunks(m, s, tm.transformer_config(m, s))[0]
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    seen = {}
    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t
    ids = torch.randint(0, m.vocab, (b, seq))
    pos = torch.arange(seq).unsqueeze(0).expand(b, seq)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = net(ids, pos, None)
    out.float().sum().backward()
    return sum(seen.values())

m1 = ModelSpec(**json.loads(sys.argv[2]))
m2 = dataclasses.replace(m1, layers=2)
print(json.dumps({rc: saved(m2, rc) - saved(m1, rc) for rc in ("none", "selective", "full")}))
"""


def test_local_spec_layout_matches_autograd_on_cpu(tmp_path):
    """Build 1- and 2-layer megatron-core GPT models (the trainer's CPU build), run forward and
    backward, and sum the bytes of every storage autograd saves (parameters excluded): the
    difference is one layer's activations. Our per-tensor count for the local spec (fp32, unfused)
    must match within 2% (the rest: RoPE's cos/sin tables and the causal mask)."""
    import importlib.util
    import socket
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron") is None:
        pytest.skip("needs torch and megatron-core (the train extra)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = tmp_path / "saved.py"
    script.write_text(_SAVED_SCRIPT)
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, str(script), str(port), __import__("json").dumps(_CHK_SPEC)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    measured = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    m = ModelSpec(**_CHK_SPEC)
    c = layer_coeffs(m, False, 1, 1, False, flash=False, fused=False, act_bytes=4)
    for rc in ("none", "selective", "full"):
        model = layer_activation_bytes(c, 128, 128, 4, rc)
        assert measured[rc] == pytest.approx(model, rel=0.02), (rc, measured[rc], model)


def test_native_rollout_profile_has_no_vllm_budget():
    """On the cpu profile the trainer samples with its own Megatron model: the rollout phase holds the
    actor's state and one forward, not gpu_memory_utilization x HBM, and weight sync copies nothing."""
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    wl = Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=8)
    cpu = load_hardware("cpu")
    est = estimate(
        model=load_model("tiny"),
        hardware=cpu,
        cluster=Cluster(gpus=2, gpus_per_node=2),
        strategy=Strategy.of(tp=2, gpu_memory_utilization=0.6, engine="megatron"),
        workload=wl,
    )
    ro, upd = est.memory["rollout"], est.memory["update"]
    assert ro.parts["rollout_kv_cache"] == 0 and ro.parts["rollout_weights"] == 0
    assert ro.total_bytes < 0.01 * 0.6 * cpu.hbm_bytes
    assert ro.parts["weights"] == upd.parts["weights"] > 0
    assert est.memory["weight_sync"].parts["rollout_weights"] == 0
    assert ro.info == {"native_rollout": 1.0}


def test_a_probed_cpu_profile_keeps_the_cpu_trainers_activations():
    """The kernels come from the profile's stated fields, not its name: a profile written by
    `probe-hardware` on a CPU (named after its file, kernel fields copied from the
    ``cpu`` base as trainer/probe.py writes them) prices tiny's activations like ``cpu`` does
    (megatron's local fp32 spec: 671,744 B), not as a GPU's TE/bf16 layers (212,992 B)."""
    from grpo_tune.core.specs import HardwareSpec, load_hardware, load_model
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.costmodel.memory import kernels_for, train_activation_bytes
    from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate

    cpu = load_hardware("cpu").to_dict()
    probed = {
        k: cpu[k]
        for k in (
            "source",
            "bf16_dense_flops_per_s",
            "hbm_bytes",
            "hbm_bandwidth_bytes_per_s",
            "gpus_per_node",
            "intra_node_bandwidth_bytes_per_s",
            "inter_node_bandwidth_bytes_per_s",
            "host_memory_bytes",
            "host_to_device_bandwidth_bytes_per_s",
            "reserved_memory_bytes",
            "attention_kernel",
            "activation_layout",
            "efficiency",
        )
    }
    hw = HardwareSpec.from_dict({**probed, "name": "my-laptop"})
    wl = Workload(prompts=8, n=4, prompt_len=16, response_len=16, mini_batch=4)
    acts = {}
    for h in (
        hw,
        HardwareSpec.from_dict(
            {
                **probed,
                "name": "gpu-like",
                "attention_kernel": "flash",
                "activation_layout": "te-bf16",
            }
        ),
    ):
        s = validate(load_model("tiny"), Strategy(), 1)
        acts[h.name] = train_activation_bytes(
            load_model("tiny"), s, seq_len=32, mbs=1, microbatches=1, kernels=kernels_for(h, wl)
        )[0]
        e = estimate(model=load_model("tiny"), hardware=h, cluster=Cluster(gpus=1), strategy=Strategy(), workload=wl)
        assert e.memory["update"].parts["activations"] in (0.0, acts[h.name])  # 0 when the optimizer step peaks
    assert acts == {"my-laptop": 671_744, "gpu-like": 212_992}
