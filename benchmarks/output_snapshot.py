"""Snapshot the user-visible outputs of the CLI into a folder, for byte-for-byte comparison.

A restructuring ("move, don't rewrite") must leave every number and every emitted file as it was:

    python benchmarks/output_snapshot.py /tmp/before      # on the old tree
    python benchmarks/output_snapshot.py /tmp/after       # on the new tree
    diff -r /tmp/before /tmp/after

What it captures: `estimate --json` on a spread of plans, `search --json --all` and the run folder's
text files (best.yaml, verl.sh, megatron_args.txt, report.md) for three targets, `compare --json`,
`validate` and `validate --grpo`, `diagnose --json` on every shipped example, and each command's
`--help`; the estimates and searches cover both engines, FP8, separate pools (streamed or not) and NeMo-RL.
Run ids, wall-clock seconds and temporary paths are replaced by fixed tokens, so that only
real differences remain.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
H30 = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--hardware", "h100", "--rollout-tp", "2"]
CPU_TINY = ["--model", "tiny-vllm", "--gpus", "1", "--hardware", "cpu", "--enforce-eager", "--max-num-seqs", "64"]
CPU_SEARCH = [*CPU_TINY, "--prompts", "16", "--n", "8", "--mini-batch", "16", "--no-kl", "--prompt-len", "8"]
CPU_SEARCH += ["--prompt-len-mean", "3", "--response-len", "4", "--response-len-mean", "4"]
ESTIMATES = [
    ["--model", "7b", "--gpus", "8"],
    ["--model", "7b", "--gpus", "8", "--tp", "2", "--mbs", "2", "--recompute", "full"],
    ["--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--tp", "1"],
    ["--model", "70b", "--gpus", "16", "--tp", "8", "--pp", "2", "--hardware", "h200"],
    ["--model", "8b", "--gpus", "8", "--hardware", "a100", "--max-tokens-per-gpu", "8192"],
    # engines, precision, placements and frameworks (issue 37's moves: weight sync, pools, engine names)
    H30,
    [*H30, "--rollout-precision", "fp8"],
    [*H30, "--rollout-engine", "sglang"],
    ["--model", "qwen3-30b-a3b", "--gpus", "16", "--hardware", "a100", "--rollout-precision", "fp8"],
    ["--model", "7b", "--gpus", "8", "--precision", "fp8", "--kv-cache-dtype", "fp8"],
    ["--model", "7b", "--gpus", "16", "--placement", "separate", "--rollout-gpus", "8", "--staleness", "1"],
    ["--model", "qwen3-30b-a3b", "--gpus", "64", "--placement", "separate", "--rollout-gpus", "32", "--staleness", "0"],
    ["--model", "qwen3-30b-a3b", "--gpus", "64", "--placement", "separate", "--rollout-gpus", "32", "--no-stream"],
    ["--model", "7b", "--gpus", "16", "--placement", "separate", "--rollout-gpus", "8", "--rollout-engine", "sglang"],
    ["--model", "7b", "--gpus", "8", "--framework", "nemo-rl"],
    ["--model", "7b", "--gpus", "16", "--framework", "nemo-rl", "--placement", "separate", "--rollout-gpus", "8"],
    ["--model", "7b", "--gpus", "8", "--hardware", "cpu"],
    # the cpu profile's engines: its native sampler by default, vLLM's CPU build when the plan asks for it
    [*CPU_TINY, "--mbs", "8"],
    [*CPU_TINY, "--mbs", "8", "--rollout-engine", "vllm"],
]
SEARCHES = [
    ["--model", "7b", "--gpus", "8"],
    ["--model", "qwen3-30b-a3b", "--gpus", "64"],
    ["--model", "70b", "--gpus", "16"],
    ["--model", "7b", "--gpus", "8", "--rollout-engine", "sglang"],
    ["--model", "qwen3-30b-a3b", "--gpus", "16", "--hardware", "h100", "--rollout-precision", "fp8"],
    ["--model", "qwen3-30b-a3b", "--gpus", "64", "--placement", "auto", "--staleness", "0"],
    ["--model", "7b", "--gpus", "16", "--framework", "nemo-rl", "--placement", "auto", "--staleness", "1"],
    CPU_SEARCH,
    [*CPU_SEARCH, "--rollout-engine", "vllm"],
]
RUN_FILES = ["best.yaml", "verl.sh", "nemo_rl.yaml", "megatron_args.txt", "report.md"]
_RUN_ID = re.compile(r"[a-z0-9.\-]+-\d+g-[a-z0-9.\-]+-\d{8}-\d{6}(-\d+)?")


def _cli(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    p = subprocess.run(
        [str(Path(sys.executable).parent / "grpo-tune"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return f"exit {p.returncode}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}"


def _normalise(text: str, tmp: Path) -> str:
    text = text.replace(str(tmp), "<TMP>").replace(str(ROOT), "<ROOT>")
    text = _RUN_ID.sub("<RUN>", text)
    text = re.sub(r'"seconds": [0-9.e-]+', '"seconds": <S>', text)
    text = re.sub(r"; [0-9.]+ s;", "; <S> s;", text)
    text = re.sub(r"created_utc: '[^']*'", "created_utc: <T>", text)
    text = re.sub(r"(\n\s+seconds): [0-9.e-]+", r"\1: <S>", text)
    text = re.sub(r"- time: [0-9.]+ s", "- time: <S> s", text)
    return text


def snapshot(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)

        def put(name: str, text: str) -> None:
            (out / name).write_text(_normalise(text, tmp))

        for i, a in enumerate(ESTIMATES):
            put(f"estimate-{i}.txt", _cli(["estimate", *a, "--json"], tmp))
        for i, a in enumerate(SEARCHES):
            runs = tmp / f"runs{i}"
            put(f"search-{i}.txt", _cli(["search", *a, "--json", "--all", "--out", str(runs)], tmp))
            for run in sorted(runs.iterdir()) if runs.exists() else []:  # none where the search refused (exit 2)
                for f in RUN_FILES:
                    if (run / f).exists():
                        put(f"search-{i}-{f}", (run / f).read_text())
        put(
            "compare.txt",
            _cli(
                [
                    "compare",
                    "--model",
                    "7b",
                    "--gpus",
                    "8",
                    "--hardware",
                    "h100,h200,a100",
                    "--json",
                    "--out",
                    str(tmp / "cmp"),
                ],
                tmp,
            ),
        )
        put("validate.txt", _cli(["validate"], tmp))
        put("validate-grpo.txt", _cli(["validate", "--grpo"], tmp))
        for ex in sorted((ROOT / "examples").rglob("*")):
            if ex.suffix in (".sh", ".overrides"):
                rel = ex.relative_to(ROOT / "examples").as_posix().replace("/", "__")
                put(f"diagnose-{rel}.txt", _cli(["diagnose", str(ex), "--json"], tmp))
        helps = ["", "estimate", "search", "compare", "diagnose", "validate", "train", "tune", "calibrate"]
        for cmd in helps:
            put(f"help-{cmd or 'main'}.txt", _cli([*([cmd] if cmd else []), "--help"], tmp))
    json.dump({"files": sorted(p.name for p in out.iterdir())}, open(out / "INDEX.json", "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/output_snapshot.py OUTDIR")
    snapshot(Path(sys.argv[1]))
