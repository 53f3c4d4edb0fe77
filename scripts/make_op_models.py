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


def opset23_decoder() -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(23)

    def weight(name: str, shape: tuple[int, ...], std: float) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name)

    cos, sin = rope_caches()
    initializers = [
        weight("embed_tokens", (VOCAB, HIDDEN), 1.0),
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), "input_norm"),
        weight("q_proj", (HIDDEN, Q_HEADS * HEAD_SIZE), HIDDEN**-0.5),
        weight("k_proj", (HIDDEN, KV_HEADS * HEAD_SIZE), HIDDEN**-0.5),
        weight("v_proj", (HIDDEN, KV_HEADS * HEAD_SIZE), HIDDEN**-0.5),
        weight("o_proj", (Q_HEADS * HEAD_SIZE, HIDDEN), HIDDEN**-0.5),
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), "post_norm"),
        weight("gate_proj", (HIDDEN, MLP), HIDDEN**-0.5),
        weight("up_proj", (HIDDEN, MLP), HIDDEN**-0.5),
        weight("down_proj", (MLP, HIDDEN), MLP**-0.5),
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), "final_norm"),
        weight("lm_head", (HIDDEN, VOCAB), HIDDEN**-0.5),
        numpy_helper.from_array(cos, "cos_cache"),
        numpy_helper.from_array(sin, "sin_cache"),
        numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "mask_axes"),
        numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "ones_2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "ones_1"),
    ]
    rms = dict(epsilon=EPSILON, axis=-1)
    nodes = [
        helper.make_node("Gather", ["embed_tokens", "input_ids"], ["embedded"]),
        # Self-attention block.
        helper.make_node("RMSNormalization", ["embedded", "input_norm"], ["attn_in"], **rms),
        helper.make_node("MatMul", ["attn_in", "q_proj"], ["q"]),
        helper.make_node("MatMul", ["attn_in", "k_proj"], ["k"]),
        helper.make_node("MatMul", ["attn_in", "v_proj"], ["v"]),
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
        helper.make_node("MatMul", ["attn_heads", "o_proj"], ["attn_out"]),
        helper.make_node("Add", ["embedded", "attn_out"], ["resid1"]),
        # SiLU-gated MLP.
        helper.make_node("RMSNormalization", ["resid1", "post_norm"], ["mlp_in"], **rms),
        helper.make_node("MatMul", ["mlp_in", "gate_proj"], ["gate"]),
        helper.make_node("Sigmoid", ["gate"], ["gate_sigmoid"]),
        helper.make_node("Mul", ["gate", "gate_sigmoid"], ["gate_silu"]),
        helper.make_node("MatMul", ["mlp_in", "up_proj"], ["up"]),
        helper.make_node("Mul", ["gate_silu", "up"], ["mlp_hidden"]),
        helper.make_node("MatMul", ["mlp_hidden", "down_proj"], ["mlp_out"]),
        helper.make_node("Add", ["resid1", "mlp_out"], ["resid2"]),
        helper.make_node("RMSNormalization", ["resid2", "final_norm"], ["final"], **rms),
        helper.make_node("MatMul", ["final", "lm_head"], ["logits"]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                      ["batch", "past_sequence_length+sequence_length"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT,
                                      ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE]),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT,
                                      ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE]),
    ]
    total = "past_sequence_length+sequence_length"
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence_length", VOCAB]),
        helper.make_tensor_value_info("present_key", TensorProto.FLOAT, ["batch", KV_HEADS, total, HEAD_SIZE]),
        helper.make_tensor_value_info("present_value", TensorProto.FLOAT, ["batch", KV_HEADS, total, HEAD_SIZE]),
    ]
    graph = helper.make_graph(nodes, "opset23_decoder", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)],
                              producer_name="scripts/make_op_models.py")
    model.ir_version = 11
    onnx.checker.check_model(model, full_check=True)

    spec = {
        "model": "opset23_decoder",
        "opset": 23,
        "dims": {"batch": 2, "sequence_length": 3, "past_sequence_length": 5},
        "inputs": [
            {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence_length"],
             "kind": "token_ids", "range": [0, VOCAB]},
            {"name": "attention_mask", "dtype": "int64", "shape": ["batch", total],
             "kind": "attention_mask"},
            {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence_length"],
             "kind": "position_ids"},
            {"name": "past_key", "dtype": "float32",
             "shape": ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE], "kind": "float"},
            {"name": "past_value", "dtype": "float32",
             "shape": ["batch", KV_HEADS, "past_sequence_length", HEAD_SIZE], "kind": "float"},
        ],
        "outputs": [o.name for o in outputs],
        "generated_by": "scripts/make_op_models.py",
        "onnx": onnx.__version__,
    }
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
    for name, build in {"opset23_decoder": opset23_decoder}.items():
        model, spec = build()
        write(args.out / name, model, spec)
        print(args.out / name)


if __name__ == "__main__":
    main()
