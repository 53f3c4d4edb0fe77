#!/usr/bin/env python3
"""Transmuter (eager, compiled) vs ONNX Runtime on the depthwise CNN of make_depthwise_cnn.py.

For each case (batch 8 x 3x48x192, batch 1 x 3x48x320): checks the outputs of
both Transmuter modes against ORT, then measures in alternating rounds
(transmuter eager, transmuter compiled, ORT with default optimizations, same
thread count) and prints the median latencies and the median of the per-round
ratios, with the load average before and after.

    .venv/bin/python bench/depthwise_cnn_bench.py [--transmuter build/transmuter] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_depthwise_cnn  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
CASES = {"cls_b8_w192": (8, 192), "rec_b1_w320": (1, 320)}
LATENCY = re.compile(r"latency_ms: mean ([0-9.eE+-]+)\s+median ([0-9.eE+-]+)")
# Max |difference| relative to max |ORT logit|: ORT and Transmuter sum the
# convolutions in different orders, and float32 rounding over ~25 layers stays
# far inside this.
TOLERANCE = 1e-4


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def transmuter_bench(args, model: Path, feed: Path, mode: str) -> float:
    cmd = [args.transmuter, "bench", str(model), "--input", f"input={feed}", "--mode", mode,
           "--warmup", str(args.warmup), "--runs", str(args.runs)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=child_env(args)).stdout
    m = LATENCY.search(out)
    if not m:
        raise RuntimeError(f"unexpected `transmuter bench` output:\n{out}")
    return float(m.group(2))


def ort_bench(sess: ort.InferenceSession, x: np.ndarray, warmup: int, runs: int) -> float:
    for _ in range(warmup):
        sess.run(None, {"input": x})
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, {"input": x})
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms)


def child_env(args) -> dict:
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    return env


def check_outputs(args, model: Path, feed: Path, want: np.ndarray, work: Path) -> dict:
    errors = {}
    for mode in ("eager", "compiled"):
        out_dir = work / mode
        subprocess.run([args.transmuter, "run", str(model), "--input", f"input={feed}", "--mode", mode,
                        "--output-dir", str(out_dir)], check=True, capture_output=True, env=child_env(args))
        got = np.load(out_dir / "logits.npy")
        errors[mode] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    return errors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transmuter", default=str(REPO_ROOT / "build/transmuter"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "depthwise_cnn.onnx"

        onnx.save(make_depthwise_cnn.build(0), model)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        for case in args.cases.split(","):
            batch, width = CASES[case]
            x = np.random.default_rng(1).standard_normal((batch, 3, 48, width)).astype(np.float32)
            feed = work / f"{case}.npy"
            np.save(feed, x)
            errors = check_outputs(args, model, feed, sess.run(None, {"input": x})[0], work)
            load_before = loadavg()
            rounds = {"eager": [], "compiled": [], "ort": []}
            for _ in range(args.rounds):
                rounds["eager"].append(transmuter_bench(args, model, feed, "eager"))
                rounds["compiled"].append(transmuter_bench(args, model, feed, "compiled"))
                rounds["ort"].append(ort_bench(sess, x, args.warmup, args.runs))
            med = {k: statistics.median(v) for k, v in rounds.items()}
            ratio = {k: statistics.median(a / o for a, o in zip(rounds[k], rounds["ort"])) for k in ("eager", "compiled")}
            ok = all(e <= TOLERANCE for e in errors.values())
            print(f"{case}: eager {med['eager']:.2f} ms, compiled {med['compiled']:.2f} ms, ORT {med['ort']:.2f} ms; "
                  f"eager/ORT {ratio['eager']:.2f}x, compiled/ORT {ratio['compiled']:.2f}x; "
                  f"relative max|diff| eager {errors['eager']:.2e} compiled {errors['compiled']:.2e} "
                  f"({'ok' if ok else 'OVER ' + str(TOLERANCE)}); load {load_before} -> {loadavg()}", flush=True)


if __name__ == "__main__":
    main()
