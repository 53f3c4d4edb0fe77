"""bench/coverage/run.py, the coverage matrix's runner, on a corpus made here from the repo's test models:
a matching file gets ✓, a file with an operator Transmuter lacks names it, a failed export is listed, and
a file whose outputs differ (a node perturbed in Transmuter's eager runs) names that node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter"))
BERT = ROOT / "tests" / "models" / "bert"


def make_corpus(folder: Path) -> None:
    files = []
    bert = folder / "bert" / "fp32"
    bert.mkdir(parents=True)
    shutil.copy(BERT / "model.onnx", bert / "model.onnx")
    spec = json.loads((BERT / "inputs.json").read_text())
    spec["dims_alt"] = {"batch": 1, "sequence_length": 11}
    (bert / "inputs.json").write_text(json.dumps(spec))
    files.append({"arch": "bert", "family": "text encoder", "flavour": "fp32", "path": "bert/fp32/model.onnx",
                  "status": "ok"})
    # ORT runs ai.onnx.ml LinearRegressor; Transmuter has no implementation of it.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])
    graph = helper.make_graph([helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                                                coefficients=[1.0, 2.0, 3.0], intercepts=[0.5])], "g", [x], [y])
    model = helper.make_model(graph, ir_version=9,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    regressor = folder / "regressor" / "fp32"
    regressor.mkdir(parents=True)
    onnx.save(model, str(regressor / "model.onnx"))
    (regressor / "inputs.json").write_text(json.dumps({"dims": {"n": 2}, "outputs": ["y"], "inputs": [
        {"name": "x", "dtype": "float32", "shape": ["n", 3], "kind": "float"}]}))
    files.append({"arch": "regressor", "family": "vision", "flavour": "fp32", "path": "regressor/fp32/model.onnx",
                  "status": "ok"})
    files.append({"arch": "gptj", "family": "decoder", "flavour": "fp32", "path": "gptj/fp32/model.onnx",
                  "status": "export_failed", "error": "RuntimeError: the exporter gave up"})
    (folder / "manifest.json").write_text(json.dumps({"versions": {"torch": "0"}, "files": files}))


def run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "coverage" / "run.py"), "--corpus",
                           str(tmp_path / "corpus"), "--transmuter", BIN, "--doc", str(tmp_path / "coverage.md"),
                           "--json", str(report), "--work", str(tmp_path / "work"), "--no-real", *extra],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, {r["arch"]: r for r in json.loads(report.read_text())["results"]}


def test_matrix_cells_and_totals(tmp_path):
    make_corpus(tmp_path / "corpus")
    _, results = run(tmp_path)
    assert results["bert"]["status"] == "match" and results["bert"]["modes_matched"] == ["compiled", "eager"]
    assert results["bert"]["worst"] < 1e-4
    assert results["regressor"]["status"] == "missing_op"
    assert results["regressor"]["detail"] == "ai.onnx.ml LinearRegressor"
    doc = (tmp_path / "coverage.md").read_text()
    assert "- **Matched ORT in both modes**: 1 of 2 files (50.0 %)." in doc
    assert "| regressor | ✗ missing ai.onnx.ml LinearRegressor |" in doc
    assert "| bert | ✓ " in doc
    assert "- gptj / fp32: RuntimeError: the exporter gave up" in doc


def surviving_node(tmp_path: Path, op_type: str) -> onnx.NodeProto:
    """A node of the file that is still there after the load-time passes (the runner runs with them)."""
    dump = tmp_path / "dump"
    subprocess.run([BIN, "run", str(BERT / "model.onnx"), "--dump-all", str(dump), "--output-dir", str(tmp_path)],
                   check=True, capture_output=True)
    kept = {n["name"] for n in json.loads((dump / "index.json").read_text())["nodes"]
            if n["op_type"] == op_type and n["outputs"][0].get("dtype") == "float32"}
    return next(n for n in onnx.load(str(BERT / "model.onnx")).graph.node if n.op_type == op_type and n.name in kept)


def test_a_divergence_is_traced_to_its_node(tmp_path):
    make_corpus(tmp_path / "corpus")
    node = surviving_node(tmp_path, "Reshape")
    proc, results = run(tmp_path, "--only", "bert", "--perturb-node", node.name)
    bert = results["bert"]
    assert bert["status"] == "mismatch" and bert["modes_matched"] == ["compiled"]  # only eager runs perturb
    first = bert["first_divergence"]
    assert (first["name"], first["op_type"], first["passes"]) == (node.name, "Reshape", "none")
    assert f"✗ Reshape '{node.name}'"[:80] in proc.stdout
