// The axis-0 gather kernel against rows picked here one by one: int32 and int64 indices of rank 0 to 2 (a
// transposed view among them), negative ones, ones past either end (clamped, as Gather's traced path does),
// tables of rank 1 to 3 in float32, uint8 and float16, counts that span several tasks; the data's gradient
// against its MLX reference (mx::take's); mx::compile; the cases it hands to the reference.
#include "kernels/cpu/take_rows.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace transmuter::kernels {
namespace {

// The reference the operator gives the kernel: mx::take of the clamped, wrapped indices.
Reference take_reference(int rows) {
  return [rows](const std::vector<mx::array>& in) {
    mx::array i =
        mx::clip(mx::astype(in[1], mx::int64), mx::array(-int64_t{rows}), mx::array(int64_t{rows} - 1));
    i = mx::where(mx::less(i, mx::array(int64_t{0})), mx::add(i, mx::array(int64_t{rows})), i);
    return std::vector<mx::array>{mx::take(in[0], i, 0)};
  };
}

// out's bytes as the rows of `table` picked by `indices` (clamped into [-rows, rows - 1], then wrapped).
void expect_rows(const mx::array& table, const mx::array& indices, const mx::array& out) {
  mx::array dense_table = mx::contiguous(table);
  mx::array wide = mx::astype(mx::contiguous(indices), mx::int64);
  mx::eval(dense_table, wide, out);
  const int64_t rows = table.shape(0);
  const auto row_bytes = static_cast<int64_t>(table.nbytes()) / rows;
  ASSERT_EQ(out.nbytes(), static_cast<size_t>(wide.size() * row_bytes));
  for (size_t i = 0; i < wide.size(); ++i) {
    int64_t row = std::clamp<int64_t>(wide.data<int64_t>()[i], -rows, rows - 1);
    if (row < 0) row += rows;
    ASSERT_EQ(std::memcmp(out.data<char>() + i * row_bytes, dense_table.data<char>() + row * row_bytes,
                          static_cast<size_t>(row_bytes)),
              0)
        << "index " << i << " (" << wide.data<int64_t>()[i] << ")";
  }
}

TEST(TakeRowsKernel, PicksTheClampedWrappedRows) {
  const std::vector<mx::Shape> tables = {{50}, {50, 384}, {7, 3, 5}};
  for (const mx::Shape& shape : tables) {
    for (mx::Dtype type : {mx::float32, mx::uint8, mx::float16}) {
      const mx::array table =
          mx::astype(mx::random::uniform(-100.0f, 100.0f, shape, mx::float32, mx::random::key(1)), type);
      const int rows = shape[0];
      for (mx::Dtype index_type : {mx::int32, mx::int64}) {
        const std::vector<mx::array> index_sets = {
            mx::array(3, index_type),  // rank 0
            mx::astype(mx::array({0, 1, -1, -rows, rows - 1, rows, rows + 9, -rows - 4}),
                       index_type),  // ends
            mx::astype(mx::random::randint(-rows, rows, {4, 600}, mx::int32, mx::random::key(2)), index_type),
            mx::transpose(mx::astype(mx::random::randint(0, rows, {5, 3}, mx::int32, mx::random::key(3)),
                                     index_type)),  // a view
        };
        for (const mx::array& indices : index_sets) {
          bool reference_ran = false;
          Reference reference = [&](const std::vector<mx::array>& in) {
            reference_ran = true;
            return take_reference(rows)(in);
          };
          mx::array out = take_rows(table, indices, reference, mx::Device::cpu);
          mx::Shape want_shape = indices.shape();
          want_shape.insert(want_shape.end(), shape.begin() + 1, shape.end());
          ASSERT_EQ(out.shape(), want_shape);
          ASSERT_EQ(out.dtype(), type);
          expect_rows(table, indices, out);
          EXPECT_FALSE(reference_ran);
        }
      }
    }
  }
}

// The data's gradient is the reference's (a scatter-add of the cotangent rows), a repeated row summed.
// Other axes: a pooler's first token ([B, S, H], axis 1, a scalar index), a middle axis with a matrix of
// indices, the last axis; clamped and wrapped like axis 0.
TEST(TakeRowsKernel, PicksAlongAnyAxis) {
  const mx::array data = mx::random::uniform(-9.0f, 9.0f, {3, 5, 4, 6}, mx::float32, mx::random::key(40));
  const std::vector<std::pair<int, mx::array>> cases = {
      {1, mx::array(int64_t{0})},
      {1, mx::array({4, -1, 2, 7, -9, 0}, {2, 3}, mx::int64)},
      {2, mx::array({3, 0}, {2}, mx::int32)},
      {3, mx::array({5, -6, 6}, {3}, mx::int64)},
  };
  for (const auto& [axis, indices] : cases) {
    const int size = data.shape(axis);
    const Reference reference = [size, axis](const std::vector<mx::array>& in) {
      mx::array i =
          mx::clip(mx::astype(in[1], mx::int64), mx::array(-int64_t{size}), mx::array(int64_t{size} - 1));
      i = mx::where(mx::less(i, mx::array(int64_t{0})), mx::add(i, mx::array(int64_t{size})), i);
      return std::vector<mx::array>{mx::take(in[0], i, axis)};
    };
    const mx::array got = take_rows(data, indices, reference, mx::Device::cpu, axis);
    EXPECT_EQ(std::string(got.primitive().name()), "transmuter::TakeRows");
    const mx::array want = reference({data, indices})[0];
    ASSERT_EQ(got.shape(), want.shape()) << "axis " << axis;
    EXPECT_TRUE(mx::array_equal(got, want).item<bool>()) << "axis " << axis;
  }
}

TEST(TakeRowsKernel, GradientIsTheReferences) {
  const mx::array table = mx::random::normal({6, 4}, mx::float32, 0.0f, 1.0f, mx::random::key(4));
  const mx::array indices = mx::array({1, 1, -1, 9});
  auto loss_of = [&](bool kernel) {
    return [kernel, indices](const std::vector<mx::array>& in) {
      mx::array picked = kernel ? take_rows(in[0], indices, take_reference(6), mx::Device::cpu)
                                : take_reference(6)({in[0], indices})[0];
      return std::vector<mx::array>{mx::sum(mx::multiply(picked, mx::reshape(mx::arange(16.0f), {4, 4})))};
    };
  };
  auto [_, got] = mx::vjp(loss_of(true), {table}, {mx::array(1.0f)});
  auto [__, want] = mx::vjp(loss_of(false), {table}, {mx::array(1.0f)});
  EXPECT_TRUE(mx::array_equal(got[0], want[0]).item<bool>());
  EXPECT_GT(mx::max(mx::abs(got[0])).item<float>(), 0.0f);
}

TEST(TakeRowsKernel, CompiledEqualsEager) {
  const mx::array table = mx::random::normal({30, 8}, mx::float32, 0.0f, 1.0f, mx::random::key(5));
  auto f = [](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{take_rows(in[0], in[1], take_reference(30), mx::Device::cpu)};
  };
  const mx::array indices = mx::array({2, -3, 29, 0}, {2, 2});
  mx::array eager = f({table, indices})[0];
  mx::array compiled = mx::compile(f)({table, indices})[0];
  EXPECT_TRUE(mx::array_equal(eager, compiled).item<bool>());
}

// Float indices, an empty first axis and no indices at all are the reference's.
TEST(TakeRowsKernel, OtherCasesRunTheReference) {
  int calls = 0;
  Reference reference = [&](const std::vector<mx::array>& in) {
    ++calls;
    return std::vector<mx::array>{in[0]};
  };
  take_rows(mx::zeros({4, 2}), mx::array({1.0f}), reference, mx::Device::cpu);
  take_rows(mx::zeros({0, 2}), mx::array({0}), reference, mx::Device::cpu);
  take_rows(mx::zeros({4, 2}), mx::zeros({0}, mx::int32), reference, mx::Device::cpu);
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace transmuter::kernels
