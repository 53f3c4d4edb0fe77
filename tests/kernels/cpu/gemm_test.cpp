// The packed-weight GEMM against mx::matmul + bias + the activation written
// out in MLX ops, over shapes that hit every edge of the tiling: rows not a
// multiple of the 6-row tile, columns not a multiple of the panel, depths
// around the 256-deep K block, one row, one column.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "support/random_arrays.h"
#include "support/simd_targets.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Both sides sum K float32 products of unit normals in different orders: at
// K <= 600 the sums stay below ~100 in magnitude, a few ulps are < 1e-4; the
// GELU epilogue adds the erf fit's 4e-7 relative.
constexpr float kTolerance = 1e-4f;

mx::array gelu_erf(const mx::array& z) {
  return mx::multiply(mx::multiply(z, mx::array(0.5f)),
                      mx::add(mx::array(1.0f), mx::erf(mx::divide(z, mx::array(std::sqrt(2.0f))))));
}

mx::array gelu_tanh(const mx::array& z) {
  mx::array inner =
      mx::multiply(mx::array(0.7978845608f),
                   mx::add(z, mx::multiply(mx::array(0.044715f), mx::power(z, mx::array(3.0f)))));
  return mx::multiply(mx::multiply(z, mx::array(0.5f)), mx::add(mx::array(1.0f), mx::tanh(inner)));
}

mx::array expected(const mx::array& a, const mx::array& b, const std::optional<mx::array>& bias,
                   Activation activation) {
  mx::array z = mx::matmul(a, b);
  if (bias) z = mx::add(z, *bias);
  if (activation == Activation::kGeluErf) return gelu_erf(z);
  if (activation == Activation::kGeluTanh) return gelu_tanh(z);
  return z;
}

TEST(PackedGemm, PackingIsExactAndUnpackingInvertsIt) {
  const int64_t width = gemm_panel_width();
  EXPECT_GE(width, 2);
  mx::array b = random_array({5, 2 * static_cast<int>(width) + 3}, 1);
  mx::array packed = pack_gemm_rhs(b, false);
  EXPECT_EQ(packed.shape(), (mx::Shape{3, 5, static_cast<int>(width)}));
  EXPECT_EQ(max_abs_diff(unpack_gemm_rhs(packed, b.shape(1)), b), 0.0f);
  // packed[p, k, j] = B[k, p * width + j]; zero past N.
  EXPECT_EQ(packed.data<float>()[1 * 5 * width + 2 * width + 3],
            mx::slice(b, {2, static_cast<int>(width) + 3}, {3, static_cast<int>(width) + 4}).item<float>());
  EXPECT_EQ(mx::slice(packed, {2, 0, 3}, {3, 5, static_cast<int>(width)}).size(), 5u * (width - 3));
  EXPECT_EQ(mx::max(mx::abs(mx::slice(packed, {2, 0, 3}, {3, 5, static_cast<int>(width)}))).item<float>(),
            0.0f);
  // [N, K] storage (Gemm transB) packs to the same panels.
  mx::array from_transposed = pack_gemm_rhs(mx::contiguous(mx::transpose(b)), true);
  EXPECT_EQ(max_abs_diff(from_transposed, packed), 0.0f);
}

// The transposing packer's 4 x 4 register blocks and its edges, from rows at odd byte offsets (a
// weight read where it lies in its file).
TEST(PackedGemm, RowsAtAnyAlignmentTransposeIntoAPanel) {
  constexpr int64_t kWidth = 16, kRows = 11, kDepth = 23;  // 2 blocks + 3 rows, 5 blocks + 3 depths
  std::vector<uint8_t> storage(1 + kRows * kDepth * sizeof(float));
  std::vector<const uint8_t*> rows(kRows);
  for (int64_t j = 0; j < kRows; ++j) {
    rows[j] = storage.data() + 1 + j * kDepth * sizeof(float);
    for (int64_t kk = 0; kk < kDepth; ++kk) {
      const float value = static_cast<float>(100 * j + kk);
      std::memcpy(const_cast<uint8_t*>(rows[j]) + kk * sizeof(float), &value, sizeof(float));
    }
  }
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    std::vector<float> panel(kDepth * kWidth, -1.0f);
    transpose_rows_into_panel(rows.data(), kRows, kDepth, kWidth, panel.data());
    for (int64_t kk = 0; kk < kDepth; ++kk) {
      for (int64_t j = 0; j < kWidth; ++j) {
        const float want =
            j < kRows ? static_cast<float>(100 * j + kk) : -1.0f;  // columns past cols untouched
        ASSERT_EQ(panel[kk * kWidth + j], want) << target << ": depth " << kk << ", column " << j;
      }
    }
  });
  EXPECT_GE(targets, 1);
}

// On every SIMD target of the CPU (the panel width and the partial-vector tails differ).
TEST(PackedGemm, MatchesMatmulOnEveryTilingEdge) {
  const int targets = testing::for_each_simd_target([](const std::string& target) {
    // 12, 19, 30: AVX-512 tiles of 12 rows, then 6 and the rest; 100: blocks of over 8 row tiles, K in
    // slices of 512.
    for (int m : {1, 5, 6, 7, 12, 13, 19, 30, 100}) {
      for (auto [k, n] :
           {std::pair{1, 1}, {3, 15}, {255, 16}, {256, 17}, {257, 33}, {600, 100}, {1100, 40}}) {
        mx::array a = random_array({m, k}, static_cast<uint64_t>(m * 1000 + k));
        mx::array b = random_array({k, n}, static_cast<uint64_t>(n));
        mx::array got = packed_matmul(a, pack_gemm_rhs(b, false), std::nullopt, n, Activation::kIdentity,
                                      mx::Device::cpu);
        ASSERT_EQ(got.shape(), (mx::Shape{m, n}));
        // Sums of 1100 products (of N(0, 1) values, ~33 in size) round more in float32: ~sqrt(K) growth.
        const float tolerance = k > 600 ? 3e-4f : kTolerance;
        EXPECT_LT(max_abs_diff(got, mx::matmul(a, b)), tolerance)
            << target << " " << m << "x" << k << "x" << n;
      }
    }
  });
  EXPECT_GE(targets, 1);
}

TEST(PackedGemm, BiasAndActivationEpilogues) {
  mx::array a = random_array({2, 9, 40}, 3);  // leading axes fold into rows
  mx::array b = random_array({40, 50}, 4, 0.3f);
  mx::array bias = random_array({50}, 5);
  mx::array packed = pack_gemm_rhs(b, false);
  for (Activation act : {Activation::kIdentity, Activation::kGeluErf, Activation::kGeluTanh}) {
    for (bool with_bias : {false, true}) {
      std::optional<mx::array> maybe_bias;
      if (with_bias) maybe_bias = bias;
      mx::array got = packed_matmul(a, packed, maybe_bias, 50, act, mx::Device::cpu);
      mx::array want = expected(a, b, maybe_bias, act);
      ASSERT_EQ(got.shape(), (mx::Shape{2, 9, 50}));
      EXPECT_LT(max_abs_diff(got, want), kTolerance) << static_cast<int>(act) << " bias " << with_bias;
      EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 1.0f);  // not vacuous
    }
  }
  // A 1-D left side gives a 1-D result, as MatMul does.
  mx::array v = random_array({40}, 6);
  EXPECT_EQ(packed_matmul(v, packed, bias, 50, Activation::kIdentity, mx::Device::cpu).shape(),
            (mx::Shape{50}));
  EXPECT_LT(max_abs_diff(packed_matmul(v, packed, bias, 50, Activation::kIdentity, mx::Device::cpu),
                         mx::add(mx::matmul(v, b), bias)),
            kTolerance);
}

// A residual (the output's shape) starts the accumulators with the bias;
// one that broadcasts is added by MLX; its gradient is the cotangent.
TEST(PackedGemm, ResidualIsAddedInTheEpilogue) {
  mx::array a = random_array({3, 13, 300}, 61);  // K over one 256-deep slice
  mx::array b = random_array({300, 37}, 62);
  mx::array bias = random_array({37}, 63);
  const mx::array packed = pack_gemm_rhs(b, false);
  for (const mx::Shape& shape : {mx::Shape{3, 13, 37}, mx::Shape{13, 37}}) {
    mx::array z = random_array(shape, 64);
    mx::array got = packed_matmul(a, packed, bias, 37, Activation::kIdentity, mx::Device::cpu, z);
    EXPECT_LT(max_abs_diff(got, mx::matmul(a, b) + bias + z), kTolerance);
  }
  mx::array z = random_array({3, 13, 37}, 65);
  mx::array weights = random_array({3, 13, 37}, 66);
  auto [_, grads] = mx::vjp(
      [&](const std::vector<mx::array>& p) {
        return std::vector<mx::array>{mx::sum(
            packed_matmul(p[0], packed, bias, 37, Activation::kIdentity, mx::Device::cpu, p[1]) * weights)};
      },
      {a, z}, {mx::array(1.0f)});
  EXPECT_LT(max_abs_diff(grads[1], weights), 1e-6f);
  EXPECT_LT(max_abs_diff(grads[0], mx::matmul(weights, mx::transpose(b))), kTolerance);
}

TEST(PackedGemm, ThreadedBlocksCoverLargeProducts) {
  // Several row blocks (96 rows) and panel blocks (4 panels): every task's
  // share of the output must be written once.
  mx::array a = random_array({300, 128}, 7);
  mx::array b = random_array({128, 300}, 8);
  mx::array bias = random_array({300}, 9);
  mx::array got = packed_matmul(a, pack_gemm_rhs(b, false), bias, 300, Activation::kGeluErf, mx::Device::cpu);
  EXPECT_LT(max_abs_diff(got, expected(a, b, bias, Activation::kGeluErf)), kTolerance);
}

// BlockSplit's tasks partition the output, in whole tiles; when there are few of them, their count
// shares evenly between the threads (a 7x7 layer's 49 rows x 5 panels had five one-panel tasks, three
// on one of two threads) unless the row blocks are down to two tiles.
TEST(PackedGemm, BlockSplitCoversTheOutputOnceInTasksTheThreadsShare) {
  struct Case {
    int64_t m, panels;
  };
  for (const int64_t threads : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{8}}) {
    // 49 x 1 with 4 threads: 3 row blocks of 18 rows, and 4 blocks round to 18 rows as well.
    for (const Case c : {Case{49, 5}, Case{49, 1}, Case{49, 10}, Case{128, 12}, Case{16, 12}, Case{1, 3},
                         Case{300, 10}, Case{13, 1}, Case{3136, 2}, Case{200, 1}}) {
      const BlockSplit split(c.m, c.panels, 96, 6, 4, threads);
      const std::string shape = std::to_string(c.m) + "x" + std::to_string(c.panels) + " on " +
                                std::to_string(threads) + " threads";
      std::vector<int> covered(static_cast<size_t>(c.m * c.panels), 0);
      for (int64_t t = 0; t < split.tasks(); ++t) {
        int64_t row0, rows, panel0, panels;
        split.task(t, row0, rows, panel0, panels);
        EXPECT_EQ(row0 % 6, 0) << shape << ": tasks start on a tile";
        for (int64_t r = row0; r < row0 + rows; ++r)
          for (int64_t p = panel0; p < panel0 + panels; ++p) covered[static_cast<size_t>(r * c.panels + p)]++;
      }
      EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int n) { return n == 1; })) << shape;
      if (split.tasks() < 4 * threads && split.block_rows > 12)
        EXPECT_EQ(split.tasks() % threads, 0) << shape << ": " << split.tasks() << " tasks";
    }
  }
}

TEST(PackedGemm, GradientsAndCompileFollowTheReference) {
  mx::array a = random_array({7, 20}, 10);
  mx::array b = random_array({20, 18}, 11, 0.5f);
  mx::array bias = random_array({18}, 12);
  mx::array packed = pack_gemm_rhs(b, false);
  auto through_kernel = [](const std::vector<mx::array>& p) {
    mx::array y = packed_matmul(p[0], p[1], p[2], 18, Activation::kGeluErf, mx::Device::cpu);
    return std::vector<mx::array>{mx::sum(mx::square(y))};
  };
  auto written_out = [](const std::vector<mx::array>& p) {
    return std::vector<mx::array>{mx::sum(mx::square(expected(p[0], p[1], p[2], Activation::kGeluErf)))};
  };
  auto [_, got] = mx::vjp(through_kernel, {a, packed, bias}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(written_out, {a, b, bias}, {mx::array(1.0f)});
  EXPECT_LT(max_abs_diff(got[0], want[0]), 1e-3f);
  // The packed weight's gradient is B's, in the packed layout (zero in the padding).
  EXPECT_LT(max_abs_diff(unpack_gemm_rhs(got[1], 18), want[1]), 1e-3f);
  const int panels = got[1].shape(0), width = got[1].shape(2), last_cols = 18 - (panels - 1) * width;
  if (last_cols < width) {
    mx::array padding = mx::slice(got[1], {panels - 1, 0, last_cols}, {panels, 20, width});
    EXPECT_EQ(mx::max(mx::abs(padding)).item<float>(), 0.0f);
  }
  EXPECT_LT(max_abs_diff(got[2], want[2]), 1e-3f);
  auto compiled = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{packed_matmul(mx::add(in[0], mx::array(1.0f)), in[1], std::nullopt, 18,
                                                Activation::kIdentity, mx::Device::cpu)};
  });
  EXPECT_LT(max_abs_diff(compiled({a, packed})[0], mx::matmul(mx::add(a, mx::array(1.0f)), b)), kTolerance);
}

TEST(PackedGemm, ArgumentsOutsideTheKernelRunTheReference) {
  mx::array b = random_array({8, 5}, 13);
  mx::array packed = pack_gemm_rhs(b, false);
  // float16 rows: the reference promotes as mx::matmul does.
  mx::array a16 = mx::astype(random_array({3, 8}, 14), mx::float16);
  mx::array got = packed_matmul(a16, packed, std::nullopt, 5, Activation::kIdentity, mx::Device::cpu);
  EXPECT_LT(max_abs_diff(got, mx::matmul(mx::astype(a16, mx::float32), b)), 1e-2f);
  // A panel width this CPU does not use (a layout from elsewhere) still computes.
  mx::array narrow =
      mx::reshape(mx::transpose(mx::reshape(mx::pad(b, {{0, 0}, {0, 1}}), {8, 3, 2}), {1, 0, 2}), {3, 8, 2});
  EXPECT_FALSE(packed_rhs_fits(narrow, 5));
  mx::array a = random_array({3, 8}, 15);
  EXPECT_LT(max_abs_diff(packed_matmul(a, narrow, std::nullopt, 5, Activation::kIdentity, mx::Device::cpu),
                         mx::matmul(a, b)),
            kTolerance);
  // A depth that does not match is MLX's error.
  EXPECT_THROW(packed_matmul(random_array({3, 7}, 16), packed, std::nullopt, 5, Activation::kIdentity,
                             mx::Device::cpu),
               std::invalid_argument);
  EXPECT_THROW(pack_gemm_rhs(random_array({2, 3, 4}, 17), false), std::invalid_argument);
  EXPECT_THROW(pack_gemm_rhs(mx::zeros({0, 4}), false), std::invalid_argument);
  EXPECT_THROW(pack_gemm_rhs(mx::zeros({2, 4}, mx::int32), false), std::invalid_argument);
}

TEST(BatchedGemm, MatchesMatmulWithBroadcastBatchesPackedOrInPlace) {
  // (a shape, b shape): batch broadcasting both ways, a 2-D b shared by the
  // batch, few rows (b read in place) and many (b packed per call).
  const std::vector<std::pair<mx::Shape, mx::Shape>> cases = {{{7, 20}, {20, 33}},
                                                              {{2, 3, 13, 40}, {40, 17}},
                                                              {{2, 1, 9, 8}, {1, 4, 8, 20}},
                                                              {{4, 2, 30}, {4, 30, 70}},
                                                              {{3, 300, 64}, {3, 64, 300}},
                                                              {{1, 2, 5}, {3, 5, 2}},
                                                              {{2, 12, 16, 64}, {2, 12, 64, 16}}};
  uint64_t seed = 30;
  for (const auto& [as, bs] : cases) {
    mx::array a = random_array(as, seed++);
    mx::array b = random_array(bs, seed++);
    ASSERT_TRUE(batched_matmul_fits(a, b, mx::Device::cpu));
    mx::array got = batched_matmul(a, b, mx::Device::cpu);
    mx::array want = mx::matmul(a, b);
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_LT(max_abs_diff(got, want), kTolerance) << as << " x " << bs;
  }
}

TEST(BatchedGemm, OtherArgumentsRunMlx) {
  mx::array a = random_array({1, 8}, 40), b = random_array({8, 4}, 41);
  EXPECT_FALSE(batched_matmul_fits(a, b, mx::Device::cpu));  // one row: matvec's
  EXPECT_FALSE(batched_matmul_fits(random_array({3, 8}, 42), random_array({7, 4}, 43), mx::Device::cpu));
  EXPECT_FALSE(
      batched_matmul_fits(random_array({2, 3, 8}, 44), random_array({3, 8, 4}, 45), mx::Device::cpu));
  mx::array h = mx::astype(random_array({3, 8}, 46), mx::float16);
  EXPECT_FALSE(batched_matmul_fits(h, mx::astype(b, mx::float16), mx::Device::cpu));
  EXPECT_LT(max_abs_diff(batched_matmul(h, mx::astype(b, mx::float16), mx::Device::cpu),
                         mx::matmul(h, mx::astype(b, mx::float16))),
            1e-2f);
  EXPECT_THROW(batched_matmul(random_array({3, 8}, 47), random_array({7, 4}, 48), mx::Device::cpu),
               std::invalid_argument);
}

TEST(BatchedGemm, GradientsAndCompileFollowMatmul) {
  mx::array a = random_array({2, 9, 12}, 50), b = random_array({2, 12, 7}, 51);
  auto loss = [](bool kernel) {
    return [kernel](const std::vector<mx::array>& p) {
      mx::array y = kernel ? batched_matmul(p[0], p[1], mx::Device::cpu) : mx::matmul(p[0], p[1]);
      return std::vector<mx::array>{mx::sum(mx::square(y))};
    };
  };
  auto [_, got] = mx::vjp(loss(true), {a, b}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss(false), {a, b}, {mx::array(1.0f)});
  EXPECT_LT(max_abs_diff(got[0], want[0]), 1e-3f);
  EXPECT_LT(max_abs_diff(got[1], want[1]), 1e-3f);
  auto compiled = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{batched_matmul(mx::add(in[0], mx::array(1.0f)), in[1], mx::Device::cpu)};
  });
  EXPECT_LT(max_abs_diff(compiled({a, b})[0], mx::matmul(mx::add(a, mx::array(1.0f)), b)), kTolerance);
}

}  // namespace
}  // namespace transmuter::kernels
