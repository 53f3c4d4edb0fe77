"""Whole-model comparison: `transmuter run` against ONNX Runtime.

Every folder here with an inputs.json is one model: either its own model.onnx
(tiny exports made by scripts/export_models.py), another folder's model named by
its "model_of" key (the same model fed other inputs), or one fetched by the script
named in its "fetch" key (the real pretrained model). Inputs listed in its
"static" key are passed with --static (host values while compiling). For each model the test
builds seeded, valid inputs (tests/models/model_inputs.py), runs ONNX Runtime
with graph optimizations off as the reference, then runs

    $TRANSMUTER_BIN run MODEL --input NAME=FILE.npy ... [--static NAME=FILE.npy ...]
                    --output-dir DIR --mode {eager,compiled} --passes {default,none}

and requires every output to match: same shape, same dtype, max abs diff
<= 1e-4, or the model's "tolerance" key (float16 models; its reason is written
beside it, in "tolerance_reason"). Float inputs declared float16 are drawn as
float32 and rounded. The worst diff per model/mode/output is printed at the end of the run
(see conftest.py).

Env: TRANSMUTER_BIN (default <repo>/build/transmuter).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from model_inputs import build_inputs

MODELS_DIR = Path(__file__).resolve().parent
REPO_ROOT = MODELS_DIR.parents[1]
MODES = ("eager", "compiled")
# fp32 end to end: ORT and MLX differ only in summation order and in the
# libm/vectorized erf/exp/tanh they use; 1e-4 absolute leaves ~100x headroom
# over the ~1e-6 seen between PyTorch and ORT on these models, yet catches any
# real error (a wrong axis, a missed mask, a dropped bias all move outputs by
# >= 1e-2).
TOLERANCE = 1e-4
SEED = 1234
RUN_TIMEOUT_S = 600


def model_names() -> list[str]:
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "inputs.json").is_file())


def sanitize(name: str) -> str:
    """The output file name `transmuter run` uses for an output name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def transmuter_bin() -> Path:
    return Path(os.environ.get("TRANSMUTER_BIN", REPO_ROOT / "build" / "transmuter"))


def fetch_model(script: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / script)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"{script} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


@dataclass
class Reference:
    model_path: Path
    input_files: dict[str, Path]
    outputs: dict[str, np.ndarray]
    static_inputs: frozenset[str] = frozenset()
    tolerance: float = TOLERANCE


def model_inputs(spec: dict) -> dict[str, np.ndarray]:
    return build_inputs(spec["inputs"], spec["dims"], np.random.default_rng(SEED))


def model_path_of(name: str, spec: dict) -> Path:
    if "fetch" in spec:
        return fetch_model(spec["fetch"])
    if "model_of" in spec:
        return MODELS_DIR / spec["model_of"] / "model.onnx"
    return MODELS_DIR / name / "model.onnx"


def make_reference(name: str, work_dir: Path) -> Reference:
    spec = json.loads((MODELS_DIR / name / "inputs.json").read_text())
    model_path = model_path_of(name, spec)
    inputs = model_inputs(spec)
    if "tolerance" in spec and not spec.get("tolerance_reason"):
        pytest.fail(f"{name}: inputs.json sets a tolerance without a tolerance_reason")

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]
    assert output_names == spec["outputs"], f"{name}: inputs.json outputs are stale"
    outputs = dict(zip(output_names, session.run(output_names, inputs), strict=True))

    input_files = {}
    for input_name, value in inputs.items():
        path = work_dir / f"{sanitize(input_name)}.npy"
        np.save(path, value)
        input_files[input_name] = path
    return Reference(
        model_path,
        input_files,
        outputs,
        frozenset(spec.get("static", [])),
        float(spec.get("tolerance", TOLERANCE)),
    )


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache: dict[str, Reference] = {}

    def get(name: str) -> Reference:
        if name not in cache:
            cache[name] = make_reference(name, tmp_path_factory.mktemp(f"{name}_inputs"))
        return cache[name]

    return get


def run_transmuter(reference: Reference, mode: str, out_dir: Path, passes: str = "default") -> None:
    binary = transmuter_bin()
    if not binary.is_file():
        pytest.fail(f"transmuter binary not found at {binary} (set TRANSMUTER_BIN)")
    command = [str(binary), "run", str(reference.model_path)]
    for input_name, path in reference.input_files.items():
        option = "--static" if input_name in reference.static_inputs else "--input"
        command += [option, f"{input_name}={path}"]
    command += ["--output-dir", str(out_dir), "--mode", mode, "--passes", passes]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        pytest.fail(
            f"transmuter run exited {result.returncode}\n$ {' '.join(command)}\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )


def max_abs_diff(got: np.ndarray, expected: np.ndarray) -> float:
    """Max |got - expected|; NaN in the same place counts as equal, elsewhere as inf."""
    if got.size == 0:
        return 0.0
    if got.dtype == np.bool_:
        return float(np.count_nonzero(got != expected))
    a = got.astype(np.float64)
    b = expected.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    diff = np.where(both_nan, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max())


# Load-time passes (fusions onto own kernels) on and off: both must match ORT.
PASSES = ("default", "none")


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", model_names())
def test_matches_onnxruntime(name, mode, passes, references, tmp_path, record_property):
    reference = references(name)
    out_dir = tmp_path / "outputs"
    run_transmuter(reference, mode, out_dir, passes)

    failures = []
    for output_name, expected in reference.outputs.items():
        path = out_dir / f"{sanitize(output_name)}.npy"
        if not path.is_file():
            failures.append(f"{output_name}: {path.name} not written")
            continue
        got = np.load(path)
        if got.shape != expected.shape:
            failures.append(f"{output_name}: shape {got.shape}, expected {expected.shape}")
            continue
        if got.dtype != expected.dtype:
            failures.append(f"{output_name}: dtype {got.dtype}, expected {expected.dtype}")
            continue
        diff = max_abs_diff(got, expected)
        record_property("max_abs_diff", (output_name, diff))
        if not diff <= reference.tolerance:
            failures.append(f"{output_name}: max abs diff {diff:.3e} > {reference.tolerance:.0e}")
    assert not failures, f"{name} ({mode}, passes {passes}):\n" + "\n".join(failures)
