"""The vLLM rollout engine on a GPU: weight sync, agreement with the Megatron engine, sleep/wake,
and a short `grpo-tune train` with rollout_engine: vllm.

GPU only (``@pytest.mark.gpu``; skipped without CUDA or without vllm). Run on a GPU machine with
``python -m pytest -m gpu tests/test_trainer_vllm.py``. Each case runs in its own Python process
(vLLM and megatron keep process-wide state), launched from the test and reporting JSON back.
On CPU, the adapter's bookkeeping (engine options, sleep/wake order, bucketed sync, per-request
seeds, stop handling) is checked against a fake ``vllm`` module, and import safety in a subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_harness import train_run

ROOT = Path(__file__).resolve().parent.parent

try:
    import torch

    _CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _CUDA = False
_VLLM = importlib.util.find_spec("vllm") is not None
needs_gpu = pytest.mark.skipif(not (_CUDA and _VLLM), reason="needs a CUDA GPU and vllm (pip install 'grpo-tune[gpu]')")


def _cfg(tmp: Path, *, rollout_tp=1, gpus=1, steps=3, engine="vllm"):
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    return RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("h200-141gb"),
        cluster=Cluster(gpus=gpus, gpus_per_node=gpus),
        strategy=Strategy.of(mbs=8, recompute="none", rollout_tp=rollout_tp, gpu_memory_utilization=0.3),
        workload=Workload(prompts=8, n=4, prompt_len=8, response_len=8, mini_batch=8, kl=True, dtype="bf16"),
        trainer=TrainerOptions(
            steps=steps,
            lr=1e-3,
            dataset="synthetic",
            out_dir=str(tmp / "run"),
            checkpoint_every=steps,
            rollout_engine=engine,
        ),
    )


# ---- the cases, each run in a fresh process -----------------------------------------------------


def _case_sync(tmp: Path) -> dict:
    import torch

    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.data import synthetic_examples
    from grpo_tune.trainer.engine import Engine
    from grpo_tune.trainer.rollout import SamplingParams, get_rollout_engine
    from grpo_tune.trainer.rollout.sampling import pack
    from grpo_tune.trainer.tokenizer import CharTokenizer

    cfg = _cfg(tmp)
    parallel.init(cfg)
    actor = Engine(cfg)
    tok = CharTokenizer()
    eng = get_rollout_engine("vllm", cfg=cfg, engine=actor, tokenizer=tok)
    prompts = [tok.encode_prompt(e.prompt) for e in synthetic_examples(16, seed=0)]
    sp = SamplingParams(max_tokens=8, seed=11)
    res: dict = {}

    # 1. a zero lm_head makes every logit 0: each sampled token then has log-prob -log(V)
    eng.resume()
    eng.update_weights(
        (n, torch.zeros_like(t) if n == "lm_head.weight" else t) for n, t in actor.named_parameters_for_export()
    )
    _, lps = eng.generate_with_logprobs(prompts, sp)
    res["zero_head_lp_err"] = max(abs(x + math.log(128)) for r in lps for x in r)

    # 2. the real weights: vLLM's log-probs of its own samples against the Megatron engine's
    eng.update_weights(actor.named_parameters_for_export())
    ids, lps = eng.generate_with_logprobs(prompts, sp)
    b = pack(prompts, ids, pad_id=tok.pad_id)
    mlp = actor.logprobs(b["tokens"], micro_batch_size=8)[0].float().cpu()
    m = b["response_mask"].bool()
    meg = mlp[m].float()
    vl = torch.tensor([x for r in lps for x in r])
    res["n_tokens"] = int(m.sum())
    res["max_abs_diff"] = float((meg - vl).abs().max())
    dv, dm = vl + math.log(128), meg + math.log(128)  # deviations from uniform carry the signal
    res["corr"] = float(torch.corrcoef(torch.stack([dv, dm]))[0, 1])
    res["spread"] = float(dm.std())

    # 3. sleep frees memory; wake + sync + the same seed reproduce the same responses
    free_awake = torch.cuda.mem_get_info()[0]
    eng.release()
    res["freed_bytes"] = int(torch.cuda.mem_get_info()[0] - free_awake)
    eng.resume()
    eng.update_weights(actor.named_parameters_for_export())
    res["same_after_wake"] = eng.generate(prompts, sp) == ids
    res["stop_kept_last"] = all(tok.eos_id not in r[:-1] for r in ids)
    return res


CASES = {"sync": _case_sync}


def _run_case(name: str, tmp: Path, timeout: int = 600) -> dict:
    out = tmp / f"{name}.json"
    r = subprocess.run(
        [sys.executable, __file__, name, str(tmp), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0 and out.exists(), r.stdout[-4000:] + r.stderr[-4000:]
    return json.loads(out.read_text())


# ---- tests ----------------------------------------------------------------------------------


def test_importing_the_registry_never_imports_vllm():
    code = "import sys, grpo_tune.trainer.rollout, grpo_tune.trainer.rollout.vllm; assert 'vllm' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.gpu
@needs_gpu
def test_vllm_weight_sync_logprobs_and_sleep(tmp_path):
    res = _run_case("sync", tmp_path)
    print(res)
    assert res["zero_head_lp_err"] < 1e-3  # update_weights reached vLLM's model
    assert res["n_tokens"] >= 32
    # bf16 on both sides: per-token log-probs agree to a few 1e-2 and track each other closely
    assert res["max_abs_diff"] < 0.05 and res["corr"] > 0.9, res
    assert res["freed_bytes"] > 1 << 30  # 30% of an H200 minus weights is tens of GiB of KV cache
    assert res["same_after_wake"] and res["stop_kept_last"]


@pytest.mark.gpu
@needs_gpu
def test_grpo_train_with_vllm_rollout(tmp_path):
    rows = train_run(_cfg(tmp_path, steps=3), tmp_path, timeout=900)
    assert [x["step"] for x in rows] == [1, 2, 3]
    assert all(math.isfinite(x["loss"]) and x["phases_s"]["weight_sync"] > 0 for x in rows)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.skipif(not _CUDA or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_grpo_train_rollout_tp2_with_train_tp1(tmp_path):
    """Rollout TP differs from training TP (2 processes: train DP2, one rollout replica of TP2)."""
    rows = train_run(_cfg(tmp_path, rollout_tp=2, gpus=2, steps=2), tmp_path, timeout=900)
    assert [x["step"] for x in rows] == [1, 2]


# ---- the adapter's bookkeeping on CPU, against a fake vllm module ---------------------------------


class _FakeVllm:
    """Stands in for the vllm package: records the calls the adapter makes."""

    def __init__(self):
        import dataclasses
        import types

        self.events: list = []
        fake = self

        @dataclasses.dataclass
        class EngineArgs:
            model: str = ""
            data_parallel_size: int = 1

        class SamplingParams:
            def __init__(self, **kw):
                self.kw = kw

        class Model:
            def load_weights(self, weights):
                fake.events.append(("load", [n for n, _ in weights]))
                return {n for n, _ in weights}

        class LLM:
            def __init__(self, **kw):
                fake.llm_kwargs = kw
                model = Model()
                runner = types.SimpleNamespace(model=model)
                worker = types.SimpleNamespace(model_runner=runner)
                self.llm_engine = types.SimpleNamespace(
                    model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=worker))
                )

            def sleep(self, level=1):
                fake.events.append(("sleep", level))

            def reset_prefix_cache(self):
                fake.events.append(("reset_prefix_cache",))

            def wake_up(self, tags=None):
                fake.events.append(("wake", tuple(tags or ())))

            def generate(self, prompts, sampling_params, use_tqdm=True):
                fake.events.append(("generate", len(prompts)))
                sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
                fake.seen_params = sps
                outs = []
                for p, sp in zip(prompts, sps):
                    first = 40 + (sp.kw.get("seed") or 0) % 50
                    ids = [first, p["prompt_token_ids"][-1], 3, 77, 78][: sp.kw["max_tokens"]]  # 3 = EOS
                    lp = [{t: types.SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(ids)]
                    outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, logprobs=lp)]))
                return outs

        self.module = types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, EngineArgs=EngineArgs)


@pytest.fixture
def fake_vllm(monkeypatch):
    fake = _FakeVllm()
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    return fake


def test_adapter_builds_a_colocated_sleeping_engine(fake_vllm, tmp_path):
    from grpo_tune.trainer.rollout import get_rollout_engine
    from grpo_tune.trainer.tokenizer import CharTokenizer

    cfg = _cfg(tmp_path)
    eng = get_rollout_engine("vllm", cfg=cfg, tokenizer=CharTokenizer(), device="cpu")
    kw = fake_vllm.llm_kwargs
    assert kw["enable_sleep_mode"] and kw["load_format"] == "dummy" and kw["skip_tokenizer_init"]
    assert (kw["tensor_parallel_size"], kw["gpu_memory_utilization"], kw["max_model_len"], kw["dtype"]) == (
        1,
        0.3,
        16,
        "bfloat16",
    )
    hf_cfg = json.loads((Path(kw["model"]) / "config.json").read_text())
    assert (hf_cfg["vocab_size"], hf_cfg["num_hidden_layers"], hf_cfg["architectures"]) == (
        128,
        4,
        ["LlamaForCausalLM"],
    )
    assert fake_vllm.events == [("sleep", 2)]  # memory goes back to training until the first rollout
    assert eng.collective_batch is False and eng.shares_actor_weights is False


def test_adapter_wakes_weights_before_kv_cache_and_buckets_the_sync(fake_vllm, tmp_path):
    import torch

    from grpo_tune.trainer.rollout import SamplingParams
    from grpo_tune.trainer.rollout.vllm import VLLMRollout
    from grpo_tune.trainer.tokenizer import CharTokenizer

    eng = VLLMRollout(cfg=_cfg(tmp_path), tokenizer=CharTokenizer(), device="cpu", bucket_bytes=64, sleep_level=1)
    fake_vllm.events.clear()
    eng.resume()
    tensors = [(f"w{i}", torch.zeros(8)) for i in range(5)]  # 32 bytes each: buckets of two
    eng.update_weights(iter(tensors))
    ids, lps = eng.generate_with_logprobs(
        [[2, 55, 61], [2, 56, 61]], SamplingParams(max_tokens=4, seed=5, stop_token_ids=(99,))
    )
    eng.release()
    assert fake_vllm.events == [
        ("wake", ("weights",)),
        ("load", ["w0", "w1"]),
        ("load", ["w2", "w3"]),
        ("load", ["w4"]),
        ("wake", ("kv_cache",)),
        ("reset_prefix_cache",),
        ("generate", 2),
        ("sleep", 1),
    ]
    assert ids == [[ids[0][0], 61, 3], [ids[1][0], 61, 3]]  # cut after EOS, which is kept
    assert lps == [[-0.5, -1.0, -1.5]] * 2
    seeds = [sp.kw["seed"] for sp in fake_vllm.seen_params]
    assert len(set(seeds)) == 2  # copies of a prompt must not share a seed
    assert fake_vllm.seen_params[0].kw["stop_token_ids"] == [3, 99] and fake_vllm.seen_params[0].kw["logprobs"] == 0
    # a second resume while awake is a no-op; generate wakes a released engine by itself
    fake_vllm.events.clear()
    assert eng.generate([[2, 1]], SamplingParams(max_tokens=1)) == [[40]]
    assert fake_vllm.events == [("wake", ("weights",)), ("wake", ("kv_cache",)), ("generate", 1)]


def test_adapter_rejects_bad_options(fake_vllm, tmp_path):
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.trainer.rollout.vllm import VLLMRollout

    with pytest.raises(GrpoTuneError):
        VLLMRollout(cfg=_cfg(tmp_path), device="cpu", sleep_level=3)
    if not _CUDA:
        with pytest.raises(GrpoTuneError, match="CUDA"):
            VLLMRollout(cfg=_cfg(tmp_path))


@pytest.mark.parametrize(
    "knobs",
    [
        dict(enforce_eager=False, max_num_seqs=256, max_num_batched_tokens=8192, chunked_prefill=True),
        dict(enforce_eager=True, max_num_seqs=64, max_num_batched_tokens=4096, chunked_prefill=False),
    ],
)
def test_every_engine_knob_of_the_plan_reaches_vllm_llm(fake_vllm, tmp_path, knobs):
    """The engine that runs is the one the cost model priced: each rollout knob of the strategy arrives
    in vllm.LLM's keywords under vLLM's own name (two settings, so a constant cannot pass)."""
    from grpo_tune.trainer.rollout.vllm import VLLMRollout
    from grpo_tune.trainer.tokenizer import CharTokenizer

    cfg = _cfg(tmp_path)
    cfg = cfg.replace(strategy=cfg.strategy.replace(gpu_memory_utilization=0.45, **knobs))
    VLLMRollout(cfg=cfg, tokenizer=CharTokenizer(), device="cpu")
    kw = fake_vllm.llm_kwargs
    assert kw["enforce_eager"] is knobs["enforce_eager"]
    assert kw["max_num_seqs"] == knobs["max_num_seqs"]
    assert kw["max_num_batched_tokens"] == knobs["max_num_batched_tokens"]
    assert kw["enable_chunked_prefill"] is knobs["chunked_prefill"]
    assert kw["gpu_memory_utilization"] == 0.45 and kw["tensor_parallel_size"] == 1
    assert kw["enable_sleep_mode"] is True


def test_free_cache_engine_off_keeps_vllm_awake(fake_vllm, tmp_path):
    """verl's free_cache_engine=False: the memory model keeps weights and KV cache resident, so the
    adapter neither asks for sleep mode nor sleeps."""
    from grpo_tune.trainer.rollout.vllm import VLLMRollout
    from grpo_tune.trainer.tokenizer import CharTokenizer

    cfg = _cfg(tmp_path)
    eng = VLLMRollout(
        cfg=cfg.replace(strategy=cfg.strategy.replace(free_cache_engine=False)), tokenizer=CharTokenizer(), device="cpu"
    )
    eng.release()
    assert fake_vllm.llm_kwargs["enable_sleep_mode"] is False and fake_vllm.events == []


def test_startup_memory_arithmetic():
    """vLLM starts when fraction x total <= free (its start-up check); otherwise OOM_RISK names the
    largest fraction that would start, rounded down."""
    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.trainer.rollout.vllm import check_startup_memory

    gib = 2**30
    check_startup_memory(0.6, free_bytes=int(139.5 * gib), total_bytes=140 * gib)  # an empty H200
    check_startup_memory(0.5, free_bytes=70 * gib, total_bytes=140 * gib)  # exactly enough
    # the actor and reference resident first (say 60 GiB): 0.6 x 140 = 84 GiB > 80 GiB free
    with pytest.raises(GrpoTuneError) as ei:
        check_startup_memory(0.6, free_bytes=80 * gib, total_bytes=140 * gib)
    assert ei.value.code == "OOM_RISK"
    assert "84.00 GiB" in ei.value.message and "80.00 GiB is free" in ei.value.message
    assert "0.57" in ei.value.hint  # floor(100 * 80 / 140) / 100


@pytest.mark.gpu
@needs_gpu
def test_the_start_up_check_refuses_before_vllm_does(tmp_path):
    """On a GPU: with most of the memory held (as the actor and reference would hold it if built first),
    the adapter refuses with OOM_RISK and the largest fraction that would start, before vLLM's own
    'Free memory on device ... is less than desired GPU memory utilization'."""
    import torch

    from grpo_tune.core.errors import GrpoTuneError
    from grpo_tune.trainer.rollout.vllm import VLLMRollout
    from grpo_tune.trainer.tokenizer import CharTokenizer

    free, total = torch.cuda.mem_get_info()
    hold = torch.empty(int(free - 0.2 * total), dtype=torch.uint8, device="cuda")  # leave 20% free; asks 30%
    try:
        with pytest.raises(GrpoTuneError) as ei:
            VLLMRollout(cfg=_cfg(tmp_path), tokenizer=CharTokenizer())
        assert ei.value.code == "OOM_RISK" and "would refuse to start" in ei.value.message
    finally:
        del hold
        torch.cuda.empty_cache()


def test_build_makes_vllm_before_the_actor_and_reference(monkeypatch, tmp_path):
    """trainer.build.build starts vLLM on an empty GPU (its start-up check passes), then the actor and
    the reference; the native sampler, which runs on the actor, comes after the actor."""
    import types

    from grpo_tune.trainer import build, engine, parallel, rollout
    from grpo_tune.trainer.tokenizer import CharTokenizer

    order: list[str] = []

    class FakeEngine:
        def __init__(self, cfg, trainable=True):
            order.append("actor" if trainable else "reference")

    def fake_rollout(name, **kw):
        order.append(f"rollout:{name}")
        return types.SimpleNamespace()

    monkeypatch.setattr(engine, "Engine", FakeEngine)
    monkeypatch.setattr(rollout, "get_rollout_engine", fake_rollout)
    monkeypatch.setattr(parallel, "layout", lambda: types.SimpleNamespace(rank=0, world_size=1))
    monkeypatch.setattr("grpo_tune.trainer.loop.GRPOLoop", lambda *a, **k: types.SimpleNamespace())
    from grpo_tune.trainer.loop import Item

    items = [Item(prompt_ids=[5, 6], answer="1")]
    for name, want in (
        ("vllm", ["rollout:vllm", "actor", "reference"]),
        ("megatron", ["actor", "reference", "rollout:megatron"]),
    ):
        order.clear()
        cfg = _cfg(tmp_path, engine=name)
        build.build(cfg, items=items, reward_fn=lambda it, ids: 0.0, tokenizer=CharTokenizer())
        assert order == want, name


if __name__ == "__main__":  # a case in a fresh process: python tests/test_trainer_vllm.py CASE TMP OUT
    sys.path.insert(0, str(ROOT))
    _name, _tmp, _out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    _res = CASES[_name](_tmp)
    _out.write_text(json.dumps(_res))
    import os

    os._exit(0)  # skip vLLM's and torch.distributed's slow or hanging teardown


def test_adapter_buckets_the_sync_by_the_plans_sync_bucket_mb(fake_vllm, tmp_path):
    """No bucket_bytes given: the bucket is strategy.sync_bucket_mb MiB (what the cost model priced and verl.sh
    sets). 1 MiB and five 512 KiB tensors (2**17 fp32 values each) give buckets of two, two and one."""
    import torch

    from grpo_tune.trainer.rollout.vllm import VLLMRollout
    from grpo_tune.trainer.tokenizer import CharTokenizer

    cfg = _cfg(tmp_path)
    cfg = cfg.replace(strategy=cfg.strategy.replace(sync_bucket_mb=1))
    eng = VLLMRollout(cfg=cfg, tokenizer=CharTokenizer(), device="cpu", sleep_level=1)
    assert eng.bucket_bytes == 1 << 20
    fake_vllm.events.clear()
    eng.update_weights(iter([(f"w{i}", torch.zeros(1 << 17)) for i in range(5)]))
    loads = [e[1] for e in fake_vllm.events if e[0] == "load"]
    assert loads == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    default = VLLMRollout(cfg=_cfg(tmp_path), tokenizer=CharTokenizer(), device="cpu", sleep_level=1)
    assert default.bucket_bytes == 2048 << 20  # verl 0.9.1's default, the plan's when unset


# ---- vLLM on CPU: what runs without vLLM (the real engine: tests/test_vllm_cpu*.py, marker `vllm`) ----------------


def test_rollout_mismatch_is_verls_probability_difference_and_ours_in_log_probs():
    """verl's calculate_debug_metrics: |exp(lp_actor) - exp(lp_rollout)| over the response tokens (mean, max,
    std) and the Pearson correlation of the probabilities; ours: the log-prob difference. Golden values by hand."""
    import math as m

    import torch

    from grpo_tune.trainer.loop import rollout_mismatch, scatter_response_logprobs

    trainer = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, -3.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    rollout = scatter_response_logprobs([[1, 2], [1, 2]], [[-1.1, -2.0], [-0.3]], mask)
    assert torch.allclose(rollout, torch.tensor([[0.0, -1.1, -2.0, 0.0], [0.0, -0.3, 0.0, 0.0]]))
    got = rollout_mismatch(trainer, rollout, mask)
    dp = [abs(m.exp(-1.0) - m.exp(-1.1)), 0.0, abs(m.exp(-0.5) - m.exp(-0.3))]
    assert got["rollout_probs_diff_mean"] == pytest.approx(sum(dp) / 3, rel=1e-5)
    assert got["rollout_probs_diff_max"] == pytest.approx(max(dp), rel=1e-5)
    assert got["rollout_logprob_diff_mean"] == pytest.approx((0.1 + 0.0 + 0.2) / 3, rel=1e-5)
    assert got["rollout_logprob_diff_max"] == pytest.approx(0.2, rel=1e-5)
    assert 0.9 < got["rollout_actor_probs_pearson_corr"] <= 1.0
    assert rollout_mismatch(trainer, trainer, torch.zeros_like(mask)) == {}  # no response token: nothing to log


def test_the_mismatch_reaches_verls_names():
    from grpo_tune.trainer.tracking import verl_metrics

    out = verl_metrics({"rollout_probs_diff_mean": 0.01, "rollout_probs_diff_max": 0.2, "weight_version": 3})
    assert out["training/rollout_probs_diff_mean"] == 0.01 and out["training/rollout_probs_diff_max"] == 0.2
    assert out["training/rollout_probs_diff_valid"] == 1.0 and out["training/weight_version"] == 3.0
    assert "training/rollout_probs_diff_valid" not in verl_metrics({"weight_version": 0})  # the native sampler


def test_the_cpu_kv_cache_is_the_priced_one_capped_by_max_num_seqs(tmp_path):
    """vLLM on CPU gets the KV bytes the cost model leaves (gpu_memory_utilization x this rank's share of the RAM,
    less weights and working set), but never more than max_num_seqs sequences in whole 128-token blocks hold at
    the run's dtype."""
    import dataclasses

    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.costmodel.memory import kv_bytes_per_token, kv_cache_capacity
    from grpo_tune.trainer.rollout.vllm import CPU_BLOCK_SIZE, cpu_kv_cache_bytes

    m, hw = load_model("tiny-vllm"), load_hardware("cpu")

    def cfg(seqs, gmu, gpus=1, dtype="fp32"):
        return RunConfig(
            model=m,
            hardware=hw,
            cluster=Cluster(gpus=gpus, gpus_per_node=gpus),
            strategy=Strategy.of(max_num_seqs=seqs, gpu_memory_utilization=gmu),
            workload=Workload(prompts=8, n=2, prompt_len=100, response_len=60, mini_batch=8, dtype=dtype),
            trainer=TrainerOptions(rollout_engine="vllm"),
        )

    per_tok = kv_bytes_per_token(m, 1)  # bf16 bytes per token
    assert cpu_kv_cache_bytes(cfg(16, 0.5)) == 16 * 2 * CPU_BLOCK_SIZE * per_tok * 2  # 160 tokens: 2 blocks, fp32
    assert cpu_kv_cache_bytes(cfg(16, 0.5, dtype="bf16")) == 16 * 2 * CPU_BLOCK_SIZE * per_tok
    # a budget below the cap: the cost model's KV bytes on this rank's share of the host's RAM (2 ranks)
    c = cfg(20_000, 0.2, gpus=2)
    share = dataclasses.replace(hw, hbm_bytes=int(hw.rank_memory_bytes(2)))
    want = kv_cache_capacity(m, share, c.strategy, c.workload).kv_bytes
    assert cpu_kv_cache_bytes(c) == int(want) and 0 < want < hw.hbm_bytes / 2


def test_negative_stop_ids_never_reach_vllm(fake_vllm, tmp_path):
    """Profile mode's synthetic tokenizer has no EOS (id -1): vLLM refuses an out-of-vocabulary stop id."""
    import types

    from grpo_tune.trainer.rollout import SamplingParams
    from grpo_tune.trainer.rollout.vllm import VLLMRollout

    eng = VLLMRollout(cfg=_cfg(tmp_path), tokenizer=types.SimpleNamespace(eos_id=-1), device="cpu")
    eng.generate([[2, 5]], SamplingParams(max_tokens=2, stop_token_ids=(7,)))
    assert fake_vllm.seen_params[0].kw["stop_token_ids"] == [7]
