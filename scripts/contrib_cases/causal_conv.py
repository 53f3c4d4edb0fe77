"""CausalConvWithState (com.microsoft, version 1): the stateful depthwise
causal conv1d of onnxruntime-genai's LFM2, Qwen3.5 (Gated DeltaNet) and Mamba
builds, with every attribute ORT's CPU kernel accepts (causal_conv_with_state.cc:
ndim 1, state_window 0, any dilation, channels-first and channels_last, bias,
past_state or none, activation none/silu/swish), for prefill (L > 1) and decode
(L = 1) lengths, and kernel widths 1-5 (the CPU kernel's fixed-width decode
paths) and beyond.

Tolerance: float32 1e-5 absolute + 1e-5 relative. Each output is a sum of k
products plus a bias, summed in another order (ORT from the bias, Transmuter
tap by tap), so they differ by a few float32 ulps; SiLU's exp adds one or two.
The present state is copied, so it is compared exactly.
"""

from __future__ import annotations

from contrib_cases import normal, op_case, rng

TOL = {"rtol": 1e-5, "atol": 1e-5}


def case(g, name, batch, channels, length, k, *, dilation=1, channels_last=False, bias=True, past=True,
         activation=None):
    pad = (k - 1) * dilation
    if channels_last:
        x = normal(g, (batch, length, channels))
        state = normal(g, (batch, pad, channels))
    else:
        x = normal(g, (batch, channels, length))
        state = normal(g, (batch, channels, pad))
    inputs = [("input", x), ("const:weight", normal(g, (channels, 1, k), 0.5)),
              ("const:bias", normal(g, (channels,), 0.3)) if bias else None,
              ("past_state", state) if past else None]
    attrs = {}
    if dilation != 1:
        attrs["dilation"] = dilation
    if channels_last:
        attrs["channels_last"] = 1
    if activation is not None:
        attrs["activation"] = activation
    return op_case(f"causal_conv_with_state_{name}", "CausalConvWithState", inputs, ["output", "present_state"],
                   attrs, **TOL)


def cases():
    g = rng(2701)
    out = []
    for k in (1, 2, 3, 4, 5, 7):
        out.append(case(g, f"prefill_k{k}", 2, 6, 9, k))
        out.append(case(g, f"decode_k{k}", 2, 6, 1, k))
    out.append(case(g, "prefill_shorter_than_state", 1, 4, 2, 5))
    out.append(case(g, "no_past", 2, 5, 7, 4, past=False))
    out.append(case(g, "no_past_decode", 2, 5, 1, 4, past=False))
    out.append(case(g, "no_bias", 1, 8, 6, 3, bias=False))
    for activation in ("silu", "swish", "none"):
        out.append(case(g, f"activation_{activation}", 2, 8, 5, 4, activation=activation))
    out.append(case(g, "dilation2", 2, 6, 10, 3, dilation=2))
    out.append(case(g, "dilation3_decode", 1, 6, 1, 4, dilation=3))
    out.append(case(g, "channels_last", 2, 12, 7, 3, channels_last=True))
    out.append(case(g, "channels_last_decode_silu", 2, 12, 1, 4, channels_last=True, activation="silu"))
    out.append(case(g, "channels_last_dilation2_no_past", 1, 8, 6, 3, channels_last=True, dilation=2, past=False))
    # LFM2's shape: hidden 64, L_cache 3, no bias.
    out.append(case(g, "lfm2_prefill", 1, 64, 11, 3, bias=False))
    out.append(case(g, "lfm2_decode", 1, 64, 1, 3, bias=False))
    return out
