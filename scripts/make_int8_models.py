#!/usr/bin/env python3
"""Make the int8 test models with ONNX Runtime's own quantization tool.

    .venv/bin/python scripts/make_int8_models.py [NAME ...]

From the tiny float fixtures tests/models/bert and tests/models/resnet this
writes, with onnxruntime.quantization, every format the Hub's quantized exports
come in (names below, all by default):

    bert_int8, bert_int8_per_channel    quantize_dynamic: DynamicQuantizeLinear ->
                                        MatMulInteger -> Cast -> Mul -> Add, what
                                        every `*_quantized.onnx` on the Hub has
    resnet_int8_dynamic                 quantize_dynamic of a CNN: ConvInteger
    mobilenet_tiny_int8_static_qdq,     quantize_static of a MobileNetV2-style CNN built here
    mobilenet_tiny_int8_static_qdq_s8,  (the _s8 one with int8 activations, quantize_static's default)
    mobilenet_tiny_int8_static_qoperator  (make_mobilenet_tiny, also written as the float fixture
                                          tests/models/mobilenet_tiny): depthwise convolutions, a
                                          shortcut Add, Gemm (QGemm in the QOperator form)
    bert_int8_static_qdq,               quantize_static, QDQ format: float ops
    resnet_int8_static_qdq                between QuantizeLinear/DequantizeLinear
                                          pairs (Optimum's and ORT's default)
    bert_int8_static_qoperator,         quantize_static, QOperator format:
    resnet_int8_static_qoperator          QLinearMatMul, QLinearConv, QLinearAdd,
                                          ... (com.microsoft QLinear* included)

each as model.onnx, inputs.json (the source's, with "generated_by", how it was
quantized, and the tolerance below) and ops.txt. A variant is kept only when
ONNX Runtime loads and runs it. Static quantization calibrates on
CALIBRATION_BATCHES seeded batches of the source's own kind of inputs.

reduce_range=True (7-bit weights in int8) everywhere: ONNX Runtime's x86 uint8
x int8 kernel without VNNI (AVX2 vpmaddubsw) adds pairs of products in
saturating int16 and 255 * 127 * 2 > 32767. Measured on an AVX2 machine with
full-range weights: 3 of bert_int8's 13 MatMulInteger outputs differed from the
exact integer product by up to 1560 (Transmuter's products are exact), which
moved the pooler output by 9e-3. With 7-bit weights a pair sums to at most
255 * 64 * 2 = 32640 and ORT is exact on every CPU. ORT's quantization docs
recommend it for such CPUs.

Tolerance: the default 1e-4 of the float models (tests/models/test_models.py),
against ORT with graph optimizations off. Activations are quantized as
round(x / scale) + zero point, so an x computed one float32 ulp away from ORT
(another summation order in LayerNorm, Softmax or Gelu) can fall on the other
side of a rounding boundary; the 8-bit value then moves by one step and the
row's output by about scale_x * scale_w * |w| (dynamic) or by a whole step of
the next tensor's calibrated scale (static), which 1e-4 would not absorb.
Measured with the tests' seeded inputs (2026-12-06, ORT 1.31.1): no flips in any
variant; worst differences bert_int8 7.2e-7, bert_int8_per_channel 4.8e-7,
bert_int8_static_qdq 6.0e-8, bert_int8_static_qoperator 4.8e-7, the ResNet
variants 1.2e-7 or exactly 0, the mobilenet_tiny ones exactly 0 (the QOperator
one through qlinear_conv_as_conv, QGemm and the Requantize kernel). If other inputs or machines produce a flip, the
right fix is a documented, model-specific tolerance ("tolerance" and
"tolerance_reason" in its inputs.json, which regenerating keeps), not a looser
global one.
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                      quantize_static)

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO_ROOT / "tests" / "models"
sys.path.insert(0, str(MODELS_DIR))
from model_inputs import build_inputs  # noqa: E402

CALIBRATION_BATCHES = 8
SCRIPT = "scripts/make_int8_models.py"


class SeededInputs(CalibrationDataReader):
    """CALIBRATION_BATCHES batches of the source model's inputs, seeds 100.."""

    def __init__(self, spec: dict):
        self.batches = iter(build_inputs(spec["inputs"], spec["dims"], np.random.default_rng(100 + i))
                            for i in range(CALIBRATION_BATCHES))

    def get_next(self):
        return next(self.batches, None)


def dynamic(per_channel: bool):
    def quantize(source: Path, target: Path, spec: dict) -> str:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=per_channel,
                         reduce_range=True)
        return f"quantize_dynamic(weight_type=QInt8, per_channel={per_channel}, reduce_range=True)"
    return quantize


def static(quant_format: QuantFormat, activations: QuantType = QuantType.QUInt8):
    def quantize(source: Path, target: Path, spec: dict) -> str:
        quantize_static(str(source), str(target), SeededInputs(spec), quant_format=quant_format,
                        activation_type=activations, weight_type=QuantType.QInt8, per_channel=True,
                        reduce_range=True)
        return (f"quantize_static(quant_format={quant_format.name}, activation_type={activations.name}, "
                f"weight_type=QInt8, per_channel=True, reduce_range=True, {CALIBRATION_BATCHES} seeded "
                "calibration batches)")
    return quantize


def make_mobilenet_tiny() -> None:
    """tests/models/mobilenet_tiny: a MobileNetV2-style float CNN built here with onnx.helper (a stem, an
    inverted residual block: 1x1 expand, Relu6-style Clip, depthwise 3x3, 1x1 project, shortcut Add; a strided
    depthwise block; GlobalAveragePool, Flatten, Gemm), the source of the int8 variants whose QOperator form
    has QGemm and QLinearAdd beside QLinearConv. Seeded, so rewriting it gives the same bytes."""
    from onnx import TensorProto, helper, numpy_helper

    g = np.random.default_rng(2026)
    weights = {}

    def conv(name, x, cin, cout, k, stride=1, group=1, clip=True):
        weights[f"{name}_w"] = (g.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k))
                                ).astype(np.float32)
        weights[f"{name}_b"] = (g.standard_normal(cout) * 0.1).astype(np.float32)
        pad = k // 2
        nodes = [helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c"], group=group,
                                  strides=[stride, stride], pads=[pad] * 4, kernel_shape=[k, k])]
        if clip:
            nodes.append(helper.make_node("Clip", [f"{name}_c", "zero", "six"], [f"{name}_y"]))
            return nodes, f"{name}_y"
        return nodes, f"{name}_c"

    nodes = []
    for spec in [("stem", "pixel_values", 3, 16, 3, 2, 1, True), ("expand", None, 16, 48, 1, 1, 1, True),
                 ("depthwise", None, 48, 48, 3, 1, 48, True), ("project", None, 48, 16, 1, 1, 1, False)]:
        name, x, cin, cout, k, stride, group, clip = spec
        made, out = conv(name, x or last, cin, cout, k, stride, group, clip)
        nodes += made
        last = out
    nodes.append(helper.make_node("Add", ["stem_y", last], ["block1"]))
    for spec in [("expand2", "block1", 16, 64, 1, 1, 1, True), ("depthwise2", None, 64, 64, 3, 2, 64, True),
                 ("project2", None, 64, 24, 1, 1, 1, False)]:
        name, x, cin, cout, k, stride, group, clip = spec
        made, out = conv(name, x or last, cin, cout, k, stride, group, clip)
        nodes += made
        last = out
    weights["fc_w"] = (g.standard_normal((10, 24)) * 0.3).astype(np.float32)
    weights["fc_b"] = (g.standard_normal(10) * 0.1).astype(np.float32)
    nodes += [helper.make_node("GlobalAveragePool", [last], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    initializers = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    initializers += [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                     numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    graph = helper.make_graph(
        nodes, "mobilenet_tiny", [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out = MODELS_DIR / "mobilenet_tiny"
    out.mkdir(exist_ok=True)
    onnx.save(model, str(out / "model.onnx"))
    spec = {"model": "mobilenet_tiny", "opset": 17, "dims": {"batch": 2},
            "inputs": [{"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, 32, 32], "kind": "float"}],
            "outputs": ["logits"], "generated_by": SCRIPT,
            "about": "a MobileNetV2-style float CNN built with onnx.helper (make_mobilenet_tiny)"}
    (out / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")
    (out / "ops.txt").write_text("".join(f"{op} {n}\n" for op, n in sorted(op_counts(model).items())))
    print(f"{out}: float source")


# name: (source fixture, how to quantize it)
VARIANTS = {
    "bert_int8": ("bert", dynamic(per_channel=False)),
    "bert_int8_per_channel": ("bert", dynamic(per_channel=True)),
    "resnet_int8_dynamic": ("resnet", dynamic(per_channel=True)),
    "bert_int8_static_qdq": ("bert", static(QuantFormat.QDQ)),
    "resnet_int8_static_qdq": ("resnet", static(QuantFormat.QDQ)),
    "bert_int8_static_qoperator": ("bert", static(QuantFormat.QOperator)),
    "resnet_int8_static_qoperator": ("resnet", static(QuantFormat.QOperator)),
    "mobilenet_tiny_int8_static_qdq": ("mobilenet_tiny", static(QuantFormat.QDQ)),
    "mobilenet_tiny_int8_static_qoperator": ("mobilenet_tiny", static(QuantFormat.QOperator)),
    "mobilenet_tiny_int8_static_qdq_s8": ("mobilenet_tiny", static(QuantFormat.QDQ, QuantType.QInt8)),
}


def run_in_ort(path: Path, spec: dict) -> list[np.ndarray] | None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return session.run(None, build_inputs(spec["inputs"], spec["dims"], np.random.default_rng(0)))
    except Exception as error:  # noqa: BLE001 - any load/run failure drops the variant
        print(f"{path}: ONNX Runtime cannot run it ({error}); skipped", file=sys.stderr)
        return None


def op_counts(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                               for n in model.graph.node)


def make(name: str, source_name: str, quantize) -> None:
    source_dir = MODELS_DIR / source_name
    spec = json.loads((source_dir / "inputs.json").read_text())
    out_dir = MODELS_DIR / name
    with tempfile.TemporaryDirectory() as tmp:
        quantized_path = Path(tmp) / "model.onnx"
        how = quantize(source_dir / "model.onnx", quantized_path, spec)
        if run_in_ort(quantized_path, spec) is None:
            return
        model = onnx.load(str(quantized_path))
    out_dir.mkdir(exist_ok=True)
    onnx.save(model, str(out_dir / "model.onnx"))
    previous = json.loads((out_dir / "inputs.json").read_text()) if (out_dir / "inputs.json").is_file() else {}
    written = dict(spec)
    written["model"] = name
    written["generated_by"] = SCRIPT
    written["quantization"] = f"onnxruntime.quantization.{how} of tests/models/{source_name}/model.onnx"
    written["onnxruntime"] = ort.__version__
    # A tolerance and its reason are set by hand after measuring (see the
    # docstring); regenerating keeps them.
    for key in ("tolerance", "tolerance_reason"):
        if key in previous:
            written[key] = previous[key]
    (out_dir / "inputs.json").write_text(json.dumps(written, indent=2) + "\n")
    counts = op_counts(model)
    (out_dir / "ops.txt").write_text("".join(f"{op} {n}\n" for op, n in sorted(counts.items())))
    print(f"{out_dir}: {dict(sorted(counts.items()))}")


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; known: {list(VARIANTS)}", file=sys.stderr)
        return 2
    if not names or any(VARIANTS[n][0] == "mobilenet_tiny" for n in names):
        make_mobilenet_tiny()
    for name in names or VARIANTS:
        make(name, *VARIANTS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
