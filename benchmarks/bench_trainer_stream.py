"""The CPU trainer's separate pools at staleness 0, streamed and not: real `grpo-tune train` jobs (2 rollout + 2
training processes, gloo), the tiny model, 8 prompts x 4, 4 mini-batches of 2 groups, responses of 12 tokens.

Three runs of ``--steps`` steps each: no stream; the stream with the whole batch in one sampling call
(``max_num_seqs`` 256: every mini-batch ends with the batch, nothing overlaps); the stream in 4 waves of one
mini-batch (``max_num_seqs`` 4 per replica). Prints each run's mean step time over the steps after the first,
the training pool's waits and the overlap the stream logs (metrics.jsonl ``stream_*``), and the losses, which are
equal in all three (``recompute_logprobs: false``). On a shared CPU host the times are noisy; see
docs/placement.md ("The trainer's stream").

    python benchmarks/bench_trainer_stream.py [--steps 4] [--out /tmp/bench_stream]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REWARD = f"{ROOT / 'tests' / '_placement_reward.py'}:reward"


def _cfg(out: Path, *, stream: bool, max_num_seqs: int, steps: int):
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.placement import Placement
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload

    return RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=4, gpus_per_node=4),
        strategy=Strategy.of(mbs=4, recompute="none", rollout_tp=1, max_num_seqs=max_num_seqs),
        workload=Workload(prompts=8, n=4, prompt_len=8, response_len=12, mini_batch=2, kl=False, dtype="fp32"),
        trainer=TrainerOptions(
            steps=steps,
            lr=3e-3,
            dataset="synthetic",
            reward=REWARD,
            out_dir=str(out / "run"),
            checkpoint_every=steps,
            rollout_engine="megatron",
        ),
        placement=Placement(mode="separate", rollout_gpus=2, recompute_logprobs=False, stream=stream),
    )


def run(out: Path, *, stream: bool, max_num_seqs: int, steps: int) -> list[dict]:
    from grpo_tune.core.config import save

    import shutil

    shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resume of the last one
    out.mkdir(parents=True)
    path = out / "train.yaml"
    save(_cfg(out, stream=stream, max_num_seqs=max_num_seqs, steps=steps), path)
    cmd = [sys.executable, "-c", "from grpo_tune.cli.main import run; run()", "train", "--config", str(path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise SystemExit(r.stdout[-3000:] + r.stderr[-3000:])
    return [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_stream"))
    a = ap.parse_args()
    for name, stream, mns in (("no stream", False, 256), ("stream, 1 wave", True, 256), ("stream, 4 waves", True, 4)):
        rows = run(a.out / name.replace(" ", "_").replace(",", ""), stream=stream, max_num_seqs=mns, steps=a.steps)
        later = rows[1:] or rows

        def mean(f, rs=later):
            return statistics.fmean(f(r) for r in rs)

        line = (
            f"{name:16s} step {mean(lambda r: r['step_s']):.3f} s"
            f"  wait {mean(lambda r: r['phases_s']['rollout']):.3f} s"
            f"  update {mean(lambda r: r['phases_s']['update']):.3f} s"
        )
        if stream:
            line += (
                f"  first wait {mean(lambda r: r['stream_first_wait_s']):.3f} s"
                f"  overlap {mean(lambda r: r['stream_overlap_s']):.3f} s"
            )
        print(line + "  losses " + " ".join(f"{r['loss']:.6f}" for r in rows), flush=True)


if __name__ == "__main__":
    main()
