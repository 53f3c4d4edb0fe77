#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer targets in tests/fuzz/.

    .venv/bin/python tests/fuzz/make_corpus.py      # rewrites tests/fuzz/corpus/

Seeds are small valid inputs that reach deep into each reader: tiny graphs
covering initializers of several dtypes, attributes of every kind, a
subgraph (If), a model-local function, a sparse initializer and external data
(weights.bin, the 64-byte file fuzz_model_bytes puts next to the model), the
ResNet test model from tests/models; and a few .npy files. The load+run
target gets the models it can run (no external data).
"""
import io
import pathlib
import shutil

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
OPSET = [helper.make_opsetid("", 17)]
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def model(nodes, inputs, outputs, initializers=(), functions=(), sparse=(), opsets=OPSET):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers), sparse_initializer=list(sparse))
    m = helper.make_model(graph, opset_imports=opsets, functions=list(functions), ir_version=8)
    onnx.checker.check_model(m)
    return m


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def add_relu():
    # Y = Relu(X + W), X with a symbolic batch dim.
    return model([helper.make_node("Add", ["X", "W"], ["S"]), helper.make_node("Relu", ["S"], ["Y"])],
                 [vi("X", F, ["batch", 3])], [vi("Y", F, ["batch", 3])],
                 [init("W", np.array([1, -2, 3], np.float32))])


def gemm_softmax():
    return model([helper.make_node("Gemm", ["A", "B", "C"], ["G"], alpha=0.5, transB=1),
                  helper.make_node("Softmax", ["G"], ["Y"], axis=-1)],
                 [vi("A", F, [2, 3])], [vi("Y", F, [2, 4])],
                 [init("B", np.arange(12, dtype=np.float32).reshape(4, 3)), init("C", np.ones(4, np.float32))])


def conv_pool():
    return model([helper.make_node("Conv", ["X", "W"], ["C"], pads=[1, 1, 1, 1], strides=[1, 1]),
                  helper.make_node("MaxPool", ["C"], ["Y"], kernel_shape=[2, 2], strides=[2, 2])],
                 [vi("X", F, [1, 1, 4, 4])], [vi("Y", F, [1, 2, 2, 2])],
                 [init("W", np.full((2, 1, 3, 3), 0.1, np.float32))])


def shape_ops():
    # Host-value inputs: Reshape's shape, Gather's indices, Slice's starts/ends.
    nodes = [helper.make_node("Reshape", ["X", "shape"], ["R"]),
             helper.make_node("Gather", ["R", "idx"], ["G"], axis=1),
             helper.make_node("Slice", ["G", "starts", "ends"], ["S"]),
             helper.make_node("Transpose", ["S"], ["T"], perm=[1, 0]),
             helper.make_node("Concat", ["T", "T"], ["Y"], axis=0)]
    return model(nodes, [vi("X", F, [2, 3])], [vi("Y", F, [4, 2])],
                 [init("shape", np.array([3, 2], np.int64)), init("idx", np.array([1, 0], np.int64)),
                  init("starts", np.array([0], np.int64)), init("ends", np.array([2], np.int64))])


def int_ops():
    nodes = [helper.make_node("Cast", ["X"], ["C"], to=TensorProto.FLOAT),
             helper.make_node("ReduceMean", ["C"], ["M"], keepdims=1),
             helper.make_node("ConstantOfShape", ["dims"], ["Z"], value=helper.make_tensor("v", I64, [1], [2])),
             helper.make_node("Expand", ["X", "dims"], ["E"]),
             helper.make_node("Mul", ["E", "Z"], ["Y"])]
    return model(nodes, [vi("X", I64, [2, 1])], [vi("Y", I64, [2, 3]), vi("M", F, [1, 1])],
                 [init("dims", np.array([2, 3], np.int64))])


def if_subgraph():
    then = helper.make_graph([helper.make_node("Neg", ["X"], ["T"])], "then", [], [vi("T", F, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["X"], ["E"])], "else", [], [vi("E", F, [2])])
    return model([helper.make_node("If", ["cond"], ["Y"], then_branch=then, else_branch=other)],
                 [vi("cond", TensorProto.BOOL, []), vi("X", F, [2])], [vi("Y", F, [2])])


def local_function():
    # A model-local function calling another: exercises the inliner.
    inner = helper.make_function("local", "Double", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                 OPSET)
    outer = helper.make_function("local", "Quad", ["a"], ["c"],
                                 [helper.make_node("Double", ["a"], ["t"], domain="local"),
                                  helper.make_node("Double", ["t"], ["c"], domain="local")],
                                 OPSET + [helper.make_opsetid("local", 1)])
    opsets = OPSET + [helper.make_opsetid("local", 1)]
    return model([helper.make_node("Quad", ["X"], ["Y"], domain="local")],
                 [vi("X", F, [3])], [vi("Y", F, [3])], functions=[inner, outer], opsets=opsets)


def typed_initializers():
    # Initializers of several dtypes, raw and typed fields, summed after casts.
    inits = [init("f16", np.array([1, 2], np.float16)), init("i8", np.array([-1, 2], np.int8)),
             init("u8", np.array([3, 4], np.uint8)), init("b", np.array([True, False])),
             init("d", np.array([0.5, 1.5], np.float64)),
             helper.make_tensor("i32", TensorProto.INT32, [2], [5, 6]),  # int32_data, not raw
             helper.make_tensor("bf", TensorProto.BFLOAT16, [2], [1.0, 2.0])]
    nodes, last = [], "X"
    for i, t in enumerate(["f16", "i8", "u8", "b", "d", "i32", "bf"]):
        nodes.append(helper.make_node("Cast", [t], [f"c{i}"], to=F))
        nodes.append(helper.make_node("Add", [last, f"c{i}"], [f"s{i}"]))
        last = f"s{i}"
    nodes.append(helper.make_node("Identity", [last], ["Y"]))
    return model(nodes, [vi("X", F, [2])], [vi("Y", F, [2])], inits)


def sparse_initializer():
    values = helper.make_tensor("S", F, [2], [1.0, 2.0])
    indices = helper.make_tensor("S_idx", I64, [2], [0, 3])
    sparse = helper.make_sparse_tensor(values, indices, [4])
    return model([helper.make_node("Add", ["X", "S"], ["Y"])], [vi("X", F, [4])], [vi("Y", F, [4])],
                 sparse=[sparse])


def external_data():
    # 4 floats at offset 16 of weights.bin (next to the model in fuzz_model_bytes).
    w = TensorProto(name="W", data_type=F, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "16"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Y"])], "g", [vi("X", F, [4])],
                              [vi("Y", F, [4])], [w])
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


RUNNABLE = {"add_relu": add_relu, "gemm_softmax": gemm_softmax, "conv_pool": conv_pool,
            "shape_ops": shape_ops, "int_ops": int_ops, "if_subgraph": if_subgraph,
            "local_function": local_function, "typed_initializers": typed_initializers,
            "sparse_initializer": sparse_initializer}


def npy_bytes(array, version=None):
    out = io.BytesIO()
    if version is None:
        np.save(out, array)
    else:
        np.lib.format.write_array(out, array, version=version)
    return out.getvalue()


def write(folder, name, data):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    for name, make in RUNNABLE.items():
        data = make().SerializeToString()
        write(CORPUS / "model_bytes", f"{name}.onnx", data)
        write(CORPUS / "load_run", f"{name}.onnx", data)
    write(CORPUS / "model_bytes", "external_data.onnx", external_data().SerializeToString())
    resnet = (ROOT / "tests/models/resnet/model.onnx").read_bytes()
    write(CORPUS / "model_bytes", "resnet.onnx", resnet)
    write(CORPUS / "load_run", "resnet.onnx", resnet)

    npys = {"f32_2x3": np.arange(6, dtype=np.float32).reshape(2, 3),
            "i64_vector": np.array([1, -2, 3], np.int64), "bool_scalar": np.array(True),
            "f16_empty": np.zeros((0, 4), np.float16), "u8_3d": np.arange(8, dtype=np.uint8).reshape(2, 2, 2),
            "c64": np.array([1 + 2j], np.complex64), "f64_fortran": np.asfortranarray(np.eye(2))}
    for name, array in npys.items():
        write(CORPUS / "npy", f"{name}.npy", npy_bytes(array))
    write(CORPUS / "npy", "i32_v2.npy", npy_bytes(np.arange(3, dtype=np.int32), version=(2, 0)))
    write(CORPUS / "npy", "big_endian.npy", npy_bytes(np.arange(2, dtype=">i4")))


if __name__ == "__main__":
    main()
