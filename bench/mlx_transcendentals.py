#!/usr/bin/env python3
"""Cost of MLX's CPU exp/erf at the shapes of MiniLM-L3 (batch 1, seq 128).

The profile of the model (bench/profile_model.sh) puts most non-BLAS time in
mlx::core::simd::exp<float, 1> / erf<float, 1>: the x86 wheel evaluates them one
element at a time. This measures those ops alone, per call and per element, at
the shapes the model uses them (Erf in GELU on [128, 1536]; Softmax over the
[12, 128, 128] attention scores), with numpy's vectorized exp as a reference
point for what SIMD code achieves on the same machine.

    .venv/bin/python bench/mlx_transcendentals.py [--json bench/results/mlx_transcendentals.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import mlx.core as mx
import numpy as np

LAYERS = 3  # MiniLM-L3: each op below runs once per layer


def median_ms(fn, warmup: int = 5, runs: int = 50) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()

    mx.set_default_device(mx.cpu)
    ffn = mx.random.normal((128, 1536), key=mx.random.key(0))
    scores = mx.random.normal((12, 128, 128), key=mx.random.key(1))
    mx.eval(ffn, scores)
    ffn_np = np.array(ffn)

    cases = {
        "mlx erf [128,1536] (GELU)": (lambda: mx.eval(mx.erf(ffn)), ffn.size),
        "mlx exp [128,1536]": (lambda: mx.eval(mx.exp(ffn)), ffn.size),
        "mlx softmax [12,128,128] (attention)": (lambda: mx.eval(mx.softmax(scores, axis=-1)), scores.size),
        "mlx add [128,1536] (for scale)": (lambda: mx.eval(ffn + ffn), ffn.size),
        "numpy exp [128,1536] (SIMD reference)": (lambda: np.exp(ffn_np), ffn_np.size),
    }
    results = {"loadavg": os.getloadavg(), "layers": LAYERS, "cases": {}}
    print("| Op | median ms / call | ns / element | x3 layers (ms) |\n|---|---:|---:|---:|")
    for name, (fn, elements) in cases.items():
        ms = median_ms(fn)
        results["cases"][name] = {"median_ms": ms, "ns_per_element": ms * 1e6 / elements, "elements": elements}
        print(f"| {name} | {ms:.3f} | {ms * 1e6 / elements:.1f} | {ms * LAYERS:.1f} |")
    print(f"load average: {results['loadavg']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
