// Elementwise kernels over broadcast operands: float32 arithmetic, comparisons and logic, selection, and
// conversions between the common types.
//
//   y = a (op) b         op one of + - * / maximum minimum; a, b float32
//   y = a (cmp) b        cmp one of == < <= > >= (float32, int64, int32 or bool operands of one type) and
//                        logical and / or (bool): y bool
//   y = c ? a : b        c bool; a, b of one type: float32, int64, int32 or bool
//   y = T(x)             int64 / int32 / bool -> float32; float32 / int64 / int32 -> bool (x != 0);
//                        int64 / int32 / bool -> int64 / int32
//   operands of shapes that broadcast (NumPy), y of the broadcast shape
//
// Each result equals MLX's op bit for bit: every element is one IEEE single-precision operation, comparison
// or C++ conversion (rounding to nearest), and maximum / minimum return a where a is NaN or a > b (a < b),
// else b, as MLX's Maximum and Minimum do. So routing ONNX ops through them changes no output; gradients
// are those of the MLX ops (the references).
//
// Why they exist: MLX's own ops are as fast for these, but a compiled segment runs directly -- without
// MLX's scheduler, ~20-30 us a call on this host (src/runtime/direct_run.h) -- only when every primitive
// in it is a Transmuter kernel or a view. An encoder's attention mask (Cast, Sub, Mul; or Cast, And, Where
// in newer transformers exports), its embeddings' sum (Add) and a CNN's squeeze-and-excitation scale (Mul)
// were what kept whole models off.
#pragma once

#include <cstdint>
#include <vector>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

enum class BinaryOp { kAdd, kSubtract, kMultiply, kDivide, kMaximum, kMinimum };
enum class CompareOp { kEqual, kLess, kLessEqual, kGreater, kGreaterEqual, kAnd, kOr };

/** True when `binary` runs the kernel on a CPU stream: both float32, and their shapes broadcast. */
bool binary_fits(const mx::array& a, const mx::array& b);
/** a (op) b as above: the kernel on CPU streams when binary_fits, else MLX's op. */
mx::array binary(BinaryOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s = {});

/** True when `compare` runs the kernel on a CPU stream: operands of one of the types above (bool for and /
 * or), shapes that broadcast. */
bool compare_fits(CompareOp op, const mx::array& a, const mx::array& b);
/** a (cmp) b as above, bool: the kernel on CPU streams when compare_fits, else MLX's op. */
mx::array compare(CompareOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s = {});

/** True when `select` runs the kernel on a CPU stream (the types above, shapes that broadcast). */
bool select_fits(const mx::array& condition, const mx::array& a, const mx::array& b);
/** condition ? a : b: the kernel on CPU streams when select_fits, else mx::where. */
mx::array select(const mx::array& condition, const mx::array& a, const mx::array& b,
                 mx::StreamOrDevice s = {});

/** True when `convert` runs the kernel for x on a CPU stream (the pairs of types above). */
bool convert_fits(const mx::array& x, mx::Dtype to);
/** x as `to`: the kernel on CPU streams when convert_fits, else mx::astype. */
mx::array convert(const mx::array& x, mx::Dtype to, mx::StreamOrDevice s = {});

/** The most operands a broadcast loop takes. */
inline constexpr int kMaxBroadcastOperands = 4;

/** How the kernels walk a broadcast: the output's dimensions with those of extent 1 dropped and
 * neighbours merged where every operand steps through them as through one (so [N, H, W, C] * [N, 1, 1, C]
 * becomes rows N x HW of C), the last one the rows' length. Exposed for its tests. */
struct BroadcastLoop {
  std::vector<int64_t> outer;                 // the extents of the dimensions before the rows'
  std::vector<std::vector<int64_t>> strides;  // per operand: its element strides along `outer`
  int64_t inner = 1;                          // the rows' length
  std::vector<bool> steps;                    // per operand: it advances along a row (else repeats)
};

/** The loop for operands of these shapes (1 to kMaxBroadcastOperands, which must broadcast). */
BroadcastLoop broadcast_loop(const std::vector<mx::Shape>& shapes);

}  // namespace transmuter::kernels
