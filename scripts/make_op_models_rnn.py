#!/usr/bin/env python3
"""Build the small recurrent and audio models of tests/models/ with onnx.helper.

    .venv/bin/python scripts/make_op_models_rnn.py [--only NAME ...]

Writes tests/models/<name>/{model.onnx, inputs.json, ops.txt} for:
    lstm_sequence    two LSTM layers (bidirectional with peepholes and initial
                     states, then forward) over variable-length sequences
                     whose lengths come from the attention mask
    gru_sequence     a bidirectional GRU (linear_before_reset=1, PyTorch's
                     form) and a reverse GRU (linear_before_reset=0, initial
                     state), variable lengths as above
    stft_mel_frontend  an audio front end: STFT with a Hann window ->
                     magnitude -> MelWeightMatrix matmul -> log

Weights are deterministic (numpy default_rng with fixed seeds). Each model is
run once in ONNX Runtime (graph optimizations off) with the inputs the model
tests build, so a graph ORT cannot run fails here. onnx + onnxruntime + numpy
only.
"""

from __future__ import annotations

import argparse
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
SEED = 20261130


def weights(rng: np.random.Generator, name: str, shape: list[int], scale: float = 0.4) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def int64s(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def lengths_from_mask(nodes: list, mask: str, out: str) -> None:
    """sequence_lens (int32 [batch]) = number of ones in each mask row."""
    nodes.append(helper.make_node("ReduceSum", [mask, "axis_1"], [out + "_i64"], keepdims=0))
    nodes.append(helper.make_node("Cast", [out + "_i64"], [out], to=TensorProto.INT32))


def sequence_input_spec(features: int) -> list[dict]:
    return [
        {"name": "features", "dtype": "float32", "shape": ["batch", "time", features], "kind": "float"},
        {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "time"], "kind": "attention_mask"},
    ]


def lstm_sequence() -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(SEED)
    features, hidden1, hidden2, classes = 8, 6, 5, 3
    init = [
        int64s("axis_1", [1]),
        weights(rng, "W1", [2, 4 * hidden1, features]),
        weights(rng, "R1", [2, 4 * hidden1, hidden1]),
        weights(rng, "B1", [2, 8 * hidden1], 0.2),
        weights(rng, "P1", [2, 3 * hidden1], 0.3),
        weights(rng, "H1", [2, 1, hidden1], 0.5),
        weights(rng, "C1", [2, 1, hidden1], 0.5),
        int64s("merged_shape", [0, 0, 2 * hidden1]),
        weights(rng, "W2", [1, 4 * hidden2, 2 * hidden1]),
        weights(rng, "R2", [1, 4 * hidden2, hidden2]),
        weights(rng, "B2", [1, 8 * hidden2], 0.2),
        weights(rng, "head_W", [hidden2, classes]),
        weights(rng, "head_b", [classes], 0.1),
    ]
    nodes = []
    lengths_from_mask(nodes, "attention_mask", "lengths")
    nodes += [
        helper.make_node("Transpose", ["features"], ["x"], perm=[1, 0, 2]),  # [T, B, F]
        # Initial states [2, 1, H] broadcast over the batch through Expand.
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "axis_1"], ["batch"], axis=0),
        helper.make_node("Concat", ["two", "batch", "hidden1"], ["state_shape"], axis=0),
        helper.make_node("Expand", ["H1", "state_shape"], ["h1"]),
        helper.make_node("Expand", ["C1", "state_shape"], ["c1"]),
        helper.make_node(
            "LSTM",
            ["x", "W1", "R1", "B1", "lengths", "h1", "c1", "P1"],
            ["y1", "", "cell_state"],
            hidden_size=hidden1,
            direction="bidirectional",
        ),
        helper.make_node("Transpose", ["y1"], ["y1_t"], perm=[0, 2, 1, 3]),  # [T, B, 2, H]
        helper.make_node("Reshape", ["y1_t", "merged_shape"], ["x2"]),  # [T, B, 2H]
        helper.make_node(
            "LSTM", ["x2", "W2", "R2", "B2", "lengths"], ["y2", "h2"], hidden_size=hidden2, clip=3.0
        ),
        helper.make_node("Squeeze", ["y2", "axis_1"], ["y2_s"]),
        helper.make_node("Transpose", ["y2_s"], ["sequence"], perm=[1, 0, 2]),  # [B, T, H]
        helper.make_node("Squeeze", ["h2", "axis_0"], ["last"]),
        helper.make_node("MatMul", ["last", "head_W"], ["scores"]),
        helper.make_node("Add", ["scores", "head_b"], ["logits"]),
    ]
    init += [int64s("two", [2]), int64s("hidden1", [hidden1]), int64s("axis_0", [0])]
    graph = helper.make_graph(
        nodes,
        "lstm_sequence",
        [
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "time", features]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "time"]),
        ],
        [
            helper.make_tensor_value_info("sequence", TensorProto.FLOAT, ["batch", "time", hidden2]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes]),
            helper.make_tensor_value_info("cell_state", TensorProto.FLOAT, [2, "batch", hidden1]),
        ],
        init,
    )
    spec = {"dims": {"batch": 2, "time": 7}, "inputs": sequence_input_spec(features)}
    return graph, spec


def gru_sequence() -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(SEED + 1)
    features, hidden1, hidden2 = 6, 5, 4
    init = [
        int64s("axis_1", [1]),
        weights(rng, "W1", [2, 3 * hidden1, features]),
        weights(rng, "R1", [2, 3 * hidden1, hidden1]),
        weights(rng, "B1", [2, 6 * hidden1], 0.2),
        int64s("merged_shape", [0, 0, 2 * hidden1]),
        weights(rng, "W2", [1, 3 * hidden2, 2 * hidden1]),
        weights(rng, "R2", [1, 3 * hidden2, hidden2]),
        weights(rng, "B2", [1, 6 * hidden2], 0.2),
        weights(rng, "H2", [1, 2, hidden2], 0.5),  # one initial state per batch entry
    ]
    nodes = []
    lengths_from_mask(nodes, "attention_mask", "lengths")
    nodes += [
        helper.make_node("Transpose", ["features"], ["x"], perm=[1, 0, 2]),
        helper.make_node(
            "GRU",
            ["x", "W1", "R1", "B1", "lengths"],
            ["y1", "final_states"],
            hidden_size=hidden1,
            direction="bidirectional",
            linear_before_reset=1,
        ),
        helper.make_node("Transpose", ["y1"], ["y1_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["y1_t", "merged_shape"], ["x2"]),
        helper.make_node(
            "GRU",
            ["x2", "W2", "R2", "B2", "lengths", "H2"],
            ["y2", ""],
            hidden_size=hidden2,
            direction="reverse",
        ),
        helper.make_node("Squeeze", ["y2", "axis_1"], ["y2_s"]),
        helper.make_node("Transpose", ["y2_s"], ["sequence"], perm=[1, 0, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "gru_sequence",
        [
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "time", features]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "time"]),
        ],
        [
            helper.make_tensor_value_info("sequence", TensorProto.FLOAT, ["batch", "time", hidden2]),
            helper.make_tensor_value_info("final_states", TensorProto.FLOAT, [2, "batch", hidden1]),
        ],
        init,
    )
    # H2 holds one initial state per batch entry, so the batch is fixed at 2.
    spec = {"dims": {"batch": 2, "time": 9}, "inputs": sequence_input_spec(features)}
    return graph, spec


def stft_mel_frontend() -> tuple[onnx.ModelProto, dict]:
    frame_length, frame_step, mel_bins, sample_rate = 64, 16, 12, 16000
    init = [
        int64s("axis_2", [2]),
        numpy_helper.from_array(np.array(frame_length, dtype=np.int64), "frame_length"),
        numpy_helper.from_array(np.array(frame_step, dtype=np.int64), "frame_step"),
        numpy_helper.from_array(np.array(mel_bins, dtype=np.int64), "num_mel_bins"),
        numpy_helper.from_array(np.array(sample_rate, dtype=np.int64), "sample_rate"),
        numpy_helper.from_array(np.array(60.0, dtype=np.float32), "lower_edge_hertz"),
        numpy_helper.from_array(np.array(7600.0, dtype=np.float32), "upper_edge_hertz"),
        numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "log_offset"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["waveform", "axis_2"], ["signal"]),  # [B, N, 1] real
        helper.make_node("HannWindow", ["frame_length"], ["window"]),
        helper.make_node("STFT", ["signal", "frame_step", "window"], ["spectrum"], onesided=1),
        # |X| of the complex [..., 2] spectrum.
        helper.make_node("ReduceSumSquare", ["spectrum"], ["power"], axes=[-1], keepdims=0),
        helper.make_node("Sqrt", ["power"], ["magnitude"]),  # [B, frames, bins]
        helper.make_node(
            "MelWeightMatrix",
            ["num_mel_bins", "frame_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"],
            ["mel_weights"],
        ),
        helper.make_node("MatMul", ["magnitude", "mel_weights"], ["mel"]),
        helper.make_node("Add", ["mel", "log_offset"], ["mel_offset"]),
        helper.make_node("Log", ["mel_offset"], ["log_mel"]),
    ]
    graph = helper.make_graph(
        nodes,
        "stft_mel_frontend",
        [helper.make_tensor_value_info("waveform", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("log_mel", TensorProto.FLOAT, ["batch", "frames", mel_bins])],
        init,
    )
    spec = {
        "dims": {"batch": 2, "samples": 400},
        "inputs": [{"name": "waveform", "dtype": "float32", "shape": ["batch", "samples"], "kind": "float"}],
    }
    return graph, spec


MODELS = {"lstm_sequence": lstm_sequence, "gru_sequence": gru_sequence, "stft_mel_frontend": stft_mel_frontend}


def write(name: str) -> None:
    graph, spec = MODELS[name]()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="transmuter")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    directory = MODELS_DIR / name
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    onnx.save(model, str(path))

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    inputs = build_inputs(spec["inputs"], spec["dims"], np.random.default_rng(1234))
    results = session.run(outputs, inputs)

    full_spec = {
        "model": name,
        "opset": OPSET,
        "dims": spec["dims"],
        "inputs": spec["inputs"],
        "outputs": outputs,
        "generated_by": "scripts/make_op_models_rnn.py",
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
    }
    (directory / "inputs.json").write_text(json.dumps(full_spec, indent=2) + "\n")
    counts = collections.Counter(node.op_type for node in model.graph.node)
    (directory / "ops.txt").write_text("".join(f"{op} {n}\n" for op, n in sorted(counts.items())))
    shapes = ", ".join(f"{o} {list(r.shape)}" for o, r in zip(outputs, results, strict=True))
    print(f"{name}: {path.stat().st_size} bytes; ORT outputs {shapes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS), help="build only these models")
    args = parser.parse_args()
    for name in args.only or sorted(MODELS):
        write(name)


if __name__ == "__main__":
    main()
