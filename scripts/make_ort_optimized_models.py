#!/usr/bin/env python3
"""Run ONNX Runtime's transformer optimizer over the tiny test exports.

ORT's optimizer (onnxruntime.transformers.optimizer.optimize_model) is what
turns a plain export into the com.microsoft-op graphs many published models
ship: EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu,
FastGelu. For each source in SOURCES this writes

    tests/models/<name>_ort_optimized/model.onnx   the optimized graph
    tests/models/<name>_ort_optimized/inputs.json  the source's, with the new graph's input dtypes
    tests/models/<name>_ort_optimized/ops.txt      the op types it uses, with counts

which tests/models/test_models.py checks against ONNX Runtime like every model
there. The optimizer needs torch (its fusion helpers import it), so this runs in
the export environment (see scripts/export_models.py), by hand; its outputs are
committed.

Usage: /opt/export-venv/bin/python scripts/make_ort_optimized_models.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime
from onnxruntime.transformers.optimizer import optimize_model

MODELS = Path(__file__).resolve().parents[1] / "tests" / "models"

# (source folder, optimizer model_type, num_heads, hidden_size): the configs of scripts/export_models.py.
SOURCES = [
    ("bert", "bert", 4, 64),
    ("gpt2_past", "gpt2", 4, 64),
    ("vit", "vit", 4, 64),
]

NUMPY_DTYPES = {onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.FLOAT: "float32"}


def write_one(name: str, model_type: str, heads: int, hidden: int) -> None:
    source = MODELS / name
    optimized = optimize_model(
        str(source / "model.onnx"), model_type=model_type, num_heads=heads, hidden_size=hidden,
        opt_level=0, use_gpu=False,
    )
    model = optimized.model
    out = MODELS / f"{name}_ort_optimized"
    out.mkdir(exist_ok=True)
    onnx.save(model, str(out / "model.onnx"))

    spec = json.loads((source / "inputs.json").read_text())
    graph_inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    spec["inputs"] = [dict(i, dtype=NUMPY_DTYPES.get(graph_inputs[i["name"]], i["dtype"]))
                      for i in spec["inputs"] if i["name"] in graph_inputs]
    spec["about"] = (f"tests/models/{name} after ONNX Runtime {onnxruntime.__version__}'s transformer optimizer "
                     f"(model_type={model_type}, num_heads={heads}, hidden_size={hidden}, opt_level=0)")
    spec["generated_by"] = "scripts/make_ort_optimized_models.py"
    (out / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")

    counts = Counter(n.op_type if not n.domain else f"{n.domain}.{n.op_type}" for n in model.graph.node)
    (out / "ops.txt").write_text("".join(f"{op} {count}\n" for op, count in sorted(counts.items())))
    fused = {op: c for op, c in counts.items() if op.startswith("com.microsoft")}
    print(f"{out}: {fused}")


def main() -> int:
    for entry in SOURCES:
        write_one(*entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
