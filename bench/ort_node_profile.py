#!/usr/bin/env python3
"""ONNX Runtime's time per node, to set beside TRANSMUTER_KERNEL_PROFILE=1.

    .venv/bin/python bench/ort_node_profile.py MODEL --input NAME=FILE.npy [...] [--runs N] [--top K]

Runs MODEL under ORT's profiler (default optimizations, 2 intra-op threads unless --threads),
then prints, per node of the optimized graph, the median over runs of its kernel time (us),
with its op type and output shape, largest first, and the total. The profiler adds a few
microseconds per node, so the total exceeds an unprofiled run by that much times the nodes.
"""
import argparse
import collections
import json
import os
import statistics
import tempfile

import numpy as np
import onnxruntime as ort


def parse_inputs(pairs):
    feeds = {}
    for pair in pairs:
        name, _, path = pair.partition("=")
        if not path:
            raise SystemExit(f"--input wants NAME=FILE.npy, got {pair!r}")
        feeds[name] = np.load(path)
    return feeds


def node_times(profile_path, warmup):
    """{node name: ([us per run], op type, output shape)} from ORT's trace, runs after warmup."""
    with open(profile_path) as f:
        events = json.load(f)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    starts = sorted(e["ts"] for e in runs)[warmup:]
    if not starts:
        raise SystemExit("the profile has no runs past the warmup")
    per_node = collections.defaultdict(lambda: [[], "", ""])
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if e["ts"] < starts[0]:
            continue
        args = e.get("args", {})
        entry = per_node[e["name"][: -len("_kernel_time")]]
        entry[0].append(e["dur"])
        entry[1] = args.get("op_name", "")
        shapes = args.get("output_type_shape", [])
        entry[2] = "x".join(str(d) for d in next(iter(shapes[0].values()))) if shapes else ""
    return per_node, len(starts)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()

    feeds = parse_inputs(args.input)
    with tempfile.TemporaryDirectory() as work:
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(work, "ort")
        session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
        for _ in range(args.warmup + args.runs):
            session.run(None, feeds)
        per_node, runs = node_times(session.end_profiling(), args.warmup)

    rows = []
    for name, (durations, op, shape) in per_node.items():
        # A node runs once per run; median over the runs seen.
        rows.append((statistics.median(durations), name, op, shape))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"ORT {ort.__version__}, {args.threads} threads, {runs} profiled runs: {total / 1000:.3f} ms of node time per run")
    by_op = collections.Counter()
    for us, _, op, _ in rows:
        by_op[op] += us
    print("per op type (ms): " + ", ".join(f"{op} {us / 1000:.3f}" for op, us in by_op.most_common()))
    for us, name, op, shape in rows[: args.top]:
        print(f"{us:10.1f} us  {op:24s} {shape:20s} {name}")


if __name__ == "__main__":
    main()
