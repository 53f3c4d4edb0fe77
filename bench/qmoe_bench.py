#!/usr/bin/env python3
"""One com.microsoft QMoE node with real shapes, Transmuter against ONNX Runtime, rounds alternating.

The node: --experts experts (default 32) of hidden size --hidden and inter size --inter (1024, 1024),
gpt-oss's SwiGLU (interleaved gate and linear halves, alpha 1.702, beta 1, limit 7), top --k (4)
routing, 4-bit symmetric weights in blocks of 32 (what onnxruntime-genai's builder writes), expert biases.
Weights are initializers (as in a real export). Timed at --tokens (default 1 = a decode step, and 128 =
a prefill), each engine in its own process per round:
  * transmuter: `transmuter bench MODEL --mode compiled` with the default passes (pack_qmoe_weights: the
    routed pairs run their experts' packed 4-bit weights) and with --passes none (the QMoE op as written:
    the routed experts, or all of them, dequantized to float32 per call);
  * ort: this script with --ort-worker, InferenceSession with default optimizations, intra-op threads =
    --threads, the median of --runs calls after --warmup.
Reported: median ms per call of each, their ratios to ORT, the load and CPU.

    .venv/bin/python bench/qmoe_bench.py [--tokens 1 128] [--rounds 3] [--runs 50] [--no-write]
Writes bench/results/qmoe/<UTC time>.json and docs/qmoe_performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))
from host import machine, save_run  # noqa: E402

SWIGLU = {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 7.0}
BITS, BLOCK = 4, 32


def make_model(path: Path, experts: int, hidden: int, inter: int, k: int, seed: int = 0) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from contrib_cases.moe import quantize

    g = np.random.default_rng(seed)
    w1, s1, _, _ = quantize(g.standard_normal((experts, 2 * inter, hidden)) / np.sqrt(hidden), BITS, BLOCK, True,
                            np.float32)
    w2, s2, _, _ = quantize(g.standard_normal((experts, hidden, inter)) / np.sqrt(inter), BITS, BLOCK, True,
                            np.float32)
    b1 = (g.standard_normal((experts, 2 * inter)) * 0.1).astype(np.float32)
    b2 = (g.standard_normal((experts, hidden)) * 0.1).astype(np.float32)
    names = ["input", "router_probs", "fc1_experts_weights", "fc1_scales", "fc1_experts_bias",
             "fc2_experts_weights", "fc2_scales", "fc2_experts_bias"]
    node = helper.make_node("QMoE", names, ["output"], domain="com.microsoft", k=k, activation_type="swiglu",
                            swiglu_fusion=1, normalize_routing_weights=1, expert_weight_bits=BITS,
                            block_size=BLOCK, **SWIGLU)
    graph = helper.make_graph(
        [node], "qmoe",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["tokens", hidden]),
         helper.make_tensor_value_info("router_probs", TensorProto.FLOAT, ["tokens", experts])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["tokens", hidden])],
        initializer=[numpy_helper.from_array(a, n) for n, a in zip(names[2:], [w1, s1, b1, w2, s2, b2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)], ir_version=10)
    onnx.save(model, str(path))


def inputs_for(folder: Path, tokens: int, hidden: int, experts: int) -> dict[str, Path]:
    g = np.random.default_rng(tokens)
    arrays = {"input": g.standard_normal((tokens, hidden)).astype(np.float32),
              "router_probs": g.standard_normal((tokens, experts)).astype(np.float32)}
    paths = {}
    for name, value in arrays.items():
        paths[name] = folder / f"{name}_{tokens}.npy"
        np.save(paths[name], value)
    return paths


def transmuter_ms(binary: Path, model: Path, inputs: dict[str, Path], passes: str, runs: int, warmup: int,
                  threads: int) -> float:
    command = [str(binary), "bench", str(model), "--mode", "compiled", "--runs", str(runs), "--warmup",
               str(warmup), "--passes", passes]
    for name, path in inputs.items():
        command += ["--input", f"{name}={path}"]
    env = dict(os.environ, TRANSMUTER_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    match = re.search(r"median ([\d.]+)", result.stdout)
    if match is None:
        raise SystemExit(f"transmuter bench printed no median:\n{result.stdout}{result.stderr}")
    return float(match.group(1))


def ort_ms(model: Path, inputs: dict[str, Path], runs: int, warmup: int, threads: int) -> float:
    command = [sys.executable, __file__, "--ort-worker", str(model), str(runs), str(warmup), str(threads)]
    for name, path in inputs.items():
        command.append(f"{name}={path}")
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def ort_worker(argv: list[str]) -> None:
    import onnxruntime as ort

    model, runs, warmup, threads = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    feeds = {arg.split("=", 1)[0]: np.load(arg.split("=", 1)[1]) for arg in argv[4:]}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1000)
    print(statistics.median(times))


def write_doc(result: dict, path: Path) -> None:
    m = result["machine"]
    lines = [
        "# QMoE performance",
        "",
        "Generated by `bench/qmoe_bench.py` (do not edit). One com.microsoft QMoE node: "
        f"{result['experts']} experts, hidden {result['hidden']}, inter {result['inter']}, top-{result['k']} "
        f"routing, gpt-oss's SwiGLU, {BITS}-bit symmetric weights in blocks of {BLOCK}, expert biases, weights as "
        "initializers. Each engine in its own process per round, rounds alternating; median ms per call of "
        f"{result['runs']} calls after {result['warmup']} warm-up calls, {result['threads']} threads.",
        "",
        "- transmuter (packed): compiled, default passes: pack_qmoe_weights converts the experts' weights once at "
        "load, and each routed (token, expert) pair runs its expert's packed 4-bit weight "
        "(kernels::routed_quantized_matmul: the pairs of an expert as one GEMV, or one dequantized GEMM from 6 rows).",
        "- transmuter (as written): `--passes none`, the QMoE op: per call, the routed experts' packed rows "
        "gathered and dequantized to float32 when a call routes fewer pairs than there are experts, else every "
        "expert.",
        "- ORT: onnxruntime with default optimizations (its CPU QMoE kernel).",
        "",
        "Every call feeds the same input, so it routes to the same experts, whose weights stay in cache between "
        "calls (a real decode step routes each token anew, and the weights of 4 of 32 experts, 7.5 MiB here, may "
        "come from memory).",
        "",
        f"Run {result['json']}, CPU {m['before']['cpu']}, {m['before']['cpus']} cores, load "
        f"{m['before']['loadavg'][0]:.2f} before, {m['after']['loadavg'][0]:.2f} after.",
        "",
        "| tokens | packed ms | as written ms | ORT ms | packed / ORT | as written / ORT | per-round packed / ORT |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        packed, written, ort = (statistics.median(row[key]) for key in ("packed", "written", "ort"))
        rounds = ", ".join(f"{p / o:.2f}" for p, o in zip(row["packed"], row["ort"]))
        lines.append(f"| {row['tokens']} | {packed:.3f} | {written:.2f} | {ort:.3f} | {packed / ort:.2f} | "
                     f"{written / ort:.1f} | {rounds} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--ort-worker":
        ort_worker(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inter", type=int, default=1024)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 128])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--binary", type=Path, default=ROOT / "build" / "transmuter")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    cache = ROOT / ".cache" / "bench-models"
    cache.mkdir(parents=True, exist_ok=True)
    model = cache / f"qmoe_e{args.experts}_h{args.hidden}_i{args.inter}_k{args.k}.onnx"
    if not model.exists():
        make_model(model, args.experts, args.hidden, args.inter, args.k)
    result = {"experts": args.experts, "hidden": args.hidden, "inter": args.inter, "k": args.k,
              "runs": args.runs, "warmup": args.warmup, "threads": args.threads,
              "machine": {"before": machine()}, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in args.tokens:
            inputs = inputs_for(Path(tmp), tokens, args.hidden, args.experts)
            row = {"tokens": tokens, "packed": [], "written": [], "ort": []}
            for r in range(args.rounds):
                order = ["packed", "written", "ort"] if r % 2 == 0 else ["ort", "written", "packed"]
                for engine in order:
                    if engine == "ort":
                        ms = ort_ms(model, inputs, args.runs, args.warmup, args.threads)
                    else:
                        ms = transmuter_ms(args.binary, model, inputs, "default" if engine == "packed" else "none",
                                           args.runs, args.warmup, args.threads)
                    row[engine].append(ms)
                print(f"tokens {tokens} round {r + 1}: packed {row['packed'][-1]:.3f} ms, as written "
                      f"{row['written'][-1]:.2f} ms, ORT {row['ort'][-1]:.3f} ms, load {os.getloadavg()[0]:.2f}",
                      flush=True)
            result["rows"].append(row)
    result["machine"]["after"] = machine()
    if not args.no_write:
        save_run(result, ROOT, "qmoe", "qmoe_performance.md", write_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
