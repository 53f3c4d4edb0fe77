// The DynamicQuantizeLinear kernel against its MLX composition: the same bytes, scale and zero point
// for sizes around the vector widths and the kernel's chunks, and for ranges on one side of zero, a
// constant zero tensor and a wide one.
#include "kernels/cpu/dynamic_quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/random_arrays.h"
#include "support/simd_targets.h"

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

// quantize_dequantize against the QuantizeLinear -> DequantizeLinear composition it replaces (cast to the
// integer type and back included): the same floats, for ties, values far outside the range (saturated),
// signed and unsigned ranges, lengths that end inside a vector.
TEST(QuantizeDequantizeKernel, EqualsTheOperatorsComposition) {
  auto composition = [](const mx::array& x, float scale, float zero, mx::Dtype type) {
    mx::array q = mx::add(mx::round(mx::divide(x, mx::array(scale)), 0), mx::array(zero));
    const bool is_signed = type == mx::int8;
    q = mx::astype(mx::clip(q, mx::array(is_signed ? -128.0f : 0.0f), mx::array(is_signed ? 127.0f : 255.0f)),
                   type);
    return mx::multiply(mx::subtract(mx::astype(q, mx::float32), mx::array(zero)), mx::array(scale));
  };
  const float scale = 0.05f;
  // Exact ties of x / scale (k + 0.5 for scale 0.5) and far outside the range.
  std::vector<float> special = {0.25f, 0.75f, -0.25f, -0.75f, 1e6f, -1e6f, 3e38f, -3e38f, 0.0f, -0.0f};
  for (auto [type, zero] : {std::pair{mx::uint8, 128.0f}, std::pair{mx::int8, -3.0f}}) {
    const float low = type == mx::int8 ? -128.0f : 0.0f, high = type == mx::int8 ? 127.0f : 255.0f;
    for (int n : {1, 15, 17, 1000, 70001}) {
      mx::array x = testing::random_array({n}, static_cast<uint64_t>(n), 10.0f);
      mx::array got = quantize_dequantize(x, mx::array(scale), mx::array(zero), low, high, mx::Device::cpu);
      EXPECT_TRUE(mx::array_equal(got, composition(x, scale, zero, type)).item<bool>()) << n;
    }
    mx::array ties(special.data(), {static_cast<int>(special.size())});
    mx::array got = quantize_dequantize(ties, mx::array(0.5f), mx::array(zero), low, high, mx::Device::cpu);
    EXPECT_TRUE(mx::array_equal(got, composition(ties, 0.5f, zero, type)).item<bool>());
  }
}

// QuantizeLinear per tensor in one pass: ONNX's composition's bytes (x / scale rounded half to even,
// shifted, saturated) for uint8 and int8, sizes around the vectors and chunks, ties and far-out values.
TEST(QuantizePerTensorKernel, EqualsTheOperatorsComposition) {
  auto composition = [](const mx::array& x, float scale, float zero, mx::Dtype type) {
    mx::array q = mx::add(mx::round(mx::divide(x, mx::array(scale)), 0), mx::array(zero));
    const bool is_signed = type == mx::int8;
    return mx::astype(
        mx::clip(q, mx::array(is_signed ? -128.0f : 0.0f), mx::array(is_signed ? 127.0f : 255.0f)), type);
  };
  std::vector<float> special = {0.25f, 0.75f,  -0.25f, -0.75f, 1e6f,  -1e6f,
                                3e38f, -3e38f, 0.0f,   -0.0f,  63.75f};
  for (auto [type, zero] : {std::pair{mx::uint8, 128.0f}, std::pair{mx::int8, -3.0f}}) {
    for (int n : {1, 15, 17, 1000, 70001}) {
      mx::array x = testing::random_array({n}, static_cast<uint64_t>(n) + 7, 10.0f);
      mx::array got = quantize_per_tensor(x, mx::array(0.05f), mx::array(zero), type, mx::Device::cpu);
      ASSERT_EQ(got.dtype(), type);
      EXPECT_TRUE(mx::array_equal(got, composition(x, 0.05f, zero, type)).item<bool>()) << n;
    }
    mx::array ties(special.data(), {static_cast<int>(special.size())});
    mx::array got = quantize_per_tensor(ties, mx::array(0.5f), mx::array(zero), type, mx::Device::cpu);
    EXPECT_TRUE(mx::array_equal(got, composition(ties, 0.5f, zero, type)).item<bool>());
  }
  EXPECT_THROW(
      quantize_per_tensor(mx::array({1.0f}), mx::array(0.5f), mx::array(0.0f), mx::int32, mx::Device::cpu),
      std::invalid_argument);
}

// An input nothing else holds (a convolution's output in a model) is rounded in place: the result takes its
// buffer and has the same values; an input the caller still holds is left as it was.
TEST(QuantizeDequantizeKernel, RoundsAnInputNothingElseHoldsInPlace) {
  auto want_of = [](const mx::array& x) {  // QuantizeLinear (uint8, zero point 128) -> DequantizeLinear
    mx::array q = mx::clip(mx::add(mx::round(mx::divide(x, mx::array(0.05f)), 0), mx::array(128.0f)),
                           mx::array(0.0f), mx::array(255.0f));
    return mx::multiply(mx::subtract(q, mx::array(128.0f)), mx::array(0.05f));
  };
  mx::array x = mx::multiply(testing::random_array({4, 1000}, 5, 10.0f), mx::array(1.0f));
  mx::array want = want_of(x);
  mx::eval(x, want);
  const float* buffer = x.data<float>();
  const std::vector<float> before(buffer, buffer + x.size());
  mx::array kept = quantize_dequantize(x, mx::array(0.05f), mx::array(128.0f), 0.0f, 255.0f, mx::Device::cpu);
  mx::eval(kept);
  EXPECT_NE(kept.data<float>(), buffer);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), x.data<float>()));
  EXPECT_TRUE(mx::array_equal(kept, want).item<bool>());
  mx::array taken =
      quantize_dequantize(x, mx::array(0.05f), mx::array(128.0f), 0.0f, 255.0f, mx::Device::cpu);
  x = mx::array(0.0f);  // the graph now holds the input's only reference
  mx::eval(taken);
  EXPECT_EQ(taken.data<float>(), buffer) << "the result should take the input's buffer";
  EXPECT_TRUE(mx::array_equal(taken, want).item<bool>());
}

// qlinear_add against ONNX Runtime's arithmetic computed here, element by element (std::fma: each fused
// multiply-add rounded once, then round half to even and saturation): the same bytes under every SIMD target
// (targets without FMA instructions take the scalar path), both 8-bit types, lengths that end inside a
// vector, sums far past the range; an operand nothing else holds gives its buffer; other shapes run the
// reference.
TEST(QLinearAddKernel, EqualsOrtsFusedMultiplyAdds) {
  const int targets = testing::for_each_simd_target([](const std::string& target) {
    for (mx::Dtype type : {mx::uint8, mx::int8}) {
      const bool is_signed = type == mx::int8;
      const int lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
      for (int n : {1, 17, 1000, 40001}) {
        auto integers = [&](uint64_t seed) {
          return mx::astype(mx::random::randint(lo, hi + 1, {n}, mx::int32, mx::random::key(seed)), type);
        };
        mx::array a = integers(static_cast<uint64_t>(n)), b = integers(static_cast<uint64_t>(n) + 1);
        mx::eval(a, b);
        // sA 0.05, sB 0.08, sC 0.07, zero points 3, -7 (or 131, 120) and 10 (or 125): sums that saturate.
        const float ra = 0.05f / 0.07f, rb = 0.08f / 0.07f;
        const float za = is_signed ? 3.0f : 131.0f, zb = is_signed ? -7.0f : 120.0f,
                    zc = is_signed ? 10.0f : 125.0f;
        const QLinearAddRatios r{ra, rb, zc - (ra * za + rb * zb)};
        std::vector<int> want(static_cast<size_t>(n));
        mx::array a32 = mx::astype(a, mx::int32), b32 = mx::astype(b, mx::int32);
        mx::eval(a32, b32);
        for (int i = 0; i < n; ++i) {
          const float sum = std::fma(static_cast<float>(a32.data<int32_t>()[i]), r.a,
                                     std::fma(static_cast<float>(b32.data<int32_t>()[i]), r.b, r.fixed));
          want[static_cast<size_t>(i)] = static_cast<int>(
              std::clamp(std::nearbyint(sum), static_cast<float>(lo), static_cast<float>(hi)));
        }
        bool reference_ran = false;
        Reference reference = [&](const std::vector<mx::array>& in) {
          reference_ran = true;
          return std::vector<mx::array>{in[0]};
        };
        mx::array got = qlinear_add(a, b, r, reference, mx::Device::cpu);
        mx::eval(got);
        ASSERT_FALSE(reference_ran) << target;
        ASSERT_EQ(got.dtype(), type);
        mx::array got32 = mx::astype(got, mx::int32);
        mx::eval(got32);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got32.data<int32_t>())) << target << " n " << n;
      }
    }
  });
  EXPECT_GE(targets, 1);

  // Broadcast operands and float inputs are not the kernel's: the reference runs.
  bool reference_ran = false;
  Reference reference = [&](const std::vector<mx::array>& in) {
    reference_ran = true;
    return std::vector<mx::array>{in[0]};
  };
  mx::array a = mx::zeros({4, 3}, mx::uint8), row = mx::zeros({3}, mx::uint8);
  mx::eval(qlinear_add(a, row, {1, 1, 0}, reference, mx::Device::cpu));
  EXPECT_TRUE(reference_ran);

  // In place: A nothing else holds gives its buffer.
  mx::array x = mx::astype(mx::random::randint(0, 256, {5000}, mx::int32, mx::random::key(3)), mx::uint8);
  mx::eval(x);
  const uint8_t* buffer = x.data<uint8_t>();
  mx::array y = qlinear_add(x, mx::ones({5000}, mx::uint8), {0.5f, 0.5f, 1.0f}, reference, mx::Device::cpu);
  x = mx::array(0.0f);
  mx::eval(y);
  EXPECT_EQ(y.data<uint8_t>(), buffer);
}

// qlinear_global_average_nhwc against ONNX Runtime's formula computed here per image and channel (int32 sums,
// centered, times the scale in float32, round half to even, plus y_zero, saturated): both 8-bit types, a
// MobileNet head's [2, 7, 7, 1280], a rank-3 [N, positions, C], a scale of 1/2 whose products end in .5
// (ties to even), saturation at both ends, and a transposed view (copied dense first).
TEST(QLinearGlobalAverageKernel, EqualsOrtsFormula) {
  struct Case {
    mx::Shape shape;
    QGlobalAverage q;
  };
  for (mx::Dtype type : {mx::uint8, mx::int8}) {
    const bool is_signed = type == mx::int8;
    const int lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
    const std::vector<Case> cases = {
        {{2, 7, 7, 1280}, {0.02f / (0.015f * 49), is_signed ? -3 : 120, is_signed ? 5 : 130}},
        {{3, 4, 5}, {0.5f, is_signed ? 0 : 128, 0}},                           // products ending in .5
        {{1, 2, 3, 17}, {1.5f, is_signed ? -100 : 0, is_signed ? 100 : 200}},  // saturates
    };
    for (const Case& c : cases) {
      mx::array x = mx::astype(mx::random::randint(lo, hi + 1, c.shape, mx::int32, mx::random::key(7)), type);
      mx::array x32 = mx::astype(x, mx::int32);
      mx::eval(x, x32);
      const int64_t batch = c.shape.front(), channels = c.shape.back();
      const int64_t positions = static_cast<int64_t>(x.size()) / (batch * channels);
      std::vector<int32_t> want(static_cast<size_t>(batch * channels));
      for (int64_t n = 0; n < batch; ++n) {
        for (int64_t ch = 0; ch < channels; ++ch) {
          int32_t sum = 0;
          for (int64_t p = 0; p < positions; ++p)
            sum += x32.data<int32_t>()[(n * positions + p) * channels + ch];
          const float v = static_cast<float>(sum - c.q.x_zero * static_cast<int32_t>(positions)) * c.q.scale;
          want[static_cast<size_t>(n * channels + ch)] =
              static_cast<int32_t>(std::clamp(std::nearbyint(v) + static_cast<float>(c.q.y_zero),
                                              static_cast<float>(lo), static_cast<float>(hi)));
        }
      }
      bool reference_ran = false;
      Reference reference = [&](const std::vector<mx::array>& in) {
        reference_ran = true;
        return std::vector<mx::array>{in[0]};
      };
      mx::array got = qlinear_global_average_nhwc(x, c.q, reference, mx::Device::cpu);
      mx::Shape kept(c.shape.size(), 1);
      kept.front() = static_cast<int>(batch);
      kept.back() = static_cast<int>(channels);
      ASSERT_EQ(got.shape(), kept);
      ASSERT_EQ(got.dtype(), type);
      mx::array got32 = mx::astype(got, mx::int32);
      mx::eval(got32);
      ASSERT_FALSE(reference_ran);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got32.data<int32_t>()))
          << (is_signed ? "int8 " : "uint8 ") << x.size() << " elements";
    }
    // Channels-first [4, 5, 3, 2] viewed channels-last as [4, 3, 2, 5]: the kernel reads the view copied
    // dense (its buffer in memory order would mix channels into the sums).
    mx::array base =
        mx::astype(mx::random::randint(lo, hi + 1, {4, 5, 3, 2}, mx::int32, mx::random::key(8)), type);
    mx::array view = mx::transpose(base, {0, 2, 3, 1});
    const QGlobalAverage q{0.25f, 0, 1};
    Reference unused = [](const std::vector<mx::array>& in) { return std::vector<mx::array>{in[0]}; };
    mx::array from_view = qlinear_global_average_nhwc(view, q, unused, mx::Device::cpu);
    mx::array from_dense = qlinear_global_average_nhwc(mx::contiguous(view), q, unused, mx::Device::cpu);
    EXPECT_TRUE(mx::array_equal(from_view, from_dense).item<bool>());
  }
  // Float input is not the kernel's: the reference runs.
  bool reference_ran = false;
  Reference reference = [&](const std::vector<mx::array>& in) {
    reference_ran = true;
    return std::vector<mx::array>{in[0]};
  };
  mx::eval(qlinear_global_average_nhwc(mx::zeros({1, 2, 2, 3}), {1, 0, 0}, reference, mx::Device::cpu));
  EXPECT_TRUE(reference_ran);
}

// dequantize_per_tensor and requantize against their compositions (QuantizeLinear with scale 1 after a
// multiplication, DequantizeLinear per tensor): the same values, per tensor and per channel along the
// last axis, both 8-bit types, saturation, lengths that end inside a vector.
TEST(RequantizeKernels, EqualTheCompositions) {
  for (mx::Dtype type : {mx::uint8, mx::int8}) {
    const float zero = type == mx::int8 ? -7.0f : 131.0f;
    for (int c : {1, 17, 64}) {
      mx::array v = testing::random_array({3, 5, c}, static_cast<uint64_t>(c), 3000.0f);
      for (bool per_channel : {false, true}) {
        mx::array m = per_channel ? mx::random::uniform(0.001f, 0.2f, {c}, mx::float32, mx::random::key(c))
                                  : mx::array(0.037f);
        mx::array got = requantize(v, m, mx::array(zero), type, mx::Device::cpu);
        const bool is_signed = type == mx::int8;
        mx::array want = mx::astype(
            mx::clip(mx::add(mx::round(mx::multiply(v, m), 0), mx::array(zero)),
                     mx::array(is_signed ? -128.0f : 0.0f), mx::array(is_signed ? 127.0f : 255.0f)),
            type);
        ASSERT_EQ(got.dtype(), type);
        EXPECT_TRUE(mx::array_equal(got, want).item<bool>()) << c << (per_channel ? " per channel" : "");
        mx::array back = dequantize_per_tensor(got, mx::array(0.25f), mx::array(zero), mx::Device::cpu);
        mx::array back_want =
            mx::multiply(mx::subtract(mx::astype(got, mx::float32), mx::array(zero)), mx::array(0.25f));
        EXPECT_TRUE(mx::array_equal(back, back_want).item<bool>()) << c;
        // The DequantizeLinear fused in (fuse_quantize_dequantize): the same floats, in one pass.
        mx::array fused = requantize(v, m, mx::array(zero), type, mx::Device::cpu,
                                     Dequantization{mx::array(0.25f), mx::array(zero + 3.0f)});
        mx::array fused_want = mx::multiply(
            mx::subtract(mx::astype(want, mx::float32), mx::array(zero + 3.0f)), mx::array(0.25f));
        ASSERT_EQ(fused.dtype(), mx::float32);
        EXPECT_TRUE(mx::array_equal(fused, fused_want).item<bool>())
            << c << (per_channel ? " per channel" : "");
      }
    }
  }
  // The float32 result takes the buffer of a V nothing else holds.
  mx::array v = testing::random_array({4, 64}, 9, 300.0f);
  mx::eval(v);
  const float* buffer = v.data<float>();
  mx::array y = requantize(v, mx::array(0.5f), mx::array(128.0f), mx::uint8, mx::Device::cpu,
                           Dequantization{mx::array(0.1f), mx::array(128.0f)});
  v = mx::array(0.0f);
  mx::eval(y);
  EXPECT_EQ(y.data<float>(), buffer);
}

}  // namespace
}  // namespace transmuter::kernels
