"""vLLM on CPU, priced (default suite: no vLLM needed, pure cost model).

* The ``grpo-tune-cpu`` stack's ``[engines.vllm]`` table holds the decode host costs fitted to the measured vLLM-CPU
  rollout curve (benchmarks/results/vllm_cpu.json) through autotune.calibrate.fit: refitting them with the
  command the table names gives the file's values, and with them the model's error on the tiny plan (16
  sequences x 64 tokens, measured 2.80 s) is +4.2% where the native sampler's costs gave -84%.
* ``search --hardware cpu --rollout-engine vllm`` prices that engine with those costs and emits a best.yaml whose
  trainer runs vLLM (``trainer.rollout_engine: vllm``); without the flag (or with ``auto``) the cpu profile keeps
  its native sampler. The price moves with the table's values; SGLang on CPU, or a stack with no vLLM costs, is a
  coded NOT_PRICED error.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from grpo_tune.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
STACK = ROOT / "grpo_tune" / "profiles" / "stacks" / "grpo-tune-cpu.toml"
SEARCH = (
    "search --model tiny-vllm --gpus 1 --hardware cpu --prompts 16 --n 8 --mini-batch 16 --no-kl --prompt-len 8 "
    "--prompt-len-mean 3 --response-len 4 --response-len-mean 4 --enforce-eager --max-num-seqs 128 --top 1"
).split()
ESTIMATE = "estimate --model tiny-vllm --gpus 1 --hardware cpu --mbs 8 --enforce-eager --max-num-seqs 64 --json".split()


def _bench():
    spec = importlib.util.spec_from_file_location("bench_vllm_cpu", ROOT / "benchmarks" / "bench_vllm_cpu.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_vllm_cpu", mod)
    spec.loader.exec_module(mod)
    return mod


def _cli(*argv: str) -> str:
    r = CliRunner().invoke(app, list(argv))
    assert r.exit_code == 0, r.output
    return r.output


def test_the_cpu_stack_holds_the_refit_of_the_measured_rollout_curve():
    from grpo_tune.core.stacks import load_stack

    bench = _bench()
    table = load_stack("grpo-tune-cpu").engines["vllm"]
    assert table.provenance == "fitted" and table.command == bench.FIT_COMMAND
    assert "benchmarks/results/vllm_cpu.json" in table.source
    rows = json.loads((ROOT / "benchmarks" / "results" / "vllm_cpu.json").read_text())["points"]
    got = bench.fit(rows)["host_costs"]
    assert set(table.params) == set(bench.HOST_KEYS)
    for k in bench.HOST_KEYS:  # the file keeps 4 significant digits of the fit
        assert table.params[k] == pytest.approx(got["after"][k], rel=1e-3), k
    assert table.params["decode_step_overhead_s"] == pytest.approx(0.957e-3, rel=0.01)
    assert table.params["decode_sequence_overhead_s"] == pytest.approx(1e-7, rel=0.01)  # the fit's lower bound
    # the tiny plan's rollout error: +190% with the native sampler's costs, +17.9% as the profile prices it now
    assert got["prior"]["tiny_plan_error_pct"] == pytest.approx(190.0, abs=0.5)
    assert got["as_profiled"]["tiny_plan_error_pct"] == pytest.approx(17.9, abs=0.5)
    assert got["as_profiled"]["mape_pct"] == pytest.approx(17.3, abs=0.5)
    assert got["prior"]["mape_pct"] == pytest.approx(188.2, abs=0.5)
    # the printed table is the file's
    text = bench.stack_table({"host_costs": got})
    assert text.startswith("[engines.vllm.params]") and "decode_step_overhead_s = 9.571e-04" in text


def test_a_cpu_search_prices_vllm_when_asked_and_emits_a_plan_the_trainer_runs_with_it(tmp_path):
    from grpo_tune.core.config import load

    native = json.loads(_cli(*SEARCH, "--json", "--no-emit"))["best"]
    auto = json.loads(_cli(*SEARCH, "--rollout-engine", "auto", "--json", "--no-emit"))["best"]
    assert auto["time"] == native["time"]  # auto on cpu: the native sampler, as without the flag
    _cli(*SEARCH, "--rollout-engine", "vllm", "--out", str(tmp_path))
    (path,) = tmp_path.glob("tiny-vllm-1g-cpu-*/best.yaml")
    doc = yaml.safe_load(path.read_text())
    assert doc["trainer"]["rollout_engine"] == "vllm"
    # the engine is the plan's: written in the strategy (not the cpu platform's default), not in the hardware
    assert doc["strategy"]["engine"] == "vllm" and "rollout_engine" not in doc["hardware"]
    assert doc["hardware"]["stack"] == "grpo-tune-cpu"
    assert doc["strategy"]["rollout_tp"] == 1 and doc["strategy"]["enforce_eager"] is True
    # priced with vLLM's costs: a different rollout from the native sampler's, and a KV cache in its memory
    assert doc["predicted"]["phases_s"]["rollout"] != pytest.approx(native["time"]["phases_s"]["rollout"], rel=0.05)
    # read back, the plan is priced with the stack's [engines.vllm] table
    cfg = load(path)
    assert cfg.hardware.efficiency.decode_step_overhead_s == pytest.approx(0.9571e-3)
    assert cfg.hardware.efficiency.decode_sequence_overhead_s == pytest.approx(1e-7)
    assert cfg.trainer.rollout_engine == "vllm"


def test_the_price_moves_with_the_stacks_vllm_costs_and_the_refusals_are_coded(tmp_path, capsys):
    from grpo_tune.cli.main import main

    def rollout(*extra: str) -> dict:
        doc = json.loads(_cli(*ESTIMATE, *extra))
        return doc["details"] | doc["time"]

    base, vllm = rollout(), rollout("--rollout-engine", "vllm")
    assert vllm["phases_s"]["rollout"] != pytest.approx(base["phases_s"]["rollout"], rel=0.05)
    # a copy of the stack whose vLLM step overhead is doubled: the decode step grows by the same 0.957 ms
    text = STACK.read_text()
    slow = tmp_path / "slow.toml"
    slow.write_text(text.replace("decode_step_overhead_s = 9.571e-4", "decode_step_overhead_s = 1.9142e-3"))
    moved = rollout("--rollout-engine", "vllm", "--stack", str(slow))
    assert moved["decode_step_s"] - vllm["decode_step_s"] == pytest.approx(0.9571e-3, rel=1e-3)
    assert moved["phases_s"]["rollout"] > vllm["phases_s"]["rollout"]
    # the native sampler does not read the table
    assert rollout("--stack", str(slow))["phases_s"] == base["phases_s"]

    bare = tmp_path / "bare.toml"
    bare.write_text(text[: text.index("[engines.vllm]")])
    capsys.readouterr()
    for extra, words in (
        (["--rollout-engine", "sglang"], "not sglang"),
        (["--rollout-engine", "vllm", "--stack", str(bare)], "no [engines.vllm] table"),
    ):
        assert main([*ESTIMATE, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert "[NOT_PRICED]" in err and words in " ".join(err.split()) and "Traceback" not in err, err


def test_a_stack_engine_table_is_checked():
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.core.stacks import StackSpec

    head = {"name": "x", "framework": "grpo-tune", "release": "1", "source": "s"}
    ok = StackSpec.from_dict({**head, "engines": {"vllm": {"params": {"decode_step_overhead_s": 0.01}}}}, where="t")
    assert ok.engines["vllm"].params == {"decode_step_overhead_s": 0.01}
    for bad, words in (
        ({"tgi": {"params": {}}}, "unknown engine 'tgi'"),
        ({"vllm": {"params": {"hbm_efficiency": 0.5}}}, "hbm_efficiency not a stack parameter"),
        ({"vllm": {"speed": 1}}, "unknown key(s) speed"),
        ({"vllm": {"params": {}, "provenance": "guessed"}}, "provenance must be fitted or spec-only"),
    ):
        with pytest.raises(ConfigError) as e:
            StackSpec.from_dict({**head, "engines": bad}, where="t")
        assert words in str(e.value), (bad, str(e.value))


def test_vllms_memory_on_cpu_is_a_share_of_one_ranks_ram():
    """gpu_memory_utilization on the cpu profile is a fraction of one rank's share of the RAM (as the trainer gives
    vLLM its KV cache): 4 ranks of 24 GiB at 0.5 hold 3 GiB each for vLLM, not half of the whole machine."""
    argv = "estimate --model tiny-vllm --gpus 4 --hardware cpu --mbs 8 --rollout-engine vllm --json".split()
    doc = json.loads(_cli(*argv, "--gpu-memory-utilization", "0.5"))
    assert doc["fits"]
    roll = doc["memory"]["phases"]["rollout"]
    vllm = roll["rollout_weights_bytes"] + roll["rollout_activations_bytes"] + roll["rollout_kv_cache_bytes"]
    assert vllm == pytest.approx(0.5 * 24 * 2**30 / 4, rel=1e-6)


def test_vllm_on_cpu_is_priced_without_cuda_graphs():
    """vLLM's CPU platform runs eager whatever the plan asks (it sets enforce_eager and empties the capture sizes,
    vllm/platforms/cpu.py): on the cpu profile a plan with enforce_eager off is priced as the eager one, with no
    CUDA graphs kept outside the KV cache (colocated, through training, or on a rollout pool) and no graph replay
    in its decode time. On a GPU the same plan still pays CUDA_GRAPH_BYTES out of its KV cache. Before issue 36's
    fix the cpu plan lost 512 MiB of KV cache to graphs and kept them through training."""
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.costmodel import pools
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.costmodel.memory import CUDA_GRAPH_BYTES, kv_bytes_per_token

    m = load_model("tiny-vllm")
    wl = Workload(prompts=16, n=8, mini_batch=16, kl=False, prompt_len=8, prompt_len_mean=3, response_len=4)

    def priced(hw: str, eager: bool):
        s = Strategy.of(mbs=8, engine="vllm", enforce_eager=eager, max_num_seqs=64)
        return estimate(model=m, hardware=load_hardware(hw), cluster=Cluster(gpus=1), strategy=s, workload=wl)

    def kv_tokens(e) -> float:
        return e.memory["rollout"].info["kv_cache_tokens"]

    eager, graphs = priced("cpu", True), priced("cpu", False)
    assert kv_tokens(graphs) == kv_tokens(eager) > 0
    for phase, pm in graphs.memory.items():
        assert pm.parts == eager.memory[phase].parts, phase
        assert not pm.parts.get("vllm_cuda_graphs") and not pm.parts.get("rollout_cuda_graphs"), phase
    assert graphs.peak_bytes == eager.peak_bytes and graphs.time.phases == eager.time.phases
    # a rollout pool on cpu: no graphs either
    hw = load_hardware("cpu")
    for e in (True, False):
        pm, _ = pools.rollout_memory(m, hw, Cluster(gpus=1), Strategy.of(engine="vllm", enforce_eager=e), wl)
        assert pm.parts["rollout_cuda_graphs"] == 0.0
    # the same plan on a GPU captures them: the KV cache it leaves is CUDA_GRAPH_BYTES smaller (the test can fail)
    g_eager, g_graphs = priced("h100", True), priced("h100", False)
    per_tok = kv_bytes_per_token(m, 1, g_graphs.strategy.precision.kv_cache_dtype)
    assert kv_tokens(g_eager) - kv_tokens(g_graphs) == pytest.approx(CUDA_GRAPH_BYTES / per_tok, abs=1)
    assert g_graphs.memory["update"].parts["vllm_cuda_graphs"] == CUDA_GRAPH_BYTES  # asleep through training


def test_vllm_on_cpu_stays_resident_through_training_with_the_trainers_kv_cache():
    """vLLM's CPU platform has no sleep mode ("Sleep mode is not supported on current platform"), so the trainer runs
    it with sleep off whatever free_cache_engine asks, and its weights (at the workload's dtype) and the KV cache
    the trainer gives it (cpu_kv_cache_bytes: max_num_seqs full sequences in whole 128-token blocks, not the whole
    memory fraction) stay resident through every training phase. No sleep or wake seconds are priced there, even
    under a stack that sets them. On a GPU the plan still sleeps: nothing resident, and the stack's seconds paid.
    The old tree priced the cpu engine asleep (no vllm_resident with free_cache_engine, the whole fraction without)."""
    import dataclasses as dc

    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.costmodel import pools
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.costmodel.memory import host_kv_cache_bytes, kv_bytes_per_token, rollout_weight_bytes

    m = load_model("tiny-vllm")
    wl = Workload(prompts=16, n=8, mini_batch=16, prompt_len=8, prompt_len_mean=3, response_len=4, dtype="fp32")

    def priced(hw, free: bool, gpus: int = 1):
        s = Strategy.of(mbs=8, engine="vllm", enforce_eager=True, max_num_seqs=64, free_cache_engine=free)
        return estimate(model=m, hardware=hw, cluster=Cluster(gpus=gpus), strategy=s, workload=wl)

    def slow(hw):  # a stack that prices a sleep and a wake
        return dc.replace(hw, efficiency=dc.replace(hw.efficiency, engine_sleep_s=1.0, engine_wake_s=2.0))

    cpu = load_hardware("cpu")
    # 64 sequences of 8 + 4 tokens: one 128-token block each, fp32 (twice the bf16 bytes per token)
    kv = 64 * 128 * kv_bytes_per_token(m, 1) * 2
    weights = rollout_weight_bytes(m, 1, "bf16") * 2
    assert kv == 16 * 2**20 and weights == pytest.approx(4.76 * 2**20, rel=0.01)
    for gpus in (1, 2):
        asleep, awake = priced(cpu, True, gpus), priced(cpu, False, gpus)
        # the fraction the old tree held without free_cache_engine
        share = awake.strategy.rollout.gpu_memory_utilization * cpu.rank_memory_bytes(gpus)
        for phase in ("old_logprob", "ref_logprob", "update"):
            assert asleep.memory[phase].parts == awake.memory[phase].parts, phase
            assert asleep.memory[phase].parts["vllm_resident"] == weights + kv < share / 100, phase
            assert "vllm_cuda_graphs" not in asleep.memory[phase].parts
        assert host_kv_cache_bytes(m, cpu, asleep.strategy, wl, gpus) == kv
        # no sleep or wake time, whatever the stack says
        for e in (asleep, priced(slow(cpu), True, gpus)):
            assert dict(e.time.phases) == dict(awake.time.phases)
            assert e.details["weight_sync_wake_s"] == 0.0
    # a separate placement's training pool holds no vLLM at all
    s = Strategy.of(mbs=8, engine="vllm", enforce_eager=True, max_num_seqs=64)
    train = pools.train_pool(model=m, hardware=cpu, cluster=Cluster(gpus=2), strategy=s, workload=wl)
    assert train.memory.keys() == {"old_logprob", "ref_logprob", "update"}
    assert not any("vllm_resident" in pm.parts for pm in train.memory.values())
    # a GPU sleeps: nothing resident through training, and the stack's sleep and wake are paid
    h100 = load_hardware("h100")
    base, slept = priced(h100, True), priced(slow(h100), True)
    assert "vllm_resident" not in base.memory["update"].parts
    assert slept.details["weight_sync_wake_s"] == 2.0
    assert slept.time.phases["rollout"] - base.time.phases["rollout"] == pytest.approx(
        1.0 - h100.efficiency.engine_sleep_s
    )
    awake = priced(h100, False)  # awake: it holds its whole fraction
    frac = awake.strategy.rollout.gpu_memory_utilization
    assert awake.memory["update"].parts["vllm_resident"] == frac * h100.hbm_bytes
