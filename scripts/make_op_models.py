"""Builds small test models around single ONNX operators, with onnx.helper only.

Unlike scripts/export_models.py (PyTorch exports of real architectures), these
models are written node by node, for operators that exporters do not emit yet.
Each goes to tests/models/<name>/ with the files tests/models/test_models.py
reads (model.onnx, inputs.json) plus ops.txt; weights come from a fixed seed, so
reruns write the same bytes.

    opset23_decoder  one decoder layer on the opset-23 LLM operators:
                     RMSNormalization, RotaryEmbedding (3-D input, position_ids),
                     Attention (3-D Q/K/V, grouped-query heads, 4-D past_key/
                     past_value -> present_key/present_value, is_causal plus a
                     boolean padding mask), a SiLU-gated MLP and an LM head.
    opset24_static_cache  the same layer on a static (external) KV cache:
                     TensorScatter writes the new keys/values at per-row
                     write_indices, Attention gets 4-D Q/K/V and
                     nonpad_kv_seqlen; RotaryEmbedding on 4-D input, interleaved,
                     rotating half of each head.

Usage: .venv/bin/python scripts/make_op_models.py [--out tests/models]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO_ROOT = Path(__file__).resolve().parents[1]

# opset-23 decoder layer sizes: 4 query heads share 2 key/value heads.
VOCAB = 96
HIDDEN = 32
Q_HEADS = 4
KV_HEADS = 2
HEAD_SIZE = HIDDEN // Q_HEADS
MLP = 48
MAX_POSITIONS = 64
ROPE_THETA = 10000.0
EPSILON = 1e-6


def rope_caches() -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [MAX_POSITIONS, HEAD_SIZE / 2] of the usual RoPE angles."""
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, HEAD_SIZE, 2, dtype=np.float64) / HEAD_SIZE)
    angles = np.outer(np.arange(MAX_POSITIONS, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def layer_weights(rng: np.random.Generator) -> list[TensorProto]:
    """Embedding, projections, norms, MLP, LM head and RoPE tables."""

    def weight(name: str, shape: tuple[int, ...], std: float) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name)

    def norm(name: str) -> TensorProto:
        return numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), name)

    cos, sin = rope_caches()
    return [
        weight("embed_tokens", (VOCAB, HIDDEN), 1.0),
        norm("input_norm"),
        weight("q_proj", (HIDDEN, Q_HEADS * HEAD_SIZE), HIDDEN**-0.5),
        weight("k_proj", (HIDDEN, KV_HEADS * HEAD_SIZE), HIDDEN**-0.5),
        weight("v_proj", (HIDDEN, KV_HEADS * HEAD_SIZE), HIDDEN**-0.5),
        weight("o_proj", (Q_HEADS * HEAD_SIZE, HIDDEN), HIDDEN**-0.5),
        norm("post_norm"),
        weight("gate_proj", (HIDDEN, MLP), HIDDEN**-0.5),
        weight("up_proj", (HIDDEN, MLP), HIDDEN**-0.5),
        weight("down_proj", (MLP, HIDDEN), MLP**-0.5),
        norm("final_norm"),
        weight("lm_head", (HIDDEN, VOCAB), HIDDEN**-0.5),
        numpy_helper.from_array(cos, "cos_cache"),
        numpy_helper.from_array(sin, "sin_cache"),
    ]


def ints(name: str, values: list[int]) -> TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


RMS = dict(epsilon=EPSILON, axis=-1)


def attention_in_nodes() -> list[onnx.NodeProto]:
    """input_ids -> embedded, then the normed input projected to q, k, v [B, S, heads * D]."""
    return [
        helper.make_node("Gather", ["embed_tokens", "input_ids"], ["embedded"]),
        helper.make_node("RMSNormalization", ["embedded", "input_norm"], ["attn_in"], **RMS),
        helper.make_node("MatMul", ["attn_in", "q_proj"], ["q"]),
        helper.make_node("MatMul", ["attn_in", "k_proj"], ["k"]),
        helper.make_node("MatMul", ["attn_in", "v_proj"], ["v"]),
    ]


def attention_out_nodes() -> list[onnx.NodeProto]:
    """attn_heads [B, S, Q_HEADS * D] -> residual, SiLU-gated MLP, final norm, logits."""
    return [
        helper.make_node("MatMul", ["attn_heads", "o_proj"], ["attn_out"]),
        helper.make_node("Add", ["embedded", "attn_out"], ["resid1"]),
        helper.make_node("RMSNormalization", ["resid1", "post_norm"], ["mlp_in"], **RMS),
        helper.make_node("MatMul", ["mlp_in", "gate_proj"], ["gate"]),
        helper.make_node("Sigmoid", ["gate"], ["gate_sigmoid"]),
        helper.make_node("Mul", ["gate", "gate_sigmoid"], ["gate_silu"]),
        helper.make_node("MatMul", ["mlp_in", "up_proj"], ["up"]),
        helper.make_node("Mul", ["gate_silu", "up"], ["mlp_hidden"]),
        helper.make_node("MatMul", ["mlp_hidden", "down_proj"], ["mlp_out"]),
        helper.make_node("Add", ["resid1", "mlp_out"], ["resid2"]),
        helper.make_node("RMSNormalization", ["resid2", "final_norm"], ["final"], **RMS),
        helper.make_node("MatMul", ["final", "lm_head"], ["logits"]),
    ]


def finish(name: str, opset: int, nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="scripts/make_op_models.py")
    model.ir_version = 11
    onnx.checker.check_model(model, full_check=True)
    return model


def spec_of(name: str, opset: int, dims: dict, inputs: list[dict], outputs) -> dict:
    return {
        "model": name,
        "opset": opset,
        "dims": dims,
        "inputs": inputs,
        "outputs": [o.name for o in outputs],
        "generated_by": "scripts/make_op_models.py",
        "onnx": onnx.__version__,
    }


def opset23_decoder() -> tuple[onnx.ModelProto, dict]:
    initializers = layer_weights(np.random.default_rng(23)) + [
        ints("mask_axes", [1, 2]),
        ints("ones_2", [1, 1]),
        ints("ones_1", [1]),
    ]
    nodes = attention_in_nodes() + [
        helper.make_node("RotaryEmbedding", ["q", "cos_cache", "sin_cache", "position_ids"], ["q_rot"],
                         num_heads=Q_HEADS),
        helper.make_node("RotaryEmbedding", ["k", "cos_cache", "sin_cache", "position_ids"], ["k_rot"],
                         num_heads=KV_HEADS),
        # attention_mask [batch, past + sequence] (1 = real token) -> boolean
        # [batch, 1, sequence, past + sequence], composed with is_causal. (ONNX
        # Runtime wants the query axis spelled out, not broadcast.)
        helper.make_node("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["mask_bool", "mask_axes"], ["mask_4d"]),
        helper.make_node("Shape", ["input_ids"], ["sequence_length"], start=1, end=2),
        helper.make_node("Concat", ["ones_2", "sequence_length", "ones_1"], ["mask_shape"], axis=0),
        helper.make_node("Expand", ["mask_4d", "mask_shape"], ["attn_mask"]),
        helper.make_node(
            "Attention",
            ["q_rot", "k_rot", "v", "attn_mask", "past_key", "past_value"],
            ["attn_heads", "present_key", "present_value"],
            q_num_heads=Q_HEADS,
            kv_num_heads=KV_HEADS,
            is_causal=1,
        ),
    ] + attention_out_nodes()
    total = "past_sequence_length+sequence_length"
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", total]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT,
                                      ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE]),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT,
                                      ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence_length", VOCAB]),
        helper.make_tensor_value_info("present_key", TensorProto.FLOAT, ["batch", KV_HEADS, total, HEAD_SIZE]),
        helper.make_tensor_value_info("present_value", TensorProto.FLOAT, ["batch", KV_HEADS, total, HEAD_SIZE]),
    ]
    model = finish("opset23_decoder", 23, nodes, inputs, outputs, initializers)
    spec = spec_of("opset23_decoder", 23, {"batch": 2, "sequence_length": 3, "past_sequence_length": 5}, [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence_length"],
         "kind": "token_ids", "range": [0, VOCAB]},
        {"name": "attention_mask", "dtype": "int64", "shape": ["batch", total], "kind": "attention_mask"},
        {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence_length"],
         "kind": "position_ids"},
        {"name": "past_key", "dtype": "float32",
         "shape": ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE], "kind": "float"},
        {"name": "past_value", "dtype": "float32",
         "shape": ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE], "kind": "float"},
    ], outputs)
    return model, spec


def opset24_static_cache() -> tuple[onnx.ModelProto, dict]:
    initializers = layer_weights(np.random.default_rng(24)) + [
        ints("q_heads_shape", [0, 0, Q_HEADS, HEAD_SIZE]),
        ints("kv_heads_shape", [0, 0, KV_HEADS, HEAD_SIZE]),
        ints("merged", [0, 0, Q_HEADS * HEAD_SIZE]),
        ints("zero", [0]),
        ints("one", [1]),
        ints("last_axis", [1]),
    ]

    def to_heads(name: str, shape: str) -> list[onnx.NodeProto]:
        """[B, S, heads * D] -> [B, heads, S, D]."""
        return [
            helper.make_node("Reshape", [name, shape], [f"{name}_split"]),
            helper.make_node("Transpose", [f"{name}_split"], [f"{name}_heads"], perm=[0, 2, 1, 3]),
        ]

    nodes = attention_in_nodes() + [
        # Positions continue from each row's write index: write_indices[b] + [0, S).
        helper.make_node("Shape", ["input_ids"], ["sequence_length"], start=1, end=2),
        helper.make_node("Squeeze", ["sequence_length", "zero"], ["sequence_scalar"]),
        helper.make_node("Range", ["zero_scalar", "sequence_scalar", "one_scalar"], ["steps"]),
        helper.make_node("Unsqueeze", ["write_indices", "last_axis"], ["write_column"]),
        helper.make_node("Add", ["write_column", "steps"], ["position_ids"]),
        helper.make_node("Add", ["write_indices", "sequence_length"], ["nonpad_kv_seqlen"]),
        *to_heads("q", "q_heads_shape"),
        *to_heads("k", "kv_heads_shape"),
        *to_heads("v", "kv_heads_shape"),
        # 4-D RotaryEmbedding, interleaved pairs, on half of each head.
        helper.make_node("RotaryEmbedding", ["q_heads", "cos_half", "sin_half", "position_ids"], ["q_rot"],
                         interleaved=1, rotary_embedding_dim=HEAD_SIZE // 2),
        helper.make_node("RotaryEmbedding", ["k_heads", "cos_half", "sin_half", "position_ids"], ["k_rot"],
                         interleaved=1, rotary_embedding_dim=HEAD_SIZE // 2),
        # The cache update happens outside Attention (static cache).
        helper.make_node("TensorScatter", ["cache_key", "k_rot", "write_indices"], ["present_key"], axis=2),
        helper.make_node("TensorScatter", ["cache_value", "v_heads", "write_indices"], ["present_value"], axis=2),
        helper.make_node("Attention", ["q_rot", "present_key", "present_value", "", "", "", "nonpad_kv_seqlen"],
                         ["attn_4d"], is_causal=1),
        helper.make_node("Transpose", ["attn_4d"], ["attn_tokens"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["attn_tokens", "merged"], ["attn_heads"]),
    ] + attention_out_nodes()
    cos, sin = rope_caches()
    initializers += [
        numpy_helper.from_array(cos[:, : HEAD_SIZE // 4].copy(), "cos_half"),
        numpy_helper.from_array(sin[:, : HEAD_SIZE // 4].copy(), "sin_half"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero_scalar"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one_scalar"),
    ]
    cache = ["batch", KV_HEADS, "cache_length", HEAD_SIZE]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info("write_indices", TensorProto.INT64, ["batch"]),
        helper.make_tensor_value_info("cache_key", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("cache_value", TensorProto.FLOAT, cache),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence_length", VOCAB]),
        helper.make_tensor_value_info("present_key", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("present_value", TensorProto.FLOAT, cache),
    ]
    model = finish("opset24_static_cache", 24, nodes, inputs, outputs, initializers)
    dims = {"batch": 2, "sequence_length": 3, "cache_length": 8}
    spec = spec_of("opset24_static_cache", 24, dims, [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence_length"],
         "kind": "token_ids", "range": [0, VOCAB]},
        # Each row writes its new tokens at a random slot that leaves room for them.
        {"name": "write_indices", "dtype": "int64", "shape": ["batch"], "kind": "token_ids",
         "range": [0, dims["cache_length"] - dims["sequence_length"] + 1]},
        {"name": "cache_key", "dtype": "float32", "shape": cache, "kind": "float"},
        {"name": "cache_value", "dtype": "float32", "shape": cache, "kind": "float"},
    ], outputs)
    return model, spec


def write(directory: Path, model: onnx.ModelProto, spec: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, directory / "model.onnx")
    (directory / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")
    counts = collections.Counter(node.op_type for node in model.graph.node)
    (directory / "ops.txt").write_text("".join(f"{op} {n}\n" for op, n in sorted(counts.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "models")
    args = parser.parse_args()
    for name, build in {"opset23_decoder": opset23_decoder, "opset24_static_cache": opset24_static_cache}.items():
        model, spec = build()
        write(args.out / name, model, spec)
        print(args.out / name)


if __name__ == "__main__":
    main()
