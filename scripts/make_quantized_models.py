#!/usr/bin/env python3
"""Make int8 dynamic-quantized variants of the tiny BERT fixture.

    .venv/bin/python scripts/make_quantized_models.py

Reads tests/models/bert/model.onnx and writes, with
onnxruntime.quantization.quantize_dynamic (int8 weights, uint8 activations
quantized at run time by DynamicQuantizeLinear, MatMulInteger products):

    tests/models/bert_int8/              per-tensor weight scales
    tests/models/bert_int8_per_channel/  per-channel weight scales

each with model.onnx, inputs.json (bert's, with "generated_by" and the
tolerance below) and ops.txt. A variant is kept only when ONNX Runtime loads
and runs it. quantize_dynamic with default options turns MatMul (and Gemm,
which it leaves alone unless asked) into DynamicQuantizeLinear ->
MatMulInteger -> Cast -> Mul (scales) -> Add (bias), the graph every
`*_quantized.onnx` export on the Hub has.

reduce_range=True (7-bit weights in int8) keeps ONNX Runtime's reference
exact: its x86 uint8 x int8 kernel without VNNI (AVX2 vpmaddubsw) adds pairs
of products in saturating int16, and 255 * 127 * 2 > 32767. Measured on this
AMD EPYC (AVX2, no VNNI) with full-range weights: 3 of the 13 MatMulInteger
outputs of bert_int8 differ from the exact integer product by up to 1560
(Transmuter's are exact), which moves the pooler output by 9e-3. With 7-bit
weights a pair sums to at most 255 * 64 * 2 = 32640 and ORT is exact. This is
what ONNX Runtime's quantization docs recommend for such CPUs.

Tolerance: the models are held to the same 1e-4 absolute as the float ones.
The quantized activations are round(x / scale) + zero point, so an x that
Transmuter computes one float32 ulp away from ONNX Runtime (another summation
order in LayerNorm, Softmax or Gelu) can fall on the other side of a rounding
boundary; the uint8 value then differs by one and the layer's output by
scale_x * scale_w * |w| in that row. Measured with the test's seeded inputs:
no activation flips in either model, worst output difference 8.3e-7
(per-tensor) and 4.8e-7 (per-channel). With full-range weights (where ORT's
products were also off, above) 2 of 896 values of one DynamicQuantizeLinear
flipped and moved that layer's output by 9e-5. A flip is quantization, not an
error: if other inputs or machines produce one that exceeds 1e-4, the right
fix is a documented, model-specific tolerance, not a looser global one.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO_ROOT / "tests" / "models"
SOURCE = MODELS_DIR / "bert"
sys.path.insert(0, str(MODELS_DIR))
from model_inputs import build_inputs  # noqa: E402

VARIANTS = {"bert_int8": False, "bert_int8_per_channel": True}


def loads_in_ort(path: Path, spec: dict) -> bool:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        session.run(None, build_inputs(spec["inputs"], spec["dims"], np.random.default_rng(0)))
    except Exception as error:  # noqa: BLE001 - any load/run failure drops the variant
        print(f"{path}: ONNX Runtime cannot run it ({error}); skipped", file=sys.stderr)
        return False
    return True


def write_ops(model_path: Path, out: Path) -> None:
    counts = collections.Counter(node.op_type for node in onnx.load(str(model_path)).graph.node)
    out.write_text("".join(f"{op} {n}\n" for op, n in sorted(counts.items())))


def make(name: str, per_channel: bool, spec: dict) -> None:
    out_dir = MODELS_DIR / name
    out_dir.mkdir(exist_ok=True)
    model_path = out_dir / "model.onnx"
    quantize_dynamic(
        str(SOURCE / "model.onnx"),
        str(model_path),
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        reduce_range=True,
    )
    if not loads_in_ort(model_path, spec):
        model_path.unlink()
        out_dir.rmdir()
        return
    quantized = dict(spec)
    quantized["model"] = name
    quantized["generated_by"] = "scripts/make_quantized_models.py"
    quantized["quantization"] = (
        "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8, "
        f"per_channel={per_channel}, reduce_range=True) of tests/models/bert/model.onnx"
    )
    quantized["onnxruntime"] = ort.__version__
    quantized["note"] = (
        "compared with ONNX Runtime at the default 1e-4; reduce_range keeps ORT's u8s8 products "
        "exact on CPUs without VNNI (see scripts/make_quantized_models.py)"
    )
    (out_dir / "inputs.json").write_text(json.dumps(quantized, indent=2) + "\n")
    write_ops(model_path, out_dir / "ops.txt")
    print(model_path)


def main() -> None:
    spec = json.loads((SOURCE / "inputs.json").read_text())
    for name, per_channel in VARIANTS.items():
        make(name, per_channel, spec)


if __name__ == "__main__":
    main()
