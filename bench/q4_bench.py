#!/usr/bin/env python3
"""4-bit weight-only matrix products: Transmuter against ONNX Runtime's MatMulNBits, one run.

    .venv/bin/python bench/q4_bench.py --build build-q4 [--rounds 7] [--runs 50] [--baseline BIN]

Cases: a one-node com.microsoft MatMulNBits model (4 bits, block 32, uint8 zero points, constant
weight, as onnxruntime's MatMulNBitsQuantizer writes it), K = N = 4096, at M = 1 (GEMV, a decode
step) and M = 128 (GEMM, a prefill), whose weight stays cached between calls; and a chain of
--chain such nodes at M = 1, each with its own weight, more than the L3 cache holds, so that the
weights come from memory as in a decoder (times per node). Each round, in an order that rotates:
  * transmuter: `transmuter bench MODEL --mode eager` in a fresh process (the load-time pass
    packs the weight into MLX's layout; the node runs src/kernels/cpu/quantized_matmul.h), on the
    accuracy_level 0 model (float32 activations);
  * transmuter_int8: the same on the accuracy_level 4 model (A rounded to int8 per block as ORT
    does, then the integer GEMV: vpdpbusd where the CPU has AVX512-VNNI);
  * kernel: bench/quantized_matmul_bench (the same kernel on the same layout, without the model
    around it, mx::eval per call; for the chain, as many weights used in turn: --copies);
  * ort_fp32 / ort_int8: InferenceSession.run with default graph optimizations, accuracy_level 0
    (float32 compute, the same math as Transmuter) and 4 (A quantized to int8 per block, what
    onnxruntime-genai's int4 CPU builds ask for);
  * baseline (with --baseline): another transmuter binary, e.g. one built before the kernel.
Two threads everywhere (TRANSMUTER_NUM_THREADS, OPENBLAS_NUM_THREADS, intra_op_num_threads).
Reported: the median over rounds of each round's median, GB/s = bytes each engine reads per call
(its packed weight + scales + biases or zero points) / time, GFLOPS = 2 M K N / time, and the
ceiling: the read bandwidth of a 1 GiB buffer summed by the kernel's two threads, measured in
the same run (also a numpy copy of 1 GiB: read + write). Also the CPU model, `uptime` load
averages before and after, and the other processes' share of the CPU during the run (/proc/stat).

Writes bench/results/q4/<UTC time>.json (raw) and docs/quantized_performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import cpu_model  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
THREADS = 2
LATENCY_LINE = re.compile(r"latency_ms: mean ([0-9.eE+-]+)\s+median ([0-9.eE+-]+)\s+min ([0-9.eE+-]+)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build-q4", help="build folder with transmuter and bench/quantized_matmul_bench")
    p.add_argument("--baseline", help="another transmuter binary to time beside it (e.g. before the kernel)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--runs", type=int, default=50, help="calls per engine per round (GEMM: a fifth)")
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--rows", default="1,128", help="M of each one-node case, comma-separated")
    p.add_argument("--chain", type=int, default=64,
                   help="layers of the M = 1 chain case, whose weights (~800 MB) exceed the L3 cache (0: none)")
    p.add_argument("--out", default=str(REPO_ROOT / "bench/results/q4"))
    p.add_argument("--doc", default=str(REPO_ROOT / "docs/quantized_performance.md"))
    return p.parse_args()


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cpu_flags() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni") if f in flags)
    return ""


def l3_cache() -> str:
    path = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    return path.read_text().strip() if path.exists() else "unknown"


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    fields = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def nbits_model(m: int, k: int, n: int, block: int, accuracy_level: int, layers: int, path: Path) -> dict:
    """`layers` MatMulNBits nodes in a chain (K == N when more than one), 4 bits, each with its own
    constant B, scales and uint8 zero points; returns the bytes of one node's weight."""
    rng = np.random.default_rng(0)
    blocks = k // block
    nodes, initializers = [], []
    for i in range(layers):
        b = rng.integers(0, 256, size=(n, blocks, block // 2), dtype=np.uint8)
        scales = (rng.random(n * blocks, dtype=np.float32) * 0.006 + 0.0005).astype(np.float32)
        zp = rng.integers(0, 256, size=(n, (blocks + 1) // 2), dtype=np.uint8)
        names = [f"B{i}", f"scales{i}", f"zp{i}"]
        initializers += [numpy_helper.from_array(t, name) for t, name in zip((b, scales, zp), names)]
        nodes.append(helper.make_node("MatMulNBits", ["A" if i == 0 else f"Y{i - 1}", *names],
                                      ["Y" if i == layers - 1 else f"Y{i}"], domain="com.microsoft",
                                      K=k, N=n, bits=4, block_size=block, accuracy_level=accuracy_level))
    graph = helper.make_graph(
        nodes, "q4", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    onnx.save(model, str(path))
    return {"ort": b.nbytes + scales.nbytes + zp.nbytes,
            # MLX's layout: the same packed bits, float32 scales and biases per group.
            "transmuter": b.nbytes + 2 * 4 * n * blocks}


def transmuter_bench(binary: str, model: Path, m: int, runs: int) -> float:
    env = dict(os.environ, TRANSMUTER_NUM_THREADS=str(THREADS), OPENBLAS_NUM_THREADS=str(THREADS))
    out = subprocess.run([binary, "bench", str(model), "--mode", "eager", "--warmup", "5", "--runs", str(runs)],
                         capture_output=True, text=True, env=env, check=True).stdout
    match = LATENCY_LINE.search(out)
    if not match:
        raise RuntimeError(f"unexpected `transmuter bench` output:\n{out}")
    return float(match.group(2))


def kernel_bench(binary: Path, m: int, k: int, n: int, block: int, runs: int, extra: list[str] | None = None) -> dict:
    env = dict(os.environ, TRANSMUTER_NUM_THREADS=str(THREADS), OPENBLAS_NUM_THREADS=str(THREADS))
    out = subprocess.run([str(binary), "--runs", str(runs), "--bits", "4", "--group", str(block), *(extra or []),
                          f"{m}x{k}x{n}"], capture_output=True, text=True, env=env, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def ort_session(model: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def ort_bench(session: ort.InferenceSession, x: np.ndarray, runs: int) -> float:
    for _ in range(5):
        session.run(None, {"A": x})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, {"A": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def numpy_copy_gbps() -> float:
    src = np.ones(1 << 28, dtype=np.float32)  # 1 GiB
    dst = np.empty_like(src)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(times) * 1e-9


def agreement(binary: str, model: Path, session: ort.InferenceSession, m: int, k: int, work: Path) -> float:
    """max |transmuter - ORT fp32| / max |ORT| on one random input."""
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    np.save(work / "A.npy", x)
    out_dir = work / "out"
    subprocess.run([binary, "run", str(model), "--input", f"A={work / 'A.npy'}", "--output-dir", str(out_dir)],
                   capture_output=True, text=True, check=True,
                   env=dict(os.environ, TRANSMUTER_NUM_THREADS=str(THREADS)))
    ours = np.load(out_dir / "Y.npy")
    ref = session.run(None, {"A": x})[0]
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def main() -> None:
    args = parse_args()
    build = Path(args.build)
    if not build.is_absolute():
        build = REPO_ROOT / build
    transmuter = str(build / "transmuter")
    kernel_binary = build / "bench/quantized_matmul_bench"
    work = REPO_ROOT / ".cache/q4-bench"
    work.mkdir(parents=True, exist_ok=True)
    rows = [int(r) for r in args.rows.split(",")]
    k, n, block = args.k, args.n, args.block

    load_before = uptime()
    busy0, total0 = cpu_ticks()
    own0 = os.times()
    bandwidth = kernel_bench(kernel_binary, 1, 64, 64, block, 1, ["--bandwidth"])[0]["bandwidth"]
    bandwidth["numpy_copy_gbps"] = numpy_copy_gbps()
    gemm_rows = kernel_bench(kernel_binary, 1, 64, 64, block, 1)[0]["gemm_rows"]

    cases = []
    plan = [(m, 1) for m in rows] + ([(1, args.chain)] if args.chain > 1 else [])
    for m, layers in plan:
        models = {}
        for level in (0, 4):
            path = work / f"matmulnbits_m{m}_k{k}_n{n}_b{block}_l{layers}_acc{level}.onnx"
            models[level] = path
            bytes_read = nbits_model(m, k, n, block, level, layers, path)
        sessions = {"ort_fp32": ort_session(models[0]), "ort_int8": ort_session(models[4])}
        x = np.random.default_rng(2).standard_normal((m, k)).astype(np.float32)
        runs = args.runs if m <= 8 else max(5, args.runs // 5)
        if layers > 1:
            runs = max(5, runs // 5)
        engines = ["transmuter", "transmuter_int8", "kernel", "ort_fp32", "ort_int8"] + (
            ["baseline"] if args.baseline else [])
        times: dict[str, list[float]] = {e: [] for e in engines}
        for r in range(args.rounds):
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            for engine in order:
                if engine == "transmuter":
                    times[engine].append(transmuter_bench(transmuter, models[0], m, runs))
                elif engine == "transmuter_int8":
                    times[engine].append(transmuter_bench(transmuter, models[4], m, runs))
                elif engine == "baseline":
                    times[engine].append(transmuter_bench(args.baseline, models[0], m, max(3, runs // 10)))
                elif engine == "kernel":  # with a chain: as many weights, used in turn; the time of `layers` calls
                    copies = ["--copies", str(layers)] if layers > 1 else []
                    times[engine].append(
                        layers * kernel_bench(kernel_binary, m, k, n, block, runs * layers, copies)[0]["kernel_ms"])
                else:
                    times[engine].append(ort_bench(sessions[engine], x, runs))
            print(f"M={m} layers={layers} round {r + 1}: " + ", ".join(f"{e} {times[e][-1]:.3f} ms" for e in engines), flush=True)
        flops = 2.0 * m * k * n
        case = {"m": m, "k": k, "n": n, "bits": 4, "block": block, "layers": layers, "runs_per_round": runs,
                "bytes_per_call": bytes_read, "engines": {}}
        for engine in engines:
            ms = statistics.median(times[engine]) / layers  # per node
            nbytes = bytes_read["ort" if engine.startswith("ort") else "transmuter"]
            case["engines"][engine] = {"median_ms": ms, "rounds_ms": times[engine], "gbps": nbytes / ms * 1e-6,
                                       "gflops": flops / ms * 1e-6,
                                       "share_of_bandwidth": nbytes / ms * 1e-6 / bandwidth["read_gbps"]}
        for engine in engines:
            if engine.startswith("ort"):
                continue
            per_round = [mine / ref for mine, ref in zip(times[engine], times["ort_fp32"])]
            case["engines"][engine]["ratio_to_ort_fp32"] = statistics.median(per_round)
            per_round = [mine / ref for mine, ref in zip(times[engine], times["ort_int8"])]
            case["engines"][engine]["ratio_to_ort_int8"] = statistics.median(per_round)
        case["max_rel_diff_vs_ort_fp32"] = agreement(transmuter, models[0], sessions["ort_fp32"], m, k, work)
        cases.append(case)
        for path in models.values():
            if layers > 1:
                path.unlink()  # ~400 MB each

    busy1, total1 = cpu_ticks()
    own1 = os.times()
    hz = os.sysconf("SC_CLK_TCK")
    own = (own1.children_user + own1.children_system + own1.user + own1.system
           - own0.children_user - own0.children_system - own0.user - own0.system) * hz
    other_share = max(0.0, (busy1 - busy0 - own) / max(1, total1 - total0))
    result = {"time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "cpu": cpu_model(),
              "cpu_flags": cpu_flags(), "l3_cache": l3_cache(), "cores": os.cpu_count(), "threads": THREADS,
              "load_before": load_before, "load_after": uptime(), "other_processes_cpu_share": other_share,
              "onnxruntime": ort.__version__, "commit": git_head(), "gemm_rows": gemm_rows, "bandwidth": bandwidth, "cases": cases}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    json_path = out / f"{stamp}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    Path(args.doc).write_text(render(result, json_path))
    print(f"wrote {json_path} and {args.doc}")


def git_head() -> str:
    proc = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


ENGINE_NAMES = {
    "transmuter": "Transmuter (`transmuter bench`, eager)",
    "transmuter_int8": "Transmuter, accuracy_level 4 (int8 A, integer GEMV)",
    "kernel": "kernel alone (`quantized_matmul_bench`, mx::eval per call)",
    "ort_fp32": "ORT MatMulNBits, accuracy_level 0 (fp32)",
    "ort_int8": "ORT MatMulNBits, accuracy_level 4 (int8 A)",
    "baseline": "Transmuter before the kernel (`mx::quantized_matmul` / dequantize + GEMM)",
}


def render(r: dict, json_path: Path) -> str:
    bw = r["bandwidth"]
    lines = [
        "# Quantized (4-bit) matrix products on the CPU",
        "",
        "Generated by `bench/q4_bench.py` (raw numbers: "
        f"`{json_path.relative_to(REPO_ROOT) if json_path.is_relative_to(REPO_ROOT) else json_path}`). "
        "Do not edit by hand.",
        "",
        "A com.microsoft MatMulNBits with a constant 4-bit weight (block 32, uint8 zero points) is packed at "
        "load into MLX's affine layout (`pack_matmul_nbits`) and runs `src/kernels/cpu/quantized_matmul.h` on "
        f"CPU streams: a GEMV that streams the packed weight once for up to {r['gemm_rows'] - 1} rows (tiles of "
        "3 rows), blocks of the weight dequantized into the float GEMM's panels for more.",
        "",
        f"Machine: {r['cpu']} ({r['cores']} cores; {r['cpu_flags']}; L3 {r.get('l3_cache', 'unknown')}, shared "
        f"with the host's other guests), {r['threads']} threads for every engine, "
        f"ONNX Runtime {r['onnxruntime']}, commit {r['commit']} plus the working tree.",
        f"Load before: `{r['load_before']}`; after: `{r['load_after']}`; other processes used "
        f"{100 * r['other_processes_cpu_share']:.0f} % of the machine's CPU time during the run.",
        "",
        f"Memory bandwidth (the ceiling): **{bw['read_gbps']:.1f} GB/s** read by {bw['threads']} threads "
        f"(a 1 GiB buffer summed, median of 5; fastest {bw['read_gbps_best']:.1f}; one thread "
        f"{bw['read_gbps_one_thread']:.1f}); numpy copy of 1 GiB: {bw['numpy_copy_gbps']:.1f} GB/s "
        "(read + write counted).",
        "",
    ]
    for c in r["cases"]:
        b = c["bytes_per_call"]
        kind = "GEMV" if c["m"] == 1 else "GEMM"
        title = f"## {kind}: M = {c['m']}, K = {c['k']}, N = {c['n']}, 4 bits, block {c['block']}"
        if c["layers"] > 1:
            title += f", a chain of {c['layers']} nodes"
        lines += [title, ""]
        if c["layers"] > 1:
            lines += [f"{c['layers']} nodes, each with its own weight ({c['layers'] * b['transmuter'] / 2**20:.0f} MiB "
                      "in MLX's layout, more than the L3): most of each weight comes from memory, as in a decoder's "
                      "step. Times are per node (the chain's time / its length).", ""]
        else:
            lines += ["One node: its weight stays in the L2/L3 caches between calls, so this is the speed on "
                      "cached weights.", ""]
        lines += [
            f"Bytes read per call: Transmuter {b['transmuter'] / 2**20:.2f} MiB (packed weight + float32 scales "
            f"and biases), ORT {b['ort'] / 2**20:.2f} MiB (packed weight + float32 scales + uint8 zero points). "
            f"{c['runs_per_round']} calls per engine per round; median of the rounds' medians.",
            "",
            "| Engine | ms | GB/s | of read bandwidth | GFLOPS | / ORT fp32 | / ORT int8 |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, e in c["engines"].items():
            ratio0 = f"{e['ratio_to_ort_fp32']:.2f}" if "ratio_to_ort_fp32" in e else ""
            ratio4 = f"{e['ratio_to_ort_int8']:.2f}" if "ratio_to_ort_int8" in e else ""
            lines.append(f"| {ENGINE_NAMES[name]} | {e['median_ms']:.3f} | {e['gbps']:.1f} | "
                         f"{100 * e['share_of_bandwidth']:.0f} % | {e['gflops']:.1f} | {ratio0} | {ratio4} |")
        lines += ["", f"Transmuter against ORT fp32 on one input: max |difference| / max |ORT| = "
                      f"{c['max_rel_diff_vs_ort_fp32']:.2g}.", ""]
        if c["layers"] > 1 and c["m"] == 1:
            share = c["engines"]["transmuter"]["share_of_bandwidth"]
            lines += [f"Issue 7's target for this case (weights from memory): at least 70 % of the read bandwidth. "
                      f"Reached: {100 * share:.0f} % (the kernel alone, {c['layers']} weights in turn: "
                      f"{100 * c['engines']['kernel']['share_of_bandwidth']:.0f} %; at accuracy_level 4: "
                      f"{100 * c['engines']['transmuter_int8']['share_of_bandwidth']:.0f} %).", ""]
    lines += [
        "Ratios are medians of per-round ratios (engines alternate within each round, in rotating order). "
        "GB/s counts each engine's own bytes, so the two columns are not the same work: MLX's layout stores a "
        "float32 bias per group where ORT stores a 4-bit zero point. ORT at accuracy_level 4 quantizes A to int8 "
        "and multiplies in integers (less precise, not what Transmuter computes). The host is shared: single "
        "rounds vary; see the raw rounds in the JSON.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
