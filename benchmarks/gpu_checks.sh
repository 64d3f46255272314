#!/usr/bin/env bash
# The trainer's GPU checks on a CUDA machine, from the repo root, in under 5 minutes:
#   PYTHON=/opt/torch/.venv/bin/python3 bash benchmarks/gpu_checks.sh      (results in $OUT)
# megatron-core 0.16.1 (and pyyaml, if the venv lacks it) in ./.device/site:
#   pip install --target .device/site megatron-core==0.16.1 pyyaml
# 1. benchmarks/gpu_checks.py (no pytest needed): CPU-optimizer memory drop vs the cost model,
#    bf16 vs fp32 at world size 1, `profile` per-phase CUDA peaks on qwen2.5-0.5b -> $OUT/gpu_checks.json
# 2. if pytest is importable: the -m gpu tests that need neither TE nor vLLM -> $OUT/pytest_gpu.log
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-$PWD/gpu-checks-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/tests:$PWD/.device/site${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; "$PY" -c "import torch, megatron.core as m; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'megatron-core', m.__version__)"; } \
  > "$OUT/env.txt" 2>&1
timeout 225 "$PY" benchmarks/gpu_checks.py --out "$OUT" 2>&1 | tail -c 200000 > "$OUT/gpu_checks.log"
rc=$?
if "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
  timeout 60 "$PY" -m pytest -q -m gpu -p no:cacheprovider -x \
    tests/test_trainer_loop_offload.py tests/test_trainer_gpu.py::test_thd_packing_matches_padded_logprobs \
    > "$OUT/pytest_gpu.log" 2>&1
  echo "pytest -m gpu exit $?" >> "$OUT/pytest_gpu.log"
else
  echo "pytest/hypothesis not importable: pytest part skipped" > "$OUT/pytest_gpu.log"
fi
cat "$OUT/gpu_checks.log" | grep -E '^(cpu_optimizer|bf16|profile) ' || true
exit $rc
