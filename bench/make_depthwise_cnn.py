#!/usr/bin/env python3
"""A small PP-LCNet / MobileNet-style depthwise CNN with random weights, for measuring.

Stem: Conv 3x3 stride 2 (+bias) + HardSwish. Then blocks of
  depthwise Conv kxk (group = channels, +bias) + HardSwish
  [+ SE: GlobalAveragePool -> Conv 1x1 -> Relu -> Conv 1x1 -> HardSigmoid -> Mul]
  pointwise Conv 1x1 (+bias) + HardSwish,
with 3x3 and 5x5 depthwise kernels, strides 1, 2 and (2, 1) as PaddleOCR's text
recognizers use, one SE block; then GlobalAveragePool -> Flatten -> Gemm.
The input is [N, 3, 48, W] with symbolic N and W.

    .venv/bin/python bench/make_depthwise_cnn.py OUT.onnx
No torch: onnx.helper and numpy only (seeded, so the file is reproducible).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# (kernel, stride (h, w), in channels, out channels, SE)
BLOCKS = [
    (3, (1, 1), 16, 32, False),
    (3, (2, 2), 32, 64, False),
    (3, (1, 1), 64, 64, False),
    (3, (2, 2), 64, 128, False),
    (3, (1, 1), 128, 128, False),
    (3, (2, 1), 128, 256, False),
    (5, (1, 1), 256, 256, False),
    (5, (1, 1), 256, 256, False),
    (5, (2, 1), 256, 512, True),
    (5, (1, 1), 512, 512, False),
]
CLASSES = 10


class GraphBuilder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def weight(self, stem: str, shape: tuple[int, ...], fan_in: int) -> str:
        name = self.name(stem)
        values = self.rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        self.initializers.append(numpy_helper.from_array(values, name))
        return name

    def bias(self, channels: int) -> str:
        name = self.name("b")
        values = self.rng.uniform(-0.1, 0.1, channels).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(values, name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: tuple[int, int], group: int) -> str:
        w = self.weight("w", (cout, cin // group, k, k), fan_in=cin // group * k * k)
        return self.node("Conv", [x, w, self.bias(cout)], kernel_shape=[k, k], strides=list(stride),
                         pads=[k // 2] * 4, group=group)

    def squeeze_excite(self, x: str, channels: int) -> str:
        pooled = self.node("GlobalAveragePool", [x])
        squeezed = self.node("Relu", [self.conv(pooled, channels, channels // 4, 1, (1, 1), 1)])
        gate = self.node("HardSigmoid", [self.conv(squeezed, channels // 4, channels, 1, (1, 1), 1)],
                         alpha=1.0 / 6, beta=0.5)
        return self.node("Mul", [x, gate])


def build(seed: int) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.node("HardSwish", [g.conv("input", 3, 16, 3, (2, 2), 1)])
    for k, stride, cin, cout, se in BLOCKS:
        x = g.node("HardSwish", [g.conv(x, cin, cin, k, stride, cin)])
        if se:
            x = g.squeeze_excite(x, cin)
        x = g.node("HardSwish", [g.conv(x, cin, cout, 1, (1, 1), 1)])
    flat = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
    fc = g.weight("fc", (BLOCKS[-1][3], CLASSES), fan_in=BLOCKS[-1][3])
    g.nodes.append(helper.make_node("Gemm", [flat, fc, g.bias(CLASSES)], ["logits"], name="fc"))
    graph = helper.make_graph(
        g.nodes, "depthwise_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 48, "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    onnx.save(build(args.seed), args.out)


if __name__ == "__main__":
    main()
