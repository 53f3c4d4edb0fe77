// The concatenation kernel against mx::concatenate, byte for byte: every axis of rank-1 to rank-4 parts,
// elements of 1, 2, 4 and 8 bytes, two to four parts, an empty part, a transposed view, enough bytes for
// several tasks; gradients (mx::concatenate's); the cases handed to MLX.
#include "kernels/cpu/concatenate.h"

#include <gtest/gtest.h>
#include <mlx/primitives.h>

#include <string>
#include <vector>

namespace transmuter::kernels {
namespace {

mx::array part(mx::Shape shape, mx::Dtype dtype, uint64_t seed) {
  return mx::astype(mx::random::uniform(-100.0f, 100.0f, shape, mx::float32, mx::random::key(seed)), dtype);
}

TEST(ConcatenateKernel, EqualsMlxOnEveryAxis) {
  uint64_t seed = 1;
  for (mx::Dtype dtype : {mx::uint8, mx::float16, mx::float32, mx::int64}) {
    for (const mx::Shape& base : {mx::Shape{7}, mx::Shape{3, 5}, mx::Shape{2, 3, 4}, mx::Shape{2, 3, 4, 5}}) {
      for (int axis = 0; axis < static_cast<int>(base.size()); ++axis) {
        std::vector<mx::array> parts;
        for (int extent : {1, 3, 0, 2}) {  // an empty part among them
          mx::Shape shape = base;
          shape[axis] = extent;
          parts.push_back(part(shape, dtype, seed++));
        }
        const mx::array got = kernels::concatenate(parts, axis, mx::Device::cpu);
        EXPECT_EQ(std::string(got.primitive().name()), "transmuter::Concatenate");
        EXPECT_TRUE(mx::array_equal(got, mx::concatenate(parts, axis)).item<bool>())
            << dtype << " rank " << base.size() << " axis " << axis;
      }
    }
  }
  // A class token before a ViT's patches (a broadcast view), and parts of several tasks' bytes.
  const mx::array token = mx::broadcast_to(part({1, 1, 768}, mx::float32, 90), {8, 1, 768});
  const mx::array patches = part({8, 196, 768}, mx::float32, 91);
  EXPECT_TRUE(mx::array_equal(kernels::concatenate({token, patches}, 1, mx::Device::cpu),
                              mx::concatenate({token, patches}, 1))
                  .item<bool>());
  const mx::array t = mx::transpose(part({64, 48}, mx::float32, 92));
  EXPECT_TRUE(mx::array_equal(kernels::concatenate({t, t}, 0, mx::Device::cpu), mx::concatenate({t, t}, 0))
                  .item<bool>());
}

TEST(ConcatenateKernel, GradientsAreMlxs) {
  const mx::array a = part({2, 3}, mx::float32, 100), b = part({2, 5}, mx::float32, 101);
  auto loss = [](bool kernel) {
    return [kernel](const std::vector<mx::array>& in) {
      const mx::array y = kernel ? kernels::concatenate(in, 1, mx::Device::cpu) : mx::concatenate(in, 1);
      return mx::sum(mx::multiply(y, y));
    };
  };
  const std::vector<mx::array> got = mx::grad(loss(true), std::vector<int>{0, 1})({a, b});
  const std::vector<mx::array> want = mx::grad(loss(false), std::vector<int>{0, 1})({a, b});
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(mx::allclose(got[i], want[i]).item<bool>()) << i;
}

TEST(ConcatenateKernel, OtherCasesAreMlxs) {
  const mx::array a = part({2, 3}, mx::float32, 110);
  EXPECT_FALSE(concatenate_fits({a}, 0));                                     // one part
  EXPECT_FALSE(concatenate_fits({a, part({2, 3}, mx::int32, 111)}, 0));       // types differ
  EXPECT_FALSE(concatenate_fits({a, part({3, 3}, mx::float32, 112)}, 1));     // other axes differ
  EXPECT_FALSE(concatenate_fits({a, part({2, 3, 1}, mx::float32, 113)}, 0));  // ranks differ
  EXPECT_THROW(kernels::concatenate({a, part({3, 3}, mx::float32, 114)}, 1, mx::Device::cpu), std::exception);
}

}  // namespace
}  // namespace transmuter::kernels
