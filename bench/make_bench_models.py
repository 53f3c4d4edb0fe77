#!/usr/bin/env python3
"""Benchmark models of the sizes issue 8 names, built with onnx.helper + numpy (no torch).

Random weights, seeded, scaled so activations stay finite and O(1): linear/attention
weights N(0, 0.02) as BERT/ViT initialise them, LayerNorm gamma 1 and beta 0, conv
weights He-scaled (std sqrt(2 / fan_in)) with the last conv of each residual branch
scaled down so 16 residual additions do not blow the activations up. The graphs mirror
what a PyTorch (opset 17) export produces, so the same patterns reach Transmuter's passes:

  encoder  Gather embeddings + position Gather of a Slice -> LayerNormalization;
           extended mask (1 - Cast(mask)) * -3.4028235e38 added to the scores;
           per layer MatMul + Add bias for Q/K/V, Shape/Gather/Unsqueeze/Concat -> Reshape
           to heads, Transpose (0,2,1,3) and K^T (0,2,3,1), MatMul, Div sqrt(d), Add mask,
           Softmax, MatMul V, Transpose back, Reshape, dense + residual + LayerNormalization,
           Erf GELU (Div sqrt2, Erf, Add 1, Mul x, Mul 0.5) in the FFN.
  vit      Conv patch embedding, Reshape + Transpose, cls token Concat, position Add,
           pre-LayerNorm blocks with the encoder's attention (no mask) and GELU MLP.
  resnet50 Conv (BatchNorm folded into the bias, as an eval-mode export) + Relu,
           MaxPool, bottleneck blocks 3-4-6-3, GlobalAveragePool, Flatten, Gemm.
  mobilenetv2  inverted residuals: 1x1 expand + Clip(0, 6), depthwise 3x3 + Clip(0, 6),
           1x1 project, residual Add.
  pplcnet  PaddleOCR's PP-LCNet: depthwise 3x3/5x5 + HardSwish, SE (GlobalAveragePool,
           Conv1x1, Relu, Conv1x1, HardSigmoid, Mul), pointwise + HardSwish; `cls` (text
           orientation, 2 classes) and `rec` (strides (2,1) keep the width, CTC-style head).
  convnext ConvNeXt-atto-sized: depthwise 7x7, channels-last LayerNormalization, MLP with
           Erf GELU, layer scale, residual; used for the first-compile latency.
  minilm_l6_int8  minilm_l6 through ONNX Runtime's quantize_dynamic (int8 weights), as the Hub's
           `model_quantized.onnx` exports are made.
  mobilenetv2_int8_qdq, mobilenetv2_int8_qoperator  mobilenetv2 through ONNX Runtime's
           quantize_static (QDQ and QOperator formats, uint8 activations), as its tools write an int8 CNN;
  mobilenetv2_int8_s8_qdq  the same with quantize_static's defaults (QDQ, int8 activations).

    .venv/bin/python bench/make_bench_models.py [NAME ...] [--out-dir .cache/bench-models]
Writes <out-dir>/<NAME>.onnx (skips existing files unless --force); prints the paths.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / ".cache/bench-models"
OPSET = 17
FLOAT_MIN = -3.4028234663852886e38  # torch.finfo(float32).min, as BERT exports fill masked scores


class GraphBuilder:
    """Accumulates nodes and initializers with unique names; weights from one seeded RNG."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counter = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}_{self.counter}"

    def weight(self, stem: str, array: np.ndarray) -> str:
        name = self.fresh(stem)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def normal(self, stem: str, shape: tuple[int, ...], std: float) -> str:
        return self.weight(stem, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def const(self, value, dtype=np.float32) -> str:
        """A Constant node, as exports write scalars and shape pieces."""
        name = self.fresh("const")
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype))))
        return name

    def op(self, op_type: str, inputs: list[str], stem: str | None = None, **attrs) -> str:
        out = self.fresh(stem or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def model(self, name: str, inputs: list, outputs: list) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="transmuter bench/make_bench_models.py")
        model.ir_version = 8
        return model


# --- transformer pieces --------------------------------------------------------

def linear(g: GraphBuilder, x: str, d_in: int, d_out: int, stem: str) -> str:
    """MatMul by a [d_in, d_out] weight, then Add of the bias (torch's Linear export)."""
    y = g.op("MatMul", [x, g.normal(f"{stem}.weight", (d_in, d_out), 0.02)])
    return g.op("Add", [g.weight(f"{stem}.bias", np.zeros(d_out, np.float32)), y])


def layer_norm(g: GraphBuilder, x: str, width: int, stem: str, eps: float = 1e-12) -> str:
    gamma = g.weight(f"{stem}.weight", np.ones(width, np.float32))
    beta = g.weight(f"{stem}.bias", np.zeros(width, np.float32))
    return g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)


def gelu_erf(g: GraphBuilder, x: str) -> str:
    erf = g.op("Erf", [g.op("Div", [x, g.const(math.sqrt(2.0))])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [erf, g.const(1.0)])]), g.const(0.5)])


def dim_of(g: GraphBuilder, x: str, axis: int) -> str:
    """Shape -> Gather(axis) -> Unsqueeze: one dimension as a 1-element int64 tensor."""
    size = g.op("Gather", [g.op("Shape", [x]), g.const(axis, np.int64)], axis=0)
    return g.op("Unsqueeze", [size, g.const([0], np.int64)])


def split_heads(g: GraphBuilder, x: str, heads: int, head_dim: int, perm: list[int]) -> str:
    shape = g.op("Concat", [dim_of(g, x, 0), dim_of(g, x, 1), g.const([heads], np.int64),
                            g.const([head_dim], np.int64)], axis=0)
    return g.op("Transpose", [g.op("Reshape", [x, shape])], perm=perm)


def attention(g: GraphBuilder, x: str, hidden: int, heads: int, stem: str, mask: str | None) -> str:
    head_dim = hidden // heads
    q = split_heads(g, linear(g, x, hidden, hidden, f"{stem}.query"), heads, head_dim, [0, 2, 1, 3])
    k = split_heads(g, linear(g, x, hidden, hidden, f"{stem}.key"), heads, head_dim, [0, 2, 3, 1])
    v = split_heads(g, linear(g, x, hidden, hidden, f"{stem}.value"), heads, head_dim, [0, 2, 1, 3])
    scores = g.op("Div", [g.op("MatMul", [q, k]), g.const(math.sqrt(head_dim))])
    if mask is not None:
        scores = g.op("Add", [scores, mask])
    context = g.op("Transpose", [g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
    merged = g.op("Concat", [dim_of(g, context, 0), dim_of(g, context, 1), g.const([hidden], np.int64)], axis=0)
    return linear(g, g.op("Reshape", [context, merged]), hidden, hidden, f"{stem}.output")


def ffn(g: GraphBuilder, x: str, hidden: int, ffn_dim: int, stem: str) -> str:
    return linear(g, gelu_erf(g, linear(g, x, hidden, ffn_dim, f"{stem}.fc1")), ffn_dim, hidden, f"{stem}.fc2")


def bert_encoder(layers: int, hidden: int, heads: int, ffn_dim: int, vocab: int = 30522, seed: int = 0,
                 max_positions: int = 512) -> onnx.ModelProto:
    """Post-LayerNorm BERT encoder; inputs input_ids/attention_mask [batch, sequence] int64,
    output last_hidden_state [batch, sequence, hidden]."""
    g = GraphBuilder(seed)
    words = g.op("Gather", [g.normal("word_embeddings", (vocab, hidden), 0.02), "input_ids"])
    # Positions: rows [0, sequence) of a position-id buffer, as BERT's export slices it.
    position_ids = g.weight("position_ids", np.arange(max_positions, dtype=np.int64)[None, :])
    seq = dim_of(g, "input_ids", 1)
    positions = g.op("Slice", [position_ids, g.const([0], np.int64), seq, g.const([1], np.int64),
                               g.const([1], np.int64)])
    pos = g.op("Gather", [g.normal("position_embeddings", (max_positions, hidden), 0.02), positions])
    token_type = g.normal("token_type_embeddings", (1, hidden), 0.02)  # type 0 everywhere
    x = layer_norm(g, g.op("Add", [g.op("Add", [words, token_type]), pos]), hidden, "embeddings.LayerNorm")
    mask = g.op("Cast", [g.op("Unsqueeze", ["attention_mask", g.const([1, 2], np.int64)])], to=TensorProto.FLOAT)
    mask = g.op("Mul", [g.op("Sub", [g.const(1.0), mask]), g.const(FLOAT_MIN)])
    for i in range(layers):
        stem = f"encoder.layer.{i}"
        x = layer_norm(g, g.op("Add", [attention(g, x, hidden, heads, f"{stem}.attention", mask), x]), hidden,
                       f"{stem}.attention.LayerNorm")
        x = layer_norm(g, g.op("Add", [ffn(g, x, hidden, ffn_dim, stem), x]), hidden, f"{stem}.output.LayerNorm")
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
           for n in ("input_ids", "attention_mask")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    return g.model("bert_encoder", ids, [out])


def vit(layers: int = 12, hidden: int = 768, heads: int = 12, ffn_dim: int = 3072, image: int = 224, patch: int = 16,
        seed: int = 0) -> onnx.ModelProto:
    """Pre-LayerNorm ViT; input pixel_values [batch, 3, image, image], output last_hidden_state."""
    g = GraphBuilder(seed)
    patches = (image // patch) ** 2
    conv = g.op("Conv", ["pixel_values", g.normal("patch.weight", (hidden, 3, patch, patch), 0.02),
                         g.weight("patch.bias", np.zeros(hidden, np.float32))],
                kernel_shape=[patch, patch], strides=[patch, patch])
    tokens = g.op("Transpose", [g.op("Reshape", [conv, g.const([0, hidden, -1], np.int64)])], perm=[0, 2, 1])
    cls_shape = g.op("Concat", [dim_of(g, "pixel_values", 0), g.const([1, hidden], np.int64)], axis=0)
    cls = g.op("Expand", [g.normal("cls_token", (1, 1, hidden), 0.02), cls_shape])
    x = g.op("Add", [g.op("Concat", [cls, tokens], axis=1), g.normal("position_embeddings", (1, patches + 1, hidden), 0.02)])
    for i in range(layers):
        stem = f"layer.{i}"
        x = g.op("Add", [attention(g, layer_norm(g, x, hidden, f"{stem}.ln1", 1e-12), hidden, heads, stem, None), x])
        x = g.op("Add", [ffn(g, layer_norm(g, x, hidden, f"{stem}.ln2", 1e-12), hidden, ffn_dim, stem), x])
    x = layer_norm(g, x, hidden, "final_ln")
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    inp = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, image, image])
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", patches + 1, hidden])
    return g.model("vit", [inp], [out])


# --- CNN pieces ------------------------------------------------------------------

def conv(g: GraphBuilder, x: str, c_in: int, c_out: int, kernel: int | tuple[int, int], stride=1, group: int = 1,
         gain: float = 1.0) -> str:
    """Conv with a bias (BatchNorm folded in), He-scaled weights times `gain`; 'same' padding."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    fan_in = (c_in // group) * kh * kw
    w = g.normal("conv.weight", (c_out, c_in // group, kh, kw), gain * math.sqrt(2.0 / fan_in))
    b = g.normal("conv.bias", (c_out,), 0.01)
    return g.op("Conv", [x, w, b], kernel_shape=[kh, kw], strides=[sh, sw], group=group,
                pads=[kh // 2, kw // 2, kh // 2, kw // 2])


def relu6(g: GraphBuilder, x: str) -> str:
    return g.op("Clip", [x, g.const(0.0), g.const(6.0)])


def classifier(g: GraphBuilder, x: str, channels: int, classes: int) -> str:
    flat = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    return g.op("Gemm", [flat, g.normal("fc.weight", (classes, channels), 0.02),
                         g.weight("fc.bias", np.zeros(classes, np.float32))], transB=1)


def image_model(g: GraphBuilder, name: str, logits: str, channels: int, height: int, width: int,
                out_shape: list) -> onnx.ModelProto:
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    inp = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", channels, height, width])
    return g.model(name, [inp], [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)])


def resnet50(seed: int = 0, image: int = 224, classes: int = 1000) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.op("Relu", [conv(g, "pixel_values", 3, 64, 7, 2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            c_out = width * 4
            y = g.op("Relu", [conv(g, x, c_in, width, 1)])
            y = g.op("Relu", [conv(g, y, width, width, 3, stride)])
            y = conv(g, y, width, c_out, 1, gain=0.2)
            shortcut = conv(g, x, c_in, c_out, 1, stride) if block == 0 else x
            x = g.op("Relu", [g.op("Add", [y, shortcut])])
            c_in = c_out
    return image_model(g, "resnet50", classifier(g, x, c_in, classes), 3, image, image, ["batch", classes])


def mobilenetv2(seed: int = 0, image: int = 224, classes: int = 1000) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = relu6(g, conv(g, "pixel_values", 3, 32, 3, 2))
    c_in = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            y = relu6(g, conv(g, x, c_in, hidden, 1)) if t != 1 else x
            y = relu6(g, conv(g, y, hidden, hidden, 3, stride, group=hidden))
            y = conv(g, y, hidden, c, 1, gain=0.5)
            x = g.op("Add", [x, y]) if stride == 1 and c_in == c else y
            c_in = c
    x = relu6(g, conv(g, x, c_in, 1280, 1))
    return image_model(g, "mobilenetv2", classifier(g, x, 1280, classes), 3, image, image, ["batch", classes])


# PP-LCNet blocks: (kernel, c_in, c_out, stride, SE), channels before scaling (PaddleClas NET_CONFIG).
LCNET_BLOCKS = [(3, 16, 32, 1, False), (3, 32, 64, 2, False), (3, 64, 64, 1, False), (3, 64, 128, 2, False),
                (3, 128, 128, 1, False), (3, 128, 256, 2, False), *[(5, 256, 256, 1, False)] * 5,
                (5, 256, 512, 2, True), (5, 512, 512, 1, True)]


def squeeze_excite(g: GraphBuilder, x: str, channels: int) -> str:
    s = g.op("Relu", [conv(g, g.op("GlobalAveragePool", [x]), channels, channels // 4, 1)])
    s = g.op("HardSigmoid", [conv(g, s, channels // 4, channels, 1)], alpha=1.0 / 6.0, beta=0.5)
    return g.op("Mul", [x, s])


def pplcnet(task: str, seed: int = 0) -> onnx.ModelProto:
    """`cls`: scale 0.35, 3x48x192, 2 classes + Softmax. `rec`: scale 0.5, 3x48x320, strides (2,1)
    after the first two downsamplings, height pooled away, a 6625-class CTC head + Softmax."""
    scale, height, width = (0.35, 48, 192) if task == "cls" else (0.5, 48, 320)

    def ch(c: int) -> int:
        return max(8, int(c * scale + 4) // 8 * 8)  # PaddleClas make_divisible(c * scale)

    g = GraphBuilder(seed)
    x = g.op("HardSwish", [conv(g, "pixel_values", 3, ch(16), 3, 2)])
    downsamplings = 1
    for kernel, c_in, c_out, stride, se in LCNET_BLOCKS:
        if stride == 2:
            downsamplings += 1
            if task == "rec" and downsamplings > 2:
                stride = (2, 1)  # text recognition keeps the width (the sequence) at 1/4
        x = g.op("HardSwish", [conv(g, x, ch(c_in), ch(c_in), kernel, stride, group=ch(c_in))])
        if se:
            x = squeeze_excite(g, x, ch(c_in))
        x = g.op("HardSwish", [conv(g, x, ch(c_in), ch(c_out), 1)])
    c = ch(512)
    if task == "cls":
        logits = g.op("Softmax", [classifier(g, x, c, 2)], axis=-1)
        return image_model(g, "pplcnet_cls", logits, 3, height, width, ["batch", 2])
    # [B, C, H', W/4] -> average over H' -> [B, W/4, C] -> neck Linear -> CTC head.
    seq = g.op("Transpose", [g.op("Squeeze", [g.op("ReduceMean", [x], axes=[2], keepdims=1),
                                              g.const([2], np.int64)])], perm=[0, 2, 1])
    neck = g.op("HardSwish", [linear(g, seq, c, 256, "neck")])
    logits = g.op("Softmax", [linear(g, neck, 256, 6625, "ctc")], axis=-1)
    return image_model(g, "pplcnet_rec", logits, 3, height, width, ["batch", width // 4, 6625])


def convnext(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320), image: int = 224, classes: int = 1000,
             seed: int = 0) -> onnx.ModelProto:
    """ConvNeXt-atto-sized. Channels-first LayerNorm (stem, downsampling) as Transpose ->
    LayerNormalization -> Transpose; blocks as in the torch reference implementation."""
    g = GraphBuilder(seed)

    def ln_channels_first(x: str, c: int, stem: str) -> str:
        y = layer_norm(g, g.op("Transpose", [x], perm=[0, 2, 3, 1]), c, stem, 1e-6)
        return g.op("Transpose", [y], perm=[0, 3, 1, 2])

    x = ln_channels_first(g.op("Conv", ["pixel_values", g.normal("stem.weight", (dims[0], 3, 4, 4), 0.02),
                                        g.weight("stem.bias", np.zeros(dims[0], np.float32))],
                                   kernel_shape=[4, 4], strides=[4, 4]), dims[0], "stem.ln")
    for stage, (depth, c) in enumerate(zip(depths, dims)):
        if stage > 0:
            x = ln_channels_first(x, dims[stage - 1], f"down{stage}.ln")
            x = g.op("Conv", [x, g.normal("down.weight", (c, dims[stage - 1], 2, 2), 0.02),
                              g.weight("down.bias", np.zeros(c, np.float32))], kernel_shape=[2, 2], strides=[2, 2])
        for block in range(depth):
            stem = f"stage{stage}.{block}"
            y = conv(g, x, c, c, 7, group=c, gain=0.5)
            y = layer_norm(g, g.op("Transpose", [y], perm=[0, 2, 3, 1]), c, f"{stem}.ln", 1e-6)
            y = linear(g, gelu_erf(g, linear(g, y, c, 4 * c, f"{stem}.pw1")), 4 * c, c, f"{stem}.pw2")
            y = g.op("Mul", [y, g.weight(f"{stem}.gamma", np.full(c, 0.1, np.float32))])
            x = g.op("Add", [x, g.op("Transpose", [y], perm=[0, 3, 1, 2])])
    pooled = layer_norm(g, g.op("ReduceMean", [x], axes=[2, 3], keepdims=0), dims[-1], "head.ln", 1e-6)
    logits = linear(g, pooled, dims[-1], classes, "head")
    return image_model(g, "convnext", logits, 3, image, image, ["batch", classes])


# --- the catalogue ----------------------------------------------------------------

def dynamic_int8(float_model: str):
    """ONNX Runtime's quantize_dynamic of another bench model (int8 weights, the defaults the Hub's
    `model_quantized.onnx` files are made with): DynamicQuantizeLinear + MatMulInteger per product."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    import tempfile

    source = ensure_model(float_model)
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "quantized.onnx"
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
        return onnx.load(str(target))


def static_int8(float_model: str, quant_format: str, activations: str = "QUInt8"):
    """ONNX Runtime's quantize_static of an image bench model, in the QDQ or QOperator format (uint8
    activations, or `activations` "QInt8" as quantize_static's defaults; int8 per-channel weights,
    calibrated on 4 seeded random batch-1 images): what ORT's tools write for an int8 CNN
    (QuantizeLinear/DequantizeLinear pairs around float ops, or QLinearConv)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    import tempfile

    source = ensure_model(float_model)
    graph_input = onnx.load(str(source), load_external_data=False).graph.input[0]
    shape = [1 if not d.dim_value else d.dim_value for d in graph_input.type.tensor_type.shape.dim]

    class SeededImages(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter({graph_input.name: np.random.default_rng(100 + i).standard_normal(shape)
                                 .astype(np.float32)} for i in range(4))

        def get_next(self):
            return next(self.batches, None)

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "quantized.onnx"
        quantize_static(str(source), str(target), SeededImages(), quant_format=getattr(QuantFormat, quant_format),
                        activation_type=getattr(QuantType, activations), weight_type=QuantType.QInt8,
                        per_channel=True)
        return onnx.load(str(target))


MODELS = {
    "tiny_encoder": lambda: bert_encoder(layers=2, hidden=64, heads=4, ffn_dim=256, vocab=1000, max_positions=128),
    "minilm_l6": lambda: bert_encoder(layers=6, hidden=384, heads=12, ffn_dim=1536),
    "minilm_l6_int8": lambda: dynamic_int8("minilm_l6"),
    "bert_base": lambda: bert_encoder(layers=12, hidden=768, heads=12, ffn_dim=3072),
    "vit_base": vit,
    "resnet50": resnet50,
    "mobilenetv2": mobilenetv2,
    "mobilenetv2_int8_qdq": lambda: static_int8("mobilenetv2", "QDQ"),
    "mobilenetv2_int8_qoperator": lambda: static_int8("mobilenetv2", "QOperator"),
    "mobilenetv2_int8_s8_qdq": lambda: static_int8("mobilenetv2", "QDQ", "QInt8"),
    "pplcnet_cls": lambda: pplcnet("cls"),
    "pplcnet_rec": lambda: pplcnet("rec"),
    "convnext_atto": convnext,
}


def ensure_model(name: str, out_dir: Path = DEFAULT_OUT, force: bool = False) -> Path:
    """Builds MODELS[name] into out_dir/name.onnx unless it is already there; checks the graph."""
    if name not in MODELS:
        raise KeyError(f"unknown bench model '{name}' (known: {', '.join(MODELS)})")
    path = out_dir / f"{name}.onnx"
    if path.exists() and not force:
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    model = MODELS[name]()
    onnx.checker.check_model(model)  # all of them stay far below the 2 GB protobuf limit
    tmp = path.with_suffix(".onnx.tmp")
    onnx.save(model, tmp)
    tmp.replace(path)  # never leave a half-written model where a later run would trust it
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help=f"models to build (default: all): {', '.join(MODELS)}")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    p.add_argument("--force", action="store_true", help="rebuild existing files")
    args = p.parse_args()
    for name in args.names or MODELS:
        print(ensure_model(name, args.out_dir, args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
