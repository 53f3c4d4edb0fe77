// The quantized-weight kernel against mx::quantized_matmul (MLX's scalar CPU
// kernel) on weights made by mx::quantize, over bits 4 and 8, every group size,
// row counts that hit both paths (the GEMV's 3-row tiles, the dequantized
// GEMM's 192-row blocks), depths that end inside a vector of words, and
// column counts that are not multiples of the SIMD width or of a task block.
#include "kernels/cpu/quantized_matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "support/random_arrays.h"
#include "support/simd_targets.h"

namespace transmuter::kernels {
namespace {

using testing::max_abs_diff;
using testing::random_array;

// Both sides sum K float32 products in different orders (the kernel also
// factors each group as scale * sum(x q) + bias * sum(x)). The rounding error
// of either is bounded by a few units of float32 (6e-8) times
// magnitude = sum_k |x_k| (|scale q| + |bias|), the sum of the absolute
// values of every term either side adds; it grows like sqrt(K) for random
// signs (~2e-6 of the magnitude at K = 1024). 1e-5 of the magnitude is the
// check; the measured worst case (printed) is 5e-8 with AVX-512.
constexpr float kRelativeTolerance = 1e-5f;

struct QuantizedWeight {
  mx::array w, scales, biases;
};

QuantizedWeight quantized_weight(int n, int k, int group_size, int bits, uint64_t seed) {
  std::vector<mx::array> q = mx::quantize(random_array({n, k}, seed, 0.5f), group_size, bits, "affine");
  mx::eval(q);
  return {q[0], q[1], q[2]};
}

// max over the outputs of |got - reference| / magnitude (see kRelativeTolerance).
float relative_error(const mx::array& x, const QuantizedWeight& q, const mx::array& got, int group_size,
                     int bits) {
  mx::array reference =
      mx::quantized_matmul(x, q.w, q.scales, q.biases, true, group_size, bits, "affine", mx::Device::cpu);
  mx::array terms = mx::dequantize(q.w, mx::abs(q.scales), mx::abs(q.biases), group_size, bits, "affine");
  mx::array magnitude = mx::matmul(mx::abs(x), mx::transpose(terms));
  mx::array ratio =
      mx::divide(mx::abs(mx::subtract(got, reference)), mx::maximum(magnitude, mx::array(1e-30f)));
  return mx::max(ratio).item<float>();
}

TEST(QuantizedMatmulKernel, MatchesMlxOnEveryLayoutAndTilingEdge) {
  // Rows from quantized_matmul_gemm_rows() on take the dequantized GEMM: 1-5
  // below run the GEMV (5: a 3-row and a 2-row tile), 7 and 64 the GEMM.
  ASSERT_GT(quantized_matmul_gemm_rows(), 5);
  ASSERT_LE(quantized_matmul_gemm_rows(), 7);
  float worst = 0.0f;
  for (int bits : {4, 8}) {
    for (int group_size : {32, 64, 128}) {
      // K: 3 groups (at group 32 it ends inside a vector of words) and 1024;
      // N: 1, one short of the 4-column tile and of the 32-column block, past the 64-column GEMM block.
      for (auto [k, n] : {std::pair{3 * group_size, 1}, {3 * group_size, 31}, {1024, 67}, {1024, 3}}) {
        const QuantizedWeight q =
            quantized_weight(n, k, group_size, bits, static_cast<uint64_t>(k + n + bits));
        for (int m : {1, 2, 3, 5, 7, 64}) {
          mx::array x = random_array({m, k}, static_cast<uint64_t>(m * 7 + group_size));
          ASSERT_TRUE(quantized_matmul_fits(x, q.w, q.scales, q.biases, group_size, bits, mx::Device::cpu));
          mx::array got = quantized_matmul(x, q.w, q.scales, q.biases, group_size, bits, mx::Device::cpu);
          ASSERT_EQ(got.shape(), (mx::Shape{m, n}));
          const float error = relative_error(x, q, got, group_size, bits);
          worst = std::max(worst, error);
          EXPECT_LT(error, kRelativeTolerance)
              << "bits " << bits << " group " << group_size << " M " << m << " K " << k << " N " << n;
        }
      }
    }
  }
  std::printf("worst error / magnitude: %.3g\n", worst);
}

// A symmetric weight (no stored biases): the kernel's -2^(bits - 1) * scale biases, on both paths.
TEST(QuantizedMatmulKernel, SymmetricWeightsDeriveTheirBiases) {
  for (int bits : {4, 8}) {
    for (int group_size : {32, 128}) {
      QuantizedWeight q =
          quantized_weight(37, 256, group_size, bits, static_cast<uint64_t>(bits + group_size));
      q.biases = symmetric_biases(q.scales, bits);
      EXPECT_EQ(
          max_abs_diff(q.biases, mx::multiply(q.scales, mx::array(-static_cast<float>(1 << (bits - 1))))),
          0.0f);
      for (int m : {1, 3, 7}) {
        mx::array x = random_array({m, 256}, static_cast<uint64_t>(m));
        ASSERT_TRUE(quantized_matmul_fits(x, q.w, q.scales, std::nullopt, group_size, bits, mx::Device::cpu));
        mx::array got = quantized_matmul(x, q.w, q.scales, std::nullopt, group_size, bits, mx::Device::cpu);
        EXPECT_LT(relative_error(x, q, got, group_size, bits), kRelativeTolerance)
            << "bits " << bits << " group " << group_size << " M " << m;
      }
    }
  }
}

TEST(QuantizedMatmulKernel, GemmRowBlocksAndLeadingAxes) {
  // 200 rows: two of the GEMM's 192-row blocks; [2, 100, K] folds into rows.
  const QuantizedWeight q = quantized_weight(130, 256, 64, 4, 11);
  mx::array x = random_array({2, 100, 256}, 12);
  mx::array got = quantized_matmul(x, q.w, q.scales, q.biases, 64, 4, mx::Device::cpu);
  ASSERT_EQ(got.shape(), (mx::Shape{2, 100, 130}));
  EXPECT_LT(relative_error(mx::reshape(x, {200, 256}), q, mx::reshape(got, {200, 130}), 64, 4),
            kRelativeTolerance);
  // A single row given as a vector.
  mx::array v = random_array({256}, 13);
  mx::array y = quantized_matmul(v, q.w, q.scales, q.biases, 64, 4, mx::Device::cpu);
  ASSERT_EQ(y.shape(), (mx::Shape{130}));
  EXPECT_LT(relative_error(mx::reshape(v, {1, 256}), q, mx::reshape(y, {1, 130}), 64, 4), kRelativeTolerance);
}

TEST(QuantizedMatmulKernel, LayoutsItDoesNotTakeRunMlx) {
  const QuantizedWeight q2 = quantized_weight(16, 128, 64, 2, 21);
  mx::array x = random_array({2, 128}, 22);
  EXPECT_FALSE(quantized_matmul_fits(x, q2.w, q2.scales, q2.biases, 64, 2, mx::Device::cpu));
  mx::array reference =
      mx::quantized_matmul(x, q2.w, q2.scales, q2.biases, true, 64, 2, "affine", mx::Device::cpu);
  EXPECT_EQ(max_abs_diff(quantized_matmul(x, q2.w, q2.scales, q2.biases, 64, 2, mx::Device::cpu), reference),
            0.0f);

  const QuantizedWeight q4 = quantized_weight(16, 128, 64, 4, 23);
  EXPECT_FALSE(
      quantized_matmul_fits(mx::astype(x, mx::float16), q4.w, q4.scales, q4.biases, 64, 4, mx::Device::cpu));
  EXPECT_FALSE(
      quantized_matmul_fits(x, q4.w, mx::astype(q4.scales, mx::float16), q4.biases, 64, 4, mx::Device::cpu));
  EXPECT_FALSE(
      quantized_matmul_fits(x, q4.w, q4.scales, q4.biases, 32, 4, mx::Device::cpu));  // scales' shape
  EXPECT_FALSE(
      quantized_matmul_fits(random_array({2, 64}, 24), q4.w, q4.scales, q4.biases, 64, 4, mx::Device::cpu));
  EXPECT_FALSE(
      quantized_matmul_fits(random_array({0, 128}, 25), q4.w, q4.scales, q4.biases, 64, 4, mx::Device::cpu));
}

TEST(QuantizedMatmulKernel, GradientsAreMlxs) {
  const QuantizedWeight q = quantized_weight(40, 128, 32, 4, 31);
  mx::array x = random_array({3, 128}, 32);
  mx::array cotangent = random_array({3, 40}, 33);
  mx::array tangent = random_array({3, 128}, 34);
  auto kernel = [&](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{quantized_matmul(in[0], q.w, q.scales, q.biases, 32, 4, mx::Device::cpu)};
  };
  auto reference = [&](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        mx::quantized_matmul(in[0], q.w, q.scales, q.biases, true, 32, 4, "affine", mx::Device::cpu)};
  };
  // Both are MLX's derivative (the same graph), so they agree exactly.
  auto [outputs, grads] = mx::vjp(kernel, {x}, {cotangent});
  auto [ref_outputs, ref_grads] = mx::vjp(reference, {x}, {cotangent});
  EXPECT_EQ(max_abs_diff(grads[0], ref_grads[0]), 0.0f);
  EXPECT_LT(relative_error(x, q, outputs[0], 32, 4), kRelativeTolerance);
  auto [jvp_outputs, tangents] = mx::jvp(kernel, {x}, {tangent});
  auto [ref_jvp_outputs, ref_tangents] = mx::jvp(reference, {x}, {tangent});
  EXPECT_EQ(max_abs_diff(tangents[0], ref_tangents[0]), 0.0f);
  // With respect to the scales too (MLX has none with respect to w).
  auto of_scales = [&](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{quantized_matmul(x, q.w, in[0], q.biases, 32, 4, mx::Device::cpu)};
  };
  auto ref_of_scales = [&](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        mx::quantized_matmul(x, q.w, in[0], q.biases, true, 32, 4, "affine", mx::Device::cpu)};
  };
  EXPECT_EQ(max_abs_diff(mx::vjp(of_scales, {q.scales}, {cotangent}).second[0],
                         mx::vjp(ref_of_scales, {q.scales}, {cotangent}).second[0]),
            0.0f);
}

// ONNX Runtime's rounding of A at MatMulNBits accuracy_level 4 (MLAS QuantizeARow_CompInt8), as a plain
// loop: per group, scale = max|x| / 127 and x -> nearbyint(x * (127 / max|x|)) * scale.
mx::array ort_int8_rounded(const mx::array& x, int group) {
  mx::array dense = mx::contiguous(x);
  mx::eval(dense);
  const float* in = dense.data<float>();
  const int k = x.shape(-1);
  const size_t rows = x.size() / k;
  std::vector<float> out(x.size());
  for (size_t r = 0; r < rows; ++r) {
    for (int g0 = 0; g0 < k; g0 += group) {
      const int end = std::min(k, g0 + group);
      float amax = 0.0f;
      for (int i = g0; i < end; ++i) amax = std::max(amax, std::fabs(in[r * k + i]));
      const float inverse = amax == 0.0f ? 0.0f : 127.0f / amax;
      for (int i = g0; i < end; ++i)
        out[r * k + i] = std::nearbyint(in[r * k + i] * inverse) * (amax / 127.0f);
    }
  }
  return mx::array(out.begin(), x.shape(), mx::float32);
}

TEST(Int8GroupRounding, IsOrtsRoundingOfA) {
  // K = 93: two whole groups of 32 and a partial one; row 1's first group all zero.
  mx::array x = random_array({3, 93}, 41, 3.0f);
  mx::array zero_group = mx::concatenate({mx::zeros({1, 32}), mx::ones({1, 61})}, 1);
  x = mx::where(mx::concatenate({mx::ones({1, 93}), zero_group, mx::ones({1, 93})}, 0) != 0.0f, x,
                mx::array(0.0f));
  mx::array got = int8_group_rounded(x, 32, mx::Device::cpu);
  ASSERT_EQ(got.shape(), x.shape());
  EXPECT_EQ(max_abs_diff(got, ort_int8_rounded(x, 32)), 0.0f);
  EXPECT_EQ(max_abs_diff(mx::slice(got, {1, 0}, {2, 32}), mx::zeros({1, 32})), 0.0f);
  // It rounds: the values move, by at most half a step (max|x| / 254) of their group.
  EXPECT_GT(max_abs_diff(got, x), 0.0f);
  EXPECT_LE(max_abs_diff(got, x), 3.0f * 4.0f / 254.0f);
}

TEST(Int8GroupRounding, GradientPassesStraightThrough) {
  mx::array x = random_array({2, 64}, 42);
  mx::array cotangent = random_array({2, 64}, 43);
  auto rounded = [](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{int8_group_rounded(in[0], 32, mx::Device::cpu)};
  };
  EXPECT_EQ(max_abs_diff(mx::vjp(rounded, {x}, {cotangent}).second[0], cotangent), 0.0f);
}

// Activations::int8_per_group: the product of the rounded x, on the GEMV and the GEMM paths.
TEST(QuantizedMatmulKernel, Int8ActivationsAreOrtsAccuracyLevel4) {
  float least_moved = 1.0f;
  for (int bits : {4, 8}) {
    for (int group_size : {32, 128}) {
      const QuantizedWeight q =
          quantized_weight(45, 256, group_size, bits, static_cast<uint64_t>(bits * group_size));
      for (int m : {1, 3, 7, 64}) {
        mx::array x = random_array({m, 256}, static_cast<uint64_t>(m + 50));
        mx::array got = quantized_matmul(x, q.w, q.scales, q.biases, group_size, bits, mx::Device::cpu,
                                         Activations::int8_per_group);
        EXPECT_LT(relative_error(ort_int8_rounded(x, group_size), q, got, group_size, bits),
                  kRelativeTolerance)
            << "bits " << bits << " group " << group_size << " M " << m;
        // Not the product of the unrounded x.
        const float moved = relative_error(x, q, got, group_size, bits);
        least_moved = std::min(least_moved, moved);
        EXPECT_GT(moved, 5 * kRelativeTolerance);
      }
    }
  }
  std::printf("least change from the unrounded product / magnitude: %.3g\n", least_moved);
}

// The int8 GEMV's dot products differ per SIMD target (AVX512-VNNI's vpdpbusd, AVX-512's and AVX2's
// vpmaddubsw for 4 bits, the float GEMV on the rounded x elsewhere): each target this CPU runs, over
// group sizes whose groups are smaller than a vector of weights and larger, depths ending inside one,
// depths of whole runs of a vector's lanes of groups and of runs and a tail (18 groups: SmolLM2's
// K = 576 at group 32), stored and symmetric biases.
TEST(QuantizedMatmulKernel, Int8ActivationsOnEverySimdTarget) {
  const int targets = testing::for_each_simd_target([](const std::string& target) {
    for (int bits : {4, 8}) {
      for (int group_size : {32, 64, 128}) {
        for (auto [k, n] : {std::pair{3 * group_size, 31}, {1024, 67}, {18 * group_size, 29}}) {
          const QuantizedWeight q =
              quantized_weight(n, k, group_size, bits, static_cast<uint64_t>(k + n + group_size));
          for (bool symmetric : {false, true}) {
            const std::optional<mx::array> biases =
                symmetric ? std::nullopt : std::optional<mx::array>(q.biases);
            const QuantizedWeight reference_weight{q.w, q.scales,
                                                   symmetric ? symmetric_biases(q.scales, bits) : q.biases};
            for (int m : {1, 3, 5}) {
              mx::array x = random_array({m, k}, static_cast<uint64_t>(m + k));
              mx::array got = quantized_matmul(x, q.w, q.scales, biases, group_size, bits, mx::Device::cpu,
                                               Activations::int8_per_group);
              EXPECT_LT(
                  relative_error(ort_int8_rounded(x, group_size), reference_weight, got, group_size, bits),
                  kRelativeTolerance)
                  << target << " bits " << bits << " group " << group_size << " K " << k << " N " << n
                  << " M " << m << (symmetric ? " symmetric" : "");
            }
          }
        }
      }
    }
  });
  EXPECT_GE(targets, 1);
}

// The float GEMV and GEMM on every target: the tails of rows of w, of the groups and of the columns.
TEST(QuantizedMatmulKernel, FloatActivationsOnEverySimdTarget) {
  const int targets = testing::for_each_simd_target([](const std::string& target) {
    for (int bits : {4, 8}) {
      for (int group_size : {32, 128}) {
        const int k = 3 * group_size, n = 37;
        const QuantizedWeight q = quantized_weight(n, k, group_size, bits, static_cast<uint64_t>(bits + k));
        for (int m : {1, 2, 3, 7}) {
          mx::array x = random_array({m, k}, static_cast<uint64_t>(m + 90));
          mx::array got = quantized_matmul(x, q.w, q.scales, q.biases, group_size, bits, mx::Device::cpu);
          EXPECT_LT(relative_error(x, q, got, group_size, bits), kRelativeTolerance)
              << target << " bits " << bits << " group " << group_size << " M " << m;
        }
      }
    }
  });
  EXPECT_GE(targets, 1);
}

// --- routed_quantized_matmul: a mixture of experts' products, each pair on its expert's weight ------------

// E experts' weights [E, N, ...], each quantized on its own, and the per-expert weights for the reference.
struct ExpertWeights {
  std::vector<QuantizedWeight> each;
  mx::array w, scales, biases;
};

ExpertWeights expert_weights(int experts, int n, int k, int group_size, int bits, uint64_t seed) {
  ExpertWeights e{{}, mx::array(0), mx::array(0), mx::array(0)};
  std::vector<mx::array> w, scales, biases;
  for (int i = 0; i < experts; ++i) {
    e.each.push_back(quantized_weight(n, k, group_size, bits, seed + static_cast<uint64_t>(i)));
    w.push_back(e.each.back().w);
    scales.push_back(e.each.back().scales);
    biases.push_back(e.each.back().biases);
  }
  e.w = mx::stack(w);
  e.scales = mx::stack(scales);
  e.biases = mx::stack(biases);
  mx::eval({e.w, e.scales, e.biases});
  return e;
}

// Pair p's row against its expert's own quantized_matmul reference (relative_error per pair).
float routed_error(const mx::array& x, const std::vector<uint32_t>& experts, const ExpertWeights& e,
                   const mx::array& got, int group_size, int bits) {
  const int pairs = static_cast<int>(experts.size()), share = pairs / x.shape(0), k = x.shape(1);
  float worst = 0.0f;
  for (int p = 0; p < pairs; ++p) {
    mx::array row = mx::slice(x, {p / share, 0}, {p / share + 1, k});
    mx::array mine = mx::slice(got, {p, 0}, {p + 1, got.shape(1)});
    worst =
        std::max(worst, relative_error(row, e.each[experts[static_cast<size_t>(p)]], mine, group_size, bits));
  }
  return worst;
}

TEST(RoutedQuantizedMatmul, EachPairIsItsExpertsProduct) {
  const int experts = 6;
  for (int bits : {4, 8}) {
    for (int group_size : {32, 128}) {
      const int k = 2 * group_size, n = 37;
      const ExpertWeights e =
          expert_weights(experts, n, k, group_size, bits, static_cast<uint64_t>(bits * 10));
      // A decode step (one token, k = 2 routes: one GEMV per expert), a token whose two routes pick one
      // expert, unused experts; many pairs on one expert (its rows take the dequantized GEMM).
      std::vector<std::pair<int, std::vector<uint32_t>>> routings = {
          {1, {4, 1}}, {1, {2, 2}}, {3, {0, 5, 5, 0, 3, 5}}, {8, {1, 1, 1, 1, 1, 1, 1, 1}}, {2, {3, 1}}};
      std::vector<uint32_t> many(16, 2);
      many[3] = 0;
      routings.push_back({16, many});
      for (const auto& [rows, routes] : routings) {
        mx::array x = random_array({rows, k}, static_cast<uint64_t>(routes.size() + rows));
        mx::array indices(routes.begin(), {static_cast<int>(routes.size())}, mx::uint32);
        for (bool with_biases : {true, false}) {
          const std::optional<mx::array> biases = with_biases ? std::optional(e.biases) : std::nullopt;
          ASSERT_TRUE(routed_quantized_matmul_fits(x, indices, e.w, e.scales, biases, group_size, bits,
                                                   mx::Device::cpu));
          mx::array got =
              routed_quantized_matmul(x, indices, e.w, e.scales, biases, group_size, bits, mx::Device::cpu);
          ASSERT_EQ(got.shape(), (mx::Shape{static_cast<int>(routes.size()), n}));
          ExpertWeights reference = e;
          if (!with_biases) {
            for (auto& q : reference.each) q.biases = symmetric_biases(q.scales, bits);
          }
          EXPECT_LT(routed_error(x, routes, reference, got, group_size, bits), kRelativeTolerance)
              << "bits " << bits << " group " << group_size << " pairs " << routes.size() << " rows " << rows
              << (with_biases ? "" : " symmetric");
        }
      }
    }
  }
}

TEST(RoutedQuantizedMatmul, ComputedIndicesAndOutOfRangeExperts) {
  const ExpertWeights e = expert_weights(3, 40, 64, 32, 4, 70);
  mx::array x = random_array({2, 64}, 71);
  // Indices computed by the graph (not yet evaluated when the kernel is made), as a router's top-k are.
  mx::array indices = mx::astype(mx::argmax(random_array({4, 3}, 72), 1), mx::uint32);
  mx::array got = routed_quantized_matmul(x, indices, e.w, e.scales, e.biases, 32, 4, mx::Device::cpu);
  mx::eval(got);
  std::vector<uint32_t> routes(indices.data<uint32_t>(), indices.data<uint32_t>() + 4);
  EXPECT_LT(routed_error(x, routes, e, got, 32, 4), kRelativeTolerance);
  // An index past the experts gives NaN in its row and leaves the others alone.
  mx::array bad = mx::array({0u, 7u}, {2}, mx::uint32);
  mx::array y = routed_quantized_matmul(mx::slice(x, {0, 0}, {1, 64}), bad, e.w, e.scales, e.biases, 32, 4,
                                        mx::Device::cpu);
  EXPECT_TRUE(mx::all(mx::isnan(mx::slice(y, {1, 0}, {2, 40}))).item<bool>());
  EXPECT_FALSE(mx::any(mx::isnan(mx::slice(y, {0, 0}, {1, 40}))).item<bool>());
}

TEST(RoutedQuantizedMatmul, LayoutsItDoesNotTakeRunMlxAndGradientsAreMlxs) {
  const ExpertWeights e = expert_weights(2, 16, 64, 32, 4, 80);
  mx::array x = random_array({2, 64}, 81);
  mx::array indices = mx::array({1u, 0u, 0u, 1u}, {4}, mx::uint32);
  // 3 pairs for 2 rows: not a whole number of pairs per row.
  EXPECT_FALSE(routed_quantized_matmul_fits(x, mx::array({1u, 0u, 0u}, {3}, mx::uint32), e.w, e.scales,
                                            e.biases, 32, 4, mx::Device::cpu));
  EXPECT_FALSE(routed_quantized_matmul_fits(x, indices, e.w, e.scales, e.biases, 32, 2, mx::Device::cpu));
  // Gradient with respect to x through the kernel equals gather_qmm's.
  auto through = [&](bool kernel) {
    return [&, kernel](const std::vector<mx::array>& in) {
      mx::array y =
          kernel ? routed_quantized_matmul(in[0], indices, e.w, e.scales, e.biases, 32, 4, mx::Device::cpu)
                 : mx::reshape(mx::gather_qmm(mx::reshape(mx::repeat(in[0], 2, 0), {4, 1, 64}), e.w, e.scales,
                                              e.biases, std::nullopt, indices, true, 32, 4),
                               {4, 16});
      return std::vector<mx::array>{mx::sum(mx::multiply(y, y))};
    };
  };
  mx::array got = mx::vjp(through(true), {x}, {mx::array(1.0f)}).second[0];
  mx::array want = mx::vjp(through(false), {x}, {mx::array(1.0f)}).second[0];
  EXPECT_LT(max_abs_diff(got, want), 1e-3f * (1.0f + mx::max(mx::abs(want)).item<float>()));
}

}  // namespace
}  // namespace transmuter::kernels
