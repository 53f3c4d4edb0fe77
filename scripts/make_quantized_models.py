#!/usr/bin/env python3
"""Quantize the tiny Llama test export with ONNX Runtime's MatMulNBits quantizer
(the int8 models of ORT's quantize_dynamic / quantize_static: scripts/make_int8_models.py).

ORT's onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer is
what makes the q4/q8 exports published for LLMs: every MatMul with a constant
weight becomes a com.microsoft MatMulNBits (block-wise quantized weight, scales,
zero points). For each variant in VARIANTS this writes

    tests/models/llama_<variant>/model.onnx, inputs.json (the source's), ops.txt

which tests/models/test_models.py checks against ONNX Runtime. The quantizer
needs onnx_ir (not in the project's .venv), so this runs in the export
environment (see scripts/export_models.py), by hand; its outputs are committed.

Usage: /opt/export-venv/bin/python scripts/make_quantized_models.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

MODELS = Path(__file__).resolve().parents[1] / "tests" / "models"
SOURCE = MODELS / "llama"

# name: (bits, block_size, symmetric)
VARIANTS = {
    "q4_block32_symmetric": (4, 32, True),
    "q4_block16_asymmetric": (4, 16, False),
    "q8_block64_asymmetric": (8, 64, False),
    "q4_block128_asymmetric": (4, 128, False),
    "q8_block256_symmetric": (8, 256, True),
}


def write_variant(name: str, bits: int, block_size: int, symmetric: bool) -> None:
    quantizer = MatMulNBitsQuantizer(onnx.load(str(SOURCE / "model.onnx")), bits=bits, block_size=block_size,
                                     is_symmetric=symmetric)
    quantizer.process()
    model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
    out = MODELS / f"llama_{name}"
    out.mkdir(exist_ok=True)
    onnx.save(model, str(out / "model.onnx"))
    spec = json.loads((SOURCE / "inputs.json").read_text())
    spec["about"] = (f"tests/models/llama quantized by ONNX Runtime {onnxruntime.__version__}'s MatMulNBitsQuantizer "
                     f"(bits={bits}, block_size={block_size}, is_symmetric={symmetric})")
    spec["generated_by"] = "scripts/make_quantized_models.py"
    (out / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")
    counts = Counter(n.op_type if not n.domain else f"{n.domain}.{n.op_type}" for n in model.graph.node)
    (out / "ops.txt").write_text("".join(f"{op} {count}\n" for op, count in sorted(counts.items())))
    print(f"{out}: {counts.get('com.microsoft.MatMulNBits', 0)} MatMulNBits")


def main() -> int:
    for name, (bits, block_size, symmetric) in VARIANTS.items():
        write_variant(name, bits, block_size, symmetric)
    return 0


if __name__ == "__main__":
    sys.exit(main())
