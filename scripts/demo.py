#!/usr/bin/env python3
"""The main job: sentence embeddings from a real pretrained Hugging Face ONNX
export (sentence-transformers/paraphrase-MiniLM-L3-v2), computed by the
`transmuter` CLI eagerly and compiled, and compared with ONNX Runtime (graph
optimizations off) on the same inputs.

The sentences are given as BERT-uncased token ids (the package that ships the
model has no tokenizer; the ids were looked up in that vocabulary).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-4  # fp32 accumulation-order noise between MLX/OpenBLAS and ORT's MLAS

SENTENCES = {
    "the cat sat on the mat": [101, 1996, 4937, 2938, 2006, 1996, 13523, 102],
    "a dog sat on the mat": [101, 1037, 3899, 2938, 2006, 1996, 13523, 102],
    "the weather is nice today": [101, 1996, 4633, 2003, 3835, 2651, 102],
}


def batch_inputs() -> dict[str, np.ndarray]:
    length = max(len(ids) for ids in SENTENCES.values())
    input_ids = np.zeros((len(SENTENCES), length), dtype=np.int64)
    mask = np.zeros_like(input_ids)
    for row, ids in enumerate(SENTENCES.values()):
        input_ids[row, : len(ids)] = ids
        mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def run_transmuter(binary: Path, model: Path, inputs: dict, mode: str, workdir: Path) -> dict[str, np.ndarray]:
    args = [str(binary), "run", str(model), "--mode", mode, "--output-dir", str(workdir / mode)]
    for name, value in inputs.items():
        path = workdir / f"{name}.npy"
        np.save(path, value)
        args += ["--input", f"{name}={path}"]
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"transmuter run failed ({mode}):\n{result.stderr}")
    return {p.stem: np.load(p) for p in (workdir / mode).glob("*.npy")}


def sanitize(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def main() -> int:
    model = Path(subprocess.run([sys.executable, str(ROOT / "scripts/fetch_real_model.py")], check=True,
                                capture_output=True, text=True).stdout.strip())
    binary = Path(os.environ.get("TRANSMUTER_BIN", ROOT / "build/transmuter"))
    inputs = batch_inputs()

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    reference = dict(zip(names, session.run(None, inputs)))

    print(f"model: {model}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("eager", "compiled"):
            ours = run_transmuter(binary, model, inputs, mode, Path(tmp))
            worst = max(float(np.max(np.abs(ours[sanitize(n)].astype(np.float64) - reference[n]))) for n in names)
            ok &= worst <= TOLERANCE
            print(f"{mode:9s}: worst |transmuter - onnxruntime| over all {len(names)} outputs = {worst:.2e}"
                  f" ({'within' if worst <= TOLERANCE else 'OUTSIDE'} {TOLERANCE:g})")
            if mode == "compiled":
                embeddings = ours[sanitize("461")]
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    print(f"sentence embeddings: {embeddings.shape[1]} dims (output '461', mean-pooled by the model)")
    for text, row in zip(SENTENCES, unit):
        print(f"  {text!r:30s} [{', '.join(f'{v:+.4f}' for v in row[:5])}, ...]")
    print("cosine similarity:")
    texts = list(SENTENCES)
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            print(f"  {texts[i]!r} vs {texts[j]!r}: {float(unit[i] @ unit[j]):.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
