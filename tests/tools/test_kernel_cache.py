"""MLX's CPU backend dlopen()s fused kernels from $TMPDIR/mlx/<version>/cpu,
a folder that under /tmp every user can write. Transmuter must load them only
from a private per-user folder (src/mlx_bridge/kernel_cache.h)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter"))

# A shared object whose constructor leaves a marker file: loading it is running it.
PLANTED_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
  FILE* f = fopen(getenv("PLANT_MARKER"), "w");
  if (f) { fputs("planted code ran\n", f); fclose(f); }
}
"""


def gelu_model(path: Path) -> None:
    # Elementwise chains that MLX fuses into run-time compiled CPU kernels (unary MLX ops: float32 Add and
    # Mul are Transmuter kernels, which MLX does not fuse).
    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Sin", ["a"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Cos", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def run_compiled(model: Path, env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "TRANSMUTER_KERNEL_CACHE")}
    full.update(env)
    # --fuse on: MLX builds (and loads) run-time kernels only when it fuses, which
    # compiled plans on the CPU do not do by default.
    return subprocess.run([BIN, "run", str(model), "--mode", "compiled", "--fuse", "on",
                           "--output-dir", str(model.parent / "out")],
                          capture_output=True, text=True, timeout=300, env=full)


def kernel_libraries(folder: Path) -> list[Path]:
    return sorted(folder.glob("mlx/*/cpu/lib*.so"))


def test_kernels_planted_in_the_shared_temp_folder_are_not_loaded(tmp_path):
    model = tmp_path / "m.onnx"
    gelu_model(model)
    # 1. Learn the kernel file names this model makes (a private home).
    first_home = tmp_path / "home1"
    first_home.mkdir()
    result = run_compiled(model, {"HOME": str(first_home), "TMPDIR": str(tmp_path / "unused")})
    assert result.returncode == 0, result.stderr
    private = first_home / ".cache" / "transmuter" / "mlx-kernels"
    built = kernel_libraries(private)
    assert built, f"no fused CPU kernel was compiled under {private}"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700

    # 2. Plant a library under each of those names in the shared temp folder.
    shared = tmp_path / "shared_tmp"
    source = tmp_path / "planted.c"
    source.write_text(PLANTED_SOURCE)
    planted = tmp_path / "planted.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(planted), str(source)], check=True)
    for lib in built:
        target = shared / lib.relative_to(private)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(planted, target)
    marker = tmp_path / "marker"

    # 3. A fresh user home, TMPDIR at the planted folder: the plant must not run.
    second_home = tmp_path / "home2"
    second_home.mkdir()
    result = run_compiled(model, {"HOME": str(second_home), "TMPDIR": str(shared), "PLANT_MARKER": str(marker)})
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "a kernel planted in $TMPDIR/mlx was loaded"
    assert kernel_libraries(second_home / ".cache" / "transmuter" / "mlx-kernels")

    # Control: the plant is real — pointed at that folder, MLX does load it.
    result = run_compiled(model, {"HOME": str(second_home), "TRANSMUTER_KERNEL_CACHE": str(shared),
                                  "PLANT_MARKER": str(marker)})
    assert marker.exists(), "control failed: the planted library was never loaded, so the test proves nothing"


def test_a_kernel_folder_others_can_write_is_refused(tmp_path):
    model = tmp_path / "m.onnx"
    gelu_model(model)
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    result = run_compiled(model, {"TRANSMUTER_KERNEL_CACHE": str(open_folder)})
    assert result.returncode == 1
    assert f"refusing {open_folder} as the folder for MLX's compiled kernels" in result.stderr
    assert "writable by group or others" in result.stderr
