"""Gelu, BiasGelu, FastGelu, QuickGelu, BiasAdd, BiasSplitGelu (ORT's
gelu_op_test.cc, bias_gelu_op_test.cc, fastgelu_op_test.cc,
quick_gelu_op_test.cc, bias_add_op_test.cc, bias_split_gelu_op_test.cc).

Tolerance: float32 1e-5 absolute + 1e-4 relative: ORT and Transmuter use
different erf/tanh approximations (both within a few ulps); float16 results are
rounded once from float32 in both, so a difference is at most one half-precision
ulp (2^-10 relative).
"""

from __future__ import annotations

import numpy as np

from contrib_cases import normal, op_case, rng

FP16 = {"rtol": 2e-3, "atol": 2e-3}


def cases():
    out = []
    g = rng(101)
    for shape in [(2, 4), (3, 5, 16), (1, 7, 768)]:
        tag = "x".join(map(str, shape))
        x = normal(g, shape, 2.0)
        bias = normal(g, shape[-1:])
        out.append(op_case(f"gelu_{tag}", "Gelu", [("X", x)], ["Y"]))
        out.append(op_case(f"bias_gelu_{tag}", "BiasGelu", [("A", x), ("B", bias)], ["C"]))
        out.append(op_case(f"fast_gelu_{tag}", "FastGelu", [("X", x)], ["Y"]))
        out.append(op_case(f"fast_gelu_bias_{tag}", "FastGelu", [("X", x), ("bias", bias)], ["Y"]))
        for alpha in (1.702, 1.0):
            out.append(op_case(f"quick_gelu_{tag}_alpha{alpha}", "QuickGelu", [("X", x)], ["Y"], {"alpha": alpha}))
    out.append(op_case("quick_gelu_default_alpha", "QuickGelu", [("X", normal(g, (4, 9), 3.0))], ["Y"]))
    # Extreme inputs: saturation of tanh/erf and of the sigmoid.
    extreme = np.array([[-40.0, -10.0, -3.0, -0.5, 0.0, 0.5, 3.0, 10.0, 40.0]], np.float32)
    out.append(op_case("gelu_extremes", "Gelu", [("X", extreme)], ["Y"]))
    out.append(op_case("fast_gelu_extremes", "FastGelu", [("X", extreme)], ["Y"]))
    out.append(op_case("quick_gelu_extremes", "QuickGelu", [("X", extreme)], ["Y"], {"alpha": 1.702}))
    x16 = normal(g, (2, 3, 32), 2.0, np.float16)
    b16 = normal(g, (32,), 1.0, np.float16)
    out.append(op_case("fast_gelu_bias_fp16", "FastGelu", [("X", x16), ("bias", b16)], ["Y"], **FP16))
    out.append(op_case("quick_gelu_fp16", "QuickGelu", [("X", x16)], ["Y"], {"alpha": 1.702}, **FP16))
    return out + cuda_only_cases()


def _erf(x: np.ndarray) -> np.ndarray:
    # float64 erf from math.erf, elementwise: the reference, not an approximation.
    import math

    return np.vectorize(math.erf)(x.astype(np.float64))


def _gelu(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return 0.5 * x64 * (1.0 + _erf(x64 / np.sqrt(2.0)))


def _softmax_from(x: np.ndarray, axis: int) -> np.ndarray:
    rows = x.astype(np.float64).reshape(int(np.prod(x.shape[:axis])), -1)
    rows = np.exp(rows - rows.max(axis=1, keepdims=True))
    return (rows / rows.sum(axis=1, keepdims=True)).reshape(x.shape)


def cuda_only_cases():
    """BiasAdd, BiasSplitGelu, BiasSoftmax: ORT implements them on CUDA only, so
    the expected outputs are NumPy's, in float64 from the definitions, rounded
    to float32 (tolerance: float32 rounding of the sum and of erf/exp)."""
    g = rng(202)
    out = []
    for n, s, c in [(1, 4, 8), (2, 16, 320), (2, 3, 640)]:
        x, skip, bias = normal(g, (n, s, c)), normal(g, (n, s, c)), normal(g, (c,))
        y = (x.astype(np.float64) + bias + skip).astype(np.float32)
        out.append(op_case(f"bias_add_{n}x{s}x{c}", "BiasAdd", [("X", x), ("bias", bias), ("skip", skip)], ["Y"],
                           expected=[y]))
    for n, s, d in [(1, 4, 16), (2, 8, 1280)]:
        x, bias = normal(g, (n, s, d), 2.0), normal(g, (d,))
        z = x.astype(np.float64) + bias
        y = (z[..., : d // 2] * _gelu(z[..., d // 2:])).astype(np.float32)
        out.append(op_case(f"bias_split_gelu_{n}x{s}x{d}", "BiasSplitGelu", [("X", x), ("bias", bias)], ["Y"],
                           expected=[y]))
    data = normal(g, (2, 3, 4, 5), 3.0)
    for tag, bias_shape, axis, inner in [
        ("mask_bnss", (2, 1, 1, 5), 3, 1),
        ("outer", (1, 3, 4, 5), 3, 0),
        ("inner", (2, 1, 4, 5), 3, 1),
        ("axis2", (2, 3, 1, 5), 2, 1),
        ("default_axis", (2, 3, 4, 5), None, 0),
    ]:
        bias = normal(g, bias_shape, 2.0)
        attrs = {"is_inner_broadcast": inner}
        if axis is not None:
            attrs["axis"] = axis
        expected = _softmax_from(data + bias, 1 if axis is None else axis).astype(np.float32)
        out.append(op_case(f"bias_softmax_{tag}", "BiasSoftmax", [("data", data), ("bias", bias)], ["output"], attrs,
                           expected=[expected]))
    return out
