#!/usr/bin/env bash
# Runs the benchmarks of docs/performance.md and keeps their raw outputs.
#   bench/run_all.sh [BUILD_DIR] [RESULTS_DIR]     (defaults: build, bench/results/runs/<UTC time>)
# Needs: the build's blas_gflops, blas_gflops_reference and transmuter targets, and the real
# model (.venv/bin/python scripts/fetch_real_model.py). Takes about 2.5 minutes on 2 idle cores.
# Timings on a shared machine are only as good as its idleness: a run waits for a low load average
# and logs it, and two runs never overlap (a second one waits for the lock), since each would slow
# the other.
# Repeat it and summarize the runs with bench/summarize_runs.py (medians and ranges).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
results=${2:-$root/bench/results/runs/$(date -u +%Y%m%dT%H%M%SZ)}
results=$(mkdir -p "$results" && cd "$results" && pwd)
cd "$root"

exec 9> /tmp/transmuter-bench.lock
if ! flock -n 9; then
  echo "another bench/run_all.sh is running; waiting for it to finish" >&2
  flock 9
fi
# Start on a quiet machine: wait (up to 10 minutes) for the 1-minute load average to drop below
# BENCH_MAX_LOAD (default 1.2; our own previous run still counts in it for a while).
max_load=${BENCH_MAX_LOAD:-1.2}
for _ in $(seq 60); do
  awk -v load="$(cut -d' ' -f1 /proc/loadavg)" -v max="$max_load" 'BEGIN { exit !(load < max) }' && break
  sleep 10
done
exec > >(tee "$results/run_all.log") 2>&1

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
  "(plus uncommitted changes: $(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) files)"
echo "OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-(unset)}  OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# MLX as shipped: reference BLAS (single-threaded).
"$build/bench/blas_gflops_reference" --json "$results/blas_reference.json" | tee "$results/blas_reference.txt"
# MLX with OpenBLAS, OpenBLAS's default thread count (all cores), then one thread for a
# like-for-like comparison with the single-threaded reference BLAS.
"$build/bench/blas_gflops" --json "$results/blas_openblas.json" | tee "$results/blas_openblas.txt"
OPENBLAS_NUM_THREADS=1 "$build/bench/blas_gflops" --json "$results/blas_openblas_1thread.json" \
  | tee "$results/blas_openblas_1thread.txt"
# MLX's scalar exp/erf at the model's shapes (where the non-BLAS time goes).
.venv/bin/python bench/mlx_transcendentals.py --json "$results/mlx_transcendentals.json" \
  | tee "$results/mlx_transcendentals.txt"
# The real model against ONNX Runtime (2 threads each).
.venv/bin/python bench/model_bench.py --transmuter "$build/transmuter" --out-dir "$results" \
  | tee "$results/minilm_l3_b1_s128.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
