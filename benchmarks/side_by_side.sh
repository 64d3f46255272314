#!/usr/bin/env bash
# Cost-model and search speed of this checkout side by side with another commit, in one run
# (alternating, so load on a shared machine hits both alike):
#   benchmarks/side_by_side.sh BASE_COMMIT [ROUNDS]
# The base tree is exported with `git archive` into a temporary folder; both use this venv's packages.
set -euo pipefail
base=${1:?usage: benchmarks/side_by_side.sh BASE_COMMIT [ROUNDS]}
rounds=${2:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$here" archive "$base" | tar -x -C "$tmp"
py=${PYTHON:-python}
for r in $(seq "$rounds"); do
  for tree in "$tmp" "$here"; do
    name=$([ "$tree" = "$here" ] && echo "this checkout" || echo "base $base")
    echo "== round $r: $name"
    (cd "$tree" && PYTHONPATH="$tree" taskset -c 0 "$py" "$here/benchmarks/bench_estimate.py" --seconds 2 --models 7b,30b-a3b,dsv3 | tail -4)
    (cd "$tree" && PYTHONPATH="$tree" taskset -c 0 "$py" "$here/benchmarks/bench_search.py" --repeat 1 | tail -4)
  done
done
