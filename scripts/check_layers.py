#!/usr/bin/env python3
"""Checks the layering of src/ (docs/architecture.md, "Layers"): a file includes
only headers of its own layer and the layers below it; tools/ uses public
headers only; the compile planner names no op types."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Bottom to top. include/transmuter/ (the public API) may be included anywhere.
LAYERS = ["core", "mlx_bridge", "kernels", "graph", "onnx", "hub", "text", "passes", "ops", "runtime", "pipelines"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
PLANNER = ["src/runtime/segments.cpp", "src/runtime/compiler.cpp", "src/runtime/compiler.h"]


def layer_of(include: str) -> str | None:
    top = include.split("/")[0]
    return top if top in LAYERS else None


def main() -> int:
    problems = []
    for path in sorted((ROOT / "src").rglob("*")):
        if path.suffix not in (".h", ".cpp"):
            continue
        own = path.relative_to(ROOT / "src").parts[0]
        for include in INCLUDE.findall(path.read_text()):
            other = layer_of(include)
            if other is not None and LAYERS.index(other) > LAYERS.index(own):
                problems.append(f"{path.relative_to(ROOT)}: {own}/ includes {include} from the higher layer {other}/")
    for path in sorted((ROOT / "tools").glob("*")):
        if path.suffix not in (".h", ".cpp"):
            continue
        for include in INCLUDE.findall(path.read_text()):
            if not include.startswith("transmuter/") and "/" in include:
                problems.append(f"{path.relative_to(ROOT)}: the CLI includes the internal header {include}")
    op_types = set(re.findall(r"^\| [\w.]+ \| (\w+) \|", (ROOT / "docs" / "operators.md").read_text(), re.M))
    for name in PLANNER:
        for literal in re.findall(r'"(\w+)"', (ROOT / name).read_text()):
            if literal in op_types:
                problems.append(f"{name}: the planner names the op type \"{literal}\"; use a registry-row trait")
    for problem in problems:
        print(problem)
    print(f"layering: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
