"""vLLM's host (CPU, Python) cost per decode step and per running sequence, apart from the model's forward.

    CI=true python benchmarks/bench_vllm_host.py --out benchmarks/results/vllm_host.json   # /work/venv-vllm
    python benchmarks/bench_vllm_host.py --from-json benchmarks/results/vllm_host.json     # re-fit, no vLLM

(set out in full, with the figures, in docs/measurements.md "vLLM's host cost per decode step, by component").

One in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the engine core, the model runner and the
output processor all run in this Python thread) on the CPU build, with a throw-away model written to a temp dir
so the forward is cheap: a 1-layer Qwen2 (hidden 128, 2 heads of 64, 1 KV head, FFN 256, vocab 512, fp32,
``load_format="dummy"``, ``enforce_eager``) and a byte-level BPE tokenizer of 512 tokens trained on the spot
(``tokenizers``), so detokenization runs vLLM's real ``FastIncrementalDetokenizer``. The benchmark drives
``LLMEngine`` itself (``add_request`` x C, then ``step()`` until done) so each step is one engine iteration and
the requests' ``output_kind`` can be chosen.

C requests of 8 prompt tokens each generate exactly ``--length`` tokens (``ignore_eos``, temperature 1, no
top-p/k) with ``max_num_seqs`` = ``max_num_batched_tokens`` >= 8 C, so the prefill is one step and every later
step is a decode step over all C sequences. vLLM V1's functions on the engine-core loop are wrapped
(monkeypatched on their classes) and each call's ``time.thread_time()`` (this thread's CPU time: the Python host
work is single-threaded, the forward's OpenMP workers are other threads) is added to its component for the step:

    step           LLMEngine.step                      the whole iteration (inclusive of all below)
    core_step      EngineCore.step                     schedule + execute + sample + update
    schedule       Scheduler.schedule
    update         Scheduler.update_from_output
    execute        GPUModelRunner.execute_model        (the CPU runner subclasses it; inclusive of:)
      update_states    GPUModelRunner._update_states
      prepare_inputs   GPUModelRunner._prepare_inputs
      attn_metadata    GPUModelRunner._build_attention_metadata
      preprocess       GPUModelRunner._preprocess
      forward          GPUModelRunner._model_forward   the model's forward: EXCLUDED from host
    logits         <model>.compute_logits              the LM head GEMM: EXCLUDED from host
    sample_tokens  GPUModelRunner.sample_tokens        (inclusive of:)
      sample           GPUModelRunner._sample          the sampler (softmax / exponential / argmax ops)
      bookkeeping      GPUModelRunner._bookkeeping_sync
    process_outputs OutputProcessor.process_outputs     (inclusive of:)
      detokenize       IncrementalDetokenizer.update (Fast...)

``host`` = step - forward - logits (everything on the loop's thread that is not the model's GEMMs);
``host_net`` = host less the wrappers' own cost (``wrapper_overhead_s``, measured: ~1.4 us per wrapped call);
``core_host`` = the engine core's share (EngineCore.step - forward - logits); ``shared_host`` = host_net less the
two CPU-platform parts (``sample``: the CPU sampler's fused Gumbel-argmax kernel; ``attn_metadata``: the CPU
attention backend's builder). Per call, each component is averaged over the steady decode steps (a step that
schedules no new request and C tokens; the first two and the last are left out); one discarded warm-up call per
point, then over ``--rounds`` sweeps of all (C, mode) points the median is kept and the spread (max - min)
reported. ``host(C) = a + b C`` is fitted by least squares per mode (``relative``: residuals divided by y, so the
small C fix ``a``): ``a`` the per-step cost, ``b`` the per-sequence cost. The forward runs with one OpenMP thread
(``--threads``): with more, on a shared machine, a torch op's main thread spins at the region's barrier for a
descheduled worker and thread_time() counts that as host. Modes (per request, one engine with prefix caching and
``logprobs_mode="processed_logprobs"``, verl's defaults): ``nodetok`` (``detokenize=False``, ``FINAL_ONLY``, no
logprobs: the trainer adapter's requests), ``nodetok_lp`` (+ ``logprobs=0``: verl's in-process SPMD rollout of
mid-2025), ``detok`` (``detokenize=True``, ``FINAL_ONLY``) and ``verl`` (``detokenize=True``, ``CUMULATIVE``,
``logprobs=0``: verl 0.9.1's ``vLLMHttpServer.generate`` sets neither detokenize nor output_kind, so vLLM's
defaults hold; in its AsyncLLM the output processor runs in the front-end process, off the engine core's loop).

Measured (benchmarks/results/vllm_host.json, this shared 2-vCPU EPYC VM, thread CPU, relative fit of host_net):
nodetok a = 0.64 ms, b = 31.7 us per sequence; nodetok_lp 0.97 ms, 40.9 us; detok 0.67 ms, 36.1 us; verl 0.83
ms, 78.2 us (its engine core's share 34.6 us). The scheduler (schedule + update_from_output, ~17 us/seq) is half
of b. Shared with a GPU host (the same Python: scheduler, V1 runner input preparation and bookkeeping,
output processor; ``CPUModelRunner`` subclasses ``GPUModelRunner``): ``shared_host`` b = 27-35 us/seq for the
trainer-like modes. Not exercised here: async scheduling (off on CPU, the default on GPUs: overlaps host and
GPU), Model Runner V2 (the GPU default where Triton exists), the mp executor's output serialisation. Absolute
speeds are this CPU's: ``python_reference()`` (stored in the JSON) scales them to another host. Full reading:
docs/measurements.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONCURRENCY = (1, 8, 32, 128, 256, 512, 1024)
PROMPT_LEN = 8
VOCAB = 512
MODES = {
    # name: (detokenize, output_kind name, logprobs)
    "nodetok": (False, "FINAL_ONLY", None),
    "nodetok_lp": (False, "FINAL_ONLY", 0),
    "detok": (True, "FINAL_ONLY", None),
    "verl": (True, "CUMULATIVE", 0),
}
FORWARD = ("forward", "logits")
"""The components that are the model's own compute (excluded from ``host``)."""


def write_model(folder: Path) -> None:
    """A 1-layer Qwen2 config and a 512-token byte-level BPE tokenizer (trained here on synthetic text)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": VOCAB,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "use_sliding_window": False,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    words = ["alpha", "beta", "gamma", "delta", "reward", "policy", "token", "sample", "the", "of", "and", "12", "345"]
    text = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(40)) for i in range(200)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text, vocab_size=VOCAB, min_frequency=1, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    tok.save_pretrained(str(folder))


class Recorder:
    """Per-step thread-CPU seconds per component, from wrappers installed on vLLM's classes."""

    def __init__(self) -> None:
        self.cur: dict[str, float] = defaultdict(float)
        self.info: dict[str, int] = {}
        self.steps: list[dict] = []
        self.installed: list[str] = []

    def wrap(self, owner, name: str, label: str, hook=None) -> None:
        orig = owner.__dict__.get(name)
        if orig is None:
            raise AttributeError(f"{owner.__qualname__}.{name} not found: vLLM's code moved")
        rec = self

        @functools.wraps(orig)
        def timed(*a, **k):
            t0 = time.thread_time()
            try:
                out = orig(*a, **k)
            finally:
                rec.cur[label] += time.thread_time() - t0
            if hook is not None:
                hook(out)
            return out

        setattr(owner, name, timed)
        self.installed.append(f"{label}={owner.__module__}.{owner.__qualname__}.{name}")

    def wrap_step(self, owner, name: str) -> None:
        orig = owner.__dict__[name]
        rec = self

        @functools.wraps(orig)
        def timed(*a, **k):
            rec.cur = defaultdict(float)
            rec.info = {}
            w0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            out = orig(*a, **k)
            c1, w1, p1 = time.thread_time(), time.perf_counter(), time.process_time()
            row = dict(rec.cur)
            # the optional serialisation probe ran inside this step: not part of the in-process step
            xc, xw = row.pop("_probe_cpu", 0.0), row.pop("_probe_wall", 0.0)
            row["step"] = c1 - c0 - xc
            row["wall"] = w1 - w0 - xw
            row["process_cpu"] = p1 - p0 - xc
            rec.steps.append({**rec.info, **row})
            return out

        setattr(owner, name, timed)
        self.installed.append(f"step={owner.__module__}.{owner.__qualname__}.{name}")


def serialize_probe(rec: Recorder):
    """A hook for EngineCore.step's result: msgpack-encode each client's ``EngineCoreOutputs`` as the
    multiprocess engine core's output thread does (``MsgpackEncoder.encode_into``, vllm/v1/engine/core.py
    ``process_output_sockets``) and decode them as the front-end client does (``MsgpackDecoder(EngineCoreOutputs)``),
    timing both (``serialize``, ``deserialize``); the in-process engine does neither, so the step leaves them out."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    enc, dec, buf = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs), bytearray()

    def hook(out) -> None:
        w0, c0 = time.perf_counter(), time.thread_time()
        for eco in out[0].values():
            t0 = time.thread_time()
            bufs = enc.encode_into(eco, buf)
            t1 = time.thread_time()
            dec.decode([bytes(b) for b in bufs])
            t2 = time.thread_time()
            rec.cur["serialize"] += t1 - t0
            rec.cur["deserialize"] += t2 - t1
        rec.cur["_probe_cpu"] += time.thread_time() - c0
        rec.cur["_probe_wall"] += time.perf_counter() - w0

    return hook


def install(rec: Recorder, model_cls, serialize: bool = False) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.detokenizer import BaseIncrementalDetokenizer
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def sched_info(so) -> None:
        rec.info = {
            "tokens": so.total_num_scheduled_tokens,
            "new_reqs": len(so.scheduled_new_reqs),
            "reqs": len(so.num_scheduled_tokens),
        }

    rec.wrap_step(LLMEngine, "step")
    rec.wrap(EngineCore, "step", "core_step", hook=serialize_probe(rec) if serialize else None)
    rec.wrap(Scheduler, "schedule", "schedule", hook=sched_info)
    rec.wrap(Scheduler, "update_from_output", "update")
    for name, label in (
        ("execute_model", "execute"),
        ("_update_states", "update_states"),
        ("_prepare_inputs", "prepare_inputs"),
        ("_build_attention_metadata", "attn_metadata"),
        ("_preprocess", "preprocess"),
        ("_model_forward", "forward"),
        ("sample_tokens", "sample_tokens"),
        ("_sample", "sample"),
        ("_bookkeeping_sync", "bookkeeping"),
    ):
        rec.wrap(GPUModelRunner, name, label)
    rec.wrap(model_cls, "compute_logits", "logits")
    rec.wrap(OutputProcessor, "process_outputs", "process_outputs")
    rec.wrap(BaseIncrementalDetokenizer, "update", "detokenize")


def summarize(steps: list[dict], C: int) -> dict:
    """Mean per component over the steady decode steps of one call."""
    dec = [s for s in steps if s.get("new_reqs") == 0 and s.get("tokens") == C and s.get("reqs") == C]
    steady = dec[2:-1] if len(dec) > 4 else dec
    keys = sorted({k for s in steady for k in s} - {"tokens", "new_reqs", "reqs"})
    out = {k: statistics.fmean(s.get(k, 0.0) for s in steady) for k in keys}
    out["host"] = out["step"] - sum(out.get(k, 0.0) for k in FORWARD)
    g = out.get
    # what the wrapped components leave over, at each level
    out["execute_rest"] = g("execute", 0) - sum(
        g(k, 0) for k in ("update_states", "prepare_inputs", "attn_metadata", "preprocess", "forward", "logits")
    )
    out["sample_rest"] = g("sample_tokens", 0) - g("sample", 0) - g("bookkeeping", 0)
    out["core_rest"] = g("core_step", 0) - sum(g(k, 0) for k in ("schedule", "update", "execute", "sample_tokens"))
    out["loop_rest"] = g("step", 0) - g("core_step", 0) - g("process_outputs", 0)
    out["decode_steps"] = len(steady)
    return out


def measure(
    concurrency: list[int], length: int, rounds: int, modes: list[str], threads: int = 1, serialize: bool = False
) -> dict:
    # One OpenMP thread by default: on a shared machine a multi-threaded torch op's main thread waits (spins)
    # at the region's barrier for a descheduled worker, which thread_time() counts as host work.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    from grpo_tune.trainer.rollout.vllm import import_vllm

    vllm = import_vllm()
    import torch

    torch.set_num_threads(threads)  # OMP_NUM_THREADS is read once, when torch loads: set it here too
    from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
    from vllm.sampling_params import RequestOutputKind

    rec = Recorder()
    install(rec, Qwen2ForCausalLM, serialize)
    tmp = tempfile.TemporaryDirectory(prefix="bench_vllm_host_")
    folder = Path(tmp.name)
    write_model(folder)
    cmax = max(concurrency)
    t0 = time.perf_counter()
    llm = vllm.LLM(
        model=str(folder),
        load_format="dummy",
        dtype="float32",
        enforce_eager=True,
        max_num_seqs=cmax,
        max_num_batched_tokens=max(2048, PROMPT_LEN * cmax),
        max_model_len=PROMPT_LEN + length + 8,
        enable_prefix_caching=True,  # verl's default (rollout.enable_prefix_caching) and the adapter's
        logprobs_mode="processed_logprobs",  # verl's default (rollout.logprobs_mode)
        kv_cache_memory_bytes=512 * 2**20,
        seed=0,
    )
    build_s = time.perf_counter() - t0
    torch.set_num_threads(threads)  # and again: the engine's CPU worker may set its own count when it starts
    eng = llm.llm_engine
    runner = eng.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    meta = {
        "engine_build_s": build_s,
        "vllm": vllm.__version__,
        "model_runner": f"{type(runner).__module__}.{type(runner).__qualname__}",
        "async_scheduling": bool(eng.vllm_config.scheduler_config.async_scheduling),
        "torch_threads": __import__("torch").get_num_threads(),
        "serialize_probe": serialize,
        "wrapped": rec.installed,
    }
    print(json.dumps(meta, indent=1), flush=True)

    def call(C: int, mode: str) -> dict:
        detok, kind, logprobs = MODES[mode]
        sp = vllm.SamplingParams(
            max_tokens=length,
            ignore_eos=True,
            temperature=1.0,  # no per-request seed: a seeded request takes the sampler's per-request loop
            detokenize=detok,
            logprobs=logprobs,
            output_kind=getattr(RequestOutputKind, kind),
        )
        for i in range(C):
            ids = [(7 * i + 3 * j) % (VOCAB - 2) + 1 for j in range(PROMPT_LEN)]
            eng.add_request(f"{mode}-{C}-{time.monotonic_ns()}-{i}", {"prompt_token_ids": ids}, sp)
        rec.steps = []
        w0 = time.perf_counter()
        done = 0
        while eng.has_unfinished_requests():
            done += sum(1 for o in eng.step() if o.finished)
        wall = time.perf_counter() - w0
        assert done == C, (done, C)
        row = summarize(rec.steps, C)
        row.update(concurrency=C, mode=mode, call_wall_s=wall, load=os.getloadavg()[0])
        return row

    rows = []
    try:
        for C in concurrency:  # warm-up: one discarded call per point (first calls at a size run slower)
            for mode in modes:
                call(C, mode)
        for rnd in range(rounds):
            for C in concurrency:
                for mode in modes:
                    r = call(C, mode)
                    r["round"] = rnd
                    rows.append(r)
                    print(
                        f"round {rnd + 1}/{rounds} C={C:5d} {mode:9s} host {1e3 * r['host']:8.3f} ms/step "
                        f"({1e6 * r['host'] / C:7.2f} us/seq)  forward+logits "
                        f"{1e3 * (r['forward'] + r['logits']):7.3f} ms  sched {1e3 * r['schedule']:6.3f}  "
                        f"update {1e3 * r['update']:6.3f}  out {1e3 * r['process_outputs']:6.3f}  "
                        f"wall {1e3 * r['wall']:7.3f} ms  load {r['load']:.1f}",
                        flush=True,
                    )
    finally:
        del llm
        tmp.cleanup()
    return {**meta, "length": length, "prompt_len": PROMPT_LEN, "rounds": rounds, "calls": rows}


COMPONENTS = (
    "step",
    "host",
    "host_net",
    "core_host",
    "shared_host",
    "core_step",
    "schedule",
    "update",
    "execute",
    "update_states",
    "prepare_inputs",
    "attn_metadata",
    "preprocess",
    "forward",
    "logits",
    "sample_tokens",
    "sample",
    "bookkeeping",
    "process_outputs",
    "detokenize",
    "serialize",
    "deserialize",
    "execute_rest",
    "sample_rest",
    "core_rest",
    "loop_rest",
    "wall",
    "process_cpu",
)


def lstsq(xs: list[float], ys: list[float], relative: bool = False) -> tuple[float, float, float]:
    """y = a + b x by least squares (``relative``: each residual divided by its y, so the small-C points,
    which fix ``a``, weigh as much as the large ones); returns (a, b, r2 of the unweighted residuals)."""
    ws = [1.0 / (y * y) if relative and y > 0 else 1.0 for y in ys]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    my = sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    b = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    m0 = sum(ys) / len(ys)
    ss = sum((y - m0) ** 2 for y in ys)
    r2 = 1 - sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / ss if ss else 1.0
    return a, b, r2


def wrapper_overhead_s(n: int = 200_000) -> float:
    """Thread-CPU seconds one Recorder wrapper adds to a call (fastest of 5): the timed wrappers sit on the
    engine's loop, and ``detokenize``'s runs once per sequence per step."""

    class Probe:
        def f(self) -> None:
            return None

    p = Probe()
    plain = Probe.f
    Recorder().wrap(Probe, "f", "probe")
    wrapped = Probe.f
    best = [float("inf"), float("inf")]
    for _ in range(5):
        for i, fn in enumerate((plain, wrapped)):
            t0 = time.thread_time()
            for _ in range(n):
                fn(p)
            best[i] = min(best[i], time.thread_time() - t0)
    return max(0.0, (best[1] - best[0]) / n)


WRAPPED_PER_STEP = 15
"""Wrapped calls per decode step on the loop besides ``detokenize`` (once per sequence when detokenizing)."""


def analyse(data: dict) -> dict:
    """Median and spread over rounds per (mode, C, component); the fit a + b C per mode and component
    (unweighted and relative), and ``host_net``: ``host`` less the wrappers' own cost."""
    calls = data["calls"]
    ovh = data["wrapper_overhead_s"]
    for r in calls:
        per_seq = 1 if MODES[r["mode"]][0] else 0
        r["host_net"] = r["host"] - ovh * (WRAPPED_PER_STEP + per_seq * r["concurrency"])
        # the engine core's share (what verl 0.9.1's EngineCoreProc runs; its output processor is elsewhere)
        r["core_host"] = r["core_step"] - sum(r.get(k, 0.0) for k in FORWARD) - ovh * (WRAPPED_PER_STEP - 3)
        # host_net less the two CPU-platform parts (the CPU sampler's kernel, the CPU attention metadata builder)
        r["shared_host"] = r["host_net"] - r.get("sample", 0.0) - r.get("attn_metadata", 0.0)
    modes = sorted({r["mode"] for r in calls}, key=list(MODES).index)
    cs = sorted({r["concurrency"] for r in calls})
    table: dict = {}
    fits: dict = {}
    for mode in modes:
        table[mode] = {}
        for C in cs:
            rs = [r for r in calls if r["mode"] == mode and r["concurrency"] == C]
            table[mode][str(C)] = {
                k: {
                    "median": statistics.median(r.get(k, 0.0) for r in rs),
                    "spread": max(r.get(k, 0.0) for r in rs) - min(r.get(k, 0.0) for r in rs),
                }
                for k in COMPONENTS
            }
        fits[mode] = {}
        for k in COMPONENTS:
            ys = [table[mode][str(C)][k]["median"] for C in cs]
            a, b, r2 = lstsq([float(c) for c in cs], ys)
            ar, br, r2r = lstsq([float(c) for c in cs], ys, relative=True)
            fits[mode][k] = {
                "per_step_s": a,
                "per_sequence_s": b,
                "r2": r2,
                "relative": {"per_step_s": ar, "per_sequence_s": br, "r2": r2r},
            }
        # the per-round fits of host, for the spread of a and b themselves
        per_round = []
        for rnd in sorted({r["round"] for r in calls}):
            rs = sorted((r for r in calls if r["mode"] == mode and r["round"] == rnd), key=lambda r: r["concurrency"])
            if len(rs) >= 2:
                a, b, _ = lstsq([float(r["concurrency"]) for r in rs], [r["host_net"] for r in rs], relative=True)
                per_round.append({"per_step_s": a, "per_sequence_s": b})
        fits[mode]["host_per_round"] = per_round
    return {"table": table, "fits": fits}


def report(data: dict, res: dict) -> None:
    cs = sorted({r["concurrency"] for r in data["calls"]})
    show = (
        "host",
        "host_net",
        "core_host",
        "shared_host",
        "schedule",
        "update",
        "update_states",
        "prepare_inputs",
        "attn_metadata",
        "execute_rest",
        "sample",
        "bookkeeping",
        "process_outputs",
        "detokenize",
        "core_rest",
        "loop_rest",
        "forward",
        "logits",
        "serialize",
        "deserialize",
    )
    for mode, t in res["table"].items():
        print(f"\n== {mode}: thread-CPU us per decode step, median over rounds (spread)")
        print(f"{'C':>5} " + " ".join(f"{k[:12]:>14}" for k in show))
        for C in cs:
            cells = [f"{1e6 * t[str(C)][k]['median']:8.1f}({1e6 * t[str(C)][k]['spread']:4.0f})" for k in show]
            print(f"{C:5d} " + " ".join(f"{c:>14}" for c in cells))
        print(f"{'fit':>5} a (us/step), b (us/seq), r2:")
        for k in show:
            f = res["fits"][mode][k]
            fr = f["relative"]
            print(
                f"      {k:16s} a={1e6 * f['per_step_s']:9.1f}  b={1e6 * f['per_sequence_s']:7.3f}  r2={f['r2']:.4f}"
                f"   relative: a={1e6 * fr['per_step_s']:9.1f}  b={1e6 * fr['per_sequence_s']:7.3f}"
            )
        pr = res["fits"][mode]["host_per_round"]
        if pr:
            print(
                "      host per round: "
                + ", ".join(f"a={1e6 * p['per_step_s']:.0f} us b={1e6 * p['per_sequence_s']:.2f} us" for p in pr)
            )


def python_reference(n: int = 200_000, repeats: int = 5) -> float:
    """Thread-CPU seconds (fastest of ``repeats``) of a fixed pure-Python loop of the kind the scheduler runs
    (attribute reads, dict and list updates per request), to scale these figures to another host's CPU: run
    ``python -c 'import bench_vllm_host as b; print(b.python_reference())'`` there (no vLLM needed)."""

    class Req:
        __slots__ = ("rid", "num_computed", "out")

        def __init__(self, rid: int) -> None:
            self.rid, self.num_computed = rid, 0
            self.out: list[int] = []

    best = float("inf")
    for _ in range(repeats):
        reqs = [Req(i) for i in range(1024)]
        t0 = time.thread_time()
        sched: dict[int, int] = {}
        for i in range(n):
            r = reqs[i & 1023]
            r.num_computed += 1
            sched[r.rid] = r.num_computed
            r.out.append(i)
            if len(r.out) > 64:
                r.out.clear()
        best = min(best, time.thread_time() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--length", type=int, default=48, help="response tokens per request (ignore_eos)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads of the forward (OMP_NUM_THREADS)")
    ap.add_argument(
        "--serialize", action="store_true", help="also time the mp engine's msgpack encode/decode of the outputs"
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-json", default=None)
    args = ap.parse_args(argv)
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        data = measure(
            [int(c) for c in args.concurrency.split(",")],
            args.length,
            args.rounds,
            args.modes.split(","),
            args.threads,
            args.serialize,
        )
    if "python_reference_s" not in data:
        data["python_reference_s"] = python_reference()
    if "wrapper_overhead_s" not in data:
        data["wrapper_overhead_s"] = wrapper_overhead_s()
    print(f"wrapper overhead: {1e9 * data['wrapper_overhead_s']:.0f} ns per wrapped call")
    res = analyse(data)
    print(f"python reference loop: {1e3 * data['python_reference_s']:.1f} ms (thread CPU)")
    report(data, res)
    if args.out:
        data.update(res)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
