"""MatMulNBits and GatherBlockQuantized (ORT's matmul_4bits_test.cc,
matmul_8bits_test.cc, matmul_2bits_test.cc, gather_block_quantized_op_test.cc).

MatMulNBits weights are real float weights quantized by ONNX Runtime's own
quantizer (onnxruntime.capi's quantize_matmul_{2,4,8}bits, what
MatMulNBitsQuantizer calls), given as initializers (ORT pre-packs them).

Tolerances, |actual - expected| <= atol + rtol |expected|, with `scale` the
largest |output| of the case (computed here from the float weights):
- float32, accuracy_level 0: the dequantized weights are the same numbers in
  ORT and Transmuter (exact integer differences times the scale; ORT's g_idx
  path computes q*s - zp*s, one rounding apart), so outputs differ only by the
  float32 summation order over K: atol = 1e-5 * scale, rtol = 1e-5.
- float16 A/scales: both compute in float32 and round once, so a rounding
  boundary can move the result by one float16 ulp (2^-10 relative, and up to
  2^-10 of the scale near zero): rtol = 2e-3, atol = 2e-3 * scale. (Measured:
  identical.)
- accuracy_level 4: ORT quantizes A to int8 per block (symmetric, max|a|/127;
  2, 4 and 8 bits, uint8 or no zero points, no g_idx) and Transmuter rounds A
  the same way (kernels::int8_group_rounded), so the same tolerance as float32
  holds: the integer products are exact on both sides, only the float32 sums
  differ in order. (Before the rounding was emulated, the difference was ORT's
  quantization error of A: up to 8e-3 * scale.) With float zero points or
  g_idx ORT keeps A in float32, and so does Transmuter (cases *_acc4_float_zp,
  *_acc4_g_idx).
  Measured worst: 1.1e-6 * scale (float32).
- GatherBlockQuantized: each output element is float(q - zp) * scale (float8:
  data * scale) rounded once to the scales' dtype in both: exact
  (atol = rtol = 0).

int4/uint4 and float8 data mostly reach GatherBlockQuantized through a Cast of
an int8/uint8/float32 initializer, the way ORT's own tests feed them; the
gbq_*_initializer cases give int4/uint4 data and zero points as initializers
directly (their narrow type must survive the binding of the model's params).

Not generated, because ORT 1.31's CPU kernel differs from its own spec there
(Transmuter follows the spec): g_idx with uint8 zero points (ORT ignores the
zero points and uses 2^(bits-1)), g_idx with bits 2 or 8, float zero points
with bits 8 (ORT refuses them), float16 zero points of float16 A (ORT
ignores them). bfloat16 A has no ORT CPU kernel.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnxruntime.capi._pybind_state import (
    quantize_matmul_2bits,
    quantize_matmul_4bits,
    quantize_matmul_8bits,
)

from onnx import helper

from contrib_cases import TensorProto, normal, op_case, rng

QUANTIZERS = {2: quantize_matmul_2bits, 4: quantize_matmul_4bits, 8: quantize_matmul_8bits}


def quantize(w: np.ndarray, bits: int, block_size: int, symmetric: bool):
    """ORT's blockwise quantization of w [K, N]: B [N, k_blocks, blob], scales
    [N, k_blocks], packed uint8 zero points [N, ceil(k_blocks * bits / 8)]."""
    k, n = w.shape
    k_blocks = (k + block_size - 1) // block_size
    per_byte = 8 // bits
    padded = np.pad(w, ((0, k_blocks * block_size - k), (0, 0)))
    b = np.zeros((n, k_blocks, block_size * bits // 8), np.uint8)
    zp = np.zeros((n, (k_blocks + per_byte - 1) // per_byte), np.uint8)
    scales = np.zeros((n, k_blocks), np.float32)
    QUANTIZERS[bits](b, np.ascontiguousarray(padded), scales, zp, block_size, n, k, symmetric)
    return b, scales, zp


def unpack_zero_points(zp: np.ndarray, bits: int, k_blocks: int) -> np.ndarray:
    per_byte = 8 // bits
    fields = [(zp >> (bits * j)) & ((1 << bits) - 1) for j in range(per_byte)]
    return np.stack(fields, -1).reshape(zp.shape[0], -1)[:, :k_blocks]


def matmul_nbits_case(name, g, *, m, n, k, block_size, bits=4, zp="none", bias=False, g_idx=False,
                      dtype=np.float32, accuracy_level=0, a_shape=None, legacy_shape=False):
    w = normal(g, (k, n), 0.25)
    b, scales, packed_zp = quantize(w, bits, block_size, symmetric=zp == "none")
    k_blocks = scales.shape[1]
    a = normal(g, a_shape or (m, k), 0.25)
    inputs = [("A", a.astype(dtype)), ("const:B", b), ("const:scales", scales.astype(dtype))]
    if zp == "uint8":
        inputs.append(("const:zero_points", packed_zp))
    elif zp == "float":  # the quantizer's zero points as floats (ORT's test does this)
        inputs.append(("const:zero_points", unpack_zero_points(packed_zp, bits, k_blocks).astype(dtype)))
    elif zp == "fraction":  # non-integer zero points (HQQ-style)
        values = unpack_zero_points(packed_zp, bits, k_blocks) + g.uniform(-0.5, 0.5, (n, k_blocks))
        inputs.append(("const:zero_points", values.astype(dtype)))
    else:
        inputs.append(None)
    if legacy_shape:  # 1-D scales and zero points, kept by ORT for old models
        inputs = [(e[0], e[1].reshape(-1)) if e and e[0] in ("const:scales", "const:zero_points") else e
                  for e in inputs]
    if g_idx:
        pad = k_blocks * block_size
        inputs.append(("const:g_idx", (np.arange(pad) // block_size).astype(np.int32)))
    else:
        inputs.append(None)
    inputs.append(("const:bias", normal(g, (n,), 1.0).astype(dtype)) if bias else None)
    scale = float(np.abs(a.astype(np.float64) @ w.astype(np.float64)).max()) + (4.0 if bias else 0.0)
    if dtype == np.float16:
        tol = {"atol": 2e-3 * scale, "rtol": 2e-3}
    else:
        tol = {"atol": 1e-5 * scale, "rtol": 1e-5}
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block_size, "accuracy_level": accuracy_level}
    return op_case(name, "MatMulNBits", inputs, ["Y"], attrs, **tol)


def matmul_nbits_cases():
    out = []
    g = rng(701)
    # (M, N, K, block_size) from ORT's MatMulNBits tests: K below, equal to,
    # and not a multiple of the block; N = 1 .. 288.
    shapes = [(1, 1, 16, 16), (1, 32, 16, 128), (1, 288, 93, 32), (2, 2, 16, 16), (17, 96, 93, 64),
              (17, 288, 1024, 128), (2, 100, 1234, 16), (1, 96, 600, 256), (17, 40, 320, 32)]
    for bits in (4, 8, 2):
        for m, n, k, bs in shapes:
            tag = f"b{bits}_m{m}_n{n}_k{k}_bs{bs}"
            out.append(matmul_nbits_case(f"matmul_nbits_{tag}_sym", g, m=m, n=n, k=k, block_size=bs, bits=bits))
            out.append(matmul_nbits_case(f"matmul_nbits_{tag}_zp", g, m=m, n=n, k=k, block_size=bs, bits=bits,
                                         zp="uint8"))
        out.append(matmul_nbits_case(f"matmul_nbits_b{bits}_bias", g, m=17, n=96, k=93, block_size=32, bits=bits,
                                     zp="uint8", bias=True))
        out.append(matmul_nbits_case(f"matmul_nbits_b{bits}_legacy_1d", g, m=2, n=20, k=80, block_size=16, bits=bits,
                                     zp="uint8", legacy_shape=True))
        out.append(matmul_nbits_case(f"matmul_nbits_b{bits}_batched_a", g, m=0, n=24, k=64, block_size=32, bits=bits,
                                     zp="uint8", a_shape=(2, 3, 64)))
        out.append(matmul_nbits_case(f"matmul_nbits_b{bits}_vector_a", g, m=0, n=24, k=48, block_size=16, bits=bits,
                                     a_shape=(48,)))
        for dtype_tag, zp in (("sym", "none"), ("zp", "uint8")):
            out.append(matmul_nbits_case(f"matmul_nbits_b{bits}_fp16_{dtype_tag}", g, m=17, n=96, k=93, block_size=32,
                                         bits=bits, zp=zp, bias=True, dtype=np.float16))
        for m, n, k, bs in [(1, 288, 93, 32), (17, 96, 1024, 128), (2, 32, 192, 64)]:
            out.append(matmul_nbits_case(f"matmul_nbits_b{bits}_acc4_m{m}_n{n}_k{k}_bs{bs}", g, m=m, n=n, k=k,
                                         block_size=bs, bits=bits, zp="uint8", accuracy_level=4))
    for bits in (4, 2):  # float zero points: ORT's CPU kernel takes them for 2 and 4 bits
        for zp in ("float", "fraction"):
            out.append(matmul_nbits_case(f"matmul_nbits_b{bits}_{zp}_zp", g, m=17, n=96, k=93, block_size=32,
                                         bits=bits, zp=zp))
    # g_idx (deprecated; act-order GPTQ exports): ORT's CPU kernel, bits 4.
    for zp in ("none", "float"):
        out.append(matmul_nbits_case(f"matmul_nbits_b4_g_idx_{zp}", g, m=17, n=96, k=93, block_size=16, zp=zp))
        out.append(matmul_nbits_case(f"matmul_nbits_b4_g_idx_{zp}_bias", g, m=2, n=288, k=1234, block_size=16, zp=zp,
                                     bias=True))
    out.append(matmul_nbits_case("matmul_nbits_b4_acc4_float_zp", g, m=17, n=96, k=93, block_size=32, zp="float",
                                 accuracy_level=4))
    out.append(matmul_nbits_case("matmul_nbits_b4_acc4_g_idx", g, m=17, n=96, k=93, block_size=16, zp="none",
                                 g_idx=True, accuracy_level=4))
    out.append(matmul_nbits_case("matmul_nbits_b4_fp16_acc4", g, m=17, n=96, k=256, block_size=32, zp="uint8",
                                 dtype=np.float16, accuracy_level=4))
    return out


# --- GatherBlockQuantized -----------------------------------------------------------


def pack_last_axis(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [..., D] of `bits`-bit values -> [..., ceil(D * bits / 8)], low bits first."""
    per_byte = 8 // bits
    d = values.shape[-1]
    padded = np.zeros(values.shape[:-1] + ((d + per_byte - 1) // per_byte * per_byte,), np.uint8)
    padded[..., :d] = values
    fields = padded.reshape(values.shape[:-1] + (-1, per_byte)).astype(np.uint16)
    packed = sum(fields[..., j] << (bits * j) for j in range(per_byte))
    return packed.astype(np.uint8)


def gbq_case(name, g, *, kind, shape, indices, gather_axis=0, quantize_axis=None, block_size=32, bits=4,
             zero_points=True, scale_dtype=np.float32, cast_narrow=True):
    """GatherBlockQuantized over `shape` (the logical, unpacked data shape); cast_narrow: int4/uint4
    data and zero points as a Cast of int8/uint8 initializers, else as int4/uint4 initializers."""
    rank = len(shape)
    qaxis = rank - 1 if quantize_axis is None else quantize_axis % rank
    blocks = (shape[qaxis] + block_size - 1) // block_size
    scales_shape = list(shape)
    scales_shape[qaxis] = blocks
    scales = g.uniform(0.01, 0.5, scales_shape).astype(scale_dtype)
    attrs = {"gather_axis": gather_axis, "block_size": block_size}
    if quantize_axis is not None or qaxis != 1:  # the default quantize_axis is 1
        attrs["quantize_axis"] = qaxis if quantize_axis is None else quantize_axis
    if kind == "uint8":
        values = g.integers(0, 1 << bits, shape, dtype=np.uint8)
        zp = g.integers(0, 1 << bits, scales_shape, dtype=np.uint8)
        data = pack_last_axis(values, bits) if bits < 8 else values
        zp = pack_last_axis(zp, bits) if bits < 8 else zp
        if bits != 4 or g.random() < 0.5:
            attrs["bits"] = bits
    else:
        low, high = (-8, 8) if kind == "int4" else (0, 16)
        np_type = ml_dtypes.int4 if kind == "int4" else ml_dtypes.uint4
        data = g.integers(low, high, shape).astype(np_type)
        zp = g.integers(low, high, scales_shape).astype(np_type)
    inputs = [("const:data", data), ("indices", np.asarray(indices)), ("const:scales", scales)]
    inputs.append(("const:zero_points", zp) if zero_points else None)
    case = op_case(name, "GatherBlockQuantized", inputs, ["output"], attrs, rtol=0.0, atol=0.0)
    if kind != "uint8" and cast_narrow:
        # int4/uint4 data and zero points come from a Cast of int8/uint8
        # initializers: ORT's Python API cannot feed int4 tensors, and a
        # Cast output carries the int4 type the way ORT's test's input does.
        onnx_type = TensorProto.INT4 if kind == "int4" else TensorProto.UINT4
        wide = np.int8 if kind == "int4" else np.uint8
        constants = []
        for input_name, array in case.constants:
            if input_name in ("data", "zero_points"):
                constants.append((input_name + "_wide", array.astype(wide)))
                case.nodes.insert(0, helper.make_node("Cast", [input_name + "_wide"], [input_name], to=onnx_type))
            else:
                constants.append((input_name, array))
        case.constants = constants
    return case


def gbq_float8_case(name, g, *, onnx_type, shape, scales_shape, indices, block_size, gather_axis=0,
                    quantize_axis=None):
    """float8/float4 data (a Cast of float32 values, as for int4): output = data * scale."""
    values = g.standard_normal(shape).astype(np.float32) * 4
    scales = g.uniform(0.01, 0.5, scales_shape).astype(np.float32)
    attrs = {"gather_axis": gather_axis, "block_size": block_size}
    if quantize_axis is not None:
        attrs["quantize_axis"] = quantize_axis
    case = op_case(name, "GatherBlockQuantized", [("const:data", values), ("indices", np.asarray(indices)),
                                                  ("const:scales", scales)], ["output"], attrs, rtol=0.0, atol=0.0)
    case.nodes.insert(0, helper.make_node("Cast", ["data_wide"], ["data"], to=onnx_type))
    case.constants = [("data_wide" if n == "data" else n, a) for n, a in case.constants]
    return case


def gather_block_quantized_cases():
    out = []
    g = rng(702)
    idx2d = np.array([[0, 3, -1], [5, -10, 2]], np.int64)
    # uint8: gather_axis 0, quantize_axis the last, bits 4 (default), 8, 2.
    for bits in (4, 8, 2):
        for bs in (16, 32, 64, 128):
            for zp in (True, False):
                tag = f"uint8_b{bits}_bs{bs}_{'zp' if zp else 'nozp'}"
                out.append(gbq_case(f"gbq_{tag}", g, kind="uint8", shape=(10, 96), indices=idx2d, block_size=bs,
                                    bits=bits, zero_points=zp))
        out.append(gbq_case(f"gbq_uint8_b{bits}_rank3", g, kind="uint8", shape=(4, 3, 48), block_size=16, bits=bits,
                            indices=np.array([3, 0, -2], np.int32)))
        out.append(gbq_case(f"gbq_uint8_b{bits}_fp16", g, kind="uint8", shape=(12, 64), block_size=32, bits=bits,
                            indices=np.array([[11, -12], [4, 4]], np.int64), scale_dtype=np.float16))
        # A logical width that is not a multiple of the block (nor of the packing).
        out.append(gbq_case(f"gbq_uint8_b{bits}_ragged", g, kind="uint8", shape=(6, 40), block_size=16, bits=bits,
                            indices=np.array([1, 5], np.int64)))
    # Out-of-range indices give zeros (ORT 1.31's schema).
    out.append(gbq_case("gbq_uint8_out_of_range", g, kind="uint8", shape=(5, 32), block_size=16,
                        indices=np.array([0, 5, -6, 7, -1], np.int64)))
    out.append(gbq_case("gbq_int4_out_of_range", g, kind="int4", shape=(5, 32), block_size=16,
                        indices=np.array([[9, -1], [-100, 2]], np.int32)))
    # int4/uint4: any gather_axis and quantize_axis.
    for kind in ("int4", "uint4"):
        for gather_axis, quantize_axis in ((0, 1), (1, 0), (0, 2), (1, 2), (2, 0), (0, -1), (1, 1), (0, 0)):
            for zp in (True, False):
                name = f"gbq_{kind}_g{gather_axis}_q{str(quantize_axis).replace('-', 'm')}_{'zp' if zp else 'nozp'}"
                out.append(gbq_case(name, g, kind=kind, shape=(4, 6, 40), gather_axis=gather_axis,
                                    quantize_axis=quantize_axis, block_size=16, zero_points=zp,
                                    indices=np.array([[1, -1], [0, 2]], np.int64)))
        out.append(gbq_case(f"gbq_{kind}_2d_bs128", g, kind=kind, shape=(7, 256), quantize_axis=1, block_size=128,
                            indices=np.array([6, 0, -7], np.int64)))
        out.append(gbq_case(f"gbq_{kind}_fp16", g, kind=kind, shape=(7, 64), quantize_axis=1, block_size=32,
                            scale_dtype=np.float16, indices=np.array([3, -2], np.int32)))
        out.append(gbq_case(f"gbq_{kind}_scalar_index", g, kind=kind, shape=(7, 64), quantize_axis=1, block_size=64,
                            indices=np.array(4, np.int64)))
        out.append(gbq_case(f"gbq_{kind}_initializer", g, kind=kind, shape=(6, 64), quantize_axis=1, block_size=32,
                            indices=np.array([5, 0, -2], np.int64), cast_narrow=False))
    # float8/float4 data: no zero points, block_size 0 (one block per row),
    # scales dimensions of 1 broadcast on axes other than quantize_axis.
    # (float4e2m1 too, but ORT 1.31's CPU Cast cannot make float4 values.)
    for type_name, onnx_type in (("e4m3fn", TensorProto.FLOAT8E4M3FN), ("e5m2", TensorProto.FLOAT8E5M2)):
        out.append(gbq_float8_case(f"gbq_{type_name}_bs16", g, onnx_type=onnx_type, shape=(6, 40), scales_shape=(6, 3),
                                   indices=np.array([[5, -1], [0, 9]], np.int64), block_size=16))
        out.append(gbq_float8_case(f"gbq_{type_name}_row_scale", g, onnx_type=onnx_type, shape=(6, 40),
                                   scales_shape=(6, 1), indices=np.array([2, -6], np.int64), block_size=0))
        out.append(gbq_float8_case(f"gbq_{type_name}_tensor_scale", g, onnx_type=onnx_type, shape=(6, 40),
                                   scales_shape=(1, 1), indices=np.array([3, 1], np.int32), block_size=0))
        out.append(gbq_float8_case(f"gbq_{type_name}_axis1", g, onnx_type=onnx_type, shape=(3, 5, 32),
                                   scales_shape=(1, 5, 2), indices=np.array([4, -2], np.int64), block_size=16,
                                   gather_axis=1, quantize_axis=2))
    return out


def cases():
    return matmul_nbits_cases() + gather_block_quantized_cases()
