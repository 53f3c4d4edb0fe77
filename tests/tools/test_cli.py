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


# --- Bad values inside operators (docs/architecture.md, "Bad values") --------------------------

def _save_model(path, nodes, inputs, outputs, initializers=()):
    """Writes a small opset-18 model; inputs/outputs are (name, elem_type, shape) triples."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def _assert_clear_error(result, message):
    # Exit code 1 (a negative code would be a signal) and the op's message.
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_gather_index_out_of_range_in_an_initializer_is_a_clear_error(tmp_path, mode):
    from onnx import TensorProto, numpy_helper

    model = _save_model(tmp_path / "m.onnx", [_node("Gather", ["data", "idx"], ["y"], "g")],
                        [("data", TensorProto.FLOAT, [5])], [("y", TensorProto.FLOAT, [1])],
                        [numpy_helper.from_array(np.array([7], dtype=np.int64), "idx")])
    result = cli("run", str(model), "--mode", mode, "--output-dir", str(tmp_path / "out"))
    _assert_clear_error(result, "[Gather v1] node 'g': index 7 out of range for axis 0 of size 5")


def test_gather_index_input_is_checked_eagerly_and_clamped_when_compiled(tmp_path):
    from onnx import TensorProto

    model = _save_model(tmp_path / "m.onnx", [_node("Gather", ["data", "idx"], ["y"], "g")],
                        [("data", TensorProto.FLOAT, [5]), ("idx", TensorProto.INT64, [2])],
                        [("y", TensorProto.FLOAT, [2])])
    data = np.arange(5, dtype=np.float32) + 10
    np.save(tmp_path / "data.npy", data)
    np.save(tmp_path / "idx.npy", np.array([1 << 40, -100], dtype=np.int64))
    args = ["run", str(model), "--input", f"data={tmp_path / 'data.npy'}", "--input",
            f"idx={tmp_path / 'idx.npy'}", "--output-dir", str(tmp_path / "out")]
    _assert_clear_error(cli(*args, "--mode", "eager"),
                        "[Gather v1] node 'g': index 1099511627776 out of range for axis 0 of size 5")
    result = cli(*args, "--mode", "compiled")
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), data[[4, 0]])


def test_scatter_nd_out_of_range_is_a_clear_error(tmp_path):
    from onnx import TensorProto, numpy_helper

    model = _save_model(tmp_path / "m.onnx", [_node("ScatterND", ["data", "idx", "upd"], ["y"], "s")],
                        [("data", TensorProto.FLOAT, [4]), ("upd", TensorProto.FLOAT, [1])],
                        [("y", TensorProto.FLOAT, [4])],
                        [numpy_helper.from_array(np.array([[1 << 20]], dtype=np.int64), "idx")])
    _assert_clear_error(cli("run", str(model)), "[ScatterND v11] node 's': index 1048576 out of range for axis 0")


def test_depth_to_space_huge_blocksize_is_a_clear_error_not_sigfpe(tmp_path):
    from onnx import TensorProto

    model = _save_model(tmp_path / "m.onnx", [_node("DepthToSpace", ["x"], ["y"], "d", blocksize=65536)],
                        [("x", TensorProto.FLOAT, [1, 4, 1, 1])], [("y", TensorProto.FLOAT, None)])
    _assert_clear_error(cli("run", str(model)), "[DepthToSpace v1] node 'd': channels 4 not divisible by "
                        "blocksize^2 = 4294967296")


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_constant_of_shape_whose_count_wraps_is_a_clear_error(tmp_path, mode):
    from onnx import TensorProto, numpy_helper

    model = _save_model(tmp_path / "m.onnx", [_node("ConstantOfShape", ["shape"], ["y"], "c")], [],
                        [("y", TensorProto.FLOAT, None)],
                        [numpy_helper.from_array(np.array([65536] * 4, dtype=np.int64), "shape")])
    _assert_clear_error(cli("run", str(model), "--mode", mode),
                        "[ConstantOfShape v9] node 'c': shape [65536, 65536, 65536, 65536] has more elements")


def test_pad_beyond_int32_is_a_clear_error_not_truncated(tmp_path):
    from onnx import TensorProto, numpy_helper

    model = _save_model(tmp_path / "m.onnx", [_node("Pad", ["x", "pads"], ["y"], "p")],
                        [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, None)],
                        [numpy_helper.from_array(np.array([(1 << 32) + 1, 0], dtype=np.int64), "pads")])
    _assert_clear_error(cli("run", str(model)), "[Pad v18] node 'p': padded size of axis 0 4294967299 does not "
                        "fit in int32")


def _node(op, inputs, outputs, name, **attributes):
    from onnx import helper

    return helper.make_node(op, inputs, outputs, name=name, **attributes)
