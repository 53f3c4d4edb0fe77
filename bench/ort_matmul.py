"""ONNX Runtime's MatMul with a constant weight (MLAS, weight pre-packed by ORT) per shape: the
reference for bench/gemm_bench.

    .venv/bin/python bench/ort_matmul.py [--threads N] [--runs N] MxKxN ...

Prints per shape the median and the fastest call in ms and their GFLOPS (2*M*K*N / time). Run it
alternately with `build/bench/gemm_bench --packed-only` on the same shapes and thread count: the host
is shared and single runs vary by up to 2x.
"""
import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def matmul_model(m: int, k: int, n: int) -> bytes:
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", help="MxKxN")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    print(f"{'MxKxN':16s} {'median_ms':>10s} {'GFLOPS':>8s} {'best':>8s}")
    for shape in args.shapes:
        m, k, n = map(int, shape.split("x"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(matmul_model(m, k, n), options, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
        for _ in range(5):
            session.run(None, {"x": x})
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            session.run(None, {"x": x})
            times.append(time.perf_counter() - start)
        median = sorted(times)[len(times) // 2]
        flops = 2.0 * m * k * n
        print(f"{shape:16s} {median * 1e3:10.3f} {flops / median * 1e-9:8.1f} {flops / min(times) * 1e-9:8.1f}")


if __name__ == "__main__":
    main()
