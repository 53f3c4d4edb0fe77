// The DynamicQuantizeLinear kernel against its MLX composition: the same bytes, scale and zero point
// for sizes around the vector widths and the kernel's chunks, and for ranges on one side of zero, a
// constant zero tensor and a wide one.
#include "kernels/cpu/dynamic_quantize.h"

#include <gtest/gtest.h>

#include <string>

#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

void expect_same(const mx::array& x, const std::string& what) {
  std::vector<mx::array> got = dynamic_quantize_linear(x, mx::Device::cpu);
  std::vector<mx::array> want = dynamic_quantize_linear_reference(x, mx::Device::cpu);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].dtype(), mx::uint8);
  EXPECT_EQ(got[0].shape(), x.shape());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(mx::array_equal(got[i], want[i]).item<bool>()) << what << " output " << i;
}

TEST(DynamicQuantizeKernel, EqualsTheComposition) {
  uint64_t seed = 1;
  for (int n : {1, 7, 16, 17, 100, 16384, 16385, 50000}) {
    mx::array x = testing::random_array({n}, seed++, 3.0f);
    expect_same(x, "n " + std::to_string(n));
    expect_same(mx::abs(x), "non-negative n " + std::to_string(n));
    expect_same(mx::negative(mx::abs(x)), "non-positive n " + std::to_string(n));
  }
  expect_same(mx::zeros({3, 5}), "zeros");
  expect_same(testing::random_array({2, 128, 384}, 99, 1000.0f), "wide range, 3-D");
}

}  // namespace
}  // namespace transmuter::kernels
