#!/usr/bin/env python3
"""Materialize the official ONNX backend node tests as files on disk.

onnx >= 1.17 stopped shipping backend/test/data/node; the cases are built in
Python by onnx.backend.test.case.node (every `export*` staticmethod calls
`expect(...)`, which appends a TestCase holding the model and its data).
This script writes each case in the layout onnx used to ship:

    <out>/<test_name>/model.onnx
    <out>/<test_name>/test_data_set_0/input_<i>.pb   (TensorProto, SequenceProto
    <out>/<test_name>/test_data_set_0/output_<i>.pb   or OptionalProto by graph type)
    <out>/<test_name>/data.json                       {"rtol": ..., "atol": ...} of the case

A stamp file holding the onnx version (and this layout's version) makes
repeated runs a no-op.

Usage: make_node_tests.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, numpy_helper

DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".cache" / "onnx-node-tests"
STAMP_NAME = ".onnx-version"
LAYOUT = "layout 2 (data.json tolerances)"


def serialize_value(value, type_proto: onnx.TypeProto, name: str) -> bytes:
    """Encodes one input/output value the way onnx's own generate-data tool did."""
    if type_proto.HasField("sequence_type"):
        return numpy_helper.from_list(value, name).SerializeToString()
    if type_proto.HasField("optional_type"):
        return numpy_helper.from_optional(value, name).SerializeToString()
    if type_proto.HasField("map_type"):
        return numpy_helper.from_dict(value, name).SerializeToString()
    if isinstance(value, TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(value, name).SerializeToString()


def write_values(directory: Path, prefix: str, values, value_infos) -> None:
    for index, (value, info) in enumerate(zip(values, value_infos, strict=True)):
        payload = serialize_value(value, info.type, info.name)
        (directory / f"{prefix}_{index}.pb").write_bytes(payload)


def write_case(out: Path, case) -> None:
    case_dir = out / case.name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    (case_dir / "model.onnx").write_bytes(case.model.SerializeToString())
    # The case's own tolerances, as onnx's backend runner reads them from data.json.
    (case_dir / "data.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}) + "\n")
    graph = case.model.graph
    for set_index, (inputs, outputs) in enumerate(case.data_sets):
        data_dir = case_dir / f"test_data_set_{set_index}"
        data_dir.mkdir()
        write_values(data_dir, "input", inputs, graph.input)
        write_values(data_dir, "output", outputs, graph.output)


def collect_cases():
    # Imported late: collecting runs every export function (seconds, prints warnings).
    from onnx.backend.test.case import node as node_cases

    return node_cases.collect_testcases()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rewrite even if the stamp matches")
    args = parser.parse_args()

    stamp = args.out / STAMP_NAME
    if not args.force and stamp.exists() and stamp.read_text().strip() == f"{onnx.__version__} {LAYOUT}":
        count = sum(1 for p in args.out.iterdir() if p.is_dir())
        print(f"{count} node test cases already in {args.out} (onnx {onnx.__version__})")
        return 0

    cases = collect_cases()
    names = [case.name for case in cases]
    if len(names) != len(set(names)):
        raise SystemExit("duplicate node test names; refusing to overwrite cases")

    args.out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    # Remove folders of cases that no longer exist (e.g. after an onnx upgrade).
    wanted = set(names)
    for entry in args.out.iterdir():
        if entry.is_dir() and entry.name not in wanted:
            shutil.rmtree(entry)
    for case in cases:
        write_case(args.out, case)
    stamp.write_text(f"{onnx.__version__} {LAYOUT}\n")
    print(f"wrote {len(cases)} node test cases to {args.out} (onnx {onnx.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
