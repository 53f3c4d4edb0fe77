#!/usr/bin/env python3
"""How src/ops/onnx/pool.cpp composes a pool, timed as MLX ops: run with .venv/bin/python bench/pool_layouts.py."""
# MaxPool 3x3 stride 2 pad 1 over ResNet-50's [1, 112, 112, 64] channels-last stem output, the two ways
# src/ops/onnx/pool.cpp composed it: one strided slice per window element (9), or one axis at a time (3 + 3).
import time, mlx.core as mx
x = mx.random.normal((1, 112, 112, 64))
p = mx.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=-float("inf"))
def per_element(p):
    out = None
    for ky in range(3):
        for kx in range(3):
            s = p[:, ky:ky + 111 + 1:2, kx:kx + 111 + 1:2, :]
            out = s if out is None else mx.maximum(out, s)
    return out
def per_axis(p):
    rows = None
    for ky in range(3):
        s = p[:, ky:ky + 111 + 1:2, :, :]
        rows = s if rows is None else mx.maximum(rows, s)
    out = None
    for kx in range(3):
        s = rows[:, :, kx:kx + 111 + 1:2, :]
        out = s if out is None else mx.maximum(out, s)
    return out
assert mx.array_equal(per_element(p), per_axis(p)).item()
for name, f in [("per element", per_element), ("per axis", per_axis)] * 3:
    for mode, g in (("eager", f), ("compiled", mx.compile(f))):
        for _ in range(20): mx.eval(g(p))
        t = time.perf_counter()
        for _ in range(500): mx.eval(g(p))
        print(f"{name:12s} {mode:9s} {(time.perf_counter() - t) / 500 * 1e6:8.1f} us")
