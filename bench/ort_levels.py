"""ONNX Runtime's latency at each graph optimization level, alternating the levels round by round.

    .venv/bin/python bench/ort_levels.py MODEL.onnx INPUT.npy [--threads 2] [--rounds 5] [--runs 20]

Prints the median over rounds of each level's per-round median (ms). On CNNs the step from
`extended` (all fusions) to `all` is the NCHWc layout transformer: the reason channels_last_convs
exists (docs/architecture.md, "CPU kernels").
"""
import argparse
import time

import numpy as np
import onnxruntime as ort

LEVELS = {
    "off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("input", help=".npy file for the model's first input")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    x = np.load(args.input)
    sessions = {}
    for name, level in LEVELS.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.graph_optimization_level = level
        sessions[name] = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    feed = {sessions["off"].get_inputs()[0].name: x}
    medians = {name: [] for name in LEVELS}
    for _ in range(args.rounds):
        for name, session in sessions.items():
            for _ in range(2):
                session.run(None, feed)
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                session.run(None, feed)
                times.append((time.perf_counter() - start) * 1e3)
            medians[name].append(float(np.median(times)))
    print(args.model, {name: round(float(np.median(v)), 2) for name, v in medians.items()})


if __name__ == "__main__":
    main()
