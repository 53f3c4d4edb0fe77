"""`transmuter run --dump-all` and scripts/diff, the first-divergence tool (issue 11): the dump holds
every node's outputs, and scripts/diff names the node whose output was made to differ (the CLI's
test-only --perturb-node), not one before it or after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter"))
BERT = ROOT / "tests" / "models" / "bert" / "model.onnx"
PYTHON = sys.executable


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)


def diff(tmp_path: Path, model: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    proc = subprocess.run([PYTHON, str(ROOT / "scripts" / "diff.py"), str(model), "--transmuter", BIN,
                           "--json", str(report), *extra], capture_output=True, text=True, timeout=600)
    return proc, json.loads(report.read_text())


def float_nodes(model: Path) -> list[onnx.NodeProto]:
    """Nodes of the file whose first output ORT reports as float (perturbable)."""
    m = onnx.load(str(model))
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    return [n for n in m.graph.node if n.output and types.get(n.output[0]) == TensorProto.FLOAT]


def test_dump_all_writes_every_node_output(tmp_path):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([[3, 5, 7]], dtype=np.int64))
    result = cli("run", str(BERT), "--passes", "none", "--input", f"input_ids={ids}", "--dim", "sequence_length=3",
                 "--dump-all", str(tmp_path / "dump"), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    index = json.loads((tmp_path / "dump" / "index.json").read_text())
    model = onnx.load(str(BERT))
    assert [n["name"] for n in index["nodes"]] == [n.name for n in model.graph.node]
    assert [n["op_type"] for n in index["nodes"]] == [n.op_type for n in model.graph.node]
    for node, proto in zip(index["nodes"], model.graph.node):
        assert node["inputs"] == list(proto.input)
        assert [o["name"] for o in node["outputs"]] == [o for o in proto.output if o]
        for out in node["outputs"]:
            value = np.load(tmp_path / "dump" / out["file"])
            assert list(value.shape) == out["shape"] and str(value.dtype) == out["dtype"]
    # The graph output's dumped value is the one `run` wrote.
    last = {o["name"]: o["file"] for n in index["nodes"] for o in n["outputs"]}
    np.testing.assert_array_equal(np.load(tmp_path / "dump" / last["last_hidden_state"]),
                                  np.load(tmp_path / "out" / "last_hidden_state.npy"))


def test_dump_all_needs_eager_mode(tmp_path):
    result = cli("run", str(BERT), "--mode", "compiled", "--dump-all", str(tmp_path / "dump"))
    assert result.returncode != 0
    assert "--dump-all and --perturb-node need --mode eager" in result.stderr


def test_perturbing_an_unknown_node_is_an_error(tmp_path):
    result = cli("run", str(BERT), "--perturb-node", "no such node", "--output-dir", str(tmp_path))
    assert result.returncode != 0
    assert "--perturb-node: no node named 'no such node' ran" in result.stderr


def test_a_matching_model_has_no_divergence(tmp_path):
    proc, report = diff(tmp_path, BERT, "--dim", "sequence_length=5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["status"] == "match" and report["first_divergence"] is None
    outputs = [o for n in onnx.load(str(BERT)).graph.node for o in n.output if o]
    assert report["compared"] == len(outputs) and report["skipped"] == 0
    assert "no divergence" in proc.stdout


@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_diff_names_the_perturbed_node(tmp_path, position):
    candidates = float_nodes(BERT)
    node = {"first": candidates[0], "middle": candidates[len(candidates) // 2], "last": candidates[-1]}[position]
    proc, report = diff(tmp_path, BERT, "--dim", "sequence_length=5", "--perturb-node", node.name)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["status"] == "diverged"
    first = report["first_divergence"]
    assert (first["name"], first["op_type"], first["output"]) == (node.name, node.op_type, node.output[0])
    assert f"first divergence: node #{first['index']} '{node.name}' ({node.op_type})" in proc.stdout
    # The node's inputs are named with their shapes and dtypes.
    for name in node.input:
        if name:
            assert f"  input {name}: " in proc.stdout


def test_all_prints_every_value_and_marks_the_divergence(tmp_path):
    node = float_nodes(BERT)[10]
    proc, report = diff(tmp_path, BERT, "--perturb-node", node.name, "--all")
    assert proc.returncode == 1
    rows = [line for line in proc.stdout.splitlines() if line[:5].strip().isdigit()]
    assert len(rows) == report["compared"]
    marked = [line for line in rows if "beyond tolerance" in line]
    assert marked and node.name[:32] in marked[0]


def test_with_passes_on_fused_values_are_skipped_not_failed(tmp_path):
    proc, report = diff(tmp_path, BERT, "--passes", "default", "--dim", "sequence_length=5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["skipped"] > 0 and report["compared"] > 0  # the fused attention's inner values are gone


def test_an_unsupported_op_is_reported_as_transmuter_failing(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node("Frobnicate", ["r"], ["y"], name="odd", domain="com.example")],
                              "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "odd.onnx"
    onnx.save(model, str(path))
    proc, report = diff(tmp_path, path)
    assert proc.returncode == 2
    assert report["status"] == "both_failed"  # ORT does not know the op either
    ours = report["error"].split(" | ")[0]
    assert ours.startswith("transmuter: ") and "Frobnicate" in ours


def test_ort_sees_the_same_inputs(tmp_path):
    """The dump's values are compared with ORT on the inputs scripts/diff wrote (--keep)."""
    proc, _ = diff(tmp_path, BERT, "--keep", str(tmp_path / "work"), "--dim", "sequence_length=4")
    assert proc.returncode == 0
    session = ort.InferenceSession(str(BERT), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feeds = {name: np.load(tmp_path / "work" / "inputs" / f"input_{i}.npy") for i, name in enumerate(names)}
    assert feeds["input_ids"].shape == (1, 4) and feeds["input_ids"].dtype == np.int64
    np.testing.assert_array_equal(feeds["attention_mask"], np.ones((1, 4), np.int64))
    expected = session.run(["last_hidden_state"], feeds)[0]
    index = json.loads((tmp_path / "work" / "transmuter" / "index.json").read_text())
    files = {o["name"]: o["file"] for n in index["nodes"] for o in n["outputs"]}
    got = np.load(tmp_path / "work" / "transmuter" / files["last_hidden_state"])
    np.testing.assert_allclose(got, expected, atol=1e-5)
