"""Prints the worst output difference of every model test, pass or fail."""

from __future__ import annotations

import sys
from pathlib import Path

# test_models.py imports model_inputs from this folder under any rootdir.
sys.path.insert(0, str(Path(__file__).resolve().parent))

_diffs: list[tuple[str, str, float]] = []


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "max_abs_diff":
            output_name, diff = value
            _diffs.append((report.nodeid.split("::")[-1], output_name, diff))


def pytest_terminal_summary(terminalreporter):
    if not _diffs:
        return
    terminalreporter.section("worst |transmuter - onnxruntime| per output")
    for test_id, output_name, diff in _diffs:
        terminalreporter.write_line(f"{test_id:56s} {output_name:20s} {diff:.3e}")
