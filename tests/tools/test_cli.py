"""The `transmuter` command-line contract (DESIGN.md): info, run, bench,
conformance, and clear errors on bad input."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter"))
RESNET = ROOT / "tests" / "models" / "resnet" / "model.onnx"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)


def test_info_lists_inputs_outputs_and_ops():
    result = cli("info", str(RESNET))
    assert result.returncode == 0, result.stderr
    assert "pixel_values: float32 [batch, 3, 32, 32]" in result.stdout
    assert "pooler_output: float32 [batch, 48, 1, 1]" in result.stdout
    assert "Conv 12" in result.stdout


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_run_fills_missing_inputs_and_writes_every_output(tmp_path, mode):
    result = cli("run", str(RESNET), "--dim", "batch=2", "--mode", mode, "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "last_hidden_state.npy").shape == (2, 48, 2, 2)
    assert np.load(tmp_path / "pooler_output.npy").shape == (2, 48, 1, 1)


def test_run_takes_npy_inputs_and_is_deterministic(tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for out in ("a", "b"):
        result = cli("run", str(RESNET), "--input", f"pixel_values={tmp_path / 'x.npy'}", "--output-dir",
                     str(tmp_path / out))
        assert result.returncode == 0, result.stderr
    a = np.load(tmp_path / "a" / "pooler_output.npy")
    b = np.load(tmp_path / "b" / "pooler_output.npy")
    np.testing.assert_array_equal(a, b)


def test_output_names_are_sanitized(tmp_path):
    # The real model has an output called 'onnx::Shape_422'.
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["onnx::odd name/1"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("onnx::odd name/1", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "m.onnx")
    result = cli("run", str(tmp_path / "m.onnx"), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "onnx__odd_name_1.npy").exists()


def test_bench_reports_latency():
    result = cli("bench", str(RESNET), "--warmup", "1", "--runs", "3", "--mode", "compiled")
    assert result.returncode == 0, result.stderr
    assert "latency_ms: mean" in result.stdout


def test_truncated_model_is_a_clear_error(tmp_path):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(RESNET.read_bytes()[:1000])
    result = cli("info", str(bad))
    assert result.returncode == 1
    assert str(bad) in result.stderr and "truncated" in result.stderr


def test_unsupported_op_lists_it(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    result = cli("run", str(tmp_path / "m.onnx"))
    assert result.returncode == 1
    assert "ai.onnx NoSuchOp (opset 18)" in result.stderr


def test_wrong_input_dtype_is_a_clear_error(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 32, 32), dtype=np.int32))
    result = cli("run", str(RESNET), "--input", f"pixel_values={tmp_path / 'x.npy'}")
    assert result.returncode == 1
    assert "input 'pixel_values': expected dtype float32, got int32" in result.stderr


def test_bad_arguments_are_errors():
    assert cli("run").returncode != 0
    assert cli("run", str(RESNET), "--mode", "fast").returncode == 1
    assert cli("frobnicate").returncode == 2


def test_conformance_ends_with_the_count_line(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    case = tmp_path / "cases" / "test_neg_tiny"
    (case / "test_data_set_0").mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), case / "model.onnx")
    x = np.array([1.0, -2.0], dtype=np.float32)
    (case / "test_data_set_0" / "input_0.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())
    (case / "test_data_set_0" / "output_0.pb").write_bytes(numpy_helper.from_array(-x).SerializeToString())
    result = cli("conformance", "--cases", str(tmp_path / "cases"), "--mode", "both")
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().splitlines()[-1] == "2 passed, 0 failed, 0 skipped"
    # A wrong expected output is a failure and a non-zero exit.
    (case / "test_data_set_0" / "output_0.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())
    result = cli("conformance", "--cases", str(tmp_path / "cases"), "--mode", "eager")
    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1] == "0 passed, 1 failed, 0 skipped"
