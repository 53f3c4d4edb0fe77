"""Float32 error of Winograd's F(2x2, 3x3) and F(4x4, 3x3) against the direct float32 sum, both against
float64, emulated in numpy (every transform and product rounded to float32). Why the Winograd kernel
(src/kernels/cpu/winograd_conv.h) uses F(2x2, 3x3) only.

    .venv/bin/python bench/winograd_error.py [--tiles N]

Inputs N(0, 1), filters N(0, 1 / (9 C)) so outputs are ~1; prints the largest error over N tiles of
8 filters for C = 64 and 256.
"""
import argparse

import numpy as np

F32 = np.float32
# F(2x2, 3x3): points 0, 1, -1, infinity.
F2 = (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], F32),
      np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], F32),
      np.array([[1, 1, 1, 0], [0, 1, -1, -1]], F32))
# F(4x4, 3x3): points 0, 1, -1, 2, -2, infinity.
F4 = (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], F32),
      np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], F32),
      np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], F32))


def winograd(d: np.ndarray, g: np.ndarray, transforms) -> np.ndarray:
    """d [C, t, t] input tile, g [M, C, 3, 3] -> [M, m, m], each step rounded to float32."""
    bt, gm, at = transforms
    v = np.einsum("ij,cjk,lk->cil", bt, d, bt).astype(F32)
    u = np.einsum("ij,mcjk,lk->mcil", gm, g, gm).astype(F32)
    products = np.einsum("mcil,cil->mil", u, v).astype(F32)
    return np.einsum("ij,mjk,lk->mil", at, products, at).astype(F32)


def direct(d: np.ndarray, g: np.ndarray, m: int, dtype) -> np.ndarray:
    out = np.zeros((g.shape[0], m, m), dtype)
    for i in range(m):
        for j in range(m):
            out[:, i, j] = np.einsum("mcij,cij->m", g.astype(dtype), d[:, i:i + 3, j:j + 3].astype(dtype))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiles", type=int, default=20)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    for channels in (64, 256):
        for name, transforms in (("F(2x2, 3x3)", F2), ("F(4x4, 3x3)", F4)):
            tile = transforms[0].shape[0]
            m = tile - 2
            worst_winograd = worst_direct = 0.0
            for _ in range(args.tiles):
                d = rng.standard_normal((channels, tile, tile)).astype(F32)
                g = (rng.standard_normal((8, channels, 3, 3)) / np.sqrt(9 * channels)).astype(F32)
                exact = direct(d, g, m, np.float64)
                worst_winograd = max(worst_winograd, float(np.abs(winograd(d, g, transforms) - exact).max()))
                worst_direct = max(worst_direct, float(np.abs(direct(d, g, m, F32) - exact).max()))
            print(f"C={channels:4d} {name}: winograd {worst_winograd:.2e}  direct float32 {worst_direct:.2e}")


if __name__ == "__main__":
    main()
