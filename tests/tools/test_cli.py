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


# ------------------------------------------------------------ hostile files
# Each must be a clear error: exit code 1 (not a signal), a message that says
# what is wrong, and no hang (the timeout fails the test instead).

def cli_quick(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)


def save_model(path: Path, nodes, inputs, outputs, initializers=(), functions=(), opsets=(("", 18),)):
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, functions=list(functions),
                              opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    onnx.save(model, path)
    return model


def test_external_data_that_is_a_fifo_is_refused(tmp_path):
    from onnx import TensorProto, helper

    weights = helper.make_tensor("w", TensorProto.FLOAT, [2], [0.0, 0.0])
    weights.data_location = TensorProto.EXTERNAL
    del weights.float_data[:]
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", "8")):
        entry = weights.external_data.add()
        entry.key, entry.value = key, value
    save_model(tmp_path / "m.onnx", [helper.make_node("Identity", ["w"], ["y"])], [],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializers=[weights])
    os.mkfifo(tmp_path / "w.bin")
    for command in ("info", "run"):
        result = cli_quick(command, str(tmp_path / "m.onnx"))
        assert result.returncode == 1, result.stderr
        assert "w.bin: is a FIFO" in result.stderr and "must be regular files" in result.stderr


def test_function_bomb_is_refused(tmp_path):
    from onnx import TensorProto, helper

    functions = []
    for level in range(16):  # each calls the next 4 times: 4^15 nodes
        if level == 15:
            nodes = [helper.make_node("Relu", ["x"], ["y"])]
        else:
            names = ["x", "t0", "t1", "t2", "y"]
            nodes = [helper.make_node(f"F{level + 1}", [names[i]], [names[i + 1]], domain="bomb") for i in range(4)]
        functions.append(helper.make_function("bomb", f"F{level}", ["x"], ["y"], nodes,
                                              [helper.make_opsetid("", 18)]))
    model = save_model(tmp_path / "bomb.onnx", [helper.make_node("F0", ["x"], ["y"], domain="bomb")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                       functions=functions, opsets=(("", 18), ("bomb", 1)))
    assert len(model.SerializeToString()) < 2500
    result = cli_quick("info", str(tmp_path / "bomb.onnx"))
    assert result.returncode == 1, result.stderr
    assert "inlining function 'F0' would create more than the cap of 4194304 inlined nodes" in result.stderr


def test_sparse_initializer_with_a_huge_dense_shape_is_refused(tmp_path):
    from onnx import TensorProto, helper

    values = helper.make_tensor("s", TensorProto.FLOAT, [1], [1.0])
    indices = helper.make_tensor("", TensorProto.INT64, [1], [0])
    sparse = helper.make_sparse_tensor(values, indices, [2**20, 2**20])
    import onnx

    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**20, 2**20])],
                              sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "sparse.onnx")
    assert len(model.SerializeToString()) < 300
    for command in ("info", "run"):
        result = cli_quick(command, str(tmp_path / "sparse.onnx"))
        assert result.returncode == 1, result.stderr
        assert "sparse tensor of dims [1048576,1048576] would densify to 4398046511104 bytes" in result.stderr


def relu_model(path: Path, dims) -> None:
    from onnx import TensorProto, helper

    save_model(path, [helper.make_node("Relu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])


def test_input_dim_beyond_int32_is_an_error_not_truncated(tmp_path):
    relu_model(tmp_path / "m.onnx", [2**32 + 1])
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    assert "input 'x': dimension 0 is 4294967297" in result.stderr
    assert "outside the int32 range of MLX shapes" in result.stderr
    np.save(tmp_path / "x.npy", np.ones(1, dtype=np.float32))
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}")
    assert result.returncode == 1, result.stderr
    assert "input 'x': dimension 0 is declared 4294967297, beyond the int32 range" in result.stderr


def test_random_fill_larger_than_memory_is_an_error(tmp_path):
    relu_model(tmp_path / "m.onnx", [2**20, 2**20])
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    assert "input 'x': filling shape [1048576, 1048576] at random needs 4398046511104 bytes" in result.stderr
    assert "physical memory" in result.stderr


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_negative_dim_value_is_dynamic(tmp_path, mode):
    relu_model(tmp_path / "m.onnx", [-1, 3])
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--mode", mode, "--output-dir", str(tmp_path / "a"))
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "a" / "y.npy").shape == (1, 3)
    x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--mode", mode, "--input", f"x={tmp_path / 'x.npy'}",
                       "--output-dir", str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "b" / "y.npy"), np.maximum(x, 0))


def test_bad_npy_inputs_are_clear_errors(tmp_path):
    relu_model(tmp_path / "m.onnx", [-1, 3])
    shape = "1, " * 16000  # a 48 KB header overflowed std::regex's stack
    header = ("{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + ")}\n").encode()
    bad = tmp_path / "long.npy"
    bad.write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header + b"\0" * 4)
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--input", f"x={bad}")
    assert result.returncode == 1, result.stderr
    assert f"{bad}: malformed .npy header: shape has more than 64 dimensions" in result.stderr
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}\n"
    bad.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--input", f"x={bad}")
    assert result.returncode == 1, result.stderr
    assert "expected a dimension" in result.stderr and "stoll" not in result.stderr
    # More data than the shape holds.
    np.save(tmp_path / "x.npy", np.ones((2, 3), dtype=np.float32))
    data = (tmp_path / "x.npy").read_bytes()
    bad.write_bytes(data.replace(b"(2, 3)", b"(1, 3)"))
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--input", f"x={bad}")
    assert result.returncode == 1, result.stderr
    assert ".npy data is 24 bytes, but shape (1, 3) of <f4 needs exactly 12 bytes" in result.stderr


def test_bad_dim_option_is_a_clear_error(tmp_path):
    relu_model(tmp_path / "m.onnx", ["batch", 3])
    result = cli_quick("run", str(tmp_path / "m.onnx"), "--dim", "batch=lots")
    assert result.returncode == 1, result.stderr
    assert "--dim batch: expects a non-negative integer, got 'lots'" in result.stderr
