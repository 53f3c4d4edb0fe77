// The channels-last 8-bit convolutions (QLinearConv's integer kernels) against int64 sums on the host,
// requantized as ONNX Runtime requantizes (float(acc + bias) * multiplier, rounded half to even, plus the
// zero point, saturated): pointwise (the image as the product's left-hand side, and channel counts that
// are no multiple of 4, which are unfolded), k x k with padding, strides and dilation, a stem over RGB read
// in NCHW, uint8 and int8 activations, int8 and uint8 weights with and without zero points, per-tensor and
// per-channel multipliers, int8 and uint8 outputs, depthwise with channel tails; all exact, and the kernels'
// references (MLX ops, for other streams and CPUs) equal to them. Also what the kernels refuse.
#include "kernels/cpu/qlinear_conv.h"

#include "kernels/cpu/cpu_kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/simd_targets.h"

namespace transmuter::kernels {
namespace {

mx::array random_bytes(mx::Shape shape, mx::Dtype dtype, uint64_t seed, int lo = 0, int hi = 256) {
  if (dtype == mx::int8) lo = std::max(lo, -128), hi = std::min(hi, 128);
  return mx::astype(mx::random::randint(lo, hi, shape, mx::int32, mx::random::key(seed)), dtype);
}

std::vector<int32_t> ints(const mx::array& a) {
  mx::array i = mx::astype(mx::reshape(a, {-1}), mx::int32);
  i.eval();
  return {i.data<int32_t>(), i.data<int32_t>() + i.size()};
}

std::vector<float> floats(const mx::array& a) {
  mx::array f = mx::reshape(a, {-1});
  f.eval();
  return {f.data<float>(), f.data<float>() + f.size()};
}

struct Case {
  int batch, channels, height, width, out_channels;
  NhwcConvOptions options;
  bool depthwise = false;
  mx::Dtype weight_type = mx::int8;
  bool weight_zero = false;  // per-channel zero points (else none)
  bool per_channel = true;   // multiplier per output channel
  bool bias = true;
  mx::Dtype y_type = mx::uint8;
  mx::Dtype x_type = mx::uint8;
};

// The operator's bytes from host loops: x NHWC (as given, NCHW when channels_first_input), w ONNX [M, C/g,
// kH, kW].
std::vector<int32_t> expected(const Case& c, const mx::array& x, int32_t x_zero, const mx::array& w,
                              const std::vector<int32_t>& w_zero, const std::vector<float>& multiplier,
                              const std::vector<int32_t>& bias, int y_zero, const mx::Shape& out) {
  const NhwcConvOptions& o = c.options;
  const std::vector<int32_t> xv = ints(x), wv = ints(w);
  const int oh = out[1], ow = out[2], m_count = c.out_channels;
  const int per_group = c.depthwise ? 1 : c.channels;
  const int lo = c.y_type == mx::int8 ? -128 : 0, hi = c.y_type == mx::int8 ? 127 : 255;
  std::vector<int32_t> y;
  for (int n = 0; n < c.batch; ++n)
    for (int oy = 0; oy < oh; ++oy)
      for (int ox = 0; ox < ow; ++ox)
        for (int m = 0; m < m_count; ++m) {
          int64_t acc = 0;
          for (int ci = 0; ci < per_group; ++ci) {
            const int channel = c.depthwise ? m : ci;
            for (int ky = 0; ky < o.kernel[0]; ++ky)
              for (int kx = 0; kx < o.kernel[1]; ++kx) {
                const int iy = oy * o.strides[0] - o.pads_begin[0] + ky * o.dilations[0];
                const int ix = ox * o.strides[1] - o.pads_begin[1] + kx * o.dilations[1];
                if (iy < 0 || iy >= c.height || ix < 0 || ix >= c.width) continue;
                const size_t at =
                    o.channels_first_input
                        ? ((static_cast<size_t>(n) * c.channels + channel) * c.height + iy) * c.width + ix
                        : ((static_cast<size_t>(n) * c.height + iy) * c.width + ix) * c.channels + channel;
                const int64_t wi =
                    ((static_cast<int64_t>(m) * per_group + ci) * o.kernel[0] + ky) * o.kernel[1] + kx;
                acc += static_cast<int64_t>(xv[at] - x_zero) * (wv[wi] - w_zero[m]);
              }
          }
          const auto sum = static_cast<int32_t>(acc + bias[m]);
          const float scaled = static_cast<float>(sum) * multiplier[multiplier.size() == 1 ? 0 : m];
          const int q = static_cast<int>(std::nearbyint(scaled)) + y_zero;
          y.push_back(std::clamp(q, lo, hi));
        }
  return y;
}

void check(const Case& c, uint64_t seed) {
  const NhwcConvOptions& o = c.options;
  const mx::Shape x_shape = o.channels_first_input ? mx::Shape{c.batch, c.channels, c.height, c.width}
                                                   : mx::Shape{c.batch, c.height, c.width, c.channels};
  const mx::array x = random_bytes(x_shape, c.x_type, seed, -128, 256);
  const mx::array x_zero = c.x_type == mx::int8 ? random_bytes({}, mx::int8, seed + 1, -28, 28)
                                                : random_bytes({}, mx::uint8, seed + 1, 100, 156);
  const int in_per_group = c.depthwise ? 1 : c.channels;
  const mx::array w = random_bytes({c.out_channels, in_per_group, o.kernel[0], o.kernel[1]}, c.weight_type,
                                   seed + 2, -127, 256);
  std::optional<mx::array> w_zero;
  std::vector<int32_t> w_zero_values(static_cast<size_t>(c.out_channels), 0);
  if (c.weight_zero) {
    w_zero = c.weight_type == mx::int8 ? random_bytes({c.out_channels}, mx::int8, seed + 3, -10, 10)
                                       : random_bytes({c.out_channels}, mx::uint8, seed + 3, 118, 138);
    w_zero_values = ints(*w_zero);
  }
  // Multipliers that spread the sums over the output's range (and past it: saturation).
  const float window = static_cast<float>(in_per_group * o.kernel[0] * o.kernel[1]);
  const mx::array multiplier = mx::random::uniform(0.5f / (window * 200.0f), 3.0f / (window * 200.0f),
                                                   c.per_channel ? mx::Shape{c.out_channels} : mx::Shape{1},
                                                   mx::float32, mx::random::key(seed + 4));
  std::optional<mx::array> bias;
  std::vector<int32_t> bias_values(static_cast<size_t>(c.out_channels), 0);
  if (c.bias) {
    bias = mx::random::randint(-20000, 20000, {c.out_channels}, mx::int32, mx::random::key(seed + 5));
    bias_values = ints(*bias);
  }
  const mx::array y_zero =
      c.y_type == mx::int8 ? mx::array(static_cast<int8_t>(-7)) : mx::array(static_cast<uint8_t>(131));
  const QLinearRequantize requantize{multiplier, bias, y_zero};
  mx::array y = [&] {
    if (c.depthwise)
      return qlinear_depthwise_conv_nhwc(x, x_zero, qlinear_depthwise_weight(w, w_zero), requantize, o,
                                         mx::Device::cpu);
    mx::array rows = mx::contiguous(qlinear_conv_weight_rows(w));
    rows.eval();
    return qlinear_conv_nhwc(x, x_zero, pack_integer_gemm_rhs(rows, w_zero), c.out_channels, requantize, o,
                             mx::Device::cpu);
  }();
  // The kernel's reference (other streams, CPUs without AVX512-VNNI): the same integers through MLX ops.
  ASSERT_TRUE(y.has_primitive());
  const auto* kernel = dynamic_cast<const CpuKernel*>(&y.primitive());
  ASSERT_NE(kernel, nullptr);
  mx::array from_reference = kernel->reference()(y.inputs())[0];
  y.eval();
  ASSERT_EQ(y.dtype(), c.y_type);
  EXPECT_TRUE(mx::array_equal(from_reference, y).item<bool>());
  const std::vector<int32_t> want = expected(c, x, ints(x_zero)[0], w, w_zero_values, floats(multiplier),
                                             bias_values, ints(y_zero)[0], y.shape());
  const std::vector<int32_t> got = ints(y);
  ASSERT_EQ(got.size(), want.size());
  size_t wrong = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && wrong++ == 0) first = i;
  }
  EXPECT_EQ(wrong, 0u) << "first at " << first << ": " << (first < got.size() ? got[first] : 0) << " vs "
                       << (first < got.size() ? want[first] : 0);
  // Not saturated throughout: the values spread.
  EXPECT_GT(*std::max_element(want.begin(), want.end()) - *std::min_element(want.begin(), want.end()), 20);
}

NhwcConvOptions conv(int k, int stride, std::array<int, 2> pads_begin, std::array<int, 2> pads_end,
                     int dilation = 1) {
  NhwcConvOptions o;
  o.kernel = {k, k};
  o.strides = {stride, stride};
  o.pads_begin = pads_begin;
  o.pads_end = pads_end;
  o.dilations = {dilation, dilation};
  return o;
}

// The filters' own layout in the GEMM's row order: the transpose of qlinear_conv_weight_rows, a 1x1
// weight without a copy.
TEST(QLinearConvWeights, ColumnsAreTheTransposedRows) {
  for (const mx::Shape& shape : {mx::Shape{5, 3, 3, 3}, mx::Shape{16, 8, 1, 1}, mx::Shape{4, 2, 1, 3}}) {
    const mx::array w = random_bytes(shape, mx::int8, 40);
    const mx::array columns = qlinear_conv_weight_columns(w);
    const mx::array want = mx::transpose(qlinear_conv_weight_rows(w));
    ASSERT_EQ(columns.shape(), want.shape());
    EXPECT_TRUE(mx::array_equal(columns, want).item<bool>()) << shape[2] << "x" << shape[3];
  }
}

TEST(QLinearConvNhwc, GroupOneEqualsTheIntegerSums) {
  NhwcConvOptions stem = conv(3, 2, {1, 1}, {1, 1});
  stem.channels_first_input = true;
  const std::vector<Case> cases = {
      {2, 16, 5, 7, 40, conv(1, 1, {0, 0}, {0, 0})},                        // pointwise in place
      {1, 6, 6, 5, 33, conv(1, 1, {0, 0}, {0, 0}), false, mx::int8, true},  // C % 4 != 0: unfolded
      {1, 3, 17, 18, 32, stem},                                             // stem over NCHW RGB
      {1, 3, 224, 224, 32, stem},  // rows enough for the interleave to spread over the pool's threads
      {2, 8, 9, 11, 20, conv(3, 1, {1, 0}, {2, 1}, 2), false, mx::int8, false, false, false, mx::int8},
      {1, 24, 6, 6, 70, conv(1, 1, {0, 0}, {0, 0}), false, mx::uint8, true},  // B zero points
      {1, 12, 8, 8, 16, conv(3, 2, {0, 0}, {0, 0}), false, mx::uint8, false, true, true, mx::int8},
      // int8 activations: their bytes flipped to uint8 for VNNI, the zero point moved by 128
      {2, 16, 5, 7, 40, conv(1, 1, {0, 0}, {0, 0}), false, mx::int8, false, true, true, mx::int8, mx::int8},
      {1, 3, 17, 18, 32, stem, false, mx::int8, true, true, true, mx::uint8, mx::int8},
      {1, 8, 9, 11, 20, conv(3, 1, {1, 1}, {1, 1}), false, mx::uint8, true, false, true, mx::int8, mx::int8},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE("case " + std::to_string(seed));
    check(c, seed);
    seed += 10;
  }
}

TEST(QLinearConvNhwc, DepthwiseEqualsTheIntegerSums) {
  const std::vector<Case> cases = {
      {1, 40, 9, 10, 40, conv(3, 1, {1, 1}, {1, 1}), true},  // a channel tail
      {2, 16, 11, 9, 16, conv(3, 2, {1, 1}, {1, 1}), true, mx::int8, true, true, true, mx::int8},
      {1, 24, 12, 12, 24, conv(5, 1, {2, 2}, {2, 2}), true, mx::uint8, true, false, false},
      {1, 8, 20, 21, 8, conv(3, 1, {0, 1}, {2, 0}, 2), true},  // dilation, odd pads
      {1, 40, 9, 10, 40, conv(3, 2, {1, 1}, {1, 1}), true, mx::int8, false, true, true, mx::int8, mx::int8},
      // rows of more than eight interior columns at strides 1 and 2 (the VNNI form's shared input columns)
      {1, 24, 7, 40, 24, conv(3, 2, {1, 1}, {1, 1}), true, mx::int8, true, true, true, mx::uint8, mx::int8},
      {1, 20, 9, 44, 20, conv(5, 2, {2, 2}, {2, 2}), true},
      {2, 16, 5, 30, 16, conv(5, 1, {2, 2}, {2, 2}), true, mx::uint8, false, false, false},
  };
  uint64_t seed = 200;
  for (const Case& c : cases) {
    SCOPED_TRACE("case " + std::to_string(seed));
    check(c, seed);
    seed += 10;
  }
}

// The depthwise kernel's two forms: int32 lanes on VNNI targets, float32 on the others.
TEST(QLinearConvNhwc, DepthwiseOnEverySimdTarget) {
  const int targets = testing::for_each_simd_target([](const std::string& target) {
    SCOPED_TRACE(target);
    check({1, 40, 9, 10, 40, conv(3, 1, {1, 1}, {1, 1}), true, mx::int8, true, true, true}, 300);
    check(
        {1, 24, 8, 7, 24, conv(3, 2, {1, 1}, {1, 1}), true, mx::int8, false, true, true, mx::int8, mx::int8},
        310);
  });
  EXPECT_GE(targets, 1);
}

TEST(QLinearConvNhwc, RefusesOperandsThatDoNotAgree) {
  const NhwcConvOptions o = conv(1, 1, {0, 0}, {0, 0});
  const mx::array x = random_bytes({1, 4, 4, 8}, mx::uint8, 1);
  const mx::array x_zero(static_cast<uint8_t>(128));
  const QLinearRequantize r{mx::array({0.01f}), std::nullopt, mx::array(static_cast<uint8_t>(0))};
  mx::array rows = mx::contiguous(qlinear_conv_weight_rows(random_bytes({16, 8, 1, 1}, mx::int8, 2)));
  rows.eval();
  const PackedIntegerRhs packed = pack_integer_gemm_rhs(rows, std::nullopt);
  EXPECT_THROW(qlinear_conv_nhwc(mx::astype(x, mx::float32), x_zero, packed, 16, r, o),
               std::invalid_argument);
  EXPECT_THROW(qlinear_conv_nhwc(x, mx::array(static_cast<int8_t>(0)), packed, 16, r, o),
               std::invalid_argument);
  EXPECT_THROW(qlinear_conv_nhwc(random_bytes({1, 4, 4, 12}, mx::uint8, 3), x_zero, packed, 16, r, o),
               std::invalid_argument);  // the packed window is 8 channels
  const QLinearRequantize wrong_bias{mx::array({0.01f}), mx::array({1, 2}),
                                     mx::array(static_cast<uint8_t>(0))};
  EXPECT_THROW(qlinear_conv_nhwc(x, x_zero, packed, 16, wrong_bias, o), std::invalid_argument);
  const QLinearRequantize int32_zero{mx::array({0.01f}), std::nullopt, mx::array(0)};
  EXPECT_THROW(qlinear_conv_nhwc(x, x_zero, packed, 16, int32_zero, o), std::invalid_argument);
  const mx::array dw = qlinear_depthwise_weight(random_bytes({8, 1, 3, 3}, mx::int8, 4), std::nullopt);
  EXPECT_THROW(qlinear_depthwise_conv_nhwc(x, x_zero, dw, r, conv(5, 1, {2, 2}, {2, 2})),
               std::invalid_argument);
  EXPECT_THROW(qlinear_depthwise_weight(random_bytes({8, 2, 3, 3}, mx::int8, 5), std::nullopt),
               std::invalid_argument);
}

}  // namespace
}  // namespace transmuter::kernels
