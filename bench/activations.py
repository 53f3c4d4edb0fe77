"""The activations of one inference: the most bytes of intermediate values an executor running the
graph's nodes in their file order must hold at once, each value freed after its last reader.

Issue 8's memory target is peak RSS <= 1.1x (the weights + the activations); this is the second term.
The graph's inputs and outputs count as live throughout (the caller holds them). Shapes come from
ONNX shape inference with the inputs' dims fixed; values it leaves without a concrete shape (the
Reshape targets that Shape -> Gather -> Concat chains compute) are measured by one ONNX Runtime run
(optimizations off, so every value of the file exists) that returns just those values.

    .venv/bin/python bench/activations.py MODEL.onnx NAME=D0xD1x... [NAME=...]   (prints MiB)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import shape_inference


def _fixed_input_model(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for d, size in zip(dims, shapes[value.name]):
                d.Clear()
                d.dim_value = int(size)
    return fixed


def _bytes_of(value: onnx.ValueInfoProto) -> int | None:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape") or tensor.elem_type == 0:
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if any(d is None for d in dims):
        return None
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
    return int(np.prod(dims, dtype=np.int64)) * itemsize


def value_bytes(model: onnx.ModelProto, model_path: Path, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    """Bytes of every node output of the main graph of `model` (loaded from model_path, weights left in
    the file) for these inputs."""
    shapes = {name: array.shape for name, array in inputs.items()}
    inferred = shape_inference.infer_shapes(_fixed_input_model(model, shapes), data_prop=True)
    known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}
    sizes: dict[str, int] = {}
    missing: list[str] = []
    for node in model.graph.node:
        for name in node.output:
            if not name:
                continue
            size = _bytes_of(known[name]) if name in known else None
            if size is None:
                missing.append(name)
            else:
                sizes[name] = size
    if missing:
        sizes.update(_measured_bytes(model_path, inputs, missing))
    return sizes


def _measured_bytes(model_path: Path, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, int]:
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    declared = {o.name for o in model.graph.output}
    for name in names:
        if name not in declared:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    values = session.run(names, inputs)
    return {name: int(np.asarray(v).nbytes) for name, v in zip(names, values)}


def peak_live_bytes(model_path: Path, inputs: dict[str, np.ndarray]) -> int:
    """The peak over the node order of the bytes of live values (see the module's docstring)."""
    model = onnx.load(str(model_path), load_external_data=False)
    sizes = value_bytes(model, model_path, inputs)
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    held = {o.name for o in graph.output}
    last_reader: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in initializers:
                last_reader[name] = i
    live = sum(int(a.nbytes) for a in inputs.values())
    peak = live
    for i, node in enumerate(graph.node):
        live += sum(sizes.get(name, 0) for name in node.output if name)
        peak = max(peak, live)
        for name in set(node.input) | set(node.output):
            if name in sizes and name not in held and last_reader.get(name, -1) <= i:
                live -= sizes.pop(name)
    return peak


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    model = onnx.load(sys.argv[1], load_external_data=False)
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
    inputs = {}
    for arg in sys.argv[2:]:
        name, dims = arg.split("=")
        inputs[name] = np.zeros([int(d) for d in dims.split("x")], types[name])
    print(f"{peak_live_bytes(Path(sys.argv[1]), inputs) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
