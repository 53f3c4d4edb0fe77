// Float32 arithmetic with NumPy broadcasting, and the widening of integer and boolean tensors to
// float32, as CPU kernels.
//
//   y = a (op) b      op one of + - * / maximum minimum; a, b float32 of shapes that broadcast,
//                     y of the broadcast shape
//   y = float32(x)    x int64, int32 or bool
//
// Each result equals MLX's op bit for bit: every element is one IEEE single-precision operation (or
// conversion, rounding to nearest), and maximum / minimum return a where a is NaN or a > b (a < b),
// else b, as MLX's Maximum and Minimum do. So routing an ONNX Add, Mul or Cast through them changes no
// output; gradients are those of the MLX ops (the references).
//
// Why they exist: MLX's own ops are as fast for these, but a compiled segment runs directly -- without
// MLX's scheduler, ~20-30 us a call on this host (src/runtime/direct_run.h) -- only when every primitive
// in it is a Transmuter kernel or a view. An encoder's attention mask (Cast, Sub, Mul), its embeddings'
// sum (Add) and a CNN's squeeze-and-excitation scale (Mul) were what kept whole models off.
#pragma once

#include <cstdint>
#include <vector>

#include <mlx/mlx.h>

namespace transmuter::kernels {

namespace mx = mlx::core;

enum class BinaryOp { kAdd, kSubtract, kMultiply, kDivide, kMaximum, kMinimum };

/** True when `binary` runs the kernel for these operands on a CPU stream: both float32, and their shapes
 * broadcast. */
bool binary_fits(const mx::array& a, const mx::array& b);

/** a (op) b as above: the kernel on CPU streams when binary_fits, else MLX's op. */
mx::array binary(BinaryOp op, const mx::array& a, const mx::array& b, mx::StreamOrDevice s = {});

/** True when `to_float32` runs the kernel for x on a CPU stream: int64, int32 or bool. */
bool to_float32_fits(const mx::array& x);

/** x converted to float32: the kernel on CPU streams when to_float32_fits, else mx::astype. */
mx::array to_float32(const mx::array& x, mx::StreamOrDevice s = {});

/** How the kernel walks a broadcast: the output's dimensions with those of extent 1 dropped and
 * neighbours merged where both operands step through them as through one (so [N, H, W, C] * [N, 1, 1, C]
 * becomes rows N x HW of C), the last one the rows' length. Exposed for its tests. */
struct BroadcastLoop {
  std::vector<int64_t> outer;                 // the extents of the dimensions before the rows'
  std::vector<int64_t> a_strides, b_strides;  // the operands' element strides along `outer`
  int64_t inner = 1;                          // the rows' length
  bool a_steps = true, b_steps = true;        // the operand advances along a row (else repeats)
};

/** The loop for operands of shapes `a` and `b` (which must broadcast). */
BroadcastLoop broadcast_loop(const mx::Shape& a, const mx::Shape& b);

}  // namespace transmuter::kernels
