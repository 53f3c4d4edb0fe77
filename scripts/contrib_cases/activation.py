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
    return out
