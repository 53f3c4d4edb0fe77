"""Quantized (QOperator) contrib operators: QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearSoftmax, QLinearConcat, QLinearGlobalAveragePool,
QLinearAveragePool, DynamicQuantizeMatMul, MatMulIntegerToFloat, QuantizeLinear,
DequantizeLinear (com.microsoft) and DynamicQuantizeLSTM, after ORT's
qlinear_binary_op_test.cc, qlinear_lookup_table_test.cc, qlinear_concat_test.cc,
qlinear_pool_test.cc, qlinear_global_average_pool_test.cc, qlinear_softmax tests,
dynamic_quantize_matmul_test.cc, matmul_integer_to_float_test.cc,
quantize_ops_test.cc and dynamic_quantize_lstm_test.cc; plus whole models
quantized by onnxruntime.quantization (QOperator format).

Tolerances:
- Integer outputs are compared exactly (atol 0, rtol 0): the implementation
  follows ORT's float32 operation order (ratios and tables computed on the host
  from the same float values).
- QLinearSigmoid: atol 1 (one quantization step). ORT evaluates the logistic
  with MLAS's own polynomial, Transmuter with std::exp; a table entry whose
  sigmoid(v) / Y_scale lies within an ulp of a rounding boundary could land one
  step apart (not seen in 60 random scale pairs, but not excluded).
- QLinearSoftmax: exact for rows up to 256 entries, whose exp-table entries are
  added in ORT's order (one float32 add at a time); atol 1 for longer rows,
  summed by MLX's reduction in another order, which can move a result lying at
  a rounding boundary by one step.
- QLinearAdd is exact too: ORT's AVX2 kernel fuses its multiply-adds, which
  Transmuter reproduces on the CPU (in float64, rounded once); the case
  qlinearadd_u8_large_row holds a sum that an unfused float32 multiply and add
  would round one step apart.
- DynamicQuantizeMatMul, MatMulIntegerToFloat, DequantizeLinear: float outputs
  of exact int32 products times a float32 scale; 1e-6 relative + 1e-6 absolute
  covers the order of ORT's scale-and-bias multiply-add.
- DynamicQuantizeLSTM: 1e-5 (relative and absolute): X and each step's hidden
  state are rounded to uint8 as ORT rounds them, the rest is float32 math in
  another order. With sequence_lens, atol 2e-3: ORT rounds the states of all
  batch entries of a step with one uint8 range, where an entry whose sequence
  has ended contributes zeros (its outputs), and its reverse direction walks
  each entry through its own reversed sequence; Transmuter's masked recurrence
  keeps an ended entry's state and aligns reverse entries at the last time
  step, so a step's range, and with it the rounding step, can differ slightly
  (observed worst difference 8e-4).
- Quantized models (onnxruntime.quantization, QOperator and dynamic): float
  outputs. The CNN's float probabilities come after QLinearSigmoid, whose table
  may differ by one step (above), which moves a probability by up to about
  1e-2; atol 1e-2. The dynamically quantized MLP (DynamicQuantizeLinear,
  MatMulInteger, float Mul/Add) and ORT's fusion of it into
  DynamicQuantizeMatMul: 1e-5 relative and absolute.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from contrib_cases import Case, ModelProtoCase, op_case, rng

EXACT = {"rtol": 0.0, "atol": 0.0}
ONE_STEP = {"rtol": 0.0, "atol": 1.0}
FLOAT = {"rtol": 1e-6, "atol": 1e-6}
LSTM = {"rtol": 1e-5, "atol": 1e-5}
LSTM_SEQUENCE_LENS = {"rtol": 0.0, "atol": 2e-3}

U8, I8 = np.uint8, np.int8
TYPES = [("u8", U8), ("s8", I8)]


def f32(v):
    return np.array(v, np.float32)


def q(g, shape, dtype):
    info = np.iinfo(dtype)
    return g.integers(info.min, info.max + 1, size=shape).astype(dtype)


def zp(g, dtype, spread=20):
    center = 128 if dtype == U8 else 0
    return np.array(center + int(g.integers(-spread, spread + 1)), dtype)


def scale(g, lo=0.005, hi=0.05):
    return f32(g.uniform(lo, hi))


def all_bytes(dtype, shape=(4, 64)):
    return np.arange(256, dtype=np.uint8).view(dtype).reshape(shape)


# --- QLinearAdd / QLinearMul ------------------------------------------------------------------


def binary_cases():
    out = []
    g = rng(701)
    shapes = [
        ("same", (2, 3, 8), (2, 3, 8)),
        ("odd", (3, 37), (3, 37)),
        ("row", (2, 3, 8), (8,)),
        ("column", (2, 3, 8), (3, 1)),
        ("scalar_a", (), (4, 9)),
        ("scalar_b", (4, 9), (1,)),
        ("both_ways", (4, 1, 5), (1, 3, 1)),
        # Many values: sums near n + 0.5, where ORT's fused multiply-add decides.
        ("large_row", (64, 1024), (1024,)),
        ("large_column", (64, 1024), (64, 1)),
    ]
    for op in ("QLinearAdd", "QLinearMul"):
        for tag, dtype in TYPES:
            for shape_tag, sa, sb in shapes:
                a, b = q(g, sa, dtype), q(g, sb, dtype)
                inputs = [
                    ("A", a), ("const:A_scale", scale(g)), ("const:A_zero_point", zp(g, dtype)),
                    ("B", b), ("const:B_scale", scale(g)), ("const:B_zero_point", zp(g, dtype)),
                    ("const:C_scale", scale(g, 0.02, 0.08) if op == "QLinearAdd" else scale(g, 0.002, 0.01)),
                    ("const:C_zero_point", zp(g, dtype)),
                ]
                out.append(op_case(f"{op.lower()}_{tag}_{shape_tag}", op, inputs, ["C"], **EXACT))
            # C's zero point left out (0), scales as graph inputs (read at run
            # time). (ORT's type inference refuses a missing A or B zero point.)
            a, b = q(g, (3, 5), dtype), q(g, (3, 5), dtype)
            inputs = [("A", a), ("A_scale", scale(g)), ("A_zero_point", zp(g, dtype)), ("B", b), ("B_scale", scale(g)),
                      ("B_zero_point", zp(g, dtype)), ("C_scale", scale(g, 0.02, 0.08)), None]
            out.append(op_case(f"{op.lower()}_{tag}_no_c_zero_point", op, inputs, ["C"], **EXACT))
    # ORT's test values: A_scale 0.25, B_scale 0.5, C_scale 0.1 (ties of .5 exactly).
    a = np.array([0, 2, 3, 4, 255, 129, 127, 1], U8)
    b = np.array([1, 3, 255, 0, 255, 128, 128, 7], U8)
    for op in ("QLinearAdd", "QLinearMul"):
        inputs = [("A", a), ("const:A_scale", f32(0.25)), ("const:A_zero_point", np.array(128, U8)),
                  ("B", b), ("const:B_scale", f32(0.5)), ("const:B_zero_point", np.array(128, U8)),
                  ("const:C_scale", f32(0.1 if op == "QLinearAdd" else 1.0)), ("const:C_zero_point", np.array(128, U8))]
        out.append(op_case(f"{op.lower()}_u8_exact_ties", op, inputs, ["C"], **EXACT))
    return out


# --- lookup-table activations ------------------------------------------------------------------


def lookup_cases():
    out = []
    g = rng(702)
    for tag, dtype in TYPES:
        x = all_bytes(dtype)
        # X_zero_point left out (0); ORT's kernel reads input 4's definition,
        # so Y_zero_point is always given.
        for with_zp in (True, False):
            zp_tag = "zp" if with_zp else "no_zp"
            x_zp = ("const:X_zero_point", zp(g, dtype, 40)) if with_zp else None
            inputs = [("X", x), ("const:X_scale", f32(0.06)), x_zp,
                      ("const:Y_scale", f32(1 / 256)), ("const:Y_zero_point", np.array(0 if dtype == U8 else -128, dtype))]
            out.append(op_case(f"qlinear_sigmoid_{tag}_{zp_tag}", "QLinearSigmoid", inputs, ["Y"], **ONE_STEP))
            for alpha in (None, 0.1, -0.5):
                attrs = {} if alpha is None else {"alpha": alpha}
                alpha_tag = "default" if alpha is None else str(alpha).replace("-", "m").replace(".", "p")
                inputs = [("X", x), ("const:X_scale", scale(g, 0.02, 0.1)), x_zp,
                          ("const:Y_scale", scale(g, 0.02, 0.1)), ("const:Y_zero_point", zp(g, dtype, 40))]
                out.append(op_case(f"qlinear_leaky_relu_{tag}_{zp_tag}_{alpha_tag}", "QLinearLeakyRelu", inputs,
                                   ["Y"], attrs, **EXACT))
        # Scales as graph inputs: ORT builds its table at run time.
        inputs = [("X", q(g, (3, 7), dtype)), ("X_scale", f32(0.03)), ("X_zero_point", zp(g, dtype)),
                  ("Y_scale", f32(0.04)), ("Y_zero_point", zp(g, dtype))]
        out.append(op_case(f"qlinear_leaky_relu_{tag}_runtime_scales", "QLinearLeakyRelu", inputs, ["Y"],
                           {"alpha": 0.2}, **EXACT))
    return out


def softmax_cases():
    out = []
    g = rng(703)
    for tag, dtype in TYPES:
        y_zp = np.array(0 if dtype == U8 else -128, dtype)
        configs = [
            ("op12_axis1", (2, 3, 4), 12, 1),
            ("op12_default_axis", (2, 3, 4), 12, None),
            ("op12_axis2", (2, 3, 4), 12, 2),
            ("op13_last", (2, 3, 16), 13, -1),
            ("op13_default_axis", (3, 10), 13, None),
            ("op13_axis1", (2, 5, 3), 13, 1),
            ("op13_axis0", (4, 6), 13, 0),
            ("op13_long_row", (2, 300), 13, -1),
        ]
        for cfg_tag, shape, opset, axis in configs:
            attrs = {"opset": opset}
            if axis is not None:
                attrs["axis"] = axis
            inputs = [("X", q(g, shape, dtype)), ("const:X_scale", scale(g, 0.02, 0.2)),
                      ("const:x_zero_point", zp(g, dtype)), ("const:y_scale", f32(1 / 256)), ("const:y_zero_point", y_zp)]
            tol = ONE_STEP if cfg_tag == "op13_long_row" else EXACT  # rows of 300 > 256
            out.append(op_case(f"qlinear_softmax_{tag}_{cfg_tag}", "QLinearSoftmax", inputs, ["Y"], attrs, **tol))
        # Scales as graph inputs, x_zero_point left out (y_zero_point is required).
        inputs = [("X", q(g, (3, 8), dtype)), ("X_scale", f32(0.05)), None, ("y_scale", f32(1 / 200)),
                  ("y_zero_point", np.array(0 if dtype == U8 else -100, dtype))]
        out.append(op_case(f"qlinear_softmax_{tag}_runtime_scales", "QLinearSoftmax", inputs, ["Y"], {"opset": 13},
                           **EXACT))
    return out


# --- QLinearConcat ------------------------------------------------------------------------------


def concat_cases():
    out = []
    g = rng(704)
    for tag, dtype in TYPES:
        y_scale, y_zp = scale(g), zp(g, dtype)
        a, b, c = q(g, (2, 3, 4), dtype), q(g, (2, 5, 4), dtype), q(g, (2, 1, 4), dtype)
        inputs = [("const:Y_scale", y_scale), ("const:Y_zero_point", y_zp),
                  ("A", a), ("const:A_scale", scale(g)), ("const:A_zero_point", zp(g, dtype)),
                  ("B", b), ("const:B_scale", y_scale), ("const:B_zero_point", y_zp),  # copied as is
                  ("C", c), ("const:C_scale", scale(g)), ("const:C_zero_point", zp(g, dtype))]
        out.append(op_case(f"qlinear_concat_{tag}_axis1", "QLinearConcat", inputs, ["Y"], {"axis": 1}, **EXACT))
        a, b = q(g, (3, 2), dtype), q(g, (3, 5), dtype)
        inputs = [("Y_scale", y_scale), ("Y_zero_point", y_zp),
                  ("A", a), ("A_scale", scale(g)), ("A_zero_point", zp(g, dtype)),
                  ("B", b), ("B_scale", scale(g)), ("B_zero_point", zp(g, dtype))]
        out.append(op_case(f"qlinear_concat_{tag}_last_axis_runtime", "QLinearConcat", inputs, ["Y"], {"axis": -1},
                           **EXACT))
        a = q(g, (2, 2), dtype)
        inputs = [("const:Y_scale", y_scale), ("const:Y_zero_point", y_zp),
                  ("A", a), ("const:A_scale", scale(g, 0.05, 0.2)), ("const:A_zero_point", zp(g, dtype)),
                  ("B", q(g, (3, 2), dtype)), ("const:B_scale", scale(g, 0.001, 0.004)), ("const:B_zero_point", zp(g, dtype))]
        out.append(op_case(f"qlinear_concat_{tag}_axis0_saturating", "QLinearConcat", inputs, ["Y"], {"axis": 0},
                           **EXACT))
    return out


# --- pools ------------------------------------------------------------------------------------------


def pool_inputs(g, x, dtype):
    # ORT's schemas and type inference want both zero points.
    return [("X", x), ("const:x_scale", scale(g, 0.01, 0.05)), ("const:x_zero_point", zp(g, dtype)),
            ("const:y_scale", scale(g, 0.01, 0.05)), ("const:y_zero_point", zp(g, dtype))]


def pool_cases():
    out = []
    g = rng(705)
    for tag, dtype in TYPES:
        for shape_tag, shape, channels_last in [
            ("nchw", (2, 3, 5, 5), 0), ("nhwc", (2, 5, 5, 3), 1), ("1d", (1, 4, 7), 0),
            ("3d", (1, 2, 3, 4, 5), 0), ("wide", (1, 16, 8, 8), 0), ("nhwc_wide", (1, 8, 8, 16), 1),
        ]:
            out.append(op_case(f"qlinear_global_average_pool_{tag}_{shape_tag}", "QLinearGlobalAveragePool",
                               pool_inputs(g, q(g, shape, dtype), dtype), ["Y"], {"channels_last": channels_last},
                               **EXACT))
        configs = [
            ("k3_p1", (1, 2, 6, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
            ("k3_p1_include_pad", (1, 2, 6, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
            ("k2_s2", (2, 3, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2]}),
            ("k3_s2_ceil", (1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
            ("k3_s2_ceil_include_pad", (1, 2, 8, 8),
             {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 0, 1, 0], "count_include_pad": 1}),
            ("same_upper", (1, 3, 5, 6), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER"}),
            ("same_lower", (1, 3, 5, 6), {"kernel_shape": [3, 2], "strides": [2, 1], "auto_pad": "SAME_LOWER"}),
            ("1d", (2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
            ("3d", (1, 2, 4, 5, 6), {"kernel_shape": [2, 3, 2], "pads": [0, 1, 1, 1, 0, 1]}),
            ("global_fallback", (1, 3, 4, 5), {"kernel_shape": [4, 5]}),
            ("asymmetric_pads", (1, 1, 5, 5), {"kernel_shape": [3, 3], "pads": [0, 2, 1, 0]}),
        ]
        for cfg_tag, shape, attrs in configs:
            x = q(g, shape, dtype)
            out.append(op_case(f"qlinear_average_pool_{tag}_{cfg_tag}", "QLinearAveragePool", pool_inputs(g, x, dtype),
                               ["Y"], attrs, **EXACT))
            if len(shape) in (3, 4, 5) and cfg_tag in ("k3_p1", "k3_s2_ceil_include_pad", "1d", "3d", "same_upper"):
                x_last = np.moveaxis(x, 1, -1).copy()
                out.append(op_case(f"qlinear_average_pool_{tag}_{cfg_tag}_nhwc", "QLinearAveragePool",
                                   pool_inputs(g, x_last, dtype), ["Y"], {**attrs, "channels_last": 1}, **EXACT))
    return out


# --- matmuls -------------------------------------------------------------------------------------


def qgemm_cases(g):
    """QGemm (quantize_static's QOperator Gemm): ORT's CPU kernel takes uint8 A with uint8 or int8 B and a
    uint8 output, or int8 A, B and output; B per tensor or per column; C int32 of every broadcast shape;
    alpha, transA, transB; a float output without y_scale/y_zero_point. Requantized outputs are exact
    (tolerance 0: one rounding of the same float32 product; a tie could land on the other integer only if
    the products differed, and they are exact)."""
    out = []
    m, k, n = 4, 24, 6
    c_shapes = {"c_none": None, "c_scalar": (), "c_n": (n,), "c_1n": (1, n), "c_m1": (m, 1), "c_mn": (m, n)}
    for a_tag, a_type, b_tag, b_type in [("u8", U8, "u8", U8), ("u8", U8, "s8", I8), ("s8", I8, "s8", I8)]:
        for variant in ("float", "requant", "per_column", "trans", "alpha"):
            for c_tag, c_shape in c_shapes.items():
                if variant != "requant" and c_tag not in ("c_none", "c_n"):
                    continue
                trans_a, trans_b = variant == "trans", variant in ("trans", "per_column")
                a = q(g, (k, m) if trans_a else (m, k), a_type)
                b = q(g, (n, k) if trans_b else (k, n), b_type)
                per_col = variant == "per_column"
                b_scale = f32(g.uniform(0.01, 0.05, n)) if per_col else scale(g)
                b_zp = np.array([int(zp(g, b_type)) for _ in range(n)], b_type) if per_col else zp(g, b_type)
                c = None if c_shape is None else g.integers(-3000, 3000, c_shape).astype(np.int32)
                quantized_output = variant != "float"
                y_type = a_type  # ORT: the output's type is A's
                inputs = [("A", a), ("const:a_scale", scale(g)), ("const:a_zero_point", zp(g, a_type)),
                          ("const:B", b), ("const:b_scale", b_scale), ("const:b_zero_point", b_zp),
                          ("const:C", c) if c is not None else None,
                          ("const:y_scale", f32(g.uniform(0.05, 0.2))) if quantized_output else None,
                          ("const:y_zero_point", zp(g, y_type)) if quantized_output else None]
                attrs = {"transA": int(trans_a), "transB": int(trans_b)}
                if variant == "alpha":
                    attrs["alpha"] = 0.75
                tolerance = {"rtol": 0.0, "atol": 0.0} if quantized_output else FLOAT
                out.append(op_case(f"qgemm_{a_tag}{b_tag}_{variant}_{c_tag}", "QGemm", inputs, ["Y"], attrs,
                                   **tolerance))
    return out


def matmul_cases():
    out = []
    g = rng(706)
    for tag, dtype in TYPES:
        for shape_tag, sa, sb in [("2d", (3, 8), (8, 5)), ("batched", (2, 4, 16), (16, 6)), ("long_k", (2, 300), (300, 7))]:
            n = sb[-1]
            a = (g.standard_normal(sa) * 2).astype(np.float32)
            b = q(g, sb, dtype)
            for variant in ("plain", "zp", "bias", "zp_bias", "per_column"):
                b_scale = f32(g.uniform(0.01, 0.05, n)) if variant == "per_column" else scale(g)
                b_zp = None
                if variant in ("zp", "zp_bias"):
                    b_zp = ("const:b_zero_point", zp(g, dtype))
                if variant == "per_column":
                    b_zp = ("const:b_zero_point", np.array([int(zp(g, dtype)) for _ in range(n)], dtype))
                bias = ("bias", f32(g.standard_normal(n))) if "bias" in variant else None
                inputs = [("A", a), ("const:B", b), ("const:b_scale", b_scale), b_zp, bias]
                out.append(op_case(f"dynamic_quantize_matmul_{tag}_{shape_tag}_{variant}", "DynamicQuantizeMatMul",
                                   inputs, ["Y"], **FLOAT))
        # B as a graph input (no pre-packing) and A all positive (zero point 0).
        a = np.abs(g.standard_normal((4, 8))).astype(np.float32)
        inputs = [("A", a), ("B", q(g, (8, 3), dtype)), ("b_scale", scale(g)), None, None]
        out.append(op_case(f"dynamic_quantize_matmul_{tag}_runtime_b", "DynamicQuantizeMatMul", inputs, ["Y"], **FLOAT))
    out += qgemm_cases(g)
    for a_tag, a_type in TYPES[:1]:  # ORT's CPU kernel takes uint8 A only
        for b_tag, b_type in TYPES:
            for shape_tag, sa, sb in [("2d", (3, 8), (8, 5)), ("batched", (2, 4, 16), (16, 6))]:
                n = sb[-1]
                a, b = q(g, sa, a_type), q(g, sb, b_type)
                for variant in ("plain", "zp", "per_column_bias"):
                    per_col = variant == "per_column_bias"
                    inputs = [
                        ("A", a), ("const:B", b), ("const:a_scale", scale(g)),
                        ("const:b_scale", f32(g.uniform(0.01, 0.05, n)) if per_col else scale(g)),
                        ("const:a_zero_point", zp(g, a_type)) if variant != "plain" else None,
                        ("const:b_zero_point",
                         np.array([int(zp(g, b_type)) for _ in range(n)], b_type) if per_col else zp(g, b_type))
                        if variant != "plain" else None,
                        ("bias", f32(g.standard_normal(n))) if per_col else None,
                    ]
                    out.append(op_case(f"matmul_integer_to_float_{a_tag}{b_tag}_{shape_tag}_{variant}",
                                       "MatMulIntegerToFloat", inputs, ["Y"], **FLOAT))
    return out


# --- QuantizeLinear / DequantizeLinear ----------------------------------------------------------------


def quantize_cases():
    out = []
    g = rng(707)
    x = (g.standard_normal((2, 3, 4)) * 3).astype(np.float32)
    x[0, 0, :3] = [0.5, 1.5, -2.5]  # ties: half to even
    for tag, dtype in TYPES + [("u16", np.uint16), ("s16", np.int16)]:
        s = f32(0.5) if dtype in (U8, I8) else f32(0.001)
        z = np.array(3 if dtype in (U8, np.uint16) else -2, dtype)
        out.append(op_case(f"quantize_linear_{tag}", "QuantizeLinear", [("x", x), ("const:y_scale", s), ("const:y_zero_point", z)],
                           ["y"], **EXACT))
        qx = q(g, (2, 3, 4), dtype)
        out.append(op_case(f"dequantize_linear_{tag}", "DequantizeLinear",
                           [("x", qx), ("const:x_scale", f32(0.02)), ("const:x_zero_point", z)], ["y"], **FLOAT))
    out.append(op_case("quantize_linear_no_zp", "QuantizeLinear", [("x", x), ("const:y_scale", f32(0.05))], ["y"], **EXACT))
    out.append(op_case("dequantize_linear_no_zp", "DequantizeLinear", [("x", q(g, (5,), U8)), ("const:x_scale", f32(0.1))],
                       ["y"], **FLOAT))
    for axis in (1, 0, -1):
        dim = x.shape[axis]
        scales = f32(g.uniform(0.02, 0.2, dim))
        zps = np.array([int(zp(g, U8)) for _ in range(dim)], U8)
        out.append(op_case(f"quantize_linear_per_axis_{axis}".replace("-", "m"), "QuantizeLinear",
                           [("x", x), ("const:y_scale", scales), ("const:y_zero_point", zps)], ["y"], {"axis": axis},
                           **EXACT))
        zps8 = np.array([int(zp(g, I8)) for _ in range(dim)], I8)
        out.append(op_case(f"dequantize_linear_per_axis_{axis}".replace("-", "m"), "DequantizeLinear",
                           [("x", q(g, x.shape, I8)), ("const:x_scale", scales), ("const:x_zero_point", zps8)], ["y"],
                           {"axis": axis}, **FLOAT))
    return out


# --- DynamicQuantizeLSTM --------------------------------------------------------------------------------


def lstm_cases():
    out = []
    g = rng(708)
    T, B, I, H = 4, 3, 5, 4
    for direction in ("forward", "reverse", "bidirectional"):
        D = 2 if direction == "bidirectional" else 1
        for tag, dtype in TYPES:
            for variant in ("per_channel", "per_tensor_states", "sequence_lens"):
                shape = (D, 4 * H) if variant == "per_channel" else (D,)
                w = q(g, (D, I, 4 * H), dtype)
                r = q(g, (D, H, 4 * H), dtype)
                # ORT: int8 per-channel zero points must be 0; uint8 ones one constant.
                if dtype == I8:
                    w_zp, r_zp = np.zeros(shape, I8), np.zeros(shape, I8)
                else:
                    w_zp, r_zp = np.full(shape, 128, U8), np.full(shape, 127, U8)
                w_scale = f32(g.uniform(0.002, 0.006, shape))
                r_scale = f32(g.uniform(0.002, 0.006, shape))
                x = f32(g.standard_normal((T, B, I)))
                full = variant != "per_channel"
                inputs = [
                    ("X", x), ("const:W", w), ("const:R", r),
                    ("B", f32(g.standard_normal((D, 8 * H)) * 0.1)) if full else None,
                    ("sequence_lens", np.array([4, 2, 3], np.int32)) if variant == "sequence_lens" else None,
                    ("initial_h", f32(g.standard_normal((D, B, H)) * 0.5)) if full else None,
                    ("initial_c", f32(g.standard_normal((D, B, H)) * 0.5)) if full else None,
                    ("P", f32(g.standard_normal((D, 3 * H)) * 0.1)) if full else None,
                    ("const:W_scale", w_scale), ("const:W_zero_point", w_zp),
                    ("const:R_scale", r_scale), ("const:R_zero_point", r_zp),
                ]
                tol = LSTM_SEQUENCE_LENS if variant == "sequence_lens" else LSTM
                out.append(op_case(f"dynamic_quantize_lstm_{direction}_{tag}_{variant}", "DynamicQuantizeLSTM", inputs,
                                   ["Y", "Y_h", "Y_c"], {"hidden_size": H, "direction": direction}, **tol))
    x = f32(g.standard_normal((3, 2, 6)))
    inputs = [("X", x), ("const:W", q(g, (1, 6, 12), U8)), ("const:R", q(g, (1, 3, 12), U8)), None, None, None, None,
              None, ("const:W_scale", f32([0.004])), ("const:W_zero_point", np.array([130], U8)),
              ("const:R_scale", f32([0.003])), ("const:R_zero_point", np.array([125], U8))]
    attrs = {"hidden_size": 3, "clip": 0.8, "input_forget": 1,
             "activations": ["HardSigmoid", "Tanh", "Sigmoid"], "activation_alpha": [0.3], "activation_beta": [0.4]}
    out.append(op_case("dynamic_quantize_lstm_attributes", "DynamicQuantizeLSTM", inputs, ["Y", "Y_h", "Y_c"], attrs,
                       **LSTM))
    return out


# --- quantized models ------------------------------------------------------------------------------------


def quantized_models():
    """A tiny CNN quantized statically (QOperator) and an MLP quantized
    dynamically, with ORT's own quantization tool."""
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    g = rng(709)
    out = []

    def init(name, shape, scale_=0.3):
        return numpy_helper.from_array(f32(g.standard_normal(shape) * scale_), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "c1"], ["a1"]),
        helper.make_node("Sigmoid", ["a1"], ["s1"]),
        helper.make_node("Mul", ["s1", "a1"], ["m1"]),
        helper.make_node("AveragePool", ["m1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Concat", ["p1", "p1"], ["cat"], axis=1),
        helper.make_node("LeakyRelu", ["cat"], ["lr"], alpha=0.1),
        helper.make_node("GlobalAveragePool", ["lr"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("MatMul", ["flat", "wf"], ["mm"]),
        helper.make_node("Add", ["mm", "bf"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 5])],
        initializer=[init("w1", (4, 3, 3, 3)), init("b1", (4,), 0.1), init("w2", (4, 4, 3, 3)), init("b2", (4,), 0.1),
                     init("wf", (8, 5)), init("bf", (5,), 0.1)],
    )
    float_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    samples = [f32(g.standard_normal((1, 3, 8, 8))) for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter({"x": s} for s in samples)

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "q.onnx")
        onnx.save(float_model, src)
        for tag, act_type in [("u8", QuantType.QUInt8), ("s8", QuantType.QInt8)]:
            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QOperator, activation_type=act_type,
                            weight_type=QuantType.QInt8, per_channel=tag == "s8")
            model = onnx.load(dst)
            x = f32(g.standard_normal((1, 3, 8, 8)))
            out.append(ModelProtoCase(name=f"model_cnn_qoperator_{tag}", nodes=[], inputs=[("x", x)], outputs=["probs"],
                                      proto=model, rtol=0.0, atol=1e-2))

        mlp_nodes = [
            helper.make_node("MatMul", ["x", "w1"], ["h1"]),
            helper.make_node("Add", ["h1", "b1"], ["h2"]),
            helper.make_node("Relu", ["h2"], ["h3"]),
            helper.make_node("MatMul", ["h3", "w2"], ["y"]),
        ]
        mlp = helper.make_graph(
            mlp_nodes, "tiny_mlp",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
            initializer=[init("w1", (16, 12)), init("b1", (12,), 0.1), init("w2", (12, 6))],
        )
        onnx.save(helper.make_model(mlp, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        model = onnx.load(dst)
        x = f32(g.standard_normal((2, 16)))
        out.append(ModelProtoCase(name="model_mlp_dynamic", nodes=[], inputs=[("x", x)], outputs=["y"], proto=model,
                                  rtol=1e-5, atol=1e-5))
        # ORT's own fusion of that model (DynamicQuantizeLinear + MatMulInteger
        # + Mul/Add -> DynamicQuantizeMatMul with bias), saved by an
        # optimizing session; the case then runs it unoptimized.
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = os.path.join(tmp, "fused.onnx")
        ort.InferenceSession(dst, options, providers=["CPUExecutionProvider"])
        fused = onnx.load(options.optimized_model_filepath)
        kept = [o for o in fused.opset_import if o.domain in ("", "com.microsoft")]
        del fused.opset_import[:]
        fused.opset_import.extend(kept)
        assert any(n.op_type == "DynamicQuantizeMatMul" for n in fused.graph.node)
        out.append(ModelProtoCase(name="model_mlp_dynamic_fused", nodes=[], inputs=[("x", x)], outputs=["y"],
                                  proto=fused, rtol=1e-5, atol=1e-5))
    return out


def cases() -> list[Case]:
    return (binary_cases() + lookup_cases() + softmax_cases() + concat_cases() + pool_cases() + matmul_cases()
            + quantize_cases() + lstm_cases() + quantized_models())
