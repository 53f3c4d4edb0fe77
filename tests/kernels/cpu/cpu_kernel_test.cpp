// CpuKernel's dense copies of strided inputs: a kernel that copies its input's
// bytes to its output sees the view's elements in row-major order, for every
// element size (1, 2, 4, 8 bytes and complex64's 8 as two floats), for
// transposes (the last axis strided), broadcasts (stride 0), slices with a
// step, rank 1 to 5 and a scalar.
#include "kernels/cpu/cpu_kernel.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace transmuter::kernels {
namespace {

// Output 0 = input 0's bytes, which eval_cpu has made row-contiguous.
class ByteCopyKernel : public CpuKernel {
 public:
  using CpuKernel::CpuKernel;
  const char* name() const override { return "test::ByteCopy"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const ByteCopyKernel*>(&other) != nullptr;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const char* from = in[0].data<char>();
    char* to = out[0].data<char>();
    const size_t bytes = in[0].nbytes();
    return [from, to, bytes] { std::memcpy(to, from, bytes); };
  }
};

mx::array byte_copy(const mx::array& x) {
  Reference reference = [](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::copy(in[0])};
  };
  return make_cpu_kernel_outputs([&](mx::Stream s) { return std::make_shared<ByteCopyKernel>(s, reference); },
                                 reference, {x}, {x.shape()}, {x.dtype()}, mx::Device::cpu)[0];
}

// Distinct values in every element (as far as the type holds them).
mx::array counting(const mx::Shape& shape, mx::Dtype dtype) {
  int n = 1;
  for (int d : shape) n *= d;
  mx::array values = mx::reshape(mx::arange(n), shape);
  if (dtype == mx::complex64) return values + mx::array(mx::complex64_t{0.0f, 1.0f}) * (values + 1);
  return mx::astype(values, dtype);
}

TEST(CpuKernelInputs, StridedViewsAreCopiedInRowMajorOrder) {
  for (mx::Dtype dtype : {mx::uint8, mx::float16, mx::float32, mx::int64, mx::complex64}) {
    const std::string type = std::to_string(static_cast<int>(dtype.val()));
    mx::array base = counting({2, 3, 4, 5}, dtype);
    const std::vector<std::pair<std::string, mx::array>> views = {
        {"NCHW -> NHWC", mx::transpose(base, {0, 2, 3, 1})},
        {"reversed axes", mx::transpose(base, {3, 2, 1, 0})},
        {"broadcast rows", mx::broadcast_to(counting({1, 5}, dtype), {3, 4, 5})},
        {"broadcast columns", mx::broadcast_to(counting({4, 1}, dtype), {4, 6})},
        {"broadcast scalar", mx::broadcast_to(counting({}, dtype), {2, 3})},
        {"stepped slice", mx::slice(base, {0, 0, 0, 0}, {2, 3, 4, 5}, {1, 2, 1, 2})},
        {"rank 1 stepped", mx::slice(counting({9}, dtype), {1}, {9}, {3})},
        {"rank 5", mx::transpose(mx::reshape(base, {2, 3, 2, 2, 5}), {4, 0, 3, 1, 2})},
    };
    for (auto [what, view] : views) {
      mx::eval(view);  // a view's strides and flags are set when it is evaluated
      ASSERT_FALSE(view.flags().row_contiguous && view.size() > 1) << what;  // the copy is exercised
      mx::array got = byte_copy(view);
      mx::array want = mx::contiguous(view);
      ASSERT_EQ(got.shape(), want.shape()) << what;
      EXPECT_TRUE(mx::array_equal(got, want).item<bool>()) << what << " dtype " << type;
    }
  }
}

// dense_copy_here: the same copy, made on the calling thread, and marked computed.
TEST(CpuKernelInputs, DenseCopiesHereEqualMlxContiguous) {
  for (mx::Dtype dtype : {mx::uint8, mx::float16, mx::float32, mx::int64}) {
    mx::array base = counting({2, 3, 4, 5}, dtype);
    for (mx::array view :
         {mx::transpose(base, {0, 2, 1, 3}), mx::broadcast_to(counting({4, 1}, dtype), {4, 6}),
          mx::slice(base, {0, 0, 0, 0}, {2, 3, 4, 5}, {1, 2, 1, 2})}) {
      mx::eval(view);
      ASSERT_FALSE(view.flags().row_contiguous);
      const mx::array copy = dense_copy_here(view);
      EXPECT_EQ(copy.status(), mx::array::Status::available);
      EXPECT_TRUE(copy.flags().row_contiguous);
      EXPECT_TRUE(mx::array_equal(copy, mx::contiguous(view)).item<bool>());
    }
  }
}

bool starts_on_a_line(const mx::array& a) { return reinterpret_cast<uintptr_t>(a.data<char>()) % 64 == 0; }

// MLX's own buffers start 8 bytes past a 64-byte line (its allocator's size header); a kernel's outputs
// and dense copies start on a line, so that its vector loads and stores do not span two.
TEST(CpuKernelOutputs, StartOnA64ByteLineAndComposeWithMlx) {
  for (const mx::Shape& shape : {mx::Shape{}, mx::Shape{7}, mx::Shape{3, 5}, mx::Shape{2, 3, 4, 5}}) {
    mx::array x = counting(shape, mx::float32);
    mx::array y = byte_copy(x);
    mx::eval(y);
    EXPECT_TRUE(starts_on_a_line(y)) << y.shape().size() << "-d";
    EXPECT_TRUE(y.flags().row_contiguous);
    EXPECT_TRUE(mx::array_equal(y, x).item<bool>());
    // MLX's ops read it through its offset, and may take its buffer (y is held by nothing else here).
    mx::array plus_one = byte_copy(x) + 1.0f;
    EXPECT_TRUE(mx::array_equal(plus_one, x + 1.0f).item<bool>());
    if (shape.size() >= 2) {
      EXPECT_TRUE(mx::array_equal(mx::transpose(y), mx::transpose(x)).item<bool>());
      EXPECT_TRUE(mx::array_equal(mx::reshape(y, {-1}), mx::reshape(x, {-1})).item<bool>());
    }
  }
  mx::array view = mx::transpose(counting({4, 6}, mx::float32));
  mx::eval(view);
  EXPECT_TRUE(starts_on_a_line(dense_copy_here(view)));
}

}  // namespace
}  // namespace transmuter::kernels
