"""CPU rollout speed: the native Megatron sampler with and without its KV cache, side by side.

    python benchmarks/bench_sampler.py [--model tiny] [--prompts 8] [--prompt-len 32] [--response-len 128]
                                       [--nproc 1] [--tp 1] [--pp 1] [--repeat 2]

Runs one torchrun launch (gloo, CPU) of ``--nproc`` processes, builds the model under the given
TP/PP, and generates ``--prompts`` greedy responses of exactly ``--response-len`` tokens (EOS
disabled) from random prompts of ``--prompt-len`` tokens, alternating uncached and cached
``--repeat`` times. Prints the best wall time of each, the speed-up, and whether the tokens were
identical (they must be).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(args) -> None:
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "tests"))
    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.engine import Engine
    from grpo_tune.trainer.rollout.base import SamplingParams
    from grpo_tune.trainer.rollout.megatron import MegatronRollout
    from trainer_harness import run_config

    parallel.init_distributed()
    cfg = run_config(args.model, {"tp": args.tp, "pp": args.pp}, dist.get_world_size())
    parallel.reinit(cfg.strategy, seed=cfg.trainer.seed)
    eng = Engine(cfg)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, cfg.model.vocab, (args.prompts, args.prompt_len), generator=g).tolist()
    tok = SimpleNamespace(pad_id=0, eos_id=-1)  # no EOS: every response runs to --response-len
    params = SamplingParams(max_tokens=args.response_len, temperature=0.0, seed=1)
    best = {False: float("inf"), True: float("inf")}
    out = {}
    for _ in range(args.repeat):
        for kv in (False, True):
            ro = MegatronRollout(engine=eng, tokenizer=tok, max_seq_len=cfg.model.max_seq_len, kv_cache=kv)
            dist.barrier()
            t0 = time.perf_counter()
            out[kv] = ro.generate(prompts, params)
            dist.barrier()
            best[kv] = min(best[kv], time.perf_counter() - t0)
    if dist.get_rank() == 0:
        Path(args.json).write_text(
            json.dumps(
                {
                    "uncached_s": best[False],
                    "cached_s": best[True],
                    "same_tokens": out[False] == out[True],
                    "tokens": sum(len(r) for r in out[True]),
                }
            )
        )
    parallel.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as d:
        js = str(Path(d) / "out.json")
        env = dict(
            os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}"
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.nproc}",
            str(Path(__file__).resolve()),
            "--worker",
            "--json",
            js,
            *sys.argv[1:],
        ]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0 or not Path(js).exists():
            sys.exit(p.stdout[-3000:] + p.stderr[-3000:])
        r = json.loads(Path(js).read_text())
    print(
        f"{args.model} tp{args.tp} pp{args.pp} x{args.nproc} proc, {args.prompts} prompts of {args.prompt_len} "
        f"tokens, {args.response_len} greedy tokens each ({r['tokens']} generated)"
    )
    print(f"{'sampler':<10}{'best s':>10}{'tokens/s':>12}")
    for name, key in (("uncached", "uncached_s"), ("cached", "cached_s")):
        print(f"{name:<10}{r[key]:>10.2f}{r['tokens'] / r[key]:>12.1f}")
    print(f"speed-up {r['uncached_s'] / r['cached_s']:.2f}x; identical tokens: {r['same_tokens']}")


if __name__ == "__main__":
    main()
