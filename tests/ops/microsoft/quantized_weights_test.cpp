// com.microsoft MatMulNBits and GatherBlockQuantized: the spec's semantics
// where ONNX Runtime's CPU kernel is no reference (g_idx with zero points,
// float16 zero points, 8-bit float zero points, float8 data), traced indices,
// and the errors for bad shapes, dtypes and attributes. The cases against ONNX
// Runtime are scripts/contrib_cases/quantized_weights.py.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::i64;
using testing::int_attr;
using testing::max_abs_diff;
using testing::out0;
using testing::random_array;
using testing::run_domain_op;
using testing::to_doubles;

// A quantized weight with its reference dequantization, built element by
// element from the spec: q[n][k] in [0, 2^bits), k padded to whole blocks.
struct QuantizedWeight {
  int n, k, bits, block_size, k_blocks;
  std::vector<uint8_t> q;                  // [N, k_blocks * block_size]
  std::vector<float> scales, zero_points;  // [N, k_blocks]

  QuantizedWeight(int n_, int k_, int bits_, int block_size_)
      : n(n_), k(k_), bits(bits_), block_size(block_size_), k_blocks((k_ + block_size_ - 1) / block_size_) {
    const int padded = k_blocks * block_size;
    for (int i = 0; i < n * padded; ++i) q.push_back(static_cast<uint8_t>((i * 7 + i / 5) % (1 << bits)));
    for (int i = 0; i < n * k_blocks; ++i) {
      scales.push_back(0.05f + 0.01f * static_cast<float>(i % 7));
      zero_points.push_back(static_cast<float>((i * 3) % (1 << bits)));
    }
  }
  // Packs `values` ([rows, count], each < 2^bits) low bits first, per row.
  std::vector<uint8_t> pack(const std::vector<uint8_t>& values, int rows, int count) const {
    const int per_byte = 8 / bits, bytes = (count + per_byte - 1) / per_byte;
    std::vector<uint8_t> out(rows * bytes, 0);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < count; ++i) {
        out[r * bytes + i / per_byte] |=
            static_cast<uint8_t>(values[r * count + i] << (bits * (i % per_byte)));
      }
    }
    return out;
  }
  mx::array b() const {
    std::vector<uint8_t> bytes = pack(q, n, k_blocks * block_size);
    return mx::array(bytes.begin(), {n, k_blocks, block_size * bits / 8}, mx::uint8);
  }
  mx::array packed_zero_points() const {
    std::vector<uint8_t> values(zero_points.begin(), zero_points.end());
    std::vector<uint8_t> bytes = pack(values, n, k_blocks);
    return mx::array(bytes.begin(), {n, static_cast<int>(bytes.size()) / n}, mx::uint8);
  }
  mx::array scales_array(mx::Dtype t = mx::float32) const {
    return mx::astype(mx::array(scales.begin(), {n, k_blocks}), t);
  }
  mx::array zero_points_array(mx::Dtype t = mx::float32) const {
    return mx::astype(mx::array(zero_points.begin(), {n, k_blocks}), t);
  }
  // W^T [K, N] = (q - zp) * scale with block g_idx[k] (k / block_size when empty).
  mx::array reference(bool with_zero_points, const std::vector<int32_t>& g_idx = {}) const {
    std::vector<float> w(k * n);
    const int padded = k_blocks * block_size;
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < k; ++c) {
        const int blk = g_idx.empty() ? c / block_size : g_idx[c];
        const float zp =
            with_zero_points ? zero_points[r * k_blocks + blk] : static_cast<float>(1 << (bits - 1));
        w[c * n + r] = (static_cast<float>(q[r * padded + c]) - zp) * scales[r * k_blocks + blk];
      }
    }
    return mx::array(w.begin(), {k, n});
  }
  std::vector<Attribute> attrs() const {
    return {int_attr("K", k), int_attr("N", n), int_attr("bits", bits), int_attr("block_size", block_size)};
  }
};

std::vector<Value> matmul_nbits(const std::vector<Value>& inputs, const std::vector<Attribute>& attrs) {
  return run_domain_op("com.microsoft", "MatMulNBits", 1, inputs, attrs);
}

std::vector<Value> gather_block_quantized(const std::vector<Value>& inputs,
                                          const std::vector<Attribute>& attrs) {
  return run_domain_op("com.microsoft", "GatherBlockQuantized", 1, inputs, attrs);
}

// float32 sums over K of unit-scale products: a few ulps of outputs ~ 10.
constexpr float kTolerance = 1e-4f;

TEST(MicrosoftQuantizedWeights, MatMulNBitsFollowsTheSpecForEveryBitWidth) {
  for (int bits : {2, 4, 8}) {
    SCOPED_TRACE(bits);
    QuantizedWeight w(5, 40, bits, 16);  // K = 40: the last block is partial
    mx::array a = random_array({3, 40}, 1);
    mx::array y = out0(matmul_nbits({a, w.b(), w.scales_array()}, w.attrs()));
    EXPECT_LT(max_abs_diff(y, mx::matmul(a, w.reference(false))), kTolerance);
    y = out0(matmul_nbits({a, w.b(), w.scales_array(), w.packed_zero_points()}, w.attrs()));
    EXPECT_LT(max_abs_diff(y, mx::matmul(a, w.reference(true))), kTolerance);
    // Float zero points (ORT's CPU kernel refuses them for 8 bits).
    y = out0(matmul_nbits({a, w.b(), w.scales_array(), w.zero_points_array()}, w.attrs()));
    EXPECT_LT(max_abs_diff(y, mx::matmul(a, w.reference(true))), kTolerance);
  }
}

TEST(MicrosoftQuantizedWeights, MatMulNBitsGroupIndexWithZeroPoints) {
  // g_idx picks any block per k, and the zero points follow it (ORT 1.31's
  // CPU kernel ignores uint8 zero points when g_idx is given).
  QuantizedWeight w(4, 48, 4, 16);
  std::vector<int32_t> g_idx(48);
  for (int c = 0; c < 48; ++c) g_idx[c] = (c * 5) % 3;
  mx::array gi(g_idx.begin(), {48}, mx::int32);
  mx::array a = random_array({2, 48}, 2);
  mx::array bias = random_array({4}, 3);
  mx::array y = out0(matmul_nbits({a, w.b(), w.scales_array(), w.packed_zero_points(), gi, bias}, w.attrs()));
  EXPECT_LT(max_abs_diff(y, mx::matmul(a, w.reference(true, g_idx)) + bias), kTolerance);
}

TEST(MicrosoftQuantizedWeights, MatMulNBitsFloat16RoundsOnceFromFloat32) {
  QuantizedWeight w(6, 64, 4, 32);
  mx::array a = mx::astype(random_array({3, 64}, 4), mx::float16);
  mx::array y = out0(
      matmul_nbits({a, w.b(), w.scales_array(mx::float16), w.zero_points_array(mx::float16)}, w.attrs()));
  ASSERT_EQ(y.dtype(), mx::float16);
  // The reference from the same float16 scales, in float32, rounded once.
  QuantizedWeight rounded = w;
  for (float& s : rounded.scales) s = static_cast<float>(static_cast<mx::float16_t>(s));
  mx::array expected =
      mx::astype(mx::matmul(mx::astype(a, mx::float32), rounded.reference(true)), mx::float16);
  EXPECT_LT(max_abs_diff(y, expected), 1e-2f);  // one float16 ulp of outputs below 8
}

TEST(MicrosoftQuantizedWeights, MatMulNBitsCompiledMatchesEager) {
  QuantizedWeight w(8, 32, 4, 16);
  mx::array a = random_array({2, 3, 32}, 5);
  std::vector<Value> inputs = {a, w.b(), w.scales_array(), w.packed_zero_points()};
  auto fn = [&](const std::vector<mx::array>& args) {
    std::vector<Value> in = inputs;
    in[0] = args[0];
    return std::vector<mx::array>{out0(matmul_nbits(in, w.attrs()))};
  };
  mx::array compiled = mx::compile(fn)({a})[0];
  EXPECT_EQ(compiled.shape(), (mx::Shape{2, 3, 8}));
  EXPECT_LT(max_abs_diff(compiled, out0(matmul_nbits(inputs, w.attrs()))), 1e-6f);
}

TEST(MicrosoftQuantizedWeights, MatMulNBitsShapeErrorsNameTheInput) {
  QuantizedWeight w(4, 32, 4, 16);
  mx::array a = random_array({2, 32}, 6);
  auto message = [&](const std::vector<Value>& inputs, std::vector<Attribute> attrs = {}) {
    if (attrs.empty()) attrs = w.attrs();
    return error_of<OpError>([&] { matmul_nbits(inputs, attrs); });
  };
  std::string m = message({a, mx::zeros({4, 2, 16}, mx::uint8), w.scales_array()});
  EXPECT_NE(m.find("test_MatMulNBits"), std::string::npos) << m;
  EXPECT_NE(m.find("B must have shape (4,2,8)"), std::string::npos) << m;
  m = message({a, w.b(), mx::ones({4, 3})});
  EXPECT_NE(m.find("scales must have shape (4,2) or (8)"), std::string::npos) << m;
  m = message({a, w.b(), mx::ones({4, 2}, mx::float16)});
  EXPECT_NE(m.find("scales must have A's dtype"), std::string::npos) << m;
  m = message({a, w.b(), w.scales_array(), mx::zeros({4, 2}, mx::uint8)});
  EXPECT_NE(m.find("zero_points (packed uint8) must have shape (4,1)"), std::string::npos) << m;
  m = message({a, w.b(), w.scales_array(), mx::zeros({4, 2}, mx::int32)});
  EXPECT_NE(m.find("zero_points must be uint8 or A's dtype"), std::string::npos) << m;
  m = message({random_array({2, 31}, 7), w.b(), w.scales_array()});
  EXPECT_NE(m.find("A's last dimension must be K=32"), std::string::npos) << m;
  m = message({mx::zeros({2, 32}, mx::int32), w.b(), w.scales_array()});
  EXPECT_NE(m.find("A must be float32, float16 or bfloat16"), std::string::npos) << m;
  m = message({a, mx::astype(w.b(), mx::int8), w.scales_array()});
  EXPECT_NE(m.find("B must be uint8"), std::string::npos) << m;
  m = message({a, w.b(), w.scales_array(), Value(), Value(), mx::ones({5})});
  EXPECT_NE(m.find("bias must have shape (4)"), std::string::npos) << m;
  std::vector<int32_t> bad(32, 0);
  bad[7] = 2;
  m = message({a, w.b(), w.scales_array(), Value(), mx::array(bad.begin(), {32}, mx::int32)});
  EXPECT_NE(m.find("g_idx value 2 out of range [0, 2)"), std::string::npos) << m;
  m = message({a, w.b(), w.scales_array(), Value(), mx::zeros({31}, mx::int32)});
  EXPECT_NE(m.find("g_idx must have shape (32)"), std::string::npos) << m;
}

TEST(MicrosoftQuantizedWeights, MatMulNBitsAttributeErrors) {
  QuantizedWeight w(4, 32, 4, 16);
  std::vector<Value> inputs = {random_array({2, 32}, 8), w.b(), w.scales_array()};
  auto message = [&](int64_t bits, int64_t block_size, int64_t accuracy_level = 0) {
    return error_of<OpError>([&] {
      matmul_nbits(inputs, {int_attr("K", 32), int_attr("N", 4), int_attr("bits", bits),
                            int_attr("block_size", block_size), int_attr("accuracy_level", accuracy_level)});
    });
  };
  EXPECT_NE(message(3, 16).find("bits must be 2, 4 or 8, got 3"), std::string::npos);
  EXPECT_NE(message(4, 24).find("block_size must be a power of 2 and >= 16, got 24"), std::string::npos);
  EXPECT_NE(message(4, 8).find("block_size must be a power of 2 and >= 16, got 8"), std::string::npos);
  EXPECT_NE(message(4, 16, 7).find("accuracy_level must be 0..4, got 7"), std::string::npos);
  std::string m = error_of<OpError>([&] {
    matmul_nbits(inputs, {int_attr("N", 4), int_attr("block_size", 16)});
  });
  EXPECT_NE(m.find("K"), std::string::npos) << m;
}

TEST(MicrosoftQuantizedWeights, GatherBlockQuantizedUint8AndOutOfRangeZeros) {
  // uint8 data, bits 4 (the default): two values per byte, low nibble first.
  std::vector<uint8_t> bytes(3 * 16);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  mx::array data(bytes.begin(), {3, 16}, mx::uint8);
  mx::array scales = mx::array({0.5f, 0.25f, 2.0f}, {3, 1});
  mx::array out =
      out0(gather_block_quantized({data, i64({2, -3, 3, -4}), scales}, {int_attr("block_size", 32)}));
  ASSERT_EQ(out.shape(), (mx::Shape{4, 32}));
  std::vector<double> v = to_doubles(out);
  for (int j = 0; j < 32; ++j) {
    const int byte2 = bytes[2 * 16 + j / 2], byte0 = bytes[j / 2];
    const int q2 = j % 2 ? byte2 >> 4 : byte2 & 15, q0 = j % 2 ? byte0 >> 4 : byte0 & 15;
    EXPECT_EQ(v[j], (q2 - 8) * 2.0) << j;       // index 2
    EXPECT_EQ(v[32 + j], (q0 - 8) * 0.5) << j;  // index -3 is row 0
    EXPECT_EQ(v[64 + j], 0.0) << j;             // 3: out of range, zeros (ORT 1.31)
    EXPECT_EQ(v[96 + j], 0.0) << j;             // -4: out of range
  }
  // Traced indices give the same (no host read, no out-of-bounds read).
  auto fn = [&](const std::vector<mx::array>& args) {
    return std::vector<mx::array>{
        out0(gather_block_quantized({data, args[0], scales}, {int_attr("block_size", 32)}))};
  };
  EXPECT_EQ(max_abs_diff(mx::compile(fn)({i64({2, -3, 3, -4})})[0], out), 0.0f);
}

TEST(MicrosoftQuantizedWeights, GatherBlockQuantizedInt4AlongAnyAxes) {
  // int4 data [4, 6] quantized along axis 0 (blocks of 16 hold all 4 rows),
  // gathered along axis 1.
  std::vector<int8_t> values(24);
  for (int i = 0; i < 24; ++i) values[i] = static_cast<int8_t>(i % 16 - 8);
  Value data(mx::array(values.begin(), {4, 6}, mx::int8), OnnxType::kInt4);
  Value zp(mx::array({1, -1, 0, 2, -3, 7}, {1, 6}, mx::int8), OnnxType::kInt4);
  mx::array scales = mx::array({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {1, 6});
  mx::array out = out0(gather_block_quantized(
      {data, i64({5, 0}), scales, zp},
      {int_attr("gather_axis", 1), int_attr("quantize_axis", 0), int_attr("block_size", 16)}));
  ASSERT_EQ(out.shape(), (mx::Shape{4, 2}));
  std::vector<double> v = to_doubles(out);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(v[r * 2], (values[r * 6 + 5] - 7) * 6.0);
    EXPECT_EQ(v[r * 2 + 1], (values[r * 6] - 1) * 1.0);
  }
}

TEST(MicrosoftQuantizedWeights, GatherBlockQuantizedFloat8BroadcastsScales) {
  // float8 data (held as float32): output = data * scale, one scale for
  // every row (a dimension of 1), block_size 0 = one block per row.
  Value data(mx::array({1.5f, -2.f, 0.25f, 4.f, 3.f, -1.f}, {3, 2}), OnnxType::kFloat8E4M3FN);
  mx::array out = out0(
      gather_block_quantized({data, i64({2, 0}), mx::array({0.5f}, {1, 1})}, {int_attr("block_size", 0)}));
  EXPECT_EQ(to_doubles(out), (std::vector<double>{1.5, -0.5, 0.75, -1.0}));
  std::string m = error_of<OpError>([&] {
    gather_block_quantized(
        {data, i64({0}), mx::array({0.5f}, {1, 1}), Value(mx::zeros({1, 1}), OnnxType::kFloat8E4M3FN)},
        {int_attr("block_size", 0)});
  });
  EXPECT_NE(m.find("zero_points must not be given"), std::string::npos) << m;
}

TEST(MicrosoftQuantizedWeights, GatherBlockQuantizedErrorsNameTheNode) {
  mx::array data = mx::zeros({4, 16}, mx::uint8);
  mx::array scales = mx::ones({4, 1});
  auto message = [&](const std::vector<Value>& inputs, const std::vector<Attribute>& attrs) {
    return error_of<OpError>([&] { gather_block_quantized(inputs, attrs); });
  };
  std::string m = message({data, i64({0}), mx::ones({4, 2})}, {int_attr("block_size", 32)});
  EXPECT_NE(m.find("test_GatherBlockQuantized"), std::string::npos) << m;
  EXPECT_NE(m.find("axis 1 must be 1 (blocks along quantize_axis)"), std::string::npos) << m;
  m = message({data, mx::zeros({1}), scales}, {int_attr("block_size", 32)});
  EXPECT_NE(m.find("indices must be int32 or int64"), std::string::npos) << m;
  m = message({data, i64({0}), scales}, {int_attr("block_size", 32), int_attr("gather_axis", 1)});
  EXPECT_NE(m.find("gather_axis must be 0 for uint8 data"), std::string::npos) << m;
  m = message({data, i64({0}), scales}, {int_attr("block_size", 32), int_attr("bits", 3)});
  EXPECT_NE(m.find("bits must be 2, 4 or 8 for uint8 data, got 3"), std::string::npos) << m;
  m = message({data, i64({0}), scales}, {int_attr("block_size", 20)});
  EXPECT_NE(m.find("block_size must be a power of 2 and >= 16"), std::string::npos) << m;
  m = message({data, i64({0}), mx::ones({4})}, {int_attr("block_size", 32)});
  EXPECT_NE(m.find("scales must have data's rank 2"), std::string::npos) << m;
  m = message({data, i64({0}), scales, mx::zeros({4, 2}, mx::uint8)}, {int_attr("block_size", 32)});
  EXPECT_NE(m.find("zero_points must have shape (4,1)"), std::string::npos) << m;
  m = message({data, i64({0}), scales, mx::zeros({4, 1}, mx::int8)}, {int_attr("block_size", 32)});
  EXPECT_NE(m.find("zero_points must have data's type uint8"), std::string::npos) << m;
  m = message({mx::zeros({4, 16}, mx::int32), i64({0}), scales}, {int_attr("block_size", 32)});
  EXPECT_NE(m.find("data must be uint8, int4, uint4, float8 or float4, got int32"), std::string::npos) << m;
  Value int4(mx::zeros({4, 16}, mx::int8), OnnxType::kInt4);
  m = message({int4, i64({0}), scales}, {int_attr("block_size", 16), int_attr("bits", 8)});
  EXPECT_NE(m.find("bits must be 4 for int4 data"), std::string::npos) << m;
  m = message({data, i64({0}), scales}, {int_attr("block_size", 32), int_attr("quantize_axis", 2)});
  EXPECT_NE(m.find("test_GatherBlockQuantized"), std::string::npos) << m;
}

}  // namespace
}  // namespace transmuter
