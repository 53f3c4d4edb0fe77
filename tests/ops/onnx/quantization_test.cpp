#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/dtype.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::int_attr;
using testing::ints_attr;
using testing::run_compiled;
using testing::run_domain_op;
using testing::run_op;
using testing::to_doubles;
using testing::to_ints;

mx::array u8(std::vector<int> v, mx::Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int>(v.size())};
  return mx::astype(mx::array(v.data(), shape, mx::int32), mx::uint8);
}
mx::array i8(std::vector<int> v, mx::Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int>(v.size())};
  return mx::astype(mx::array(v.data(), shape, mx::int32), mx::int8);
}
mx::array f32(std::vector<float> v, mx::Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int>(v.size())};
  return mx::array(v.data(), shape, mx::float32);
}

Attribute type_attr(const std::string& name, OnnxType type) { return int_attr(name, static_cast<int64_t>(type)); }

/** The message of the OpError `fn` throws. */
template <typename Fn>
std::string op_error(Fn&& fn) {
  return error_of<OpError>(std::forward<Fn>(fn));
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// --- QuantizeLinear -----------------------------------------------------------------

TEST(QuantizeLinear, RoundsHalfToEvenThenAddsTheZeroPointAndSaturates) {
  // x / 2 = 0.5, 1.5, 2.5, -0.5, -1.5, 300, -300
  mx::array x = f32({1, 3, 5, -1, -3, 600, -600});
  mx::array y = run_op("QuantizeLinear", 13, {x, mx::array(2.0f), u8({10}, {})})[0].tensor();
  EXPECT_EQ(y.dtype(), mx::uint8);
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{10, 12, 12, 10, 8, 255, 0}));
  // No zero point: uint8 with zero point 0.
  EXPECT_EQ(to_ints(run_op("QuantizeLinear", 10, {x, mx::array(2.0f)})[0].tensor()),
            (std::vector<int64_t>{0, 2, 2, 0, 0, 255, 0}));
}

TEST(QuantizeLinear, PerAxisScalesAndZeroPoints) {
  mx::array x = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  mx::array y = run_op("QuantizeLinear", 13, {x, f32({1, 0.5f}), i8({0, -100})}, {int_attr("axis", 0)})[0].tensor();
  EXPECT_EQ(y.dtype(), mx::int8);
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{1, 2, 3, -92, -90, -88}));
}

TEST(QuantizeLinear, BlockedScalesCoverAShortLastBlock) {
  // axis 1 of length 5 with block_size 2: blocks {0,1}, {2,3}, {4}.
  mx::array x = f32({2, 2, 2, 2, 2, 8, 8, 8, 8, 8}, {2, 5});
  mx::array scale = f32({1, 2, 4, 1, 4, 8}, {2, 3});
  mx::array y = run_op("QuantizeLinear", 21, {x, scale},
                       {int_attr("axis", 1), int_attr("block_size", 2), type_attr("output_dtype", OnnxType::kInt16)})[0]
                    .tensor();
  EXPECT_EQ(y.dtype(), mx::int16);
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{2, 2, 1, 1, 0, 8, 8, 2, 2, 1}));
}

TEST(QuantizeLinear, SubByteAndFloat8OutputsSaturateToTheNarrowType) {
  mx::array x = f32({-20, -7.5f, 0.5f, 6.6f, 100});
  // int4 through output_dtype: [-8, 7], held as int8.
  mx::array q4 = run_op("QuantizeLinear", 21, {x, mx::array(1.0f)}, {type_attr("output_dtype", OnnxType::kInt4)})[0]
                     .tensor();
  EXPECT_EQ(q4.dtype(), mx::int8);
  EXPECT_EQ(to_ints(q4), (std::vector<int64_t>{-8, -8, 0, 7, 7}));
  mx::array u2 =
      run_op("QuantizeLinear", 25, {x, mx::array(1.0f)}, {type_attr("output_dtype", OnnxType::kUint2)})[0].tensor();
  EXPECT_EQ(to_ints(u2), (std::vector<int64_t>{0, 0, 0, 3, 3}));
  // float8e4m3fn: rounded to 3 mantissa bits, saturating at 448.
  mx::array f8 = run_op("QuantizeLinear", 21, {f32({1000, 0.3f, -17}), mx::array(1.0f)},
                        {type_attr("output_dtype", OnnxType::kFloat8E4M3FN)})[0]
                     .tensor();
  EXPECT_EQ(to_doubles(f8), (std::vector<double>{448, 0.3125, -16}));
  mx::array f8_inf = run_op("QuantizeLinear", 21, {f32({1e6f}), mx::array(1.0f)},
                            {type_attr("output_dtype", OnnxType::kFloat8E5M2), int_attr("saturate", 0)})[0]
                         .tensor();
  EXPECT_TRUE(std::isinf(to_doubles(f8_inf)[0]));
}

TEST(QuantizeLinear, TheZeroPointsElementTypeIsTheOutputType) {
  mx::array x = f32({-20, 3.4f, 100});
  // An int4 zero point is held as int8; its Value says int4, so y saturates to [-8, 7].
  Value zp4(i8({1}, {}), OnnxType::kInt4);
  Value q4 = run_op("QuantizeLinear", 21, {x, mx::array(1.0f), zp4})[0];
  EXPECT_EQ(q4.element_type(), OnnxType::kInt4);
  EXPECT_EQ(to_ints(q4.tensor()), (std::vector<int64_t>{-8, 4, 7}));
  Value zp8(f32({0}, {}), OnnxType::kFloat8E5M2);
  Value q8 = run_op("QuantizeLinear", 19, {x, mx::array(1.0f), zp8})[0];
  EXPECT_EQ(q8.element_type(), OnnxType::kFloat8E5M2);
  EXPECT_EQ(to_doubles(q8.tensor()), (std::vector<double>{-20, 3.5, 96}));
  // And back: float8 input, float32 output.
  Value y = run_op("DequantizeLinear", 19, {q8, mx::array(2.0f), zp8})[0];
  EXPECT_EQ(y.element_type(), OnnxType::kFloat);
  EXPECT_EQ(to_doubles(y.tensor()), (std::vector<double>{-40, 7, 192}));
}

TEST(QuantizeLinear, PrecisionAttributeSetsTheDivisionType) {
  // 2049 / 1 in float16 is 2048 (float16 has 11 significant bits).
  mx::array y = run_op("QuantizeLinear", 23, {f32({2049}), mx::array(1.0f)},
                       {type_attr("output_dtype", OnnxType::kUint16), type_attr("precision", OnnxType::kFloat16)})[0]
                    .tensor();
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{2048}));
  mx::array exact = run_op("QuantizeLinear", 23, {f32({2049}), mx::array(1.0f)},
                           {type_attr("output_dtype", OnnxType::kUint16)})[0]
                        .tensor();
  EXPECT_EQ(to_ints(exact), (std::vector<int64_t>{2049}));
}

TEST(QuantizeLinear, BadScalesAndAttributesAreErrorsNamingTheNode) {
  mx::array x = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  std::string m = op_error([&] { run_op("QuantizeLinear", 13, {x, f32({1, 2})}); });  // axis 1 has 3
  EXPECT_TRUE(contains(m, "[QuantizeLinear v13] node 'test_QuantizeLinear': y_scale must be a scalar or 1-D of length 3"))
      << m;
  m = op_error([&] { run_op("QuantizeLinear", 13, {x, f32({1, 2})}, {int_attr("axis", 5)}); });
  EXPECT_TRUE(contains(m, "axis")) << m;
  m = op_error([&] { run_op("QuantizeLinear", 21, {x, f32({1, 2})}, {int_attr("block_size", -1)}); });
  EXPECT_TRUE(contains(m, "block_size must be positive")) << m;
  m = op_error(
      [&] { run_op("QuantizeLinear", 21, {x, f32({1, 1}, {2, 1})}, {int_attr("axis", 1), int_attr("block_size", 2)}); });
  EXPECT_TRUE(contains(m, "does not fit input [2,3] with block_size 2")) << m;
  m = op_error([&] {
    run_op("QuantizeLinear", 21, {x, mx::array(1.0f), u8({0}, {})}, {type_attr("output_dtype", OnnxType::kInt8)});
  });
  EXPECT_TRUE(contains(m, "output_dtype int8 differs from the zero point's type uint8")) << m;
  m = op_error(
      [&] { run_op("QuantizeLinear", 21, {x, mx::array(1.0f)}, {type_attr("output_dtype", OnnxType::kFloat)}); });
  EXPECT_TRUE(contains(m, "cannot quantize to float32")) << m;
}

// --- DequantizeLinear ----------------------------------------------------------------

TEST(DequantizeLinear, PerTensorPerAxisAndBlocked) {
  mx::array x = u8({0, 10, 255, 128});
  EXPECT_EQ(to_doubles(run_op("DequantizeLinear", 13, {x, mx::array(0.5f), u8({128}, {})})[0].tensor()),
            (std::vector<double>{-64, -59, 63.5, 0}));
  mx::array xi = i8({1, 2, 3, -4, -5, -6}, {2, 3});
  mx::array per_axis =
      run_op("DequantizeLinear", 13, {xi, f32({1, 2, 3}), i8({0, 1, 2})}, {int_attr("axis", -1)})[0].tensor();
  EXPECT_EQ(to_doubles(per_axis), (std::vector<double>{1, 2, 3, -4, -12, -24}));
  mx::array blocked = run_op("DequantizeLinear", 21, {xi, f32({1, 10, 2, 20}, {2, 2})},
                             {int_attr("axis", 1), int_attr("block_size", 2)})[0]
                          .tensor();
  EXPECT_EQ(to_doubles(blocked), (std::vector<double>{1, 2, 30, -8, -10, -120}));
}

TEST(DequantizeLinear, OutputTypeFollowsTheScaleOrOutputDtype) {
  mx::array x = u8({1, 2});
  mx::array half_scale = mx::astype(mx::array(0.25f), mx::float16);
  EXPECT_EQ(run_op("DequantizeLinear", 19, {x, half_scale})[0].tensor().dtype(), mx::float16);
  mx::array y = run_op("DequantizeLinear", 23, {x, mx::array(0.25f)}, {type_attr("output_dtype", OnnxType::kBfloat16)})[0]
                    .tensor();
  EXPECT_EQ(y.dtype(), mx::bfloat16);
  EXPECT_EQ(to_doubles(y), (std::vector<double>{0.25, 0.5}));
  // int32 has no zero point: the values are scaled as they are.
  EXPECT_EQ(to_doubles(run_op("DequantizeLinear", 10, {mx::array({-3, 7}), mx::array(2.0f)})[0].tensor()),
            (std::vector<double>{-6, 14}));
}

TEST(DequantizeLinear, MismatchedZeroPointsAreErrors) {
  std::string m = op_error([&] { run_op("DequantizeLinear", 13, {u8({1, 2}), mx::array(1.0f), i8({0}, {})}); });
  EXPECT_TRUE(contains(m, "x_zero_point type int8 differs from x type uint8")) << m;
  m = op_error([&] { run_op("DequantizeLinear", 13, {u8({1, 2}), f32({1, 2}), u8({0}, {})}, {int_attr("axis", 0)}); });
  EXPECT_TRUE(contains(m, "x_zero_point shape [1] differs from x_scale shape [2]")) << m;
  m = op_error([&] { run_op("DequantizeLinear", 13, {f32({1}), mx::array(1.0f)}); });
  EXPECT_TRUE(contains(m, "cannot dequantize float32")) << m;
}

// --- DynamicQuantizeLinear -------------------------------------------------------------

TEST(DynamicQuantizeLinear, RangeIncludesZero) {
  // Range [0, 127.5]: scale 0.5, zero point 0; 50.5 and 51.5 round half to even.
  std::vector<Value> out = run_op("DynamicQuantizeLinear", 11, {f32({127.5f, 25.25f, 25.75f})}, {}, 3);
  EXPECT_EQ(out[0].tensor().dtype(), mx::uint8);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{255, 50, 52}));
  EXPECT_EQ(to_doubles(out[1].tensor()), (std::vector<double>{0.5}));
  EXPECT_EQ(to_ints(out[2].tensor()), (std::vector<int64_t>{0}));
  // Range [-25.5, 102]: scale 0.5, zero point 51.
  out = run_op("DynamicQuantizeLinear", 11, {f32({-25.5f, 102, 0})}, {}, 3);
  EXPECT_EQ(to_ints(out[2].tensor()), (std::vector<int64_t>{51}));
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{0, 255, 51}));
}

TEST(DynamicQuantizeLinear, AllZerosAndCompiled) {
  std::vector<Value> out = run_op("DynamicQuantizeLinear", 11, {f32({0, 0})}, {}, 3);
  EXPECT_EQ(to_ints(out[0].tensor()), (std::vector<int64_t>{0, 0}));
  EXPECT_FLOAT_EQ(static_cast<float>(to_doubles(out[1].tensor())[0]), 1.0f / 255.0f);
  std::vector<mx::array> traced = run_compiled("DynamicQuantizeLinear", 11, {f32({-25.5f, 102, 0})}, {0}, {}, 3);
  EXPECT_EQ(to_ints(traced[0]), (std::vector<int64_t>{0, 255, 51}));
  EXPECT_EQ(to_ints(traced[2]), (std::vector<int64_t>{51}));
  std::string m = op_error([&] { run_op("DynamicQuantizeLinear", 11, {u8({1})}, {}, 3); });
  EXPECT_TRUE(contains(m, "x must be float32")) << m;
}

// --- integer products -----------------------------------------------------------------

TEST(MatMulInteger, ExactBeyondFloat32Integers) {
  // 600 * 255 * 127 + 1 = 19431001: odd and above 2^24, so a float32
  // accumulation would round it.
  const int k = 601;
  std::vector<int> a(k, 255), b(k, 127);
  a.back() = 1;
  b.back() = 1;
  mx::array y = run_op("MatMulInteger", 10, {u8(a, {1, k}), i8(b, {k, 1})})[0].tensor();
  EXPECT_EQ(y.dtype(), mx::int32);
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{19431001}));
  // The extremes: (0 - 255) * (-128 - 127) summed 1000 times.
  std::vector<int> zeros(1000, 0), lows(1000, -128);
  mx::array extreme = run_op("MatMulInteger", 10,
                             {u8(zeros, {1, 1000}), i8(lows, {1000, 1}), u8({255}, {}), i8({127}, {})})[0]
                          .tensor();
  EXPECT_EQ(to_ints(extreme), (std::vector<int64_t>{65025000}));
}

TEST(MatMulInteger, PerRowAndPerColumnZeroPointsAndBatches) {
  mx::array a = u8({1, 2, 3, 4, 5, 6}, {2, 3});
  mx::array b = u8({1, 0, 0, 1, 1, 1}, {3, 2});
  // a - [1, 2] per row: [[0,1,2],[2,3,4]]; b - [0, 1] per column: [[1,-1],[0,0],[1,0]]
  mx::array y = run_op("MatMulInteger", 10, {a, b, u8({1, 2}), u8({0, 1})})[0].tensor();
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{2, 0, 6, -2}));
  mx::array batched = run_op("MatMulInteger", 10, {mx::stack({a, a}), b})[0].tensor();
  EXPECT_EQ(batched.shape(), (mx::Shape{2, 2, 2}));
  mx::array vector = run_op("MatMulInteger", 10, {u8({1, 2, 3}), b})[0].tensor();
  EXPECT_EQ(to_ints(vector), (std::vector<int64_t>{4, 5}));
  std::vector<mx::array> traced = run_compiled("MatMulInteger", 10, {a, b, u8({1, 2}), u8({0, 1})}, {0, 1});
  EXPECT_EQ(to_ints(traced[0]), (std::vector<int64_t>{2, 0, 6, -2}));
}

TEST(MatMulInteger, BadOperandsAreErrors) {
  std::string m = op_error([&] { run_op("MatMulInteger", 10, {f32({1}, {1, 1}), u8({1}, {1, 1})}); });
  EXPECT_TRUE(contains(m, "[MatMulInteger v10] node 'test_MatMulInteger': A must be int8 or uint8")) << m;
  m = op_error([&] { run_op("MatMulInteger", 10, {u8({1, 2}, {1, 2}), u8({1, 2, 3}, {3, 1})}); });
  EXPECT_TRUE(contains(m, "inner dimensions differ")) << m;
  m = op_error([&] { run_op("MatMulInteger", 10, {u8({1, 2}, {1, 2}), u8({1, 2}, {2, 1}), u8({1, 2, 3})}); });
  EXPECT_TRUE(contains(m, "a_zero_point of shape [3] is neither per tensor nor per row")) << m;
}

/** Reference integer convolution from the float Conv op, on small integers
 * (exact in float32 at this size). */
std::vector<int64_t> float_conv(const mx::array& x, const mx::array& w, const std::vector<Attribute>& attrs) {
  mx::array y = run_op("Conv", 11, {mx::astype(x, mx::float32), mx::astype(w, mx::float32)}, attrs)[0].tensor();
  return to_ints(mx::astype(y, mx::int32));
}

TEST(ConvInteger, MatchesFloatConvWithGroupsStridesDilationsAndPads) {
  mx::array x = mx::astype(mx::subtract(mx::remainder(mx::arange(2 * 4 * 7 * 6), mx::array(23)), mx::array(11)),
                           mx::int8);
  x = mx::reshape(x, {2, 4, 7, 6});
  mx::array w = mx::astype(mx::subtract(mx::remainder(mx::arange(6 * 2 * 3 * 2), mx::array(7)), mx::array(3)),
                           mx::int8);
  w = mx::reshape(w, {6, 2, 3, 2});
  std::vector<Attribute> attrs = {int_attr("group", 2), ints_attr("strides", {2, 1}), ints_attr("dilations", {1, 2}),
                                  ints_attr("pads", {1, 0, 2, 1})};
  mx::array y = run_op("ConvInteger", 10, {x, w}, attrs)[0].tensor();
  EXPECT_EQ(y.dtype(), mx::int32);
  EXPECT_EQ(to_ints(y), float_conv(x, w, attrs));
  // Zero points: x's per tensor, w's per output channel; the padding holds x's zero point.
  mx::array x_zp = i8({3}, {});
  mx::array w_zp = i8({1, -1, 0, 2, 0, 0});
  mx::array with_zp = run_op("ConvInteger", 10, {x, w, x_zp, w_zp}, attrs)[0].tensor();
  mx::array xc = mx::subtract(mx::astype(x, mx::int32), mx::array(3));
  mx::array wc = mx::subtract(mx::astype(w, mx::int32), mx::reshape(mx::astype(w_zp, mx::int32), {6, 1, 1, 1}));
  EXPECT_EQ(to_ints(with_zp), float_conv(xc, wc, attrs));
}

TEST(ConvInteger, ExactForLongReductions) {
  // 300 channels x 3 taps of 255 * -128 plus one: above 2^24 and odd.
  const int c = 300;
  std::vector<int> xs(c * 3, 255), ws(c * 3, -128);
  xs[0] = 1;
  ws[0] = 1;
  mx::array y = run_op("ConvInteger", 10, {u8(xs, {1, c, 3}), i8(ws, {1, c, 3})})[0].tensor();
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{(c * 3 - 1) * 255LL * -128 + 1}));
}

TEST(ConvInteger, BadShapesAreErrors) {
  std::string m = op_error([&] { run_op("ConvInteger", 10, {u8({1, 2}, {1, 2}), u8({1}, {1, 1})}); });
  EXPECT_TRUE(contains(m, "[ConvInteger v10] node 'test_ConvInteger': input must have rank >= 3")) << m;
  m = op_error([&] { run_op("ConvInteger", 10, {u8({1, 2, 3, 4}, {1, 2, 2}), u8({1, 2, 3}, {1, 3, 1})}); });
  EXPECT_TRUE(contains(m, "channels do not match")) << m;
  m = op_error([&] {
    run_op("ConvInteger", 10, {u8({1, 2}, {1, 1, 2}), u8({1}, {1, 1, 1}), u8({1, 2})});
  });
  EXPECT_TRUE(contains(m, "x_zero_point must have one element")) << m;
}

TEST(QLinearMatMul, RequantizesWithHalfToEvenAndSaturation) {
  // (a - 1) @ b = [[2, 4], [0, -2]]; multiplier 1 * 0.5 / 0.25 = 2 -> [[4, 8], [0, -4]] + 10
  mx::array a = u8({2, 3, 0, 1}, {2, 2});
  mx::array b = u8({0, 2, 1, 1}, {2, 2});
  std::vector<Value> in = {a, f32({1}), u8({1}), b, f32({0.5f}), u8({0}), f32({0.25f}), u8({10})};
  mx::array y = run_op("QLinearMatMul", 10, in)[0].tensor();
  EXPECT_EQ(y.dtype(), mx::uint8);
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{14, 18, 10, 6}));
  // Per-row a_scale [1, 3]: row 1 is [0, -12] + 10, saturated at 0.
  std::vector<Value> per_row = in;
  per_row[1] = f32({1, 3});
  EXPECT_EQ(to_ints(run_op("QLinearMatMul", 21, per_row)[0].tensor()), (std::vector<int64_t>{14, 18, 10, 0}));
  // Multiplier 0.25: [[0.5, 1], [0, -0.5]] rounds half to even to [[0, 1], [0, 0]].
  std::vector<Value> halves = in;
  halves[4] = f32({0.25f});
  halves[6] = f32({1});
  EXPECT_EQ(to_ints(run_op("QLinearMatMul", 21, halves)[0].tensor()), (std::vector<int64_t>{10, 11, 10, 10}));
  std::vector<Value> bad = in;
  bad[6] = f32({1, 2});
  std::string m = op_error([&] { run_op("QLinearMatMul", 21, bad); });
  EXPECT_TRUE(contains(m, "y_scale must have one element")) << m;
}

TEST(QLinearConv, AddsTheBiasAndRequantizesPerChannel) {
  mx::array x = u8({1, 2, 3, 4}, {1, 1, 2, 2});
  mx::array w = i8({1, 2}, {2, 1, 1, 1});  // two 1x1 filters
  mx::array bias = mx::array({10, -4});    // int32
  // acc: channel 0 = x + 10, channel 1 = 2x - 4; scales: 1 * [0.5, 1] / 1.
  std::vector<Value> in = {x, mx::array(1.0f), u8({0}, {}), w, f32({0.5f, 1}), i8({0}, {}), mx::array(1.0f),
                           u8({0}, {}), bias};
  mx::array y = run_op("QLinearConv", 10, in)[0].tensor();
  EXPECT_EQ(y.dtype(), mx::uint8);
  // channel 0: (11, 12, 13, 14) * 0.5 = 5.5, 6, 6.5, 7 -> 6, 6, 6, 7 (half to even)
  // channel 1: (-2, 0, 2, 4) -> 0 (saturated), 0, 2, 4
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{6, 6, 6, 7, 0, 0, 2, 4}));
  in[8] = mx::array({1, 2, 3});
  std::string m = op_error([&] { run_op("QLinearConv", 10, in); });
  EXPECT_TRUE(contains(m, "B must be int32 of shape [2]")) << m;
}

// ai.transmuter Requantize (fuse_quantize_dequantize's node) with the DequantizeLinear it absorbed: the
// dequantized floats; a malformed node in a file gets an error naming the input.
TEST(Requantize, ReturnsTheDequantizedFloatsWithItsOptionalInputs) {
  const std::vector<Value> in = {f32({1.0f, 2.6f, -3.0f, 300.0f}), f32({2.0f}), u8({10}, {}), f32({0.5f}),
                                 u8({12}, {})};
  // round(v * 2) + 10 = 12, 15, 4, 265 -> saturated 255; then (q - 12) * 0.5.
  mx::array y = run_domain_op("ai.transmuter", "Requantize", 1, in)[0].tensor();
  EXPECT_EQ(y.dtype(), mx::float32);
  EXPECT_TRUE(mx::array_equal(y, f32({0.0f, 1.5f, -4.0f, 121.5f}, {4})).item<bool>());
  mx::array q = run_domain_op("ai.transmuter", "Requantize", 1, {in[0], in[1], in[2]})[0].tensor();
  EXPECT_EQ(to_ints(q), (std::vector<int64_t>{12, 15, 4, 255}));
  std::vector<Value> bad = in;
  bad[4] = i8({12}, {});
  std::string m = op_error([&] { run_domain_op("ai.transmuter", "Requantize", 1, bad); });
  EXPECT_TRUE(contains(m, "dequantize_zero_point must be one uint8")) << m;
  bad = in;
  bad[3] = f32({0.5f, 1.0f});
  m = op_error([&] { run_domain_op("ai.transmuter", "Requantize", 1, bad); });
  EXPECT_TRUE(contains(m, "dequantize_scale must be one float32")) << m;
}

// --- BitCast ------------------------------------------------------------------------------

TEST(BitCast, ReinterpretsBitsOfTheSameWidth) {
  mx::array y = run_op("BitCast", 26, {f32({1.0f, -2.0f})}, {type_attr("to", OnnxType::kInt32)})[0].tensor();
  EXPECT_EQ(y.dtype(), mx::int32);
  EXPECT_EQ(to_ints(y), (std::vector<int64_t>{0x3F800000, static_cast<int32_t>(0xC0000000u)}));
  mx::array b = run_op("BitCast", 26, {mx::array({true, false})}, {type_attr("to", OnnxType::kUint8)})[0].tensor();
  EXPECT_EQ(to_ints(b), (std::vector<int64_t>{1, 0}));
  std::string m =
      op_error([&] { run_op("BitCast", 26, {f32({1.0f})}, {type_attr("to", OnnxType::kInt64)}); });
  EXPECT_TRUE(contains(m, "[BitCast v26] node 'test_BitCast': cannot bitcast float32 (32 bits) to int64 (64 bits)"))
      << m;
  m = op_error([&] { run_op("BitCast", 26, {u8({1})}, {type_attr("to", OnnxType::kString)}); });
  EXPECT_TRUE(contains(m, "cannot bitcast to string")) << m;
}

}  // namespace
}  // namespace transmuter
