"""SkipLayerNormalization, SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization, EmbedLayerNormalization (ORT's
skiplayernorm_op_test.cc, layer_norm_op_test.cc, embed_layer_norm_op_test.cc).

Tolerance: float32 1e-5 absolute + 1e-4 relative: one normalization over
hidden sizes up to 768, statistics summed in another order than ORT's
(unit-scale outputs agree to a few ulps); the inv_std_var output is 1/sigma,
so it gets 1e-4 relative as well. float16 outputs are rounded once from
float32 in both engines: 2e-3 (two half-precision ulps at unit scale).
"""

from __future__ import annotations

import numpy as np

from contrib_cases import normal, op_case, rng

FP16 = {"rtol": 2e-3, "atol": 2e-3}


def skip_cases(g):
    out = []
    for b, s, d in [(1, 1, 8), (2, 5, 32), (3, 7, 768)]:
        tag = f"{b}x{s}x{d}"
        x, skip = normal(g, (b, s, d), 2.0), normal(g, (b, s, d))
        gamma, beta, bias = normal(g, (d,)), normal(g, (d,)), normal(g, (d,))
        eps = {"epsilon": 1e-6}
        out.append(op_case(f"skip_ln_{tag}", "SkipLayerNormalization",
                           [("input", x), ("skip", skip), ("gamma", gamma), ("beta", beta)], ["output"], eps))
        out.append(op_case(f"skip_ln_bias_all_outputs_{tag}", "SkipLayerNormalization",
                           [("input", x), ("skip", skip), ("gamma", gamma), ("beta", beta), ("bias", bias)],
                           ["output", "mean", "inv_std_var", "sum"], eps))
        out.append(op_case(f"skip_ln_no_beta_sum_only_{tag}", "SkipLayerNormalization",
                           [("input", x), ("skip", skip), ("gamma", gamma), None, ("bias", bias)],
                           ["output", "", "", "sum"], eps))
        out.append(op_case(f"skip_sln_{tag}", "SkipSimplifiedLayerNormalization",
                           [("input", x), ("skip", skip), ("gamma", gamma), ("bias", bias)],
                           ["output", "", "", "sum"], eps))
        out.append(op_case(f"sln_{tag}", "SimplifiedLayerNormalization", [("X", x), ("scale", gamma)], ["Y"], eps,
                           domain=""))
        # ORT's contrib LayerNormalization in the default domain of an opset-14 export.
        out.append(op_case(f"ln_opset14_{tag}", "LayerNormalization", [("X", x), ("scale", gamma), ("B", beta)],
                           ["Y", "Mean", "InvStdDev"], eps, domain="", onnx_opset=14))
    x, gamma = normal(g, (2, 3, 4, 6)), normal(g, (4, 6))
    out.append(op_case("sln_axis2_inv_std", "SimplifiedLayerNormalization", [("X", x), ("scale", gamma)],
                       ["Y", "inv_std_var"], {"axis": 2}, domain=""))
    x, skip2d = normal(g, (2, 6, 16)), normal(g, (6, 16))
    out.append(op_case("skip_ln_broadcast_skip", "SkipLayerNormalization",
                       [("input", x), ("skip", skip2d), ("gamma", normal(g, (16,))), ("beta", normal(g, (16,)))],
                       ["output"]))
    h = np.float16
    out.append(op_case("skip_ln_fp16", "SkipLayerNormalization",
                       [("input", normal(g, (2, 4, 64), 1.0, h)), ("skip", normal(g, (2, 4, 64), 1.0, h)),
                        ("gamma", normal(g, (64,), 1.0, h)), ("beta", normal(g, (64,), 1.0, h))],
                       ["output"], **FP16))
    return out


def embed_cases(g):
    out = []
    vocab, positions, segments = 30, 16, 2
    for b, s, d in [(1, 3, 8), (2, 7, 32), (3, 16, 64)]:
        tag = f"{b}x{s}x{d}"
        ids = g.integers(0, vocab, (b, s), dtype=np.int32)
        seg = g.integers(0, segments, (b, s), dtype=np.int32)
        word, pos, segt = normal(g, (vocab, d)), normal(g, (positions, d)), normal(g, (segments, d))
        gamma, beta = normal(g, (d,)), normal(g, (d,))
        lengths = g.integers(1, s + 1, (b,))
        mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
        eps = {"epsilon": 1e-12}
        full = [("input_ids", ids), ("segment_ids", seg), ("word_embedding", word), ("position_embedding", pos),
                ("segment_embedding", segt), ("gamma", gamma), ("beta", beta)]
        out.append(op_case(f"embed_ln_{tag}", "EmbedLayerNormalization", full, ["output", "mask_index"], eps))
        out.append(op_case(f"embed_ln_mask_sum_{tag}", "EmbedLayerNormalization", full + [("mask", mask)],
                           ["output", "mask_index", "embedding_sum"], eps))
        # DistilBERT-style: no segment embedding; explicit position ids per row.
        position_ids = np.stack([np.roll(np.arange(s), r) for r in range(b)]).astype(np.int32)
        out.append(op_case(f"embed_ln_no_segment_position_ids_{tag}", "EmbedLayerNormalization",
                           [("input_ids", ids), None, ("word_embedding", word), ("position_embedding", pos), None,
                            ("gamma", gamma), ("beta", beta), ("mask", mask), ("position_ids", position_ids)],
                           ["output", "mask_index", "embedding_sum"], eps))
        out.append(op_case(f"embed_ln_broadcast_position_ids_{tag}", "EmbedLayerNormalization",
                           full + [None, ("position_ids", np.arange(s)[None, ::-1].astype(np.int32))],
                           ["output", "mask_index"], {"epsilon": 1e-5}))
    # A mask with holes counts its ones, not the position of the first zero.
    ids = g.integers(0, vocab, (2, 6), dtype=np.int32)
    holes = np.array([[1, 0, 1, 1, 0, 1], [0, 0, 0, 0, 0, 0]], np.int32)
    out.append(op_case("embed_ln_mask_holes", "EmbedLayerNormalization",
                       [("input_ids", ids), ("segment_ids", np.zeros((2, 6), np.int32)),
                        ("word_embedding", normal(g, (vocab, 16))), ("position_embedding", normal(g, (positions, 16))),
                        ("segment_embedding", normal(g, (segments, 16))), ("gamma", normal(g, (16,))),
                        ("beta", normal(g, (16,))), ("mask", holes)],
                       ["output", "mask_index"]))
    return out


def cases():
    g = rng(404)
    return skip_cases(g) + embed_cases(g)
