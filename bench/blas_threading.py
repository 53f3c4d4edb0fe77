#!/usr/bin/env python3
"""Which BLAS threading serves Transmuter best (issue 8, "BLAS threading")?

Runs `transmuter bench` on models under several BLAS set-ups, in alternating
rounds (variant after variant, round after round), and reports each variant's
median latency and the median of its per-round ratios to the first variant.
The set-ups differ only in environment variables given to the same binary:

  openblas-pthread      Debian's default libopenblas0-pthread, all cores
  openblas-pthread-1    the same with OPENBLAS_NUM_THREADS=1
  openblas-openmp       libopenblas0-openmp (LD_LIBRARY_PATH), OMP_WAIT_POLICY=passive
  openblas-openmp-active  the same with the default (active) wait policy
  mkl-gnu / mkl-seq     Intel MKL from the `mkl` wheel, LD_PRELOADed, GNU OpenMP or
                        sequential threading layer (only when the wheel is in .venv)

Also records TRANSMUTER_NUM_THREADS (the kernels' pool) with each variant, the
CPU model and the load average. Usage:
  .venv/bin/python bench/blas_threading.py [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPENMP_DIR = "/usr/lib/x86_64-linux-gnu/openblas-openmp"

CASES = {
    "minilm_l3_b1_s128": [".cache/models/paraphrase-MiniLM-L3-v2/model.onnx", "--dim", "batch_size=1",
                          "--dim", "sequence_length=128"],
    "minilm_l3_b8_s128": [".cache/models/paraphrase-MiniLM-L3-v2/model.onnx", "--dim", "batch_size=8",
                          "--dim", "sequence_length=128"],
    "minilm_l3_b1_s16": [".cache/models/paraphrase-MiniLM-L3-v2/model.onnx", "--dim", "batch_size=1",
                         "--dim", "sequence_length=16"],
}


def variants() -> dict[str, dict[str, str]]:
    found = {
        "openblas-pthread": {},
        "openblas-pthread-1": {"OPENBLAS_NUM_THREADS": "1"},
    }
    if Path(OPENMP_DIR, "libopenblas.so.0").exists():
        found["openblas-openmp"] = {"LD_LIBRARY_PATH": OPENMP_DIR, "OMP_WAIT_POLICY": "passive"}
        found["openblas-openmp-active"] = {"LD_LIBRARY_PATH": OPENMP_DIR}
    mkl = sorted(glob.glob(str(ROOT / ".venv/lib/libmkl_rt.so*")))
    if mkl:
        found["mkl-gnu"] = {"LD_PRELOAD": mkl[0], "MKL_THREADING_LAYER": "GNU"}
        found["mkl-seq"] = {"LD_PRELOAD": mkl[0], "MKL_THREADING_LAYER": "SEQUENTIAL"}
    return found


def cpu_model() -> str:
    info = Path("/proc/cpuinfo").read_text()
    name = re.search(r"model name\s*:\s*(.*)", info).group(1)
    family = re.search(r"cpu family\s*:\s*(\d+)", info).group(1)
    model = re.search(r"^model\s*:\s*(\d+)", info, re.M).group(1)
    flags = set(re.search(r"flags\s*:\s*(.*)", info).group(1).split())
    simd = ",".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni") if f in flags)
    return f"{name} (family {family}, model {model}; {simd}; {os.cpu_count()} cpus)"


def bench_once(binary: str, case: list[str], mode: str, env: dict[str, str], runs: int) -> float:
    full_env = dict(os.environ, **env)
    out = subprocess.run([binary, "bench", *case, "--mode", mode, "--warmup", "3", "--runs", str(runs)],
                         capture_output=True, text=True, env=full_env, cwd=ROOT, check=True).stdout
    return float(re.search(r"median ([\d.]+)", out).group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transmuter", default=str(ROOT / "build/transmuter"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--mode", default="compiled")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--json")
    args = p.parse_args()
    setups = variants()
    report = {"cpu": cpu_model(), "load_before": os.getloadavg(), "mode": args.mode, "cases": {}}
    print(f"cpu: {report['cpu']}\nload before: {report['load_before']}")
    for name in args.cases.split(","):
        times = {v: [] for v in setups}
        for _ in range(args.rounds):
            for v, env in setups.items():
                times[v].append(bench_once(args.transmuter, CASES[name], args.mode, env, args.runs))
        base = next(iter(setups))
        rows = {}
        print(f"\n{name} ({args.mode}): median ms, median per-round ratio to {base}")
        for v in setups:
            ratios = [t / b for t, b in zip(times[v], times[base])]
            rows[v] = {"median_ms": statistics.median(times[v]), "ratio": statistics.median(ratios),
                       "ratio_min": min(ratios), "ratio_max": max(ratios), "times_ms": times[v]}
            print(f"  {v:24s} {rows[v]['median_ms']:8.2f}  {rows[v]['ratio']:.3f} "
                  f"({rows[v]['ratio_min']:.3f}-{rows[v]['ratio_max']:.3f})")
        report["cases"][name] = rows
    report["load_after"] = os.getloadavg()
    print(f"\nload after: {report['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
