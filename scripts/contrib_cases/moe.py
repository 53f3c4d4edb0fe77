"""MoE and QMoE (ORT's moe_test.cc, test_moe_cpu.py, test_qmoe_cpu.py).

Each case is one node over a few tokens (1, 7, 32; a 3-D [batch, sequence,
hidden] input too), 4, 8 or 16 experts, k = 1, 2, 4, hidden 16..64 and inter
32..128, with the activations relu, gelu, silu, identity and SwiGLU (the
interleaved swiglu_fusion=1 that ORT's CPU kernels take, and 0 and 2; with
and without activation_alpha/beta and swiglu_limit, the gpt-oss settings of
ORT's tests), fc3 gating, normalize_routing_weights 0/1, use_sparse_mixer,
with and without biases. Expert weights are initializers, as in ORT's
tests (one MoE case feeds them as graph inputs). QMoE weights are float
weights quantized here with NumPy following the spec: per row (no block_size)
or per block of 16..64 input features, 2, 4 and 8 bits packed low bits first,
symmetric (default zero point 2^(bits-1)) or with packed uint8 zero points;
an fc2_expert_weight_bits override; router_weights.

Tolerances, |actual - expected| <= atol + rtol |expected|, with `scale` the
largest |output| of the case (computed here in float64 from the dequantized
weights):
- float32: ORT and Transmuter multiply the same numbers in float32 and differ
  in summation order only (ORT: per expert GEMMs, then a double-precision sum
  over threads): rtol = 1e-4, atol = 2e-5 * scale. Measured: at most 5.1e-7 *
  scale.
- float16 QMoE: both compute in float32 and round the output once, so a
  rounding boundary can move an element by one float16 ulp: rtol = 2e-3,
  atol = 2e-3 * scale. Measured: at most 4.7e-5 * scale.
- QMoE with 8-bit blocks, or 4-bit blocks with accuracy_level 4: ORT's CPU
  kernel runs the MatMulNBits kernels there, which quantize the activations to
  int8 per block (max|a| / 127); Transmuter keeps them in float32. The
  difference is ORT's quantization error, about 1% of the output scale:
  rtol = 2e-2, atol = 3e-2 * scale (measured: at most 1.2e-2 * scale). The
  float32 results of the same layouts are checked tightly by the 8-bit
  row-wise cases and by a NumPy-expected 8-bit block case (below).
- float16 MoE: ORT 1.31's x86 CPU kernel calls MLAS's half-precision GEMM,
  which has no x86 implementation, and returns only the biases. The expected
  outputs of these cases come from NumPy instead: the definition in float64
  from the float16 inputs, rounded to float16. Transmuter's float32 result
  rounds once too: rtol = 2e-3, atol = 2e-3 * scale.
- QMoE with fc2_expert_weight_bits different from fc1's: ORT's CPU kernel
  refuses it ("Mixed-width QMoE execution is not yet implemented on CPU"), so
  the expected output is NumPy's float64 definition rounded to float32; the
  float32 tolerance above.

Selection is stable against rounding: the routing picks the k largest
probabilities, so router logits are drawn until the k-th and (k+1)-th largest
of each token are 1e-2 apart (a flipped choice would move a whole expert's
share).

ORT 1.31's CPU kernels refuse fc3 (Mixtral's gated experts, act(fc1 x) *
fc3 x) and the SwiGLU layouts swiglu_fusion=0 (gate in fc1, linear in fc3)
and 2 (concatenated in fc1); Transmuter implements them from the spec (and
ORT's CUDA kernel). Those cases' expected outputs are NumPy's float64
definition, rounded to float32, with the float32 tolerances above (8-bit
blocks: Transmuter and NumPy both compute without int8 activations, so the
float32 tolerance too).

use_sparse_mixer=1 (PhiMoE's routing, what onnxruntime-genai's Phi-3.5-MoE
exports use) is accepted by ORT's CPU kernels and ignored: they route as
plain top-2, against the spec. Transmuter computes the sparse mixer as ORT's
CUDA kernel does, and these cases' expected outputs come from NumPy's
transliteration of that kernel (float64, float32 tolerance). Their logits
keep a margin of 1e-4 from the mask thresholds, every other token with a
runner-up inside the jitter band (so that a choice's softmax has more than
one term).

Not generated: QMoE's fp4/fp8 modes (Transmuter refuses them).
"""

from __future__ import annotations

import numpy as np

from contrib_cases import op_case, rng

ACTIVATIONS = ("relu", "gelu", "silu", "identity", "swiglu")
# gpt-oss's SwiGLU, what ORT's test_moe_cpu.py / test_qmoe_cpu.py use.
GPT_OSS_SWIGLU = {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 7.0}


def router_logits(generator, tokens: int, experts: int, k: int, dtype) -> np.ndarray:
    """Logits [tokens, experts] whose k-th and (k+1)-th largest are well apart."""
    out = np.empty((tokens, experts), dtype)
    for t in range(tokens):
        while True:
            row = generator.standard_normal(experts).astype(dtype)
            p = np.sort(row.astype(np.float64))[::-1]
            if k == experts or p[k - 1] - p[k] > 1e-2:
                out[t] = row
                break
    return out


JITTER_EPS = 0.01  # ORT's CUDA sparse_mixer_top2


def sparse_mixer(x: np.ndarray):
    """PhiMoE's sparse mixer as ORT's CUDA kernel computes it, for one token's
    logits: (experts, weights) of its two choices, and the smallest distance
    of a logit to a mask threshold (the case is redrawn when it is tiny)."""
    x = x.astype(np.float64)
    experts, weights, margin = [], [], np.inf
    for _ in range(2):
        scores = x.copy()
        scores[experts] = -np.inf
        top = int(np.argmax(scores))
        m = x[top]
        distance = (m - x) - 2 * JITTER_EPS * np.maximum(np.abs(x), m)
        masked = distance > 0
        masked[experts] = True
        others = np.ones_like(masked)
        others[experts + [top]] = False
        margin = min(margin, np.abs(distance[others]).min())
        weights.append(1.0 / np.exp(x[~masked] - m).sum())
        experts.append(top)
    return experts, np.array(weights), margin


def sparse_mixer_logits(generator, tokens: int, experts: int, dtype) -> np.ndarray:
    """Logits whose top three are 1e-3 apart and no logit within 1e-4 of a mask
    threshold; every other token with a runner-up inside the jitter band."""
    out = np.empty((tokens, experts), dtype)
    for t in range(tokens):
        while True:
            row = generator.standard_normal(experts) * 2
            if t % 2:
                top = int(np.argmax(row))
                other = (top + 1) % experts
                row[other] = row[top] - 2 * JITTER_EPS * abs(row[top]) * generator.uniform(0.2, 0.8)
            row = row.astype(dtype)
            p = np.sort(row.astype(np.float64))[::-1]
            if np.all(np.diff(p[:3]) < -1e-3) and sparse_mixer(row)[2] > 1e-4:
                out[t] = row
                break
    return out


def activate(h: np.ndarray, h3, kind: str, fusion=1, alpha=1.0, beta=0.0, limit=np.inf) -> np.ndarray:
    """act(h) [* h3], or SwiGLU of the gate and linear parts (h3: fc3's output)."""
    if kind != "swiglu":
        a = {"relu": lambda: np.maximum(h, 0),
             # ORT's CPU kernel: the tanh approximation
             "gelu": lambda: 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3))),
             "silu": lambda: h / (1 + np.exp(-h)),
             "identity": lambda: h}[kind]()
        return a if h3 is None else a * h3
    half = h.shape[-1] // 2
    g, lin = {0: (h, h3), 1: (h[..., 0::2], h[..., 1::2]), 2: (h[..., :half], h[..., half:])}[fusion]
    g, lin = np.minimum(g, limit), np.clip(lin, -limit, limit)
    return g / (1 + np.exp(-alpha * g)) * (lin + beta)


def reference(x, logits, w1, b1, w2, b2, w3=None, b3=None, *, k, activation, normalize, quantized,
              router_weights=None, sparse=False, **swiglu):
    """The operator's definition in float64 (MoE: softmax then top-k; QMoE:
    top-k of the logits, softmax over them, or gathered router_weights)."""
    x = x.astype(np.float64).reshape(-1, x.shape[-1])
    logits = logits.astype(np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        if sparse:
            top, w, _ = sparse_mixer(logits[t])
        elif quantized:
            top = np.argsort(logits[t], kind="stable")[::-1][:k]
            if router_weights is None:
                w = np.exp(logits[t, top] - logits[t, top].max())
                w /= w.sum()
            else:
                w = router_weights[t, top].astype(np.float64)
                if normalize:
                    w /= w.sum()
        else:
            p = np.exp(logits[t] - logits[t].max())
            p /= p.sum()
            top = np.argsort(p, kind="stable")[::-1][:k]
            w = p[top] / (p[top].sum() if normalize else 1.0)
        for weight, e in zip(w, top):
            h = w1[e].astype(np.float64) @ x[t] + (0 if b1 is None else b1[e])
            h3 = None if w3 is None else w3[e].astype(np.float64) @ x[t] + (0 if b3 is None else b3[e])
            y = w2[e].astype(np.float64) @ activate(h, h3, activation, **swiglu) + (0 if b2 is None else b2[e])
            out[t] += weight * y
    return out


def swiglu_attrs(swiglu: dict) -> dict:
    return {
        "fusion": swiglu.get("swiglu_fusion", 0),
        "alpha": swiglu.get("activation_alpha", 1.0),
        "beta": swiglu.get("activation_beta", 0.0),
        "limit": swiglu.get("swiglu_limit", np.inf),
    }


def moe_case(seed, *, tokens, experts, k, hidden, inter, activation="relu", normalize=0, bias=True,
             dtype=np.float32, batch=None, swiglu=None, const_weights=True, fusion=1, fc3=False, sparse=False):
    generator = rng(seed)
    fc3 = fc3 or (activation == "swiglu" and fusion == 0)
    f1 = 2 * inter if activation == "swiglu" and fusion else inter
    shape = (batch, tokens // batch, hidden) if batch else (tokens, hidden)
    x = generator.standard_normal(shape).astype(dtype)
    logits = (sparse_mixer_logits(generator, tokens, experts, dtype) if sparse
              else router_logits(generator, tokens, experts, k, dtype))
    w1 = (generator.standard_normal((experts, f1, hidden)) / np.sqrt(hidden)).astype(dtype)
    w2 = (generator.standard_normal((experts, hidden, inter)) / np.sqrt(inter)).astype(dtype)
    b1 = (generator.standard_normal((experts, f1)) * 0.1).astype(dtype) if bias else None
    b2 = (generator.standard_normal((experts, hidden)) * 0.1).astype(dtype) if bias else None
    w3 = (generator.standard_normal((experts, inter, hidden)) / np.sqrt(hidden)).astype(dtype) if fc3 else None
    b3 = (generator.standard_normal((experts, inter)) * 0.1).astype(dtype) if fc3 and bias else None
    attrs = {"k": k, "activation_type": activation, "normalize_routing_weights": normalize}
    if sparse:
        attrs["use_sparse_mixer"] = 1
    if activation == "swiglu":
        attrs["swiglu_fusion"] = fusion
        attrs.update(swiglu or {})
    ref = reference(x, logits, w1, b1, w2, b2, w3, b3, k=k, activation=activation, normalize=normalize,
                    quantized=False, sparse=sparse, **swiglu_attrs(attrs))
    scale = float(np.abs(ref).max())
    prefix = "const:" if const_weights else ""
    layout = f"_fusion{fusion}" if activation == "swiglu" and fusion != 1 else "_fc3" if fc3 else ""
    layout += "_sparse_mixer" if sparse else ""
    name = (f"{activation}{layout}{'_gptoss' if swiglu else ''}_t{tokens}{'_3d' if batch else ''}_e{experts}_k{k}"
            f"_h{hidden}_i{inter}{'_norm' if normalize else ''}{'' if bias else '_nobias'}"
            f"{'' if const_weights else '_weight_inputs'}{'_fp16' if dtype == np.float16 else ''}")
    kwargs = {"rtol": 1e-4, "atol": 2e-5 * scale}
    if dtype == np.float16:  # ORT's x86 fp16 kernel returns only the biases: NumPy's outputs (docstring)
        kwargs = {"rtol": 2e-3, "atol": 2e-3 * scale, "expected": [ref.reshape(shape).astype(np.float16)]}
    elif layout:  # ORT's CPU kernel refuses or ignores these: NumPy's outputs (docstring)
        kwargs["expected"] = [ref.reshape(shape).astype(dtype)]
    return op_case(
        name,
        "MoE",
        [("input", x), ("router_probs", logits), (prefix + "fc1_experts_weights", w1),
         (prefix + "fc1_experts_bias", b1) if bias else None, (prefix + "fc2_experts_weights", w2),
         (prefix + "fc2_experts_bias", b2) if bias else None, (prefix + "fc3_experts_weights", w3) if fc3 else None,
         (prefix + "fc3_experts_bias", b3) if fc3 and bias else None],
        ["output"],
        attrs,
        **kwargs,
    )


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint values [..., n] -> uint8 [..., ceil(n * bits / 8)], low bits first."""
    per = 8 // bits
    q = np.concatenate([q, np.zeros(q.shape[:-1] + ((-q.shape[-1]) % per,), q.dtype)], -1).astype(np.uint8)
    q = q.reshape(q.shape[:-1] + (-1, per))
    out = np.zeros(q.shape[:-1], np.uint8)
    for j in range(per):
        out |= (q[..., j] << (j * bits)).astype(np.uint8)
    return out


def quantize(w: np.ndarray, bits: int, block_size: int, symmetric: bool, dtype):
    """w [E, N, K] -> (packed weights [E, N, K * bits / 8], scales [E, N] or
    [E, N, K / block_size], packed zero points or None, dequantized float64 w)."""
    e, n, k = w.shape
    bs = block_size or k
    blocks = w.astype(np.float64).reshape(e, n, k // bs, bs)
    top = (1 << bits) - 1
    if symmetric:
        scale = np.abs(blocks).max(-1) / ((1 << (bits - 1)) - 1)
        zp = np.full(scale.shape, 1 << (bits - 1), np.int64)
    else:
        lo, hi = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
        scale = (hi - lo) / top
    scale = np.maximum(scale, 1e-6).astype(dtype)
    s64 = scale.astype(np.float64)
    if not symmetric:
        zp = np.clip(np.round(-lo / s64), 0, top).astype(np.int64)
    q = np.clip(np.round(blocks / s64[..., None]) + zp[..., None], 0, top).astype(np.int64)
    dequantized = ((q - zp[..., None]) * s64[..., None]).reshape(e, n, k)
    packed = pack(q.reshape(e, n, k), bits)
    if block_size:
        return packed, scale, None if symmetric else pack(zp, bits), dequantized
    return packed, scale[..., 0], None if symmetric else pack(zp[..., 0], bits), dequantized


def qmoe_case(seed, *, tokens, experts, k, hidden, inter, bits=4, fc2_bits=None, block_size=0, symmetric=True,
              activation="relu", normalize=0, bias=True, dtype=np.float32, router_weights=False, swiglu=None,
              accuracy_level=None, fusion=1, fc3=False, sparse=False):
    generator = rng(seed)
    fc2_bits = fc2_bits or bits
    fc3 = fc3 or (activation == "swiglu" and fusion == 0)
    f1 = 2 * inter if activation == "swiglu" and fusion else inter
    x = generator.standard_normal((tokens, hidden)).astype(dtype)
    logits = (sparse_mixer_logits(generator, tokens, experts, dtype) if sparse
              else router_logits(generator, tokens, experts, k, dtype))
    w1, s1, z1, d1 = quantize(generator.standard_normal((experts, f1, hidden)) / np.sqrt(hidden), bits, block_size,
                              symmetric, dtype)
    w2, s2, z2, d2 = quantize(generator.standard_normal((experts, hidden, inter)) / np.sqrt(inter), fc2_bits,
                              block_size, symmetric, dtype)
    b1 = (generator.standard_normal((experts, f1)) * 0.1).astype(dtype) if bias else None
    b2 = (generator.standard_normal((experts, hidden)) * 0.1).astype(dtype) if bias else None
    w3 = s3 = z3 = d3 = b3 = None
    if fc3:
        w3, s3, z3, d3 = quantize(generator.standard_normal((experts, inter, hidden)) / np.sqrt(hidden), bits,
                                  block_size, symmetric, dtype)
        b3 = (generator.standard_normal((experts, inter)) * 0.1).astype(dtype) if bias else None
    rw = generator.uniform(0.1, 1.0, (tokens, experts)).astype(dtype) if router_weights else None
    attrs = {"k": k, "activation_type": activation, "normalize_routing_weights": normalize,
             "expert_weight_bits": bits}
    if fc2_bits != bits:
        attrs["fc2_expert_weight_bits"] = fc2_bits
    if block_size:
        attrs["block_size"] = block_size
    if accuracy_level is not None:
        attrs["accuracy_level"] = accuracy_level
    if sparse:
        attrs["use_sparse_mixer"] = 1
    if activation == "swiglu":
        attrs["swiglu_fusion"] = fusion
        attrs.update(swiglu or {})
    ref = reference(x, logits, d1, b1, d2, b2, d3, b3, k=k, activation=activation, normalize=normalize,
                    quantized=True, router_weights=rw, sparse=sparse, **swiglu_attrs(attrs))
    scale = float(np.abs(ref).max())
    layout = f"_fusion{fusion}" if activation == "swiglu" and fusion != 1 else "_fc3" if fc3 else ""
    layout += "_sparse_mixer" if sparse else ""
    numpy_expected = fc2_bits != bits or layout  # ORT's CPU kernel refuses these (docstring)
    int8_activations = not numpy_expected and block_size and (bits == 8 or accuracy_level == 4)
    if int8_activations:
        tolerance = {"rtol": 2e-2, "atol": 3e-2 * scale}
    elif dtype == np.float16:
        tolerance = {"rtol": 2e-3, "atol": 2e-3 * scale}
    else:
        tolerance = {"rtol": 1e-4, "atol": 2e-5 * scale}
    bits_name = f"{bits}bit" + (f"_fc2_{fc2_bits}bit" if fc2_bits != bits else "")
    name = (f"qmoe_{bits_name}_{f'block{block_size}' if block_size else 'rowwise'}{'' if symmetric else '_zp'}"
            f"_{activation}{layout}{'_gptoss' if swiglu else ''}_t{tokens}_e{experts}_k{k}_h{hidden}_i{inter}"
            f"{'_norm' if normalize else ''}{'' if bias else '_nobias'}{'_router_weights' if router_weights else ''}"
            f"{f'_acc{accuracy_level}' if accuracy_level is not None else ''}"
            f"{'_fp16' if dtype == np.float16 else ''}")
    inputs = [("input", x), ("router_probs", logits), ("const:fc1_experts_weights", w1), ("const:fc1_scales", s1),
              ("const:fc1_experts_bias", b1) if bias else None, ("const:fc2_experts_weights", w2),
              ("const:fc2_scales", s2), ("const:fc2_experts_bias", b2) if bias else None,
              ("const:fc3_experts_weights", w3) if fc3 else None, ("const:fc3_scales", s3) if fc3 else None,
              ("const:fc3_experts_bias", b3) if b3 is not None else None,
              ("const:fc1_zero_points", z1) if z1 is not None else None,
              ("const:fc2_zero_points", z2) if z2 is not None else None,
              ("const:fc3_zero_points", z3) if z3 is not None else None,
              ("router_weights", rw) if router_weights else None]
    if numpy_expected:
        tolerance["expected"] = [ref.astype(dtype)]
    return op_case(name, "QMoE", inputs, ["output"], attrs, **tolerance)


def cases():
    out = []
    seed = iter(range(1000, 2000))
    # MoE: ORT's moe_test.cc shapes (tokens, experts, k, hidden, inter) and each activation.
    for tokens, experts, k, hidden, inter in [(1, 4, 1, 16, 32), (7, 4, 2, 32, 64), (32, 8, 2, 64, 128),
                                              (32, 8, 4, 32, 64)]:
        for activation in ACTIVATIONS:
            out.append(moe_case(next(seed), tokens=tokens, experts=experts, k=k, hidden=hidden, inter=inter,
                                activation=activation))
    out += [
        moe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, normalize=1),
        moe_case(next(seed), tokens=32, experts=8, k=4, hidden=32, inter=64, activation="silu", normalize=1),
        moe_case(next(seed), tokens=7, experts=8, k=2, hidden=16, inter=32, activation="gelu", bias=False),
        moe_case(next(seed), tokens=8, experts=4, k=2, hidden=32, inter=64, batch=2, activation="silu"),
        moe_case(next(seed), tokens=32, experts=4, k=4, hidden=16, inter=32, normalize=1),  # k = num_experts
        # test_moe_cpu.py: gpt-oss SwiGLU, normalized top-2.
        moe_case(next(seed), tokens=32, experts=4, k=2, hidden=64, inter=128, activation="swiglu", normalize=1,
                 swiglu=GPT_OSS_SWIGLU),
        moe_case(next(seed), tokens=7, experts=8, k=4, hidden=32, inter=32, activation="swiglu", bias=False,
                 swiglu={"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 0.5}),
        moe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, activation="relu", const_weights=False),
        # fc3 gating (Mixtral: silu(fc1 x) * fc3 x) and the SwiGLU layouts 0 and 2 (NumPy outputs).
        moe_case(next(seed), tokens=32, experts=8, k=2, hidden=32, inter=64, activation="silu", fc3=True,
                 normalize=1),
        moe_case(next(seed), tokens=7, experts=4, k=2, hidden=16, inter=32, activation="gelu", fc3=True, bias=False),
        moe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, activation="swiglu", fusion=0,
                 swiglu=GPT_OSS_SWIGLU),
        moe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, activation="swiglu", fusion=2,
                 swiglu=GPT_OSS_SWIGLU, normalize=1),
        # Phi-3.5-MoE (onnxruntime-genai's builder): sparse mixer top-2 routing, silu gated by fc3.
        moe_case(next(seed), tokens=32, experts=16, k=2, hidden=32, inter=64, activation="silu", fc3=True,
                 sparse=True, bias=False),
        moe_case(next(seed), tokens=7, experts=8, k=2, hidden=16, inter=32, activation="relu", sparse=True),
        # float16 (NumPy outputs, see the docstring).
        moe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, dtype=np.float16),
        moe_case(next(seed), tokens=32, experts=8, k=2, hidden=64, inter=64, activation="swiglu", normalize=1,
                 dtype=np.float16, swiglu=GPT_OSS_SWIGLU),
    ]
    # QMoE: bits x layout x zero points (test_qmoe_cpu.py), then activations and routing.
    for bits in (2, 4, 8):
        for block_size in (0, 16, 32):
            for symmetric in (True, False):
                out.append(qmoe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, bits=bits,
                                     block_size=block_size, symmetric=symmetric))
    for activation in ACTIVATIONS:
        out.append(qmoe_case(next(seed), tokens=32, experts=8, k=2, hidden=64, inter=128, bits=4,
                             activation=activation, symmetric=False))
    out += [
        qmoe_case(next(seed), tokens=1, experts=4, k=1, hidden=16, inter=32, bits=8),
        qmoe_case(next(seed), tokens=32, experts=8, k=4, hidden=32, inter=64, bits=4, block_size=32, normalize=1),
        qmoe_case(next(seed), tokens=32, experts=8, k=2, hidden=64, inter=128, bits=8, block_size=64,
                  activation="swiglu", swiglu=GPT_OSS_SWIGLU, symmetric=False),
        qmoe_case(next(seed), tokens=32, experts=4, k=2, hidden=64, inter=64, bits=4, activation="swiglu",
                  swiglu=GPT_OSS_SWIGLU, normalize=1, bias=False),
        qmoe_case(next(seed), tokens=7, experts=8, k=2, hidden=32, inter=64, bits=4, router_weights=True),
        qmoe_case(next(seed), tokens=7, experts=8, k=2, hidden=32, inter=64, bits=8, router_weights=True,
                  normalize=1, symmetric=False),
        qmoe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, bits=4, fc2_bits=8),
        qmoe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, bits=4, block_size=16,
                  accuracy_level=4, symmetric=False),
        qmoe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, bits=4, dtype=np.float16),
        qmoe_case(next(seed), tokens=7, experts=8, k=2, hidden=32, inter=64, bits=4, activation="silu", fc3=True,
                  symmetric=False),
        qmoe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, bits=8, block_size=16,
                  activation="swiglu", fusion=0, swiglu=GPT_OSS_SWIGLU),
        qmoe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, bits=4, activation="swiglu", fusion=2,
                  swiglu=GPT_OSS_SWIGLU),
        qmoe_case(next(seed), tokens=7, experts=4, k=2, hidden=32, inter=64, bits=8, block_size=16, symmetric=False,
                  dtype=np.float16),
        qmoe_case(next(seed), tokens=32, experts=8, k=2, hidden=64, inter=128, bits=4, block_size=32,
                  activation="swiglu", swiglu=GPT_OSS_SWIGLU, normalize=1, dtype=np.float16),
        qmoe_case(next(seed), tokens=32, experts=16, k=2, hidden=32, inter=64, bits=4, block_size=32,
                  activation="silu", fc3=True, sparse=True, bias=False),
        # Decode steps (fewer routed pairs than experts) on weights pack_qmoe_weights packs.
        qmoe_case(next(seed), tokens=1, experts=8, k=2, hidden=64, inter=64, bits=4, block_size=32,
                  activation="swiglu", swiglu=GPT_OSS_SWIGLU, normalize=1),
        qmoe_case(next(seed), tokens=2, experts=16, k=4, hidden=64, inter=128, bits=4, symmetric=False),
        qmoe_case(next(seed), tokens=1, experts=8, k=2, hidden=128, inter=64, bits=8),
    ]
    return out
