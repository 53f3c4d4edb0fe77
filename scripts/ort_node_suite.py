#!/usr/bin/env python3
"""Run ONNX Runtime on the materialized ONNX node test cases, two ways.

The reference for docs/conformance.md's side-by-side table: the same cases
`transmuter conformance` runs (.cache/onnx-node-tests, made by
scripts/make_node_tests.py), run by ONNX Runtime with graph optimizations off,
compared the way onnx's backend runner compares (same dtype and shape,
|actual - expected| <= atol + rtol * |expected| with the case's data.json
tolerances, NaN equal to NaN, strings equal).

- strict: the case as it is. ORT refuses models that import an opset newer
  than it knows, and its Python binding cannot take NumPy arrays of bfloat16,
  float8, float4, int4/uint4 or int2/uint2 (ml_dtypes arrays).
- loadable: the two workarounds. A model whose default-domain opset is newer
  than ORT's is re-stamped with ORT's newest opset when no node's operator
  schema differs between the two, or the newer schema only added types the
  node does not use (so the model means the same thing); narrow
  dtype feeds are handed over as raw bits with their ONNX element type
  (OrtValue.ortvalue_from_numpy_with_onnx_type).

Writes one JSON object: {case: {"strict": status, "loadable": status}} where a
status is "passed", "failed: ..." (ran, wrong output) or "error: ..." (did not
load or run). Usage:

    ort_node_suite.py [--cases DIR] [--out tests/onnx_backend/ort_results.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ROOT / ".cache" / "onnx-node-tests"
DEFAULT_OUT = ROOT / "tests" / "onnx_backend" / "ort_results.json"

# ONNX element types whose NumPy form (ml_dtypes) ORT's binding rejects.
NARROW_TYPES = {
    onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
    onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ, onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
}
for _name in ("FLOAT4E2M1", "INT2", "UINT2", "FLOAT8E8M0"):
    if hasattr(onnx.TensorProto, _name):
        NARROW_TYPES.add(getattr(onnx.TensorProto, _name))


PACKED_TYPES = {getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
                if hasattr(onnx.TensorProto, n)}


def read_value(path: Path, type_proto: onnx.TypeProto):
    """A .pb input/output as Python values: ndarray, list (sequence) or None/value (optional)."""
    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    if type_proto.HasField("map_type"):
        mp = onnx.MapProto()
        mp.ParseFromString(data)
        return numpy_helper.to_dict(mp)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def read_case(case: Path, model: onnx.ModelProto):
    data_dir = case / "test_data_set_0"
    inputs, outputs = {}, []
    for i, info in enumerate(model.graph.input):
        file = data_dir / f"input_{i}.pb"
        if file.exists():
            inputs[info.name] = (read_value(file, info.type), info.type)
    for i, info in enumerate(model.graph.output):
        outputs.append(read_value(data_dir / f"output_{i}.pb", info.type))
    return inputs, outputs


def ort_max_ir_version() -> int:
    """The newest model IR version this ORT build accepts, found by trying."""
    for ir in range(20, 3, -1):
        model = onnx.helper.make_model(
            onnx.helper.make_graph(
                [onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
                [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
            opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=ir)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return ir
        except Exception:  # noqa: BLE001
            continue
    raise RuntimeError("ONNX Runtime accepts no IR version")


def ort_max_opset() -> int:
    """The newest default-domain opset this ORT build accepts, found by trying."""
    for opset in range(40, 6, -1):
        model = onnx.helper.make_model(
            onnx.helper.make_graph(
                [onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
                [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
            opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=10)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return opset
        except Exception:  # noqa: BLE001 - any refusal means "not this opset"
            continue
    raise RuntimeError("ONNX Runtime accepts no opset")


def schema_version(op_type: str, domain: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except Exception:  # noqa: BLE001 - unknown op or domain
        return None


def nodes_of(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from nodes_of(attr.g)
            for g in attr.graphs:
                yield from nodes_of(g)


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every named tensor the shape inference can type."""
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - leave untyped; the check then refuses
        pass
    types = {t.name: t.data_type for t in model.graph.initializer}
    for info in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if info.type.HasField("tensor_type"):
            types[info.name] = info.type.tensor_type.elem_type
    return types


def allowed_types(schema, formal) -> set[int] | None:
    """ONNX element types a formal parameter of `schema` accepts (None: not a plain tensor)."""
    constraint = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    strs = constraint.get(formal.type_str, [formal.type_str])
    out = set()
    for s in strs:
        if not s.startswith("tensor("):
            return None
        name = s[len("tensor("):-1].upper()
        name = {"FLOAT": "FLOAT", "BOOL": "BOOL"}.get(name, name)
        if name == "FLOAT16":
            out.add(onnx.TensorProto.FLOAT16)
        elif hasattr(onnx.TensorProto, name):
            out.add(getattr(onnx.TensorProto, name))
    return out


def same_meaning(node, old, new, types: dict[str, int]) -> bool:
    """True when the newer schema `new` only widened the types of `old` and
    the node's types are ones `old` already accepts (opset 27/28 mostly added
    types). Same inputs, outputs and attributes are required."""
    if [i.name for i in old.inputs] != [i.name for i in new.inputs] or \
            [o.name for o in old.outputs] != [o.name for o in new.outputs] or \
            set(old.attributes) != set(new.attributes):
        return False
    formals = list(zip(node.input, old.inputs)) + list(zip(node.output, old.outputs))
    for name, formal in formals:
        if not name:
            continue
        accepted = allowed_types(old, formal)
        if accepted is None or types.get(name) not in accepted:
            return False
    return True


def restamp_opset(model: onnx.ModelProto, max_opset: int, max_ir: int) -> onnx.ModelProto | None:
    """`model` with its default-domain opset lowered to `max_opset` when that
    changes no node's meaning; None when it would."""
    default = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not default or default[0].version <= max_opset:
        if model.ir_version <= max_ir:
            return model
        lowered = onnx.ModelProto()
        lowered.CopyFrom(model)
        lowered.ir_version = max_ir
        return lowered
    old_opset = default[0].version
    local_functions = {(f.domain, f.name) for f in model.functions}
    types = None
    for node in nodes_of(model.graph):
        if node.domain not in ("", "ai.onnx") or (node.domain, node.op_type) in local_functions:
            continue
        if schema_version(node.op_type, "", old_opset) == schema_version(node.op_type, "", max_opset):
            continue
        try:
            new = onnx.defs.get_schema(node.op_type, old_opset, "")
            old = onnx.defs.get_schema(node.op_type, max_opset, "")
        except Exception:  # noqa: BLE001 - the op did not exist at max_opset
            return None
        types = value_types(model) if types is None else types
        if not same_meaning(node, old, new, types):
            return None
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    for o in lowered.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max_opset
    # The IR version only versions the file format; this ORT reads the fields
    # these cases use at its own newest IR version.
    lowered.ir_version = min(lowered.ir_version, max_ir)
    return lowered


def feed(value, type_proto: onnx.TypeProto, raw_narrow: bool):
    """The ORT feed for one input; narrow dtypes as raw bits when `raw_narrow`."""
    if not raw_narrow or not type_proto.HasField("tensor_type"):
        return value
    elem = type_proto.tensor_type.elem_type
    if elem not in NARROW_TYPES or not isinstance(value, np.ndarray):
        return value
    if elem in PACKED_TYPES:
        # ORT wants these packed (2 or 4 per byte) with the logical shape,
        # which its NumPy entry point cannot express.
        raise ValueError(f"no way to feed packed {onnx.TensorProto.DataType.Name(elem)} to ORT's binding")
    bits = value.view(np.uint16 if value.dtype.itemsize == 2 else np.uint8)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, elem)


def as_numpy(value, expected):
    """An ORT output as NumPy; float8 outputs, which the binding cannot
    convert, are read as raw bytes and viewed as the expected ml_dtypes type."""
    if not isinstance(value, ort.OrtValue):
        return value
    try:
        return value.numpy()
    except Exception:  # noqa: BLE001 - no NumPy type for this element type
        expected = np.asarray(expected)
        if expected.dtype.itemsize != 1 or "float8" not in str(expected.dtype):
            raise
        count = int(np.prod(value.shape()))
        raw = (ctypes.c_uint8 * count).from_address(value.data_ptr())
        return np.frombuffer(bytes(raw), dtype=np.uint8).view(expected.dtype).reshape(value.shape())


def compare(expected, actual, rtol: float, atol: float, where: str) -> str | None:
    """None when equal the backend runner's way, else what differs."""
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{where}: sequence length differs"
        for i, (e, a) in enumerate(zip(expected, actual)):
            if (msg := compare(e, a, rtol, atol, f"{where}[{i}]")) is not None:
                return msg
        return None
    if expected is None or actual is None:
        return None if expected is None and actual is None else f"{where}: optional presence differs"
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.dtype == object or expected.dtype.kind in "US":
        return None if np.array_equal(expected.astype(str), np.asarray(actual).astype(str)) \
            else f"{where}: strings differ"
    if expected.dtype != actual.dtype:
        # ORT returns narrow types as their raw bit containers; compare bits then.
        if expected.dtype.itemsize == actual.dtype.itemsize and expected.dtype.kind == "V" or \
                str(expected.dtype) in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                        "float8_e5m2fnuz", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"):
            try:
                actual = actual.view(expected.dtype) if actual.dtype.itemsize == expected.dtype.itemsize \
                    else actual.astype(expected.dtype)
            except (TypeError, ValueError):
                return f"{where}: dtype {actual.dtype} != {expected.dtype}"
        else:
            return f"{where}: dtype {actual.dtype} != {expected.dtype}"
    if expected.shape != actual.shape:
        return f"{where}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind in "biu" or expected.dtype == bool:
        return None if np.array_equal(expected, actual) else f"{where}: values differ"
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    ok = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return None
    worst = np.nanmax(np.abs(np.where(ok, 0, a - e)))
    return f"{where}: {int((~ok).sum())} values differ (worst {worst:.3g})"


def run_case(case: Path, max_opset: int, max_ir: int, loadable: bool) -> str:
    try:
        model = onnx.load(case / "model.onnx")
        tolerances = json.loads((case / "data.json").read_text())
        inputs, expected = read_case(case, model)
    except Exception as e:  # noqa: BLE001
        return f"error: reading the case: {e}"[:300]
    if loadable:
        restamped = restamp_opset(model, max_opset, max_ir)
        if restamped is None:
            return "error: opset newer than ONNX Runtime's, with schemas that differ"
        model = restamped
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        feeds = {name: feed(value, tp, loadable) for name, (value, tp) in inputs.items()}
        names = [o.name for o in model.graph.output]
        if any(isinstance(v, ort.OrtValue) for v in feeds.values()):
            # run_with_ort_values takes OrtValues only: wrap the plain arrays too.
            feeds = {k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
                     for k, v in feeds.items()}
            actual = [as_numpy(v, e) for v, e in zip(session.run_with_ort_values(names, feeds), expected)]
        else:
            actual = session.run(names, feeds)
    except Exception as e:  # noqa: BLE001 - ORT raises many types
        return f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}"[:300]
    for i, (e, a) in enumerate(zip(expected, actual)):
        msg = compare(e, a, tolerances["rtol"], tolerances["atol"], f"output {i}")
        if msg is not None:
            return f"failed: {msg}"[:300]
    return "passed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    ort.set_default_logger_severity(4)
    max_opset, max_ir = ort_max_opset(), ort_max_ir_version()
    cases = sorted(p for p in args.cases.iterdir() if (p / "model.onnx").is_file())
    results = {}
    for case in cases:
        results[case.name] = {"strict": run_case(case, max_opset, max_ir, False),
                              "loadable": run_case(case, max_opset, max_ir, True)}
    summary = {way: sum(r[way] == "passed" for r in results.values()) for way in ("strict", "loadable")}
    document = {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "ort_max_opset": max_opset,
                "cases": len(cases), "passed": summary, "results": results}
    args.out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"onnxruntime {ort.__version__} on {len(cases)} cases: strict {summary['strict']} passed, "
          f"loadable {summary['loadable']} passed (opset <= {max_opset})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
