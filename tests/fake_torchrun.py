"""A stand-in for torchrun in the signal and lock tests: the same process shape, none of the cost.

``python fake_torchrun.py OUT STEPS DELAY_S``: starts one "worker" in a session of its own that asks the
kernel to SIGKILL it when this process dies (what torchrun and trainer.main do), appends one metrics line
per step to OUT/metrics.jsonl, and on SIGTERM stops its worker and exits 143, as torchrun does. The pids of
both go to OUT/fake.pids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TORCHRUN_REPORT = """Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
grpo_tune.trainer.main FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 4242)
============================================================"""
"""What torchrun prints when a worker exits non-zero (its shape, torch 2.x)."""
WORKER = "import ctypes, time; ctypes.CDLL(None).prctl(1, 9); time.sleep(600)"


def main(argv: list[str]) -> int:
    out, steps, delay = Path(argv[0]), int(argv[1]), float(argv[2])
    if len(argv) > 3 and argv[3] == "nospace":  # a worker whose torch.save hit a full disk, as trainer.main records it
        print("Traceback (most recent call last):\n  ...\nOSError: [Errno 28] No space left on device", flush=True)
        rec = {"status": "error", "rank": 0, "kind": "no_space"}
        rec["message"] = f"[WORKER_FAILED] no space left on the device writing {out}/checkpoints/x.pt"
        (out / "failure.rank0.json").write_text(json.dumps(rec))
        return 1
    if len(argv) > 3 and argv[3] == "coded":  # a worker that stopped on a coded error, and torchrun's own report of it
        rec = {"status": "error", "rank": 0, "message": "[BAD_CONFIG] the vllm rollout engine needs a CUDA GPU"}
        (out / "failure.rank0.json").write_text(json.dumps(rec))
        print(TORCHRUN_REPORT, flush=True)
        return 1
    worker = subprocess.Popen([sys.executable, "-c", WORKER], start_new_session=True)

    def term(signum, frame):
        worker.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, term)
    (out / "fake.pids").write_text(f"{os.getpid()} {worker.pid}\n")
    for step in range(1, steps + 1):
        time.sleep(delay)
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"step": step, "loss": 0.0, "step_s": delay}) + "\n")
    worker.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
