// The channels-last max pool kernel against a loop over each window: kernel
// sizes, strides, dilations, pads and windows past the input's end, channel
// counts off the vector width, every SIMD target; NaN and windows wholly in
// the padding; gradients against its MLX reference; mx::compile; the cases it
// hands to the reference.
#include "kernels/cpu/max_pool.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/random_arrays.h"
#include "support/simd_targets.h"

namespace transmuter::kernels {
namespace {

using testing::random_array;

// y as a plain loop over each output's window, in double; positions outside
// x are skipped, an empty window gives -inf, a NaN in the window gives NaN.
std::vector<float> window_maxima(const mx::array& x, const MaxPoolOptions& o) {
  mx::array xf = mx::astype(x, mx::float32);
  mx::eval(xf);
  const float* v = xf.data<float>();
  const int n = x.shape(0), h = x.shape(1), w = x.shape(2), c = x.shape(3);
  std::vector<float> y;
  for (int b = 0; b < n; ++b) {
    for (int oy = 0; oy < o.output[0]; ++oy) {
      for (int ox = 0; ox < o.output[1]; ++ox) {
        for (int ch = 0; ch < c; ++ch) {
          double best = -std::numeric_limits<double>::infinity();
          bool nan = false;
          for (int ky = 0; ky < o.kernel[0]; ++ky) {
            for (int kx = 0; kx < o.kernel[1]; ++kx) {
              const int iy = oy * o.strides[0] - o.pads_begin[0] + ky * o.dilations[0];
              const int ix = ox * o.strides[1] - o.pads_begin[1] + kx * o.dilations[1];
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              const float e = v[((static_cast<int64_t>(b) * h + iy) * w + ix) * c + ch];
              nan |= std::isnan(e);
              best = std::max(best, static_cast<double>(e));
            }
          }
          y.push_back(nan ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(best));
        }
      }
    }
  }
  return y;
}

// Element-wise equal (the max of floats is exact), NaN where NaN is expected.
void expect_same(const mx::array& got, const std::vector<float>& want, const std::string& what) {
  mx::array g = mx::astype(got, mx::float32);
  mx::eval(g);
  ASSERT_EQ(g.size(), want.size()) << what;
  const float* p = g.data<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(p[i])) << what << " element " << i;
    } else {
      ASSERT_EQ(p[i], want[i]) << what << " element " << i;
    }
  }
}

bool from_kernel(const mx::array& y) {
  return y.has_primitive() && std::string(y.primitive().name()) == "transmuter::MaxPoolNhwc";
}

struct Case {
  int batch, height, width, channels;
  MaxPoolOptions options;
};

TEST(MaxPoolKernel, MatchesALoopOverEachWindow) {
  const std::vector<Case> cases = {
      // ResNet's stem pool: 3x3 stride 2 pad 1, 64 channels.
      {2, 112, 112, 64, {.kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .output = {56, 56}}},
      // Channel tails: 1, 5, 17, 70 (not multiples of 4, 8 or 16 lanes).
      {1, 9, 7, 1, {.kernel = {2, 2}, .strides = {2, 2}, .output = {4, 3}}},
      {1, 9, 7, 5, {.kernel = {3, 2}, .strides = {1, 2}, .pads_begin = {0, 1}, .output = {7, 4}}},
      {3, 6, 10, 17, {.kernel = {2, 3}, .strides = {2, 3}, .dilations = {2, 1}, .output = {2, 3}}},
      {1, 8, 8, 70, {.kernel = {3, 3}, .strides = {1, 1}, .pads_begin = {1, 1}, .output = {8, 8}}},
      // ceil_mode-like: the last windows reach past the input's end.
      {2, 7, 7, 24, {.kernel = {3, 3}, .strides = {2, 2}, .output = {4, 4}}},
      // Dilated, strided, asymmetric.
      {1,
       15,
       13,
       33,
       {.kernel = {3, 2}, .strides = {3, 2}, .dilations = {2, 3}, .pads_begin = {2, 0}, .output = {5, 5}}},
  };
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      mx::array x = random_array({c.batch, c.height, c.width, c.channels}, 100 + i);
      mx::array y = max_pool_nhwc(x, c.options, mx::Device::cpu);
      EXPECT_TRUE(from_kernel(y)) << "case " << i;
      const mx::Shape shape = {c.batch, c.options.output[0], c.options.output[1], c.channels};
      EXPECT_EQ(y.shape(), shape) << "case " << i;
      expect_same(y, window_maxima(x, c.options), target + " case " + std::to_string(i));
    }
  });
  EXPECT_GE(targets, 1);
}

TEST(MaxPoolKernel, PropagatesNanAndGivesMinusInfinityForAWindowInThePadding) {
  // Pads of 2 with a 2x2 window: the first window of each axis holds padding only.
  const MaxPoolOptions o{.kernel = {2, 2}, .strides = {2, 2}, .pads_begin = {2, 2}, .output = {3, 3}};
  std::vector<float> values(1 * 4 * 4 * 19);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 23) - 11.0f;
  values[(1 * 4 + 2) * 19 + 3] = std::numeric_limits<float>::quiet_NaN();   // [0, 1, 2, 3]
  values[(3 * 4 + 3) * 19 + 18] = std::numeric_limits<float>::quiet_NaN();  // [0, 3, 3, 18]: a tail lane
  mx::array x(values.data(), {1, 4, 4, 19}, mx::float32);
  testing::for_each_simd_target([&](const std::string& target) {
    mx::array y = max_pool_nhwc(x, o, mx::Device::cpu);
    ASSERT_TRUE(from_kernel(y));
    const std::vector<float> want = window_maxima(x, o);
    EXPECT_TRUE(std::isinf(want[0]) && want[0] < 0) << "the loop's own check of the case";
    expect_same(y, want, target);
  });
}

TEST(MaxPoolKernel, GradientsEqualThoseOfTheReference) {
  mx::array x = random_array({2, 9, 8, 20}, 201);
  const MaxPoolOptions o{.kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .output = {5, 4}};
  mx::array weights = random_array({2, 5, 4, 20}, 202);
  auto loss_of = [&](bool kernel) {
    return [&, kernel](const std::vector<mx::array>& p) {
      mx::array y = kernel ? max_pool_nhwc(p[0], o, mx::Device::cpu)
                           : max_pool_nhwc_reference(p[0], o, mx::default_stream(mx::Device::cpu));
      return std::vector<mx::array>{mx::sum(y * weights)};
    };
  };
  auto [_, got] = mx::vjp(loss_of(true), {x}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss_of(false), {x}, {mx::array(1.0f)});
  ASSERT_EQ(got[0].shape(), x.shape());
  EXPECT_TRUE(mx::array_equal(got[0], want[0]).item<bool>());
  EXPECT_GT(mx::sum(mx::abs(got[0])).item<float>(), 0.0f) << "a gradient that is all zeros checks nothing";
}

TEST(MaxPoolKernel, RunsInsideCompile) {
  mx::array x = random_array({1, 14, 14, 40}, 211);
  const MaxPoolOptions o{.kernel = {3, 3}, .strides = {2, 2}, .pads_begin = {1, 1}, .output = {7, 7}};
  auto f = mx::compile([o](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{max_pool_nhwc(mx::multiply(in[0], mx::array(2.0f)), o, mx::Device::cpu)};
  });
  expect_same(f({x})[0], window_maxima(x * 2.0f, o), "compiled");
}

TEST(MaxPoolKernel, OtherDtypesUseTheReference) {
  const MaxPoolOptions o{.kernel = {2, 2}, .strides = {1, 1}, .output = {4, 5}};
  mx::array half = mx::astype(random_array({1, 5, 6, 3}, 221), mx::float16);
  mx::array y = max_pool_nhwc(half, o, mx::Device::cpu);
  EXPECT_FALSE(from_kernel(y));
  EXPECT_EQ(y.dtype(), mx::float16);
  expect_same(y, window_maxima(half, o), "float16");

  mx::array ints = mx::astype(mx::arange(30), mx::int32);
  ints = mx::reshape(ints, {1, 5, 6, 1});
  mx::array yi = max_pool_nhwc(ints, o, mx::Device::cpu);
  EXPECT_FALSE(from_kernel(yi));
  EXPECT_EQ(yi.dtype(), mx::int32);
  expect_same(yi, window_maxima(ints, o), "int32");
}

}  // namespace
}  // namespace transmuter::kernels
