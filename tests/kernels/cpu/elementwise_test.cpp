// The elementwise kernels against MLX's ops, bit for bit -- arithmetic, comparisons and logic, selection,
// conversions. Arithmetic: every broadcast layout the
// loop distinguishes (equal shapes, a scalar on either side, a row, a channel vector, a column, both sides
// repeating, a middle axis, ranks that differ, an empty result), values with NaN, infinities and signed
// zeros (maximum / minimum pick as MLX does), sizes that span many tasks and rows longer than a task, a
// transposed view, a donated operand -- under each SIMD target the CPU has; the loop's layout itself;
// gradients (the references'); the cases handed to MLX.
#include "kernels/cpu/elementwise.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include "support/simd_targets.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace transmuter::kernels {
namespace {

constexpr BinaryOp kOps[] = {BinaryOp::kAdd,    BinaryOp::kSubtract, BinaryOp::kMultiply,
                             BinaryOp::kDivide, BinaryOp::kMaximum,  BinaryOp::kMinimum};

mx::array mlx_op(BinaryOp op, const mx::array& a, const mx::array& b) {
  switch (op) {
    case BinaryOp::kAdd:
      return mx::add(a, b);
    case BinaryOp::kSubtract:
      return mx::subtract(a, b);
    case BinaryOp::kMultiply:
      return mx::multiply(a, b);
    case BinaryOp::kDivide:
      return mx::divide(a, b);
    case BinaryOp::kMaximum:
      return mx::maximum(a, b);
    case BinaryOp::kMinimum:
      return mx::minimum(a, b);
  }
  return a;
}

// Random values with NaN, both infinities, both zeros and ties (equal values on both sides) mixed in.
mx::array awkward(const mx::Shape& shape, uint64_t seed) {
  mx::array x = mx::round(mx::random::uniform(-4.0f, 4.0f, shape, mx::float32, mx::random::key(seed)));
  const mx::array pick = mx::random::randint(0, 12, shape, mx::int32, mx::random::key(seed + 100));
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f};
  for (int k = 0; k < 4; ++k) x = mx::where(mx::equal(pick, mx::array(k)), mx::array(specials[k]), x);
  return x;
}

// Same bits (NaNs of any payload equal), and the kernel ran.
void expect_same_bits(const mx::array& got, const mx::array& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const mx::array g = mx::view(mx::contiguous(got), mx::uint32),
                  w = mx::view(mx::contiguous(want), mx::uint32);
  const mx::array both_nan = mx::logical_and(mx::isnan(got), mx::isnan(want));
  EXPECT_TRUE(mx::all(mx::logical_or(mx::equal(g, w), both_nan)).item<bool>()) << what;
}

TEST(BinaryKernel, EqualsMlxBitForBitOverEveryBroadcastLayout) {
  const std::vector<std::pair<mx::Shape, mx::Shape>> layouts = {
      {{16, 384}, {16, 384}},          // equal
      {{16, 384}, {}},                 // b a scalar
      {{}, {3, 5}},                    // a a scalar
      {{16, 384}, {384}},              // a row (a bias)
      {{2, 5, 7, 16}, {2, 1, 1, 16}},  // a channel vector per image (squeeze-and-excitation)
      {{16, 1}, {16, 384}},            // a column
      {{4, 1}, {1, 8}},                // both repeat
      {{3, 1, 5}, {1, 4, 1}},          // a middle axis
      {{2, 1, 1, 16}, {16}},           // ranks differ, a repeats
      {{1, 1, 16}, {1, 1, 16}},        // leading ones
      {{1}, {1}},                      // one element
      {{7, 13}, {13}},                 // rows shorter than a vector, with tails
      {{0, 4}, {4}},                   // empty
      {{3, 50000}, {3, 1}},            // rows longer than a task
      {{300, 173}, {300, 173}},        // many tasks, odd lengths
  };
  const int targets = testing::for_each_simd_target([&](const std::string& target) {
    uint64_t seed = 1;
    for (const auto& [sa, sb] : layouts) {
      const mx::array a = awkward(sa, seed++), b = awkward(sb, seed++);
      for (BinaryOp op : kOps) {
        const mx::array got = binary(op, a, b, mx::Device::cpu);
        const std::string what = target + ": " + std::string(got.primitive().name()) + " of " +
                                 ::testing::PrintToString(sa) + " and " + ::testing::PrintToString(sb);
        if (mx::broadcast_shapes(sa, sb) != mx::Shape{0, 4}) {
          EXPECT_EQ(std::string(got.primitive().name()).rfind("transmuter::", 0), 0u) << what;
        }
        expect_same_bits(got, mlx_op(op, a, b), what);
      }
    }
  });
  EXPECT_GE(targets, 1);
}

// A transposed view is copied dense first; an operand that nothing else holds gives its buffer to the
// output (computed in place); the same array on both sides.
TEST(BinaryKernel, ViewsDonatedOperandsAndAliasedOperands) {
  const mx::array a = awkward({64, 48}, 40), b = awkward({48, 64}, 41), row = awkward({48}, 42);
  for (BinaryOp op : kOps) {
    expect_same_bits(binary(op, a, mx::transpose(b), mx::Device::cpu), mlx_op(op, a, mx::transpose(b)),
                     "view");
    // exp(a)'s only holder is the kernel: it may be donated, and y written over it.
    const mx::array donated = binary(op, mx::exp(mx::transpose(b)), row, mx::Device::cpu);
    expect_same_bits(donated, mlx_op(op, mx::exp(mx::transpose(b)), row), "donated");
    expect_same_bits(binary(op, a, a, mx::Device::cpu), mlx_op(op, a, a), "aliased");
  }
}

TEST(BroadcastLoop, MergesWhatEveryOperandStepsThroughAlike) {
  BroadcastLoop se = broadcast_loop({{2, 5, 7, 16}, {2, 1, 1, 16}});
  EXPECT_EQ(se.outer, (std::vector<int64_t>{2, 35}));
  EXPECT_EQ(se.strides[0], (std::vector<int64_t>{560, 16}));
  EXPECT_EQ(se.strides[1], (std::vector<int64_t>{16, 0}));
  EXPECT_EQ(se.inner, 16);
  EXPECT_TRUE(se.steps[0] && se.steps[1]);

  BroadcastLoop same = broadcast_loop({{4, 1, 6}, {4, 1, 6}});  // one run of 24
  EXPECT_TRUE(same.outer.empty());
  EXPECT_EQ(same.inner, 24);

  BroadcastLoop column = broadcast_loop({{16, 1}, {16, 384}});
  EXPECT_EQ(column.outer, (std::vector<int64_t>{16}));
  EXPECT_EQ(column.strides[0], (std::vector<int64_t>{1}));
  EXPECT_EQ(column.inner, 384);
  EXPECT_FALSE(column.steps[0]);
  EXPECT_TRUE(column.steps[1]);

  // Three operands: a condition per row, a full tensor and a scalar.
  BroadcastLoop three = broadcast_loop({{3, 1}, {3, 8}, {}});
  EXPECT_EQ(three.outer, (std::vector<int64_t>{3}));
  EXPECT_EQ(three.inner, 8);
  EXPECT_EQ(three.strides[0], (std::vector<int64_t>{1}));
  EXPECT_EQ(three.strides[2], (std::vector<int64_t>{0}));
  EXPECT_FALSE(three.steps[0]);
  EXPECT_TRUE(three.steps[1]);
  EXPECT_FALSE(three.steps[2]);

  EXPECT_EQ(broadcast_loop({{0, 4}, {4}}).inner, 0);
}

TEST(BinaryKernel, GradientsAreTheMlxOps) {
  const mx::array a = mx::random::uniform(0.5f, 2.0f, {6, 5}, mx::float32, mx::random::key(50));
  const mx::array b = mx::random::uniform(0.5f, 2.0f, {5}, mx::float32, mx::random::key(51));
  for (BinaryOp op : kOps) {
    auto loss = [op](bool kernel) {
      return [op, kernel](const std::vector<mx::array>& in) {
        const mx::array y = kernel ? binary(op, in[0], in[1], mx::Device::cpu) : mlx_op(op, in[0], in[1]);
        return mx::sum(mx::multiply(y, y));
      };
    };
    const std::vector<mx::array> got = mx::grad(loss(true), std::vector<int>{0, 1})({a, b});
    const std::vector<mx::array> want = mx::grad(loss(false), std::vector<int>{0, 1})({a, b});
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(mx::allclose(got[i], want[i], 1e-6, 1e-6).item<bool>()) << static_cast<int>(op) << " " << i;
      EXPECT_GT(mx::max(mx::abs(want[i])).item<float>(), 0.0f);
    }
  }
}

TEST(BinaryKernel, OtherTypesAndShapesAreMlxs) {
  const mx::array h = mx::astype(mx::arange(6.0f), mx::float16);
  const mx::array y = binary(BinaryOp::kAdd, h, h, mx::Device::cpu);
  EXPECT_EQ(y.dtype(), mx::float16);
  EXPECT_EQ(std::string(y.primitive().name()), "Add");
  EXPECT_FALSE(binary_fits(mx::zeros({3, 4}), mx::zeros({5})));
  EXPECT_THROW(binary(BinaryOp::kAdd, mx::zeros({3, 4}), mx::zeros({5}), mx::Device::cpu), std::exception);
}

// Every pair of types the kernel converts, against mx::astype: values that round (2^24 + 1, 2^40 + 1),
// the int64 extremes, NaN and -0 to bool, int64 narrowed to int32 (wrapping as a C++ cast does).
TEST(ConvertKernel, EqualsAstype) {
  const mx::array wide =
      mx::array({int64_t{0}, int64_t{-1}, int64_t{1} << 40, (int64_t{1} << 40) + 1, (int64_t{1} << 24) + 1,
                 std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()});
  const mx::array big = mx::random::randint(-1000000, 1000000, {40000}, mx::int32, mx::random::key(60));
  const mx::array flags = mx::greater(big, mx::array(0));
  const mx::array floats = awkward({300}, 61);
  const std::vector<std::pair<mx::array, std::vector<mx::Dtype>>> cases = {
      {wide, {mx::float32, mx::bool_, mx::int32}},
      {big, {mx::float32, mx::bool_, mx::int64}},
      {mx::astype(big, mx::int64), {mx::float32, mx::bool_, mx::int32}},
      {flags, {mx::float32, mx::int64, mx::int32}},
      {floats, {mx::bool_}},
      {mx::transpose(mx::reshape(big, {200, 200})), {mx::float32}},
  };
  for (const auto& [x, targets] : cases) {
    for (mx::Dtype to : targets) {
      const mx::array got = convert(x, to, mx::Device::cpu);
      EXPECT_EQ(std::string(got.primitive().name()), "transmuter::Convert");
      EXPECT_EQ(got.dtype(), to);
      EXPECT_TRUE(mx::array_equal(got, mx::astype(x, to)).item<bool>()) << x.dtype() << " -> " << to;
    }
  }
  // Two conversions of one array to different types stay two (MLX merges equivalent primitives).
  const mx::array a = convert(big, mx::float32, mx::Device::cpu),
                  b = convert(big, mx::bool_, mx::Device::cpu);
  EXPECT_FALSE(a.primitive().is_equivalent(b.primitive()));
  const mx::array half = convert(mx::astype(big, mx::float16), mx::float32, mx::Device::cpu);
  EXPECT_EQ(std::string(half.primitive().name()), "AsType");  // not the kernel's
  EXPECT_FALSE(convert_fits(floats, mx::int64));              // float to integer: MLX's
}

mx::array mlx_compare(CompareOp op, const mx::array& a, const mx::array& b) {
  switch (op) {
    case CompareOp::kEqual:
      return mx::equal(a, b);
    case CompareOp::kLess:
      return mx::less(a, b);
    case CompareOp::kLessEqual:
      return mx::less_equal(a, b);
    case CompareOp::kGreater:
      return mx::greater(a, b);
    case CompareOp::kGreaterEqual:
      return mx::greater_equal(a, b);
    case CompareOp::kAnd:
      return mx::logical_and(a, b);
    case CompareOp::kOr:
      return mx::logical_or(a, b);
  }
  return a;
}

// Comparisons of float32 (NaN, infinities, signed zeros, ties), int64, int32 and bool operands, and logic
// of bools, over broadcast layouts, against MLX's ops.
TEST(CompareKernel, EqualsMlx) {
  const std::vector<std::pair<mx::Shape, mx::Shape>> layouts = {{{16, 384}, {16, 384}},
                                                                {{16, 384}, {}},
                                                                {{2, 1, 1, 16}, {2, 7, 1, 16}},
                                                                {{1, 1, 1, 9}, {1, 1, 9, 1}},
                                                                {{3, 50000}, {3, 1}}};
  const CompareOp comparisons[] = {CompareOp::kEqual, CompareOp::kLess, CompareOp::kLessEqual,
                                   CompareOp::kGreater, CompareOp::kGreaterEqual};
  uint64_t seed = 70;
  for (const auto& [sa, sb] : layouts) {
    const mx::array fa = awkward(sa, seed++), fb = awkward(sb, seed++);
    const mx::array pa = mx::greater(fa, mx::array(0.0f)), pb = mx::less(fb, mx::array(1.0f));
    const std::vector<std::pair<mx::array, mx::array>> operands = {
        {fa, fb},
        {mx::astype(fa, mx::int64), mx::astype(fb, mx::int64)},
        {mx::astype(fa, mx::int32), mx::astype(fb, mx::int32)},
        {pa, pb}};
    for (const auto& [a, b] : operands) {
      for (CompareOp op : comparisons) {
        const mx::array got = compare(op, a, b, mx::Device::cpu);
        EXPECT_EQ(std::string(got.primitive().name()).rfind("transmuter::", 0), 0u);
        EXPECT_TRUE(mx::array_equal(got, mlx_compare(op, a, b)).item<bool>())
            << static_cast<int>(op) << " " << a.dtype();
      }
    }
    for (CompareOp op : {CompareOp::kAnd, CompareOp::kOr}) {
      const mx::array got = compare(op, pa, pb, mx::Device::cpu);
      EXPECT_TRUE(mx::array_equal(got, mlx_compare(op, pa, pb)).item<bool>()) << static_cast<int>(op);
    }
  }
  EXPECT_FALSE(compare_fits(CompareOp::kAnd, mx::zeros({3}), mx::zeros({3})));              // logic of floats
  EXPECT_FALSE(compare_fits(CompareOp::kLess, mx::zeros({3}), mx::zeros({3}, mx::int32)));  // mixed types
}

// Where over an attention mask's layout (a row of keys against the scores), values of each width.
TEST(SelectKernel, EqualsWhere) {
  const mx::array scores = awkward({2, 4, 9, 9}, 80);
  const mx::array keep = mx::greater(awkward({2, 1, 1, 9}, 81), mx::array(0.0f));
  const mx::array fill(-std::numeric_limits<float>::infinity());
  const std::vector<std::pair<mx::array, mx::array>> values = {
      {scores, fill},
      {fill, scores},
      {mx::astype(scores, mx::int64), mx::array(int64_t{-7})},
      {mx::astype(scores, mx::int32), mx::astype(scores, mx::int32)},
      {mx::greater(scores, mx::array(1.0f)), mx::array(true)}};
  for (const auto& [a, b] : values) {
    const mx::array got = select(keep, a, b, mx::Device::cpu);
    EXPECT_EQ(std::string(got.primitive().name()), "transmuter::Select");
    EXPECT_TRUE(mx::array_equal(got, mx::where(keep, a, b), /*equal_nan=*/true).item<bool>()) << a.dtype();
  }
  const mx::array big = awkward({3, 40000}, 82);
  const mx::array rows = mx::greater(awkward({3, 1}, 83), mx::array(0.0f));
  EXPECT_TRUE(mx::array_equal(select(rows, big, mx::array(0.0f), mx::Device::cpu),
                              mx::where(rows, big, mx::array(0.0f)), true)
                  .item<bool>());
  // Gradients with respect to the values: mx::where's.
  const mx::array x = awkward({4, 9}, 84);
  auto loss = [&](bool kernel) {
    return [&, kernel](const mx::array& v) {
      const mx::array keep_x = mx::greater(x, mx::array(0.0f));
      const mx::array y = kernel ? select(keep_x, v, mx::array(2.0f), mx::Device::cpu)
                                 : mx::where(keep_x, v, mx::array(2.0f));
      return mx::sum(mx::multiply(y, y));
    };
  };
  const mx::array v = mx::random::normal({4, 9}, mx::float32, mx::random::key(85));
  EXPECT_TRUE(mx::allclose(mx::grad(loss(true))(v), mx::grad(loss(false))(v)).item<bool>());
  EXPECT_FALSE(select_fits(mx::zeros({3}), scores, scores));  // a float condition
}

}  // namespace
}  // namespace transmuter::kernels
