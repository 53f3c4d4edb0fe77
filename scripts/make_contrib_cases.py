#!/usr/bin/env python3
"""Materialize the com.microsoft contrib-operator cases, with ONNX Runtime's outputs.

Collects the cases of every module in scripts/contrib_cases/ (each module's
`cases()`), runs each through ONNX Runtime (CPU, graph optimizations off: the
contrib kernels themselves, not a fused rewrite of them; a case of an operator
that ORT implements only on CUDA carries NumPy outputs instead) and writes it in the
ONNX backend test layout that `transmuter conformance` reads:

    <out>/<family>_<case>/model.onnx        outputs typed from ORT's results
    <out>/<family>_<case>/test_data_set_0/input_<i>.pb, output_<i>.pb
    <out>/<family>_<case>/data.json         {"rtol": ..., "atol": ...}

A stamp holding ORT's version and a hash of the case modules makes a repeated
run a no-op. A case that ORT refuses is an error in the case: the script
stops and names it.

Usage: make_contrib_cases.py [--out DIR] [--force] [--filter SUBSTRING] [--family MODULE ...]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import pkgutil
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import contrib_cases  # noqa: E402

DEFAULT_OUT = SCRIPTS.parent / ".cache" / "contrib-op-cases"
STAMP_NAME = ".stamp"


def sources_digest() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(Path(contrib_cases.__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return f"onnxruntime {ort.__version__} cases {digest.hexdigest()[:16]}"


def collect(families: list[str] | None = None):
    """(name, case) for every case of every module (or of the named ones), names checked unique."""
    out, seen = [], set()
    for module_info in sorted(pkgutil.iter_modules(contrib_cases.__path__), key=lambda m: m.name):
        if families and module_info.name not in families:
            continue
        module = importlib.import_module(f"contrib_cases.{module_info.name}")
        for case in module.cases():
            name = f"{module_info.name}_{case.name}"
            if name in seen:
                raise SystemExit(f"duplicate contrib case name {name}")
            seen.add(name)
            out.append((name, case))
    return out


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def write_case(out: Path, name: str, case) -> None:
    model = case.model()
    feeds = dict(case.inputs)
    if case.expected is not None:
        results = case.expected
    else:
        try:
            results = run_ort(model, feeds)
        except Exception as error:  # ORT's own message names what it refused
            raise SystemExit(f"contrib case {name}: ONNX Runtime refused it: {error}") from error
        if case.settle is not None:
            results = case.settle(results)
    # Type the graph outputs with what ORT produced, as a real export would.
    del model.graph.output[:]
    for output_name, value in zip(case.outputs, results, strict=True):
        model.graph.output.append(
            helper.make_tensor_value_info(
                output_name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
            )
        )
    case_dir = out / name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    data_dir = case_dir / "test_data_set_0"
    data_dir.mkdir(parents=True)
    (case_dir / "model.onnx").write_bytes(model.SerializeToString())
    (case_dir / "data.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}) + "\n")
    for index, (input_name, value) in enumerate(case.inputs):
        (data_dir / f"input_{index}.pb").write_bytes(numpy_helper.from_array(value, input_name).SerializeToString())
    for index, (output_name, value) in enumerate(zip(case.outputs, results, strict=True)):
        (data_dir / f"output_{index}.pb").write_bytes(
            numpy_helper.from_array(np.asarray(value), output_name).SerializeToString()
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rewrite even if the stamp matches")
    parser.add_argument("--filter", default="", help="write only cases whose name contains this")
    parser.add_argument("--family", action="append", help="only this module's cases (repeatable)")
    args = parser.parse_args()

    stamp = args.out / STAMP_NAME
    digest = sources_digest()
    partial = bool(args.filter or args.family)
    if not args.force and not partial and stamp.exists() and stamp.read_text().strip() == digest:
        count = sum(1 for p in args.out.iterdir() if p.is_dir())
        print(f"{count} contrib op cases already in {args.out} ({digest})")
        return 0

    cases = collect(args.family)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    if not partial:
        wanted = {name for name, _ in cases}
        for entry in args.out.iterdir():
            if entry.is_dir() and entry.name not in wanted:
                shutil.rmtree(entry)
    written = 0
    for name, case in cases:
        if args.filter in name:
            write_case(args.out, name, case)
            written += 1
    if not partial:
        stamp.write_text(digest + "\n")
    print(f"wrote {written} contrib op cases to {args.out} ({digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
