// The rotary-embedding kernel against the rotate_half composition written out with MLX ops: equal
// values (the kernel rounds as the composition does) for tables per batch, per head or shared, odd
// sizes; the composition's gradients; and the arguments it hands back to the composition.
#include "kernels/cpu/rotary.h"

#include <gtest/gtest.h>

#include "support/random_arrays.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Written out independently of the kernel's reference: x * cos + concat(-x2, x1) * sin.
mx::array expected(const mx::array& x, const mx::array& cos, const mx::array& sin) {
  const int h = x.shape(-1) / 2;
  mx::array x1 = mx::slice(x, {0, 0, 0, 0}, {x.shape(0), x.shape(1), x.shape(2), h});
  mx::array x2 = mx::slice(x, {0, 0, 0, h}, x.shape());
  return x * cos + mx::concatenate({-x2, x1}, 3) * sin;
}

TEST(RotateHalfRotary, EqualsTheComposition) {
  struct Case {
    mx::Shape x, table;
  };
  for (const Case& c : {Case{{1, 8, 1, 64}, {1, 1, 1, 64}}, Case{{2, 3, 5, 16}, {2, 1, 5, 16}},
                        Case{{2, 3, 5, 16}, {1, 3, 5, 16}}, Case{{3, 2, 7, 6}, {3, 2, 7, 6}},
                        Case{{1, 4, 33, 128}, {1, 1, 33, 128}}}) {
    mx::array x = random_array(c.x, 1), cos = random_array(c.table, 2), sin = random_array(c.table, 3);
    ASSERT_TRUE(rotate_half_rotary_fits(x, cos, sin));
    mx::array got = rotate_half_rotary(x, cos, sin, mx::Device::cpu);
    mx::array want = expected(x, cos, sin);
    EXPECT_EQ(got.shape(), c.x);
    EXPECT_EQ(max_abs_diff(got, want), 0.0f) << "x " << c.x << " table " << c.table;
  }
}

TEST(RotateHalfRotary, OtherArgumentsRunTheComposition) {
  mx::array x = random_array({2, 3, 5, 16}, 4);
  // A table broadcast along the positions, a 3-D x, an odd last axis, float16: the reference.
  for (auto [xx, table] : {std::pair{x, random_array({1, 1, 1, 16}, 5)},
                           std::pair{random_array({3, 5, 16}, 6), random_array({1, 5, 16}, 7)}}) {
    EXPECT_FALSE(rotate_half_rotary_fits(xx, table, table));
    EXPECT_EQ(max_abs_diff(rotate_half_rotary(xx, table, table, mx::Device::cpu),
                           rotate_half_rotary_reference(xx, table, table, mx::Device::cpu)),
              0.0f);
  }
  mx::array odd = random_array({1, 2, 3, 5}, 8);
  EXPECT_FALSE(rotate_half_rotary_fits(odd, odd, odd));
  mx::array half = mx::astype(x, mx::float16);
  EXPECT_FALSE(rotate_half_rotary_fits(half, half, half));
}

TEST(RotateHalfRotary, GradientsAreTheCompositions) {
  mx::array x = random_array({1, 2, 3, 8}, 9), cos = random_array({1, 1, 3, 8}, 10), sin = random_array({1, 1, 3, 8}, 11);
  auto loss = [](bool kernel) {
    return [kernel](const std::vector<mx::array>& in) {
      mx::array y = kernel ? rotate_half_rotary(in[0], in[1], in[2], mx::Device::cpu) : expected(in[0], in[1], in[2]);
      return std::vector{mx::sum(y * y)};
    };
  };
  auto [_, got] = mx::vjp(loss(true), {x, cos, sin}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss(false), {x, cos, sin}, {mx::array(1.0f)});
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(max_abs_diff(got[i], want[i]), 1e-5f) << "input " << i;
}

}  // namespace
}  // namespace transmuter::kernels
