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
    # The histogram is of the graph after load-time passes: the 12 Convs (7 with
    # the Relu after them folded in) run channels-last; of the layout changes
    # only those at the borders remain: the two outputs (the stem reads the
    # 3-channel input channels-first, in place).
    assert "ai.transmuter.ConvNhwc 12" in result.stdout and "Transpose 2" in result.stdout


def test_info_with_one_pass_shows_its_rewrite():
    result = cli("info", str(RESNET), "--passes", "fuse_conv_activation")
    assert result.returncode == 0, result.stderr
    assert "Conv 5," in result.stdout and "com.microsoft.FusedConv 7" in result.stdout


def test_load_profile_prints_each_pass_and_phase():
    env = {**os.environ, "TRANSMUTER_LOAD_PROFILE": "1"}
    result = subprocess.run([BIN, "info", str(RESNET), "--passes", "fuse_conv_activation,channels_last_convs"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("load profile: ")]
    # The two selected passes with their rewrites (7 Conv + Relu pairs; 12 Convs), then the phases.
    assert any("fuse_conv_activation" in line and "7 rewrite(s)" in line for line in lines), lines
    assert any("channels_last_convs" in line and "12 rewrite(s)" in line for line in lines), lines
    for phase in ("reading the file", "passes (in all)", "binding"):
        assert any(phase in line for line in lines), (phase, lines)
    quiet = cli("info", str(RESNET))
    assert "load profile" not in quiet.stderr


def test_info_with_passes_off_shows_the_file_as_stored():
    result = cli("info", str(RESNET), "--passes", "none")
    assert result.returncode == 0, result.stderr
    assert "Conv 12" in result.stdout and "FusedConv" not in result.stdout


def test_an_unknown_passes_value_is_refused():
    result = cli("info", str(RESNET), "--passes", "some")
    assert result.returncode != 0
    assert "unknown load-time pass 'some' (passes: compute_in_float32, " in result.stderr
    assert "fold_batch_norm_into_conv, " in result.stderr and "pack_matmul_weights" in result.stderr
    result = cli("info", str(RESNET), "--passes", ",")
    assert result.returncode != 0
    assert "--passes expects default, none or pass names, got ','" in result.stderr


def test_passes_by_name_run_only_those():
    result = cli("info", str(RESNET), "--passes", "fold_batch_norm_into_conv")
    assert result.returncode == 0, result.stderr
    assert "Conv 12" in result.stdout and "FusedConv" not in result.stdout
    result = cli("info", str(RESNET), "--passes", "fuse_conv_activation,fold_batch_norm_into_conv")
    assert result.returncode == 0, result.stderr
    assert "com.microsoft.FusedConv 7" in result.stdout


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
    lines = result.stdout.strip().splitlines()
    for mode in ("eager", "compiled-static", "compiled-traced"):
        assert any(line.startswith(f"{mode}: 1 passed, 0 failed") for line in lines), result.stdout
    assert lines[-1] == "3 passed, 0 failed, 0 skipped"
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


# Shapes that are valid but far too large: the interpreter's memory limit refuses the output
# before MLX allocates it (docs/architecture.md, "Memory limit").
@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("case", ["ConstantOfShape", "Expand", "OneHot"])
def test_outputs_beyond_physical_memory_are_refused_before_allocation(tmp_path, mode, case):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    huge = np.array([1 << 17, 1 << 17], dtype=np.int64)  # 2^34 elements
    if case == "ConstantOfShape":
        nodes = [helper.make_node("ConstantOfShape", ["shape"], ["y"])]
        inits = [numpy_helper.from_array(huge, "shape")]
        inputs, out_type = [], TensorProto.FLOAT
    elif case == "Expand":
        nodes = [helper.make_node("Expand", ["x", "shape"], ["y"])]
        inits = [numpy_helper.from_array(huge, "shape")]
        inputs, out_type = [("x", TensorProto.FLOAT, [1])], TensorProto.FLOAT
    else:
        nodes = [helper.make_node("OneHot", ["x", "depth", "values"], ["y"])]
        inits = [numpy_helper.from_array(np.array(2**31 - 1, dtype=np.int64), "depth"),
                 numpy_helper.from_array(np.array([0, 1], dtype=np.float32), "values")]
        inputs, out_type = [("x", TensorProto.INT64, [8])], TensorProto.FLOAT
    model = _save_model(tmp_path / "m.onnx", nodes, inputs, [("y", out_type, None)], inits)
    result = cli_quick("run", str(model), "--mode", mode, "--output-dir", str(tmp_path / "out"))
    _assert_clear_error(result, "over the memory limit")
    assert f"[{case} v" in result.stderr


def _conformance_case(root, name, nodes, inputs, outputs, values_in, values_out):
    import onnx
    from onnx import helper, numpy_helper

    case = root / name
    (case / "test_data_set_0").mkdir(parents=True)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), case / "model.onnx")
    for prefix, values in (("input", values_in), ("output", values_out)):
        for i, v in enumerate(values):
            (case / "test_data_set_0" / f"{prefix}_{i}.pb").write_bytes(numpy_helper.from_array(v).SerializeToString())
    return case


def test_conformance_uses_the_case_tolerances_from_data_json(tmp_path):
    from onnx import TensorProto, helper

    x = np.array([1.0, -2.0], dtype=np.float32)
    case = _conformance_case(tmp_path / "cases", "test_neg_loose", [helper.make_node("Neg", ["x"], ["y"])],
                             [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])], [x], [-x + 0.25])
    result = cli("conformance", "--cases", str(tmp_path / "cases"), "--mode", "eager")
    assert result.stdout.strip().splitlines()[-1] == "0 passed, 1 failed, 0 skipped", result.stdout
    (case / "data.json").write_text('{"rtol": 0.0, "atol": 0.5}')
    result = cli("conformance", "--cases", str(tmp_path / "cases"), "--mode", "eager")
    assert result.stdout.strip().splitlines()[-1] == "1 passed, 0 failed, 0 skipped", result.stdout


def test_conformance_traced_mode_runs_host_input_ops_as_graph_breaks(tmp_path):
    from onnx import TensorProto, helper

    # Reshape's shape comes from a graph input: static in compiled-static, traced (a graph
    # break) in compiled-traced. Both must match.
    x = np.arange(6, dtype=np.float32)
    shape = np.array([2, 3], dtype=np.int64)
    _conformance_case(tmp_path / "cases", "test_reshape_fed", [helper.make_node("Reshape", ["x", "s"], ["y"])],
                      [("x", TensorProto.FLOAT, [6]), ("s", TensorProto.INT64, [2])],
                      [("y", TensorProto.FLOAT, [2, 3])], [x, shape], [x.reshape(2, 3)])
    result = cli("conformance", "--cases", str(tmp_path / "cases"), "--mode", "compiled")
    lines = result.stdout.strip().splitlines()
    assert "compiled-static: 1 passed, 0 failed" in result.stdout, result.stdout
    assert "compiled-traced: 1 passed, 0 failed" in result.stdout, result.stdout
    assert lines[-1] == "2 passed, 0 failed, 0 skipped"
