"""Attention, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding (ORT's
attention_op_test.cc, multihead_attention_op_test.cc,
group_query_attention_op_test.cc / test_gqa_cpu.py, rotary_embedding_op_test.cc),
in the configurations ONNX Runtime's CPU kernels accept.

Not covered here because ORT's CPU kernels refuse them (Transmuter's unit tests
in tests/ops/microsoft/attention_test.cpp check them against equivalent
unpacked forms instead): Attention's 4-D mask_index, MultiHeadAttention's
packed QKV / packed KV. ORT's MultiHeadAttention with unidirectional=1 and a
key length different from the query's (cross attention, no past) does not
follow its own causal rule on CPU, so no case has it.

Tolerance: float32 1e-5 absolute + 1e-4 relative: ORT and Transmuter sum the
Q.K and P.V products in different orders (BLAS blocking, fused kernels), a
few float32 ulps of unit-scale outputs (the cases pass with a tenth of it).
float16: 2e-3 absolute + 2e-3 relative: both compute in float32 and round
once, except that ORT's GroupQueryAttention rotates Q and K in float16, which
moves some outputs by one float16 ulp (2^-10 relative, 9.8e-4 at 1..2); the
other float16 cases agree exactly.
"""

from __future__ import annotations

import numpy as np

from contrib_cases import normal, op_case, rng

FP16 = {"rtol": 2e-3, "atol": 2e-3}


def _attention_cases():
    out = []
    g = rng(701)
    shapes = [(1, 1, 16, 2), (2, 5, 32, 4), (3, 17, 64, 8), (1, 5, 128, 2), (2, 17, 48, 3)]
    for batch, seq, hidden, heads in shapes:
        tag = f"b{batch}_s{seq}_d{hidden}_h{heads}"
        x = normal(g, (batch, seq, hidden))
        w = normal(g, (hidden, 3 * hidden), 1.0 / np.sqrt(hidden))
        b = normal(g, (3 * hidden,), 0.1)
        for uni in (0, 1):
            out.append(op_case(f"attention_{tag}_uni{uni}", "Attention", [("input", x), ("weights", w), ("bias", b)],
                               ["output"], {"num_heads": heads, "unidirectional": uni}))
        lengths = g.integers(1, seq + 1, batch).astype(np.int32)
        starts = np.array([g.integers(0, n) for n in lengths], np.int32)
        raw2 = (g.random((batch, seq)) > 0.3).astype(np.int32)
        raw2[:, 0] = 1
        raw3 = (g.random((batch, seq, seq)) > 0.3).astype(np.int32)
        raw3[:, :, 0] = 1
        masks = {
            "len": lengths,
            "endstart": np.concatenate([lengths, starts]),
            "len3b2": np.concatenate([lengths, np.zeros(2 * batch + 2, np.int32)]),
            "raw2d": raw2,
            "raw3d": raw3,
            "dummy": np.ones((batch, 1), np.int32),
        }
        for mask_name, mask in masks.items():
            for uni in (0, 1):
                out.append(op_case(
                    f"attention_{tag}_mask_{mask_name}_uni{uni}", "Attention",
                    [("input", x), ("weights", w), ("bias", b), ("mask_index", mask)],
                    ["output"], {"num_heads": heads, "unidirectional": uni}))
        head = hidden // heads
        for past_len in (0, 3):
            past = normal(g, (2, batch, heads, past_len, head))
            total = past_len + seq
            mask = (g.random((batch, total)) > 0.25).astype(np.int32)
            mask[:, 0] = 1
            for uni in (0, 1):
                out.append(op_case(
                    f"attention_{tag}_past{past_len}_uni{uni}", "Attention",
                    [("input", x), ("weights", w), ("bias", b), None, ("past", past)],
                    ["output", "present"], {"num_heads": heads, "unidirectional": uni}))
            out.append(op_case(
                f"attention_{tag}_past{past_len}_mask_scale_filter", "Attention",
                [("input", x), ("weights", w), ("bias", b), ("mask_index", mask), ("past", past)],
                ["output", "present"],
                {"num_heads": heads, "unidirectional": 1, "scale": 0.2, "mask_filter_value": -60.0}))
        for bias_shape in dict.fromkeys([(1, heads, seq, seq), (batch, 1, seq, seq), (batch, heads, seq, seq)]):
            tag_bias = "x".join(map(str, bias_shape))
            out.append(op_case(
                f"attention_{tag}_attention_bias_{tag_bias}", "Attention",
                [("input", x), ("weights", w), ("bias", b), ("mask_index", lengths), None,
                 ("attention_bias", normal(g, bias_shape))],
                ["output"], {"num_heads": heads}))
    # qkv_hidden_sizes: V wider than Q/K; an input hidden size above Q's (pruned heads).
    x = normal(g, (2, 5, 40))
    w = normal(g, (40, 32 + 32 + 64), 0.15)
    b = normal(g, (128,), 0.1)
    out.append(op_case("attention_qkv_hidden_sizes", "Attention", [("input", x), ("weights", w), ("bias", b)],
                       ["output"], {"num_heads": 4, "qkv_hidden_sizes": [32, 32, 64]}))
    out.append(op_case("attention_qkv_hidden_sizes_uni_mask", "Attention",
                       [("input", x), ("weights", w), ("bias", b), ("mask_index", np.array([3, 5], np.int32))],
                       ["output"], {"num_heads": 8, "qkv_hidden_sizes": [32, 32, 64], "unidirectional": 1}))
    # float16.
    x = normal(g, (2, 5, 32), 1.0, np.float16)
    w = normal(g, (32, 96), 0.18, np.float16)
    b = normal(g, (96,), 0.1, np.float16)
    past = normal(g, (2, 2, 4, 3, 8), 1.0, np.float16)
    out.append(op_case("attention_fp16", "Attention", [("input", x), ("weights", w), ("bias", b)], ["output"],
                       {"num_heads": 4}, **FP16))
    out.append(op_case("attention_fp16_past_uni_mask", "Attention",
                       [("input", x), ("weights", w), ("bias", b), ("mask_index", np.array([6, 8], np.int32)),
                        ("past", past)],
                       ["output", "present"], {"num_heads": 4, "unidirectional": 1}, **FP16))
    return out


def _mha_cases():
    out = []
    g = rng(702)
    configs = [(1, 1, 1, 2, 8), (2, 5, 5, 4, 8), (2, 5, 17, 2, 16), (3, 17, 17, 8, 8), (1, 17, 5, 1, 64)]
    for batch, seq, kv_seq, heads, head in configs:
        tag = f"b{batch}_s{seq}_l{kv_seq}_h{heads}_d{head}"
        hidden = heads * head
        q = normal(g, (batch, seq, hidden))
        k = normal(g, (batch, kv_seq, hidden))
        v = normal(g, (batch, kv_seq, hidden))
        bias = normal(g, (3 * hidden,), 0.2)
        outs3 = ["output", "present_key", "present_value"]
        out.append(op_case(f"mha_{tag}", "MultiHeadAttention", [("query", q), ("key", k), ("value", v)], outs3,
                           {"num_heads": heads}))
        out.append(op_case(f"mha_{tag}_bias", "MultiHeadAttention",
                           [("query", q), ("key", k), ("value", v), ("bias", bias)], outs3, {"num_heads": heads}))
        if seq == kv_seq:
            out.append(op_case(f"mha_{tag}_bias_uni", "MultiHeadAttention",
                               [("query", q), ("key", k), ("value", v), ("bias", bias)], outs3,
                               {"num_heads": heads, "unidirectional": 1}))
        lengths = g.integers(1, kv_seq + 1, batch).astype(np.int32)
        raw2 = (g.random((batch, kv_seq)) > 0.3).astype(np.int32)
        raw2[:, 0] = 1
        raw3 = (g.random((batch, seq, kv_seq)) > 0.3).astype(np.int32)
        raw3[:, :, 0] = 1
        masks = {"len": lengths, "len3b2": np.concatenate([lengths, np.ones(2 * batch + 2, np.int32)]),
                 "raw2d": raw2, "raw3d": raw3}
        for mask_name, mask in masks.items():
            out.append(op_case(f"mha_{tag}_mask_{mask_name}", "MultiHeadAttention",
                               [("query", q), ("key", k), ("value", v), ("bias", bias), ("key_padding_mask", mask)],
                               ["output"], {"num_heads": heads}))
        out.append(op_case(f"mha_{tag}_attention_bias", "MultiHeadAttention",
                           [("query", q), ("key", k), ("value", v), None, ("key_padding_mask", lengths),
                            ("attention_bias", normal(g, (batch, heads, seq, kv_seq)))],
                           ["output"], {"num_heads": heads, "scale": 0.3, "mask_filter_value": -100.0}))
        out.append(op_case(f"mha_{tag}_attention_bias_broadcast", "MultiHeadAttention",
                           [("query", q), ("key", k), ("value", v), None, None,
                            ("attention_bias", normal(g, (1, 1, seq, kv_seq)))],
                           ["output"], {"num_heads": heads}))
        # Cross attention with key and value already projected into heads.
        kb = normal(g, (batch, heads, kv_seq, head))
        vb = normal(g, (batch, heads, kv_seq, head))
        out.append(op_case(f"mha_{tag}_kv_bnsh", "MultiHeadAttention",
                           [("query", q), ("key", kb), ("value", vb), ("bias", bias), ("key_padding_mask", lengths)],
                           outs3, {"num_heads": heads}))
        if seq == kv_seq:
            for past_len in (0, 3):
                pk = normal(g, (batch, heads, past_len, head))
                pv = normal(g, (batch, heads, past_len, head))
                total = past_len + kv_seq
                mask = (g.random((batch, total)) > 0.25).astype(np.int32)
                mask[:, 0] = 1
                out.append(op_case(f"mha_{tag}_past{past_len}_uni", "MultiHeadAttention",
                                   [("query", q), ("key", k), ("value", v), ("bias", bias), None, None,
                                    ("past_key", pk), ("past_value", pv)],
                                   outs3, {"num_heads": heads, "unidirectional": 1}))
                out.append(op_case(f"mha_{tag}_past{past_len}_mask2d", "MultiHeadAttention",
                                   [("query", q), ("key", k), ("value", v), ("bias", bias), ("key_padding_mask", mask),
                                    None, ("past_key", pk), ("past_value", pv)],
                                   outs3, {"num_heads": heads}))
                out.append(op_case(f"mha_{tag}_past{past_len}_len_bias", "MultiHeadAttention",
                                   [("query", q), ("key", k), ("value", v), None,
                                    ("key_padding_mask", g.integers(1, total + 1, batch).astype(np.int32)),
                                    ("attention_bias", normal(g, (batch, 1, seq, total))),
                                    ("past_key", pk), ("past_value", pv)],
                                   outs3, {"num_heads": heads}))
    # V head size differing from Q/K's.
    q, k = normal(g, (2, 5, 32)), normal(g, (2, 7, 32))
    v = normal(g, (2, 7, 64))
    out.append(op_case("mha_v_head_size", "MultiHeadAttention",
                       [("query", q), ("key", k), ("value", v), ("bias", normal(g, (128,), 0.2))],
                       ["output", "present_key", "present_value"], {"num_heads": 4}))
    # float16.
    q16 = normal(g, (2, 5, 32), 1.0, np.float16)
    k16 = normal(g, (2, 5, 32), 1.0, np.float16)
    v16 = normal(g, (2, 5, 32), 1.0, np.float16)
    b16 = normal(g, (96,), 0.2, np.float16)
    pk16 = normal(g, (2, 4, 3, 8), 1.0, np.float16)
    pv16 = normal(g, (2, 4, 3, 8), 1.0, np.float16)
    out.append(op_case("mha_fp16", "MultiHeadAttention", [("query", q16), ("key", k16), ("value", v16), ("bias", b16)],
                       ["output"], {"num_heads": 4}, **FP16))
    out.append(op_case("mha_fp16_past_uni_mask", "MultiHeadAttention",
                       [("query", q16), ("key", k16), ("value", v16), ("bias", b16),
                        ("key_padding_mask", np.array([6, 8], np.int32)), None, ("past_key", pk16),
                        ("past_value", pv16)],
                       ["output", "present_key", "present_value"], {"num_heads": 4, "unidirectional": 1}, **FP16))
    return out


def _gqa(name, g, batch, seq, heads, kv_heads, head, past_len, seqlens, total, attrs=None, *, dtype=np.float32,
         packed=False, rotary=None, position_ids=None, attention_bias=None, head_sink=None, qk=False, **kw):
    """One GroupQueryAttention case; rotary: the cos/sin cache width (R/2)."""
    q = normal(g, (batch, seq, heads * head), 1.0, dtype)
    k = normal(g, (batch, seq, kv_heads * head), 1.0, dtype)
    v = normal(g, (batch, seq, kv_heads * head), 1.0, dtype)
    inputs = [("query", np.concatenate([q, k, v], -1)), None, None] if packed else \
        [("query", q), ("key", k), ("value", v)]
    if past_len is None:
        inputs += [None, None]
    else:
        inputs += [("past_key", normal(g, (batch, kv_heads, past_len, head), 1.0, dtype)),
                   ("past_value", normal(g, (batch, kv_heads, past_len, head), 1.0, dtype))]
    inputs += [("seqlens_k", np.array(seqlens, np.int32)), ("total_sequence_length", np.array(total, np.int32))]
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads, **(attrs or {})}
    if rotary:
        angles = np.arange(64)[:, None] / (10000.0 ** (np.arange(rotary) / rotary))
        inputs += [("cos_cache", np.cos(angles).astype(dtype)), ("sin_cache", np.sin(angles).astype(dtype))]
        attrs["do_rotary"] = 1
    else:
        inputs += [None, None]
    inputs.append(("position_ids", position_ids) if position_ids is not None else None)
    inputs.append(("attention_bias", attention_bias.astype(dtype)) if attention_bias is not None else None)
    inputs.append(("head_sink", head_sink.astype(dtype)) if head_sink is not None else None)
    outputs = ["output", "present_key", "present_value"] + (["output_qk"] if qk else [])
    if dtype == np.float16:
        kw = {**FP16, **kw}
    return op_case(f"gqa_{name}", "GroupQueryAttention", inputs, outputs, attrs, **kw)


def _resident_rows(tokens: int, capacity: int, window: int) -> int:
    """sliding_window_cache's L(T): the rows of a C-row buffer holding positions after T tokens."""
    g = capacity - window + 1
    return tokens if tokens <= capacity else tokens - g * -(-(tokens - capacity) // g)


def _zero_unresident(case, seqlens, capacity: int, window: int):
    """sliding_window_cache leaves present rows [L(T), C) unspecified (ORT: uninitialized memory);
    Transmuter writes zeros there, so the reference gets zeros too. The rows that hold positions, the
    output and everything the attention reads are ORT's own."""
    def settle(results):
        output, key, value = (np.array(r) for r in results[:3])
        for b, seqlen in enumerate(seqlens):
            rows = _resident_rows(seqlen + 1, capacity, window)
            key[b, :, rows:] = 0
            value[b, :, rows:] = 0
        return [output, key, value, *results[3:]]
    case.settle = settle
    return case


def _gqa_cases():
    out = []
    g = rng(703)
    # (batch, seq, heads, kv_heads, head): GQA ratios 1, 2, 4, 8.
    shapes = [(1, 1, 2, 1, 16), (2, 5, 4, 2, 16), (3, 17, 8, 2, 32), (1, 5, 8, 8, 64), (2, 17, 8, 1, 16)]
    for batch, seq, heads, kv_heads, head in shapes:
        tag = f"b{batch}_s{seq}_h{heads}_kv{kv_heads}_d{head}"
        full = [seq - 1] * batch
        out.append(_gqa(f"{tag}_prompt", g, batch, seq, heads, kv_heads, head, None, full, seq))
        out.append(_gqa(f"{tag}_prompt_past0", g, batch, seq, heads, kv_heads, head, 0, full, seq))
        if seq > 1:
            padded = [int(x) for x in g.integers(0, seq, batch)]
            out.append(_gqa(f"{tag}_prompt_padded", g, batch, seq, heads, kv_heads, head, None, padded, seq))
            out.append(_gqa(f"{tag}_prompt_window", g, batch, seq, heads, kv_heads, head, None, full, seq,
                            {"local_window_size": 3}))
            out.append(_gqa(f"{tag}_prompt_noncausal", g, batch, seq, heads, kv_heads, head, None, padded, seq,
                            {"causal": 0}))
        out.append(_gqa(f"{tag}_prompt_softcap", g, batch, seq, heads, kv_heads, head, None, full, seq,
                        {"softcap": 2.0, "scale": 0.4}))
        out.append(_gqa(f"{tag}_prompt_smooth", g, batch, seq, heads, kv_heads, head, None, full, seq,
                        {"smooth_softmax": 1}))
        out.append(_gqa(f"{tag}_prompt_rotary", g, batch, seq, heads, kv_heads, head, None, full, seq,
                        rotary=head // 2))
        out.append(_gqa(f"{tag}_prompt_rotary_interleaved_packed", g, batch, seq, heads, kv_heads, head, None, full,
                        seq, {"rotary_interleaved": 1}, rotary=head // 2, packed=True))
        # Token generation: past of 3 (and ragged batches), a shared buffer longer than the total.
        for past_len in (3, 8):
            total = 4
            seqlens = [3] + [int(x) for x in g.integers(0, 4, batch - 1)]
            gen = f"{tag}_gen_past{past_len}"
            out.append(_gqa(f"{gen}", g, batch, 1, heads, kv_heads, head, past_len, seqlens, total))
            out.append(_gqa(f"{gen}_window_softcap_sink", g, batch, 1, heads, kv_heads, head, past_len, seqlens,
                            total, {"local_window_size": 2, "softcap": 3.0}, head_sink=normal(g, (heads,))))
            out.append(_gqa(f"{gen}_rotary", g, batch, 1, heads, kv_heads, head, past_len, seqlens, total,
                            rotary=head // 2))
            ids = np.array([[s] for s in seqlens], np.int64) + 2
            out.append(_gqa(f"{gen}_rotary_interleaved_position_ids", g, batch, 1, heads, kv_heads, head, past_len,
                            seqlens, total, {"rotary_interleaved": 1}, rotary=head // 2, position_ids=ids))
            out.append(_gqa(f"{gen}_attention_bias", g, batch, 1, heads, kv_heads, head, past_len, seqlens, total,
                            attention_bias=normal(g, (batch, 1, 1, total))))
    # A subsequent prompt (several new tokens after a past; batch 1, as ORT requires).
    out.append(_gqa("subsequent_prompt", g, 1, 5, 8, 2, 16, 3, [7], 8))
    out.append(_gqa("subsequent_prompt_rotary_window", g, 1, 5, 8, 2, 16, 3, [7], 8, {"local_window_size": 4},
                    rotary=8))
    out.append(_gqa("subsequent_prompt_position_ids", g, 1, 5, 8, 2, 16, 3, [7], 8, rotary=8,
                    position_ids=np.array([[3, 4, 5, 6, 7]], np.int64)))
    # A first prompt into a buffer longer than the prompt (past and present sharing one buffer).
    out.append(_gqa("prompt_shared_buffer", g, 2, 5, 4, 2, 16, 8, [4, 4], 5))
    out.append(_gqa("prompt_shared_buffer_padded", g, 2, 5, 4, 2, 16, 8, [4, 2], 5, rotary=8))
    # First prompt: position_ids (ORT reads only the first element, as an offset); partial rotary.
    out.append(_gqa("prompt_position_ids", g, 2, 5, 4, 2, 16, None, [4, 4], 5, rotary=8,
                    position_ids=np.array([[2, 3, 4, 5, 6], [2, 3, 4, 5, 6]], np.int64)))
    out.append(_gqa("prompt_partial_rotary", g, 2, 5, 4, 2, 32, None, [4, 4], 5, rotary=8))
    out.append(_gqa("prompt_attention_bias", g, 2, 5, 4, 2, 16, None, [4, 4], 5,
                    attention_bias=normal(g, (2, 4, 5, 5)), **{}))
    out.append(_gqa("prompt_softcap_bias", g, 2, 5, 4, 2, 16, None, [4, 4], 5, {"softcap": 1.5},
                    attention_bias=normal(g, (1, 4, 5, 5))))
    out.append(_gqa("prompt_head_sink", g, 3, 17, 8, 2, 16, None, [16, 16, 16], 17, head_sink=normal(g, (8,))))
    out.append(_gqa("prompt_window_head_sink", g, 1, 17, 4, 1, 16, None, [16], 17, {"local_window_size": 5},
                    head_sink=normal(g, (4,))))
    # output_qk: where every key is valid (ORT leaves the buffer after the valid keys unset).
    for mode in (1, 2):
        out.append(_gqa(f"prompt_qk_output{mode}", g, 2, 5, 4, 2, 16, None, [4, 4], 5,
                        {"qk_output": mode, "softcap": 2.0}, qk=True))
        out.append(_gqa(f"gen_qk_output{mode}", g, 2, 1, 4, 2, 16, 4, [4, 4], 5, {"qk_output": mode}, qk=True))
    # sliding_window_cache: window-sized buffers of C rows (past_len), window W = 4, T = seqlens_k + 1.
    def windowed(name, batch, seq, kv_heads, capacity, seqlens, attrs=None, **kw):
        case = _gqa(f"window_cache_{name}", g, batch, seq, 4, kv_heads, 16, capacity, seqlens, max(seqlens) + 1,
                    {"local_window_size": 4, "sliding_window_cache": 1, **(attrs or {})}, **kw)
        return _zero_unresident(case, seqlens, capacity, 4)

    out.append(windowed("prompt", 1, 5, 2, 8, [4]))
    out.append(windowed("prompt_longer_than_cache", 1, 17, 2, 8, [16], rotary=8))  # L(17) = 7
    out.append(windowed("gen", 1, 1, 2, 8, [5]))
    out.append(windowed("gen_evicts", 1, 1, 2, 8, [8], rotary=8))  # 8 rows held, 4 kept
    out.append(windowed("gen_capacity_is_window", 1, 1, 2, 4, [9]))
    out.append(windowed("gen_ragged", 2, 1, 2, 8, [8, 3], rotary=8))
    out.append(windowed("subsequent_prompt_evicts", 1, 3, 2, 8, [9], rotary=8))
    out.append(windowed("gen_softcap_sink", 2, 1, 1, 6, [12, 20], {"softcap": 3.0}, rotary=8,
                        head_sink=normal(g, (4,))))
    out.append(windowed("fp16_gen", 2, 1, 2, 8, [10, 5], rotary=8, dtype=np.float16))
    # float16 (ORT computes in float32 and rounds once too, but rotates Q and K in float16).
    out.append(_gqa("fp16_prompt", g, 2, 5, 4, 2, 16, None, [4, 2], 5, dtype=np.float16))
    out.append(_gqa("fp16_gen_rotary", g, 2, 1, 4, 2, 16, 6, [6, 3], 7, rotary=8, dtype=np.float16))
    out.append(_gqa("fp16_prompt_window_softcap", g, 1, 17, 8, 2, 32, None, [16], 17,
                    {"local_window_size": 4, "softcap": 2.0}, dtype=np.float16))
    return out


def _rotary_cases():
    out = []
    g = rng(704)
    angles = np.arange(64)[:, None] / (10000.0 ** (np.arange(32) / 32))
    for batch, seq, heads, head in [(1, 1, 2, 8), (2, 5, 4, 16), (3, 17, 8, 32), (1, 5, 2, 64)]:
        tag = f"b{batch}_s{seq}_h{heads}_d{head}"
        x3 = normal(g, (batch, seq, heads * head))
        x4 = normal(g, (batch, heads, seq, head))
        cos = np.cos(angles[:, : head // 2]).astype(np.float32)
        sin = np.sin(angles[:, : head // 2]).astype(np.float32)
        ids = g.integers(0, 64, (batch, seq)).astype(np.int64)
        for inter in (0, 1):
            attrs = {"num_heads": heads, "interleaved": inter}
            out.append(op_case(f"rotary_{tag}_3d_int{inter}", "RotaryEmbedding",
                               [("input", x3), ("position_ids", ids), ("cos_cache", cos), ("sin_cache", sin)],
                               ["output"], attrs))
            out.append(op_case(f"rotary_{tag}_4d_int{inter}", "RotaryEmbedding",
                               [("input", x4), ("position_ids", ids), ("cos_cache", cos), ("sin_cache", sin)],
                               ["output"], {"interleaved": inter}))
            out.append(op_case(f"rotary_{tag}_offset_int{inter}", "RotaryEmbedding",
                               [("input", x3), ("position_ids", np.array([7], np.int64)), ("cos_cache", cos),
                                ("sin_cache", sin)],
                               ["output"], attrs))
            if head >= 16:
                half = head // 4
                out.append(op_case(f"rotary_{tag}_partial_int{inter}", "RotaryEmbedding",
                                   [("input", x3), ("position_ids", ids), ("cos_cache", cos[:, :half]),
                                    ("sin_cache", sin[:, :half])],
                                   ["output"], {**attrs, "rotary_embedding_dim": 2 * half}))
        out.append(op_case(f"rotary_{tag}_3d_no_num_heads", "RotaryEmbedding",
                           [("input", x3), ("position_ids", ids), ("cos_cache", cos), ("sin_cache", sin)],
                           ["output"]))
        out.append(op_case(f"rotary_{tag}_packed_batching_scale", "RotaryEmbedding",
                           [("input", x3), ("position_ids", ids), ("cos_cache", cos), ("sin_cache", sin)],
                           ["output"], {"num_heads": heads, "is_packed_batching": 1, "scale": 2.0}))
    x = normal(g, (2, 5, 64), 1.0, np.float16)
    cos = np.cos(angles[:, :8]).astype(np.float16)
    sin = np.sin(angles[:, :8]).astype(np.float16)
    ids = g.integers(0, 64, (2, 5)).astype(np.int64)
    for inter in (0, 1):
        out.append(op_case(f"rotary_fp16_int{inter}", "RotaryEmbedding",
                           [("input", x), ("position_ids", ids), ("cos_cache", cos), ("sin_cache", sin)],
                           ["output"], {"num_heads": 4, "interleaved": inter}, **FP16))
    return out


def cases():
    return _attention_cases() + _mha_cases() + _gqa_cases() + _rotary_cases()
