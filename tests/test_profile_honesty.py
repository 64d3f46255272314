"""Profiling honesty: a profiled step times what a training step does.

Profile mode reads each phase's memory (on CPU a gc scan of every live tensor, ~0.1 s each in a
process that has torch and megatron loaded). Those reads must stay outside the step's clock, or
``profile`` reports a step several times slower than ``train`` and calibration fits the scan as
"overhead". One real process (tiny, CPU, the profile's synthetic workload) alternates steps with and
without memory tracking; their fastest steps must agree (the minimum, not the median: other work on
the 2 shared cores only ever adds time, so the minimum is the step's own cost).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1.5
"""Allowed ratio of the fastest steps either way; the scan inside the clock made it ~3-6x on tiny."""


def _run(out: Path) -> None:
    from grpo_tune.core.config import RunConfig, TrainerOptions
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Strategy, Workload
    from grpo_tune.trainer import parallel
    from grpo_tune.trainer.build import build
    from grpo_tune.trainer.profile import _NoEos, even_share_reward, synthetic_items
    from grpo_tune.trainer.tokenizer import load_tokenizer

    cfg = RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy.of(mbs=8, recompute="none"),
        workload=Workload(prompts=4, n=4, prompt_len=16, response_len=16, mini_batch=4, dtype="fp32"),
        trainer=TrainerOptions(lr=1e-4, rollout_engine="megatron", out_dir=str(out.parent / "run"), seed=7),
    )
    parallel.init(cfg)
    tok = _NoEos(load_tokenizer(cfg.model, None))
    loop, _ = build(cfg, items=synthetic_items(cfg, 7), reward_fn=even_share_reward, tokenizer=tok, checkpoint_every=0)
    rows = []
    for k in range(17):
        loop.track_memory = k % 2 == 1
        m = loop.step(k)
        rows.append({"tracked": loop.track_memory, "step_s": m["step_s"], "mem": m.get("phase_memory_bytes")})
    out.write_text(json.dumps(rows))


@pytest.mark.slow
def test_a_profiled_step_takes_as_long_as_a_training_step(tmp_path):
    out = tmp_path / "rows.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    r = subprocess.run(
        [sys.executable, __file__, str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())[1:]  # the first step pays one-off costs
    tracked = min(x["step_s"] for x in rows if x["tracked"])
    plain = min(x["step_s"] for x in rows if not x["tracked"])
    assert all(x["mem"] and x["mem"]["update"] > 0 for x in rows if x["tracked"])  # memory was read
    assert 1 / TOLERANCE < tracked / plain < TOLERANCE, (tracked, plain)


if __name__ == "__main__":
    _run(Path(sys.argv[1]))
    os._exit(0)
