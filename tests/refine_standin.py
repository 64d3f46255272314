"""A stand-in for `grpo-tune profile` used only by the refine mechanics tests (crash, kill, resume).

Writes the profile JSON contract for the config it is given. Its behaviour comes from environment
variables so that one test can make it slow (REFINE_STANDIN_DELAY_S), crash on a given plan
(REFINE_STANDIN_CRASH_TP=<tp>), and log every call (REFINE_STANDIN_LOG=<file>) so that a test can
prove nothing ran twice. Step time follows a known formula of the degrees, so the ordering is real.
"""

from __future__ import annotations

import json
import os
import sys
import time

import yaml


def main(argv: list[str]) -> int:
    args = dict(zip(argv[::2], argv[1::2]))
    cfg = yaml.safe_load(open(args["--config"]))
    s, w = cfg["strategy"], cfg["workload"]
    log = os.environ.get("REFINE_STANDIN_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps({"config": args["--config"], "pid": os.getpid()}) + "\n")
    time.sleep(float(os.environ.get("REFINE_STANDIN_DELAY_S", "0")))
    if os.environ.get("REFINE_STANDIN_CRASH_TP") in (str(s["tp"]), "any"):
        print("stand-in: simulated crash", file=sys.stderr)
        os.abort()
    step = 0.1 * s["pp"] + 0.05 * s["tp"] + 0.01 * s["mbs"]
    tokens = w["prompts"] * w["n"] * (w["prompt_len"] + w["response_len"])
    gpus = cfg["cluster"]["gpus"]
    out = {
        "status": "ok",
        "message": None,
        "config": args["--config"],
        "steps": int(args["--steps"]),
        "world_size": gpus,
        "step_s": step,
        "phases_s": {
            "rollout": step / 2,
            "weight_sync": 0.0,
            "old_logprob": step / 8,
            "ref_logprob": step / 8,
            "update": step / 4,
        },
        "tokens_per_s": tokens / step,
        "tokens_per_s_per_gpu": tokens / step / gpus,
        "peak_memory_bytes": {"per_rank": [1000] * gpus, "max": 1000},
        "loss": [0.0],
        "reward": [0.0],
    }
    with open(args["--json"], "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
