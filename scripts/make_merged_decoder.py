#!/usr/bin/env python3
"""Build a tiny optimum-style merged decoder (an If on use_cache_branch) as a test fixture.

    .venv/bin/python scripts/make_merged_decoder.py

optimum exports a decoder twice (without and with past key values) and merges the
two graphs into one: the weights move to the outer graph, and a single If on the
bool input `use_cache_branch` holds the decoder without past in one branch and the
decoder with past in the other; both read the shared weights from the outer scope.
The caller always feeds past key values: dummies when use_cache_branch is false.

This script builds that structure directly with onnx.helper (no torch): a 2-layer
pre-LN GPT-style decoder with deterministic random weights (seeded NumPy), causal
attention over past + new tokens, an attention mask over all of them, and present
key/values out. It writes

    tests/models/merged_decoder/model.onnx, inputs.json, ops.txt
        use_cache_branch = true, past of 5 tokens; compiled with use_cache_branch
        static, so the branch is taken inside the compiled segment
    tests/models/merged_decoder_no_cache/inputs.json
        the same model with use_cache_branch = false and a one-token dummy past;
        compiled with a traced condition, so the If is a graph break

and checks the model in ONNX Runtime (optimizations off): the no-cache branch on
the full sequence must give the same last logits as the cache branch fed the
no-cache branch's present values.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO_ROOT / "tests" / "models"
sys.path.insert(0, str(MODELS_DIR))
from model_inputs import build_inputs  # noqa: E402

OPSET = 17
SEED = 20240607
VOCAB, HIDDEN, HEADS, LAYERS, MAX_POSITIONS = 64, 32, 2, 2, 64
HEAD_DIM = HIDDEN // HEADS
OUTPUTS = ["logits"] + [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]


def make_weights(rng: np.random.Generator) -> list[onnx.TensorProto]:
    def normal(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {
        "wte": normal(VOCAB, HIDDEN, scale=0.5),
        "wpe": normal(MAX_POSITIONS, HIDDEN, scale=0.5),
        "ln_f.g": 1 + normal(HIDDEN),
        "ln_f.b": normal(HIDDEN),
        "lm_head": normal(HIDDEN, VOCAB, scale=0.3),
    }
    for i in range(LAYERS):
        w |= {
            f"h{i}.ln1.g": 1 + normal(HIDDEN),
            f"h{i}.ln1.b": normal(HIDDEN),
            f"h{i}.qkv.w": normal(HIDDEN, 3 * HIDDEN, scale=0.2),
            f"h{i}.qkv.b": normal(3 * HIDDEN),
            f"h{i}.proj.w": normal(HIDDEN, HIDDEN, scale=0.2),
            f"h{i}.proj.b": normal(HIDDEN),
            f"h{i}.ln2.g": 1 + normal(HIDDEN),
            f"h{i}.ln2.b": normal(HIDDEN),
            f"h{i}.fc.w": normal(HIDDEN, 4 * HIDDEN, scale=0.2),
            f"h{i}.fc.b": normal(4 * HIDDEN),
            f"h{i}.out.w": normal(4 * HIDDEN, HIDDEN, scale=0.2),
            f"h{i}.out.b": normal(HIDDEN),
        }
    # Constants both branches read from the outer scope, as optimum's merge
    # hoists shared initializers.
    w |= {
        "c.qkv_split": np.array([HIDDEN] * 3, np.int64),
        "c.heads_shape": np.array([0, 0, HEADS, HEAD_DIM], np.int64),
        "c.hidden_shape": np.array([0, 0, HIDDEN], np.int64),
        "c.scale": np.array(1 / np.sqrt(HEAD_DIM), np.float32),
        "c.masked": np.array(-1e9, np.float32),
        "c.half": np.array(0.5, np.float32),
        "c.one": np.array(1.0, np.float32),
        "c.inv_sqrt2": np.array(1 / np.sqrt(2), np.float32),
        "c.zero_i": np.array(0, np.int64),
        "c.one_i": np.array(1, np.int64),
        "c.axis1": np.array([1], np.int64),
        "c.axes12": np.array([1, 2], np.int64),
    }
    return [numpy_helper.from_array(v, k) for k, v in w.items()]


class Branch:
    """Nodes of one branch; every name it makes is prefixed so branches never clash."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []

    def op(self, op_type: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> str | list[str]:
        outs = [f"{self.prefix}/{name}" + (f".{k}" if n_out > 1 else "") for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"{self.prefix}/{name}", **attrs))
        return outs[0] if n_out == 1 else outs

    def layer_norm(self, x: str, scope: str) -> str:
        return self.op("LayerNormalization", [x, f"{scope}.g", f"{scope}.b"], f"{scope}.ln", axis=-1, epsilon=1e-5)

    def linear(self, x: str, scope: str) -> str:
        return self.op("Add", [self.op("MatMul", [x, f"{scope}.w"], f"{scope}.mm"), f"{scope}.b"], f"{scope}.add")

    def heads(self, x: str, name: str) -> str:
        """[B, S, H] -> [B, heads, S, head_dim]"""
        split = self.op("Reshape", [x, "c.heads_shape"], f"{name}.split_heads")
        return self.op("Transpose", [split], f"{name}.heads", perm=[0, 2, 1, 3])


def build_branch(with_past: bool) -> onnx.GraphProto:
    b = Branch("with_past" if with_past else "no_past")
    # Sequence lengths: S new tokens, P past tokens (0 without past), T = P + S.
    ids_shape = b.op("Shape", ["input_ids"], "ids_shape")
    seq = b.op("Gather", [ids_shape, "c.one_i"], "seq_len")
    if with_past:
        past_shape = b.op("Shape", ["past_key_values.0.key"], "past_shape")
        past = b.op("Gather", [past_shape, b.op("Constant", [], "two", value_int=2)], "past_len")
    else:
        past = "c.zero_i"
    total = b.op("Add", [past, seq], "total_len")

    positions = b.op("Range", [past, total, "c.one_i"], "positions")
    x = b.op("Add", [b.op("Gather", ["wte", "input_ids"], "tok"), b.op("Gather", ["wpe", positions], "pos")], "embed")

    # allowed[b, 0, q, k] = key k is at or before query q and not padding.
    key_pos = b.op("Range", ["c.zero_i", total, "c.one_i"], "key_pos")
    causal = b.op("LessOrEqual", [b.op("Unsqueeze", [key_pos, "c.zero_i"], "key_row"),
                                  b.op("Unsqueeze", [positions, "c.axis1"], "query_col")], "causal")
    mask = b.op("Unsqueeze", [b.op("Cast", ["attention_mask"], "mask_bool", to=TensorProto.BOOL), "c.axes12"],
                "mask4d")
    allowed = b.op("And", [causal, mask], "allowed")

    presents = []
    for i in range(LAYERS):
        h = b.layer_norm(x, f"h{i}.ln1")
        q, k, v = b.op("Split", [b.linear(h, f"h{i}.qkv"), "c.qkv_split"], f"h{i}.qkv_parts", n_out=3, axis=2)
        q, k, v = b.heads(q, f"h{i}.q"), b.heads(k, f"h{i}.k"), b.heads(v, f"h{i}.v")
        if with_past:
            k = b.op("Concat", [f"past_key_values.{i}.key", k], f"h{i}.k_all", axis=2)
            v = b.op("Concat", [f"past_key_values.{i}.value", v], f"h{i}.v_all", axis=2)
        presents += [b.op("Identity", [k], f"present.{i}.key"), b.op("Identity", [v], f"present.{i}.value")]
        scores = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], f"h{i}.kT", perm=[0, 1, 3, 2])],
                                   f"h{i}.qk"), "c.scale"], f"h{i}.scores")
        probs = b.op("Softmax", [b.op("Where", [allowed, scores, "c.masked"], f"h{i}.masked")], f"h{i}.probs",
                     axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v], f"h{i}.ctx_heads")], f"h{i}.ctx_t", perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, "c.hidden_shape"], f"h{i}.ctx")
        x = b.op("Add", [x, b.linear(ctx, f"h{i}.proj")], f"h{i}.res1")
        # MLP with exact Gelu: 0.5 x (1 + erf(x / sqrt 2)).
        f = b.linear(b.layer_norm(x, f"h{i}.ln2"), f"h{i}.fc")
        erf = b.op("Erf", [b.op("Mul", [f, "c.inv_sqrt2"], f"h{i}.gelu_scaled")], f"h{i}.gelu_erf")
        gelu = b.op("Mul", [b.op("Mul", [f, "c.half"], f"h{i}.gelu_half"),
                            b.op("Add", [erf, "c.one"], f"h{i}.gelu_one")], f"h{i}.gelu")
        x = b.op("Add", [x, b.linear(gelu, f"h{i}.out")], f"h{i}.res2")
    logits = b.op("MatMul", [b.layer_norm(x, "ln_f"), "lm_head"], "logits")
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in [logits] + presents]
    return helper.make_graph(b.nodes, f"{b.prefix}_branch", [], outputs)


def build_model() -> onnx.ModelProto:
    batch, seq, past, total = "batch", "sequence_length", "past_sequence_length", "total_sequence_length"
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, total]),
    ]
    for i in range(LAYERS):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kv}", TensorProto.FLOAT, [batch, HEADS, past, HEAD_DIM]))
    inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, seq, VOCAB])]
    for i in range(LAYERS):
        for kv in ("key", "value"):
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kv}", TensorProto.FLOAT, [batch, HEADS, "present_sequence_length", HEAD_DIM]))
    merged = helper.make_node("If", ["use_cache_branch"], OUTPUTS, name="optimum::if",
                              then_branch=build_branch(with_past=True), else_branch=build_branch(with_past=False))
    graph = helper.make_graph([merged], "merged_decoder", inputs, outputs,
                              initializer=make_weights(np.random.default_rng(SEED)))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="scripts/make_merged_decoder.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def spec(use_cache: bool, dims: dict) -> dict:
    past_shape = ["batch", HEADS, "past_sequence_length", HEAD_DIM]
    inputs = [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence_length"], "kind": "token_ids",
         "range": [0, VOCAB]},
        {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "total_sequence_length"],
         "kind": "attention_mask"},
    ]
    inputs += [{"name": f"past_key_values.{i}.{kv}", "dtype": "float32", "shape": past_shape, "kind": "float"}
               for i in range(LAYERS) for kv in ("key", "value")]
    inputs.append({"name": "use_cache_branch", "dtype": "bool", "shape": [1], "kind": "bool", "value": use_cache})
    out = {"dims": dims, "inputs": inputs, "outputs": OUTPUTS, "generated_by": "scripts/make_merged_decoder.py"}
    if use_cache:
        out["static"] = ["use_cache_branch"]  # compiled: the branch is taken inside the segment
    else:
        out["model_of"] = "merged_decoder"  # the cache variant's model.onnx
    return out


def run_ort(path: Path, feeds: dict) -> dict:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(zip(OUTPUTS, session.run(OUTPUTS, feeds), strict=True))


def check_branches_agree(path: Path) -> None:
    """The cache branch fed the no-cache branch's presents continues the same sequence."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(2, 6), dtype=np.int64)
    dummy = np.zeros((2, HEADS, 1, HEAD_DIM), np.float32)
    full = run_ort(path, {"input_ids": ids, "attention_mask": np.ones((2, 6), np.int64),
                          "use_cache_branch": np.array([False])}
                   | {f"past_key_values.{i}.{kv}": dummy for i in range(LAYERS) for kv in ("key", "value")})
    prefix = run_ort(path, {"input_ids": ids[:, :5], "attention_mask": np.ones((2, 5), np.int64),
                            "use_cache_branch": np.array([False])}
                     | {f"past_key_values.{i}.{kv}": dummy for i in range(LAYERS) for kv in ("key", "value")})
    step = run_ort(path, {"input_ids": ids[:, 5:], "attention_mask": np.ones((2, 6), np.int64),
                          "use_cache_branch": np.array([True])}
                   | {f"past_key_values.{i}.{kv}": prefix[f"present.{i}.{kv}"]
                      for i in range(LAYERS) for kv in ("key", "value")})
    diff = np.abs(full["logits"][:, 5:] - step["logits"]).max()
    if not diff < 1e-4:
        raise SystemExit(f"cache branch disagrees with the no-cache branch: {diff}")


def main() -> None:
    model = build_model()
    folder = MODELS_DIR / "merged_decoder"
    folder.mkdir(exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, path)
    counts = collections.Counter(n.op_type for n in model.graph.node)
    for branch in (model.graph.node[0].attribute[0].g, model.graph.node[0].attribute[1].g):
        counts.update(n.op_type for n in branch.node)
    (folder / "ops.txt").write_text("".join(f"{op} {n}\n" for op, n in sorted(counts.items())))
    variants = {
        "merged_decoder": spec(True, {"batch": 2, "sequence_length": 3, "past_sequence_length": 5,
                                      "total_sequence_length": 8}),
        "merged_decoder_no_cache": spec(False, {"batch": 2, "sequence_length": 7, "past_sequence_length": 1,
                                                "total_sequence_length": 7}),
    }
    for name, variant in variants.items():
        (MODELS_DIR / name).mkdir(exist_ok=True)
        (MODELS_DIR / name / "inputs.json").write_text(json.dumps(variant, indent=2) + "\n")
        # The inputs the tests build must run in ORT with the expected outputs.
        feeds = build_inputs(variant["inputs"], variant["dims"], np.random.default_rng(1234))
        outs = run_ort(path, feeds)
        assert list(outs) == OUTPUTS
    check_branches_agree(path)
    print(path)


if __name__ == "__main__":
    main()
