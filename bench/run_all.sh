#!/usr/bin/env bash
# Runs the benchmarks of docs/performance.md and keeps their raw outputs in bench/results/.
#   bench/run_all.sh [BUILD_DIR] [RESULTS_DIR]     (defaults: build, bench/results)
# Needs: the build's blas_gflops, blas_gflops_reference and transmuter targets, and the real
# model (.venv/bin/python scripts/fetch_real_model.py). Takes about 3 minutes on 2 idle cores.
# Timings on a shared machine are only as good as its idleness: the load average is logged.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
results=$(mkdir -p "${2:-$root/bench/results}" && cd "${2:-$root/bench/results}" && pwd)
cd "$root"

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# MLX as shipped: reference BLAS (single-threaded).
"$build/bench/blas_gflops_reference" --json "$results/blas_reference.json" | tee "$results/blas_reference.txt"
# MLX with OpenBLAS, OpenBLAS's default thread count (all cores), then one thread for a
# like-for-like comparison with the single-threaded reference BLAS.
"$build/bench/blas_gflops" --json "$results/blas_openblas.json" | tee "$results/blas_openblas.txt"
OPENBLAS_NUM_THREADS=1 "$build/bench/blas_gflops" --json "$results/blas_openblas_1thread.json" \
  | tee "$results/blas_openblas_1thread.txt"
# The real model against ONNX Runtime (2 threads each).
.venv/bin/python bench/model_bench.py --transmuter "$build/transmuter" --out-dir "$results" | tee "$results/minilm_l3_b1_s128.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
