// The int8 GEMM (MatMulInteger with a packed constant B) against int64 sums over the unpacked
// operands: every shape edge (rows past a tile, columns past a panel, one row, one column), int8 and
// uint8 B, zero points absent, scalar and per column, and A's zero point. Integer results: exact.
#include "kernels/cpu/integer_gemm.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace transmuter::kernels {
namespace {

mx::array random_bytes(mx::Shape shape, mx::Dtype dtype, uint64_t seed) {
  const int lo = dtype == mx::int8 ? -128 : 0;
  return mx::astype(mx::random::randint(lo, lo + 256, shape, mx::int32, mx::random::key(seed)), dtype);
}

// sum_k (a - za)(b - zb[j]) in int64 on the host.
std::vector<int64_t> expected(const mx::array& a, const mx::array& b, int64_t za, const std::vector<int64_t>& zb) {
  mx::array ai = mx::astype(a, mx::int32), bi = mx::astype(b, mx::int32);
  mx::eval(ai, bi);
  const int64_t m = a.shape(0), k = a.shape(1), n = b.shape(1);
  std::vector<int64_t> y(static_cast<size_t>(m * n), 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < k; ++t)
        y[i * n + j] += (ai.data<int32_t>()[i * k + t] - za) * (bi.data<int32_t>()[t * n + j] - zb[j]);
  return y;
}

struct Shape3 {
  int m, k, n;
};

bool same_values(const mx::array& a, const mx::array& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && mx::array_equal(a, b).item<bool>();
}

// Packing from B^T (a convolution's filters) gives B's packing byte for byte: K past and short of a quad,
// N past and short of a panel, both types, each kind of zero point.
TEST(IntegerGemm, PackingFromColumnsEqualsPackingFromRows) {
  uint64_t seed = 500;
  for (auto [k, n] : {std::pair{5, 3}, {64, 33}, {37, 70}, {4, 32}}) {
    for (mx::Dtype type : {mx::int8, mx::uint8}) {
      for (int zero_kind = 0; zero_kind < 3; ++zero_kind) {
        const mx::array bt = random_bytes({n, k}, type, seed++);
        std::optional<mx::array> zero;
        if (zero_kind == 1) zero = random_bytes({1}, type, seed++);
        if (zero_kind == 2) zero = random_bytes({n}, type, seed++);
        const PackedIntegerRhs want = pack_integer_gemm_rhs(mx::contiguous(mx::transpose(bt)), zero);
        const PackedIntegerRhs got = pack_integer_gemm_rhs_columns(bt, zero);
        const std::string where = std::to_string(k) + "x" + std::to_string(n) + " zero kind " +
                                  std::to_string(zero_kind) + (type == mx::int8 ? " int8" : " uint8");
        EXPECT_TRUE(same_values(got.packed, want.packed)) << where;
        EXPECT_TRUE(same_values(got.column_sums, want.column_sums)) << where;
        EXPECT_TRUE(same_values(got.column_zeros, want.column_zeros)) << where;
      }
    }
  }
  EXPECT_THROW(pack_integer_gemm_rhs_columns(mx::zeros({4, 4}, mx::float32), std::nullopt),
               std::invalid_argument);
}

TEST(IntegerGemm, EqualsTheIntegerSums) {
  const std::vector<Shape3> shapes = {{1, 4, 1}, {6, 64, 32}, {7, 20, 33}, {13, 388, 100}, {128, 384, 64},
                                      {2, 8, 17}, {97, 12, 65}};
  uint64_t seed = 1;
  for (const Shape3& sh : shapes) {
    for (mx::Dtype b_type : {mx::int8, mx::uint8}) {
      for (int zero_kind = 0; zero_kind < 3; ++zero_kind) {  // none, scalar, per column
        mx::array a = random_bytes({sh.m, sh.k}, mx::uint8, seed++);
        mx::array b = random_bytes({sh.k, sh.n}, b_type, seed++);
        std::optional<mx::array> b_zero;
        if (zero_kind == 1) b_zero = random_bytes({1}, b_type, seed++);
        if (zero_kind == 2) b_zero = random_bytes({sh.n}, b_type, seed++);
        std::vector<int64_t> zb(static_cast<size_t>(sh.n), 0);
        if (b_zero) {
          mx::array z = mx::astype(*b_zero, mx::int32);
          z.eval();
          for (int j = 0; j < sh.n; ++j) zb[j] = z.data<int32_t>()[zero_kind == 1 ? 0 : j];
        }
        const mx::array a_zero = random_bytes({}, mx::uint8, seed++);
        const int64_t za = mx::astype(a_zero, mx::int32).item<int32_t>();
        PackedIntegerRhs packed = pack_integer_gemm_rhs(b, b_zero);
        mx::array got = integer_matmul(a, packed, sh.k, sh.n, a_zero, mx::Device::cpu);
        ASSERT_EQ(got.dtype(), mx::int32);
        ASSERT_EQ(got.shape(), (mx::Shape{sh.m, sh.n}));
        got.eval();
        const std::vector<int64_t> want = expected(a, b, za, zb);
        int64_t wrong = 0;
        for (size_t i = 0; i < want.size(); ++i) wrong += got.data<int32_t>()[i] != want[i];
        EXPECT_EQ(wrong, 0) << "m " << sh.m << " k " << sh.k << " n " << sh.n << " B " << b_type << " zero "
                            << zero_kind << " (kernel available: " << integer_gemm_available() << ")";
      }
    }
  }
}

// Leading axes of A are rows too; without A's zero point the rows are taken as they are; int8 A runs
// the reference (the kernel takes uint8).
TEST(IntegerGemm, BatchedRowsNoZeroPointAndInt8A) {
  mx::array b = random_bytes({16, 40}, mx::int8, 50);
  PackedIntegerRhs packed = pack_integer_gemm_rhs(b, std::nullopt);
  mx::array a = random_bytes({2, 3, 16}, mx::uint8, 51);
  mx::array got = integer_matmul(a, packed, 16, 40, std::nullopt, mx::Device::cpu);
  ASSERT_EQ(got.shape(), (mx::Shape{2, 3, 40}));
  std::vector<int64_t> want = expected(mx::reshape(a, {6, 16}), b, 0, std::vector<int64_t>(40, 0));
  mx::array flat = mx::reshape(got, {-1});
  flat.eval();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(flat.data<int32_t>()[i], want[i]) << i;
  mx::array signed_a = random_bytes({5, 16}, mx::int8, 52);
  mx::array zero = mx::array(static_cast<int8_t>(-3));
  mx::array y = integer_matmul(signed_a, packed, 16, 40, zero, mx::Device::cpu);
  y.eval();
  want = expected(signed_a, b, -3, std::vector<int64_t>(40, 0));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(y.data<int32_t>()[i], want[i]) << i;
}

// The float epilogue: float(acc) * scale (one element or per column) [+ bias], rounded as the separate
// Cast, Mul and Add: bit for bit the composition's.
TEST(IntegerGemm, FloatEpilogueEqualsCastMulAdd) {
  for (int n : {7, 32, 45}) {
    for (bool per_column : {false, true}) {
      for (bool with_bias : {false, true}) {
        mx::array b = random_bytes({24, n}, mx::int8, 70 + n);
        PackedIntegerRhs packed = pack_integer_gemm_rhs(b, std::nullopt);
        mx::array a = random_bytes({11, 24}, mx::uint8, 71);
        mx::array a_zero = mx::array(static_cast<uint8_t>(120));
        mx::array scale = per_column ? mx::random::uniform(0.001f, 0.01f, {n}, mx::float32, mx::random::key(72))
                                     : mx::array(0.0037f);
        std::optional<mx::array> bias;
        if (with_bias) bias = mx::random::normal({n}, mx::float32, 0, 1, mx::random::key(73));
        mx::array acc = mx::astype(integer_matmul(a, packed, 24, n, a_zero, mx::Device::cpu), mx::float32);
        mx::array got = integer_matmul(a, packed, 24, n, a_zero, mx::Device::cpu, IntegerEpilogue{scale, bias});
        mx::array want = mx::multiply(acc, scale);
        if (bias) want = mx::add(want, *bias);
        EXPECT_EQ(got.dtype(), mx::float32);
        EXPECT_TRUE(mx::array_equal(got, want).item<bool>())
            << "n " << n << " per column " << per_column << " bias " << with_bias;
        // The scale as A's (one element) times B's (per column or not).
        mx::array a_scale = mx::array(0.0123f);
        got = integer_matmul(a, packed, 24, n, a_zero, mx::Device::cpu, IntegerEpilogue{a_scale, bias, scale});
        want = mx::multiply(acc, mx::multiply(a_scale, scale));
        if (bias) want = mx::add(want, *bias);
        EXPECT_TRUE(mx::array_equal(got, want).item<bool>())
            << "factor: n " << n << " per column " << per_column << " bias " << with_bias;
      }
    }
  }
}

// A zero point computed in the same evaluation (DynamicQuantizeLinear's, inside a compiled plan) is
// read when the kernel runs, after it is computed.
TEST(IntegerGemm, ZeroPointComputedInTheSameGraph) {
  mx::array b = random_bytes({64, 48}, mx::int8, 60);
  PackedIntegerRhs packed = pack_integer_gemm_rhs(b, std::nullopt);
  mx::array a = random_bytes({9, 64}, mx::uint8, 61);
  auto f = mx::compile([packed](const std::vector<mx::array>& in) {
    mx::array zero = mx::astype(mx::add(mx::max(in[0]), mx::array(1)), mx::uint8);  // known only once computed
    return std::vector<mx::array>{integer_matmul(in[1], packed, 64, 48, zero, mx::Device::cpu)};
  });
  mx::array seed_values = mx::array({3, 90, 41}, mx::int32);
  mx::array y = f({seed_values, a})[0];
  y.eval();
  const std::vector<int64_t> want = expected(a, b, 91, std::vector<int64_t>(48, 0));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(y.data<int32_t>()[i], want[i]) << i;
}

}  // namespace
}  // namespace transmuter::kernels
