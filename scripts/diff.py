#!/usr/bin/env python3
"""Where does a model first go wrong? Runs MODEL in Transmuter and in ONNX Runtime with every
intermediate value exposed and prints the first node whose output differs beyond the tolerance.

    scripts/diff MODEL [--input NAME=FILE.npy]... [--dim NAME=VALUE]... [--seed N]
                 [--atol A] [--rtol R] [--all] [--json FILE] [--keep DIR] [--passes none|default]

Transmuter: `transmuter run MODEL --dump-all DIR` (eager; load-time passes off unless --passes default,
so that the values carry the file's names), which writes every node's outputs. ONNX Runtime: the same
model with every node output added as a graph output, graph optimizations off (ORT_DISABLE_ALL), so
that each node runs as written. Both read the same inputs: the files given, else seeded random values
(see make_input). The nodes are walked in the file's order (ONNX requires a topological one): a value
diverges when its shape or dtype differs, when integers or booleans differ at all, or when floats
differ by more than atol + rtol * |ORT's value| at any element (NaN must meet NaN). Values only one side
has (ORT cannot expose a subgraph's values; passes fuse nodes away) are skipped and counted.

Exit status: 0 when every compared value is within the tolerance, 1 at a divergence, 2 when either
engine fails to load or run the model (its error is printed; with --json also recorded, as status
transmuter_failed, onnxruntime_failed or both_failed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="value of a symbolic input dimension (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--int-high", type=int, default=16,
                   help="random integer inputs are drawn from [0, INT_HIGH) (default 16: valid token ids "
                        "and indices for most models)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: per dtype, see TOLERANCES)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: per dtype, see TOLERANCES)")
    p.add_argument("--all", action="store_true", help="print every compared value's error, not only the first "
                                                      "divergence")
    p.add_argument("--json", type=Path, help="write the result as JSON (for bench/coverage)")
    p.add_argument("--keep", type=Path, help="keep the inputs and Transmuter's dump in this folder")
    p.add_argument("--passes", default="none", help="Transmuter's --passes (default none: the file's own nodes)")
    p.add_argument("--transmuter", type=Path, default=REPO / "build" / "transmuter")
    p.add_argument("--timeout", type=float, default=600, help="seconds each engine may take")
    p.add_argument("--perturb-node", metavar="NAME", help=argparse.SUPPRESS)  # test-only: see tests/tools
    return p.parse_args(argv)


# ---- inputs -----------------------------------------------------------------------------------------------

def input_shape(value_info: onnx.ValueInfoProto, dims: dict[str, int]) -> list[int]:
    shape = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        else:
            shape.append(dims.get(d.dim_param, 1))
    return shape


def make_input(value_info: onnx.ValueInfoProto, dims: dict[str, int], rng: np.random.Generator,
               int_high: int) -> np.ndarray:
    """Seeded values that most models accept: masks of ones, position ids counting up, token type ids
    of zero, other integers in [0, int_high), floats from a standard normal."""
    tensor_type = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type"):
        raise SystemExit(f"input '{value_info.name}' is not a tensor: pass it with --input")
    dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    shape = input_shape(value_info, dims)
    name = value_info.name.lower()
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if "mask" in name:
        return np.ones(shape, dtype)
    if "position_ids" in name and shape:
        return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    if "token_type" in name:
        return np.zeros(shape, dtype)
    return rng.integers(0, int_high, size=shape).astype(dtype)


def prepare_inputs(model: onnx.ModelProto, args, folder: Path) -> dict[str, Path]:
    given = {}
    for spec in args.input:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--input expects NAME=FILE.npy, got {spec!r}")
        given[name] = Path(path)
    dims = {}
    for spec in args.dim:
        name, _, value = spec.partition("=")
        dims[name] = int(value)
    initializers = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(args.seed)
    files = {}
    folder.mkdir(parents=True, exist_ok=True)
    for value_info in model.graph.input:
        if value_info.name in initializers:
            continue
        if value_info.name in given:
            files[value_info.name] = given[value_info.name]
            continue
        path = folder / f"input_{len(files)}.npy"
        np.save(path, make_input(value_info, dims, rng, args.int_high))
        files[value_info.name] = path
    return files


# ---- the two engines --------------------------------------------------------------------------------------

@dataclass
class EngineFailure:
    engine: str
    message: str


def run_transmuter(args, inputs: dict[str, Path], dump: Path) -> dict | EngineFailure:
    """Transmuter's dump: value name -> (node index, file path)."""
    cmd = [str(args.transmuter), "run", str(args.model), "--mode", "eager", "--passes", args.passes,
           "--dump-all", str(dump), "--output-dir", str(dump / "outputs")]
    for name, path in inputs.items():
        cmd += ["--input", f"{name}={path}"]
    if args.perturb_node:
        cmd += ["--perturb-node", args.perturb_node]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return EngineFailure("transmuter", f"no result within {args.timeout:.0f} s")
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return EngineFailure("transmuter", lines[-1] if lines else f"exit status {proc.returncode}")
    index = json.loads((dump / "index.json").read_text())
    values = {}
    for node in index["nodes"]:
        for out in node["outputs"]:
            if "file" in out:
                values[out["name"]] = dump / out["file"]
    return values


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def run_ort(args, model: onnx.ModelProto, inputs: dict[str, Path]) -> dict | EngineFailure:
    """ORT's value of every node output of the top-level graph (optimizations off)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    declared = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in declared:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))  # ORT infers the type
                declared.add(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # the failure is reported below, once
    if has_external_data(model):  # the external files sit beside the original file
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         str(args.model.resolve().parent))
    feeds = {name: np.load(path) for name, path in inputs.items()}
    try:
        session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        results = session.run(names, feeds)
    except Exception as error:  # noqa: BLE001 - any ORT failure is reported, not raised
        return EngineFailure("onnxruntime", str(error).strip().splitlines()[0] if str(error).strip() else repr(error))
    return {name: value for name, value in zip(names, results)}


# ---- comparison -------------------------------------------------------------------------------------------

# (atol, rtol) by the float dtype compared, a few units in the last place of each: two engines that round
# in a different order agree to that, and a wrong op misses it by far (the perturbation in tests/tools moves
# every value by 10 %). Where the two sides' dtypes differ (a pass computing a float16 model in float32), the
# looser one applies.
TOLERANCES = {"float64": (1e-7, 1e-6), "float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)}


def tolerance(args, *dtypes) -> tuple[float, float]:
    atol, rtol = max((TOLERANCES.get(str(d), TOLERANCES["float32"]) for d in dtypes), key=lambda t: t[1])
    return (args.atol if args.atol is not None else atol, args.rtol if args.rtol is not None else rtol)

@dataclass
class Comparison:
    node_index: int
    node_name: str
    op_type: str
    output: str
    shape: tuple
    dtype: str
    max_abs: float | None = None  # None: not comparable as numbers (shape or dtype differs)
    max_rel: float | None = None
    within: bool = True
    reason: str = ""


def compare_values(ours: np.ndarray, theirs: np.ndarray, atol: float, rtol: float,
                   float_widths_may_differ: bool = True) -> tuple[bool, float | None, float | None, str]:
    """(within, max abs error, max relative error, why not) of Transmuter's value against ORT's: floats within
    atol + rtol * |ORT| at every element (NaN meeting NaN, equal infinities), other types exactly. The errors are
    None when shapes or dtypes differ. float_widths_may_differ: a float16 value beside a float32 one compares
    as numbers (a pass computing in float32); else it is a dtype mismatch. Also used by bench/coverage/run.py."""
    theirs = np.asarray(theirs)
    if ours.shape != theirs.shape:
        return False, None, None, f"shape {list(ours.shape)} vs ORT's {list(theirs.shape)}"
    if ours.dtype != theirs.dtype and not (float_widths_may_differ and ours.dtype.kind == theirs.dtype.kind == "f"):
        return False, None, None, f"dtype {ours.dtype} vs ORT's {theirs.dtype}"
    if ours.size == 0:
        return True, 0.0, 0.0, ""
    if ours.dtype.kind in "fc":
        a, b = ours.astype(np.float64), theirs.astype(np.float64)
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        if np.any(nan_a != nan_b):
            return False, float("nan"), float("nan"), f"NaN at {int(np.sum(nan_a != nan_b))} elements where the " \
                                                      f"other has a number"
        same_inf = np.isinf(a) & (a == b)
        diff = np.where(nan_a | same_inf, 0.0, np.abs(a - b))
        scale = np.where(nan_a | same_inf, 0.0, np.abs(b))
        max_abs = float(diff.max())
        max_rel = float((diff / np.maximum(scale, 1e-30)).max())
        bad = diff > atol + rtol * scale
        if np.any(bad):
            return False, max_abs, max_rel, f"{int(bad.sum())} of {a.size} elements beyond the tolerance"
        return True, max_abs, max_rel, ""
    equal = np.array_equal(ours, theirs)
    mismatched = 0 if equal else int(np.sum(ours != theirs))
    error = 0.0 if equal else float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))
    return equal, error, None, "" if equal else f"{mismatched} of {ours.size} elements differ (exact type)"


def compare(ours: np.ndarray, theirs: np.ndarray, args) -> tuple[bool, float | None, float | None, str]:
    """compare_values with the tolerance of the two dtypes (or --atol / --rtol)."""
    return compare_values(ours, theirs, *tolerance(args, ours.dtype, np.asarray(theirs).dtype))


def describe_inputs(node: onnx.NodeProto, model: onnx.ModelProto, feeds: dict[str, Path],
                    ort_values: dict) -> list[str]:
    initializers = {t.name: t for t in model.graph.initializer}
    described = []
    for name in node.input:
        if not name:
            described.append("(omitted)")
            continue
        if name in ort_values:
            v = np.asarray(ort_values[name])
            described.append(f"{name}: {v.dtype}{list(v.shape)}")
        elif name in feeds:
            v = np.load(feeds[name])
            described.append(f"{name}: {v.dtype}{list(v.shape)} (graph input)")
        elif name in initializers:
            t = initializers[name]
            dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
            described.append(f"{name}: {np.dtype(dtype)}{list(t.dims)} (initializer)")
        else:
            described.append(f"{name}: (not exposed)")
    return described


@dataclass
class Report:
    compared: list[Comparison] = field(default_factory=list)
    skipped: int = 0
    first: Comparison | None = None


def walk(model: onnx.ModelProto, ours: dict[str, Path], theirs: dict, args) -> Report:
    report = Report()
    for index, node in enumerate(model.graph.node):
        for name in node.output:
            if not name:
                continue
            if name not in ours or name not in theirs:
                report.skipped += 1
                continue
            ours_value = np.load(ours[name])
            within, max_abs, max_rel, reason = compare(ours_value, theirs[name], args)
            c = Comparison(index, node.name, node.op_type, name, tuple(ours_value.shape), str(ours_value.dtype),
                           max_abs, max_rel, within, reason)
            report.compared.append(c)
            if not within and report.first is None:
                report.first = c
    return report


def format_error(c: Comparison) -> str:
    if c.max_abs is None:
        return c.reason
    rel = f", max rel {c.max_rel:.3g}" if c.max_rel is not None else ""
    return f"max abs {c.max_abs:.3g}{rel}" + (f" ({c.reason})" if c.reason else "")


def print_report(report: Report, model: onnx.ModelProto, inputs: dict[str, Path], theirs: dict, args) -> None:
    if args.all:
        print(f"{'#':>5}  {'op':18s} {'node':32s} {'output':32s} {'shape':18s} error")
        for c in report.compared:
            mark = "" if c.within else "   <-- beyond tolerance"
            print(f"{c.node_index:5d}  {c.op_type:18.18s} {c.node_name:32.32s} {c.output:32.32s} "
                  f"{str(list(c.shape)):18.18s} {format_error(c)}{mark}")
    if args.atol is None and args.rtol is None:
        rule = "per dtype (" + ", ".join(f"{k} {a:g} + {r:g}" for k, (a, r) in TOLERANCES.items()) + ") x |ORT|"
    else:
        atol, rtol = tolerance(args, "float32")
        rule = f"atol {atol:g} + rtol {rtol:g} x |ORT|"
    print(f"compared {len(report.compared)} values ({report.skipped} on one side only), tolerance {rule}")
    if report.first is None:
        worst = max((c for c in report.compared if c.max_abs is not None), key=lambda c: c.max_abs, default=None)
        where = f"; largest error {worst.max_abs:.3g} at node #{worst.node_index} '{worst.node_name}' " \
                f"({worst.op_type})" if worst else ""
        print(f"no divergence{where}")
        return
    c = report.first
    node = model.graph.node[c.node_index]
    print(f"first divergence: node #{c.node_index} '{c.node_name}' ({node.domain + '.' if node.domain else ''}"
          f"{c.op_type}), output '{c.output}' {c.dtype}{list(c.shape)}: {format_error(c)}")
    for line in describe_inputs(node, model, inputs, theirs):
        print(f"  input {line}")


def to_json(report: Report | None, failure: EngineFailure | None, args) -> dict:
    out = {"model": str(args.model), "atol": args.atol, "rtol": args.rtol, "passes": args.passes}
    if args.atol is None and args.rtol is None:
        out["tolerances"] = TOLERANCES
    if failure is not None:
        out.update(status=f"{failure.engine}_failed", error=failure.message)
        return out
    def entry(c: Comparison | None):
        return None if c is None else {"index": c.node_index, "name": c.node_name, "op_type": c.op_type,
                                       "output": c.output, "shape": list(c.shape), "dtype": c.dtype,
                                       "max_abs": c.max_abs, "max_rel": c.max_rel, "reason": c.reason}
    worst = max((c for c in report.compared if c.max_abs is not None), key=lambda c: c.max_abs, default=None)
    out.update(status="diverged" if report.first else "match", compared=len(report.compared),
               skipped=report.skipped, first_divergence=entry(report.first), largest_error=entry(worst))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    ort.set_default_logger_severity(4)
    if not args.transmuter.exists():
        raise SystemExit(f"{args.transmuter}: not found (build it: cmake --build build, or pass --transmuter)")
    model = onnx.load(str(args.model), load_external_data=False)
    work = Path(tempfile.mkdtemp(prefix="transmuter-diff-")) if args.keep is None else args.keep
    try:
        inputs = prepare_inputs(model, args, work / "inputs")
        ours = run_transmuter(args, inputs, work / "transmuter")
        theirs = run_ort(args, model, inputs)
        failures = [r for r in (ours, theirs) if isinstance(r, EngineFailure)]
        failure = failures[0] if failures else None
        if len(failures) == 2:  # most often inputs that do not suit the model
            failure = EngineFailure("both", f"transmuter: {ours.message} | onnxruntime: {theirs.message}")
            print(f"both engines failed (do the inputs suit the model? see --input, --dim)\n"
                  f"  transmuter: {ours.message}\n  onnxruntime: {theirs.message}")
            report = None
        elif failure is not None:
            print(f"{failure.engine} failed: {failure.message}")
            report = None
        else:
            report = walk(model, ours, theirs, args)
            print_report(report, model, inputs, theirs, args)
        if args.json:
            args.json.write_text(json.dumps(to_json(report, failure, args), indent=1) + "\n")
        if failure is not None:
            return 2
        return 1 if report.first is not None else 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
