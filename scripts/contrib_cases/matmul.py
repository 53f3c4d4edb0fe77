"""FusedMatMul (ORT's fused_matmul_op_test.cc): every combination of transA,
transB, transBatchA, transBatchB on 2-D to 4-D operands, broadcast batch axes,
1-D operands, alpha.

Tolerance: 1e-5 absolute + 1e-4 relative: float32 products of K <= 64 terms
summed in another order than ORT's MLAS (a few ulps of the output's scale).
"""

from __future__ import annotations

import itertools

import numpy as np

from contrib_cases import normal, op_case, rng


def _operand_shape(batch, rows, cols, trans_batch, trans):
    """The stored shape of an operand whose product-ready shape is batch + [rows, cols]."""
    shape = list(batch) + [rows, cols]
    if trans:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    if trans_batch and len(shape) >= 3:
        # transBatch moves axis 0 behind the batch axes: undo it.
        shape = [shape[-2]] + shape[:-2] + [shape[-1]]
    return shape


def cases():
    g = rng(303)
    out = []
    m, k, n = 3, 5, 4
    for batch in [(), (2,), (2, 3)]:
        for ta, tb, tba, tbb in itertools.product((0, 1), repeat=4):
            if not batch and (tba or tbb):
                continue
            a = normal(g, _operand_shape(batch, m, k, tba, ta))
            b = normal(g, _operand_shape(batch, k, n, tbb, tb))
            attrs = {"transA": ta, "transB": tb, "transBatchA": tba, "transBatchB": tbb, "alpha": 0.75}
            tag = f"r{len(batch) + 2}_tA{ta}_tB{tb}_tbA{tba}_tbB{tbb}"
            out.append(op_case(tag, "FusedMatMul", [("A", a), ("B", b)], ["Y"], attrs))
    out.append(op_case("broadcast_batch", "FusedMatMul", [("A", normal(g, (2, 1, 3, 8))), ("B", normal(g, (4, 8, 6)))],
                       ["Y"], {"alpha": 2.0}))
    out.append(op_case("vector_b", "FusedMatMul", [("A", normal(g, (3, 8))), ("B", normal(g, (8,)))], ["Y"],
                       {"alpha": 0.5}))
    out.append(op_case("vector_a_transB", "FusedMatMul", [("A", normal(g, (8,))), ("B", normal(g, (6, 8)))], ["Y"],
                       {"transB": 1}))
    out.append(op_case("default_alpha", "FusedMatMul", [("A", normal(g, (4, 64))), ("B", normal(g, (64, 16)))], ["Y"]))
    half = {"rtol": 2e-3, "atol": 2e-3}
    out.append(op_case("fp16_transB", "FusedMatMul",
                       [("A", normal(g, (2, 3, 16), 0.5, np.float16)), ("B", normal(g, (2, 8, 16), 0.5, np.float16))],
                       ["Y"], {"transB": 1, "alpha": 0.25}, **half))
    return out
