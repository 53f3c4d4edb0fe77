#!/usr/bin/env bash
# Where the real model's eager latency goes: perf samples of `transmuter bench`, summarized
# as self time per library/function and inclusive time per MLX primitive.
#   bench/profile_model.sh [BUILD_DIR] [MODE]      (defaults: build, eager)
# Writes bench/results/minilm_profile_<MODE>.txt. Needs perf (linux-perf) and the real model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
mode=${2:-eager}
model="$root/.cache/models/paraphrase-MiniLM-L3-v2/model.onnx"
out="$root/bench/results/minilm_profile_$mode.txt"
mkdir -p "$root/bench/results"
exec 9> /tmp/transmuter-bench.lock  # shared with bench/run_all.sh: never profile during a benchmark
flock 9
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$root/.venv/bin/python" - "$work" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
np.save(f"{sys.argv[1]}/input_ids.npy", rng.integers(0, 30522, size=(1, 128), dtype=np.int64))
np.save(f"{sys.argv[1]}/attention_mask.npy", np.ones((1, 128), dtype=np.int64))
PY

# Many runs so that loading the model (also sampled) is a small share.
OPENBLAS_NUM_THREADS=2 perf record -q -F 499 --call-graph dwarf,16384 -o "$work/perf.data" \
  "$build/transmuter" bench "$model" --input "input_ids=$work/input_ids.npy" \
  --input "attention_mask=$work/attention_mask.npy" --mode "$mode" --warmup 3 --runs 40 > "$work/bench.txt"
{
  echo "# transmuter bench (MiniLM-L3, batch 1, seq 128, --mode $mode, OPENBLAS_NUM_THREADS=2) under perf"
  echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  cat "$work/bench.txt"
  echo
  echo "## self time (top 15)"
  perf report -i "$work/perf.data" --no-children --sort dso,sym --stdio -g none -w 7,24,100 2>/dev/null \
    | grep -E '^ +[0-9]' | sed -n 1,15p
  echo
  echo "## per thread (perf calls threads 'pid'; the MLX stream thread runs the graph, the other"
  echo "## transmuter thread with OpenBLAS samples is its worker) and library"
  perf report -i "$work/perf.data" --no-children --sort pid,dso --stdio -g none -w 7,20,40 2>/dev/null \
    | grep -E '^ +[0-9]' | sed -n 1,14p
  echo
  echo "## inclusive time of MLX CPU kernels and of model loading"
  perf report -i "$work/perf.data" --children --sort sym --stdio -g none -w 0,0,110 2>/dev/null \
    | grep -E '^ +[0-9]' | grep -E 'unary_real_fp|softmax|matmul<|cblas_sgemm|binary_op|reduction_op|copy_general|gather|transmuter::load' \
    | sed -n 1,20p
} > "$out"
cat "$out"
