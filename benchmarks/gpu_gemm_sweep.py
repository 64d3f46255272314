"""Measure bf16 GEMM and attention throughput at the shapes a GRPO step runs, on one GPU.

    python benchmarks/gpu_gemm_sweep.py --out gemm.csv

Shapes: the per-layer GEMMs of Qwen2.5-7B, Llama-3.1-8B, Qwen3-32B and Llama-3.1-70B split by
TP 1/2/4/8 (QKV, attention output, MLP up+gate, MLP down), at token counts from one decode step
of a few sequences (m = 8) to a packed training micro-batch (m = 32768); plus flash attention
(torch's scaled_dot_product_attention, causal) at training sequence lengths. Each row is the
median of timed repeats after a warm-up, ``2*m*n*k / t`` for GEMMs and ``4*b*h*s^2*d/2 / t``
(causal) for attention. The hardware profile's efficiency curve is fitted on these rows.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time

import torch

MODELS = {  # hidden, ffn, heads, kv_heads, head_dim (published HF configs)
    "qwen2.5-7b": (3584, 18944, 28, 4, 128),
    "llama-3.1-8b": (4096, 14336, 32, 8, 128),
    "qwen3-32b": (5120, 25600, 64, 8, 128),
    "llama-3.1-70b": (8192, 28672, 64, 8, 128),
}


def _time(fn, min_s: float = 0.05) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    reps = max(3, min(100, int(min_s / max(first, 1e-6))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_rows(tokens: list[int]):
    for name, (h, f, heads, kv, d) in MODELS.items():
        for tp in (1, 2, 4, 8):
            shapes = {
                "qkv": ((heads + 2 * kv) * d // tp, h),
                "attn_out": (h, heads * d // tp),
                "mlp_up_gate": (2 * f // tp, h),
                "mlp_down": (h, f // tp),
            }
            for part, (n, k) in shapes.items():
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                for m in tokens:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    t = _time(lambda: x @ w.t())
                    yield {
                        "kind": "gemm",
                        "model": name,
                        "tp": tp,
                        "part": part,
                        "m": m,
                        "n": n,
                        "k": k,
                        "seconds": t,
                        "tflops": 2 * m * n * k / t / 1e12,
                    }


def attention_rows():
    for name, (h, f, heads, kv, d) in MODELS.items():
        for tp in (1, 8):
            hq = heads // tp
            for s in (512, 1024, 2048, 4096, 8192):
                b = max(1, 16384 // s)
                q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                t = _time(fn)
                flops = 4 * b * hq * s * s * d / 2
                yield {
                    "kind": "attn_fwd",
                    "model": name,
                    "tp": tp,
                    "part": "causal_sdpa",
                    "m": b * s,
                    "n": s,
                    "k": d,
                    "seconds": t,
                    "tflops": flops / t / 1e12,
                }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="8,64,256,1024,4096,16384,32768")
    a = ap.parse_args()
    tokens = [int(x) for x in a.tokens.split(",")]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    rows = []
    for r in list(gemm_rows(tokens)) + list(attention_rows()):
        rows.append(r)
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    best = max(r["tflops"] for r in rows if r["kind"] == "gemm")
    print(f"{len(rows)} rows; {torch.cuda.get_device_name()}; best bf16 GEMM {best:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
