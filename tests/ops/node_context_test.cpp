#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "support/expect_error.h"
#include "support/op_test_support.h"

namespace transmuter {
namespace {

Node make_node(std::vector<Attribute> attributes) {
  Node node;
  node.name = "n1";
  node.op_type = "Fake";
  node.opset = 17;
  node.inputs = {"a", "", "c"};
  node.outputs = {"y"};
  node.attributes = std::move(attributes);
  return node;
}

TEST(NodeContext, InputsAndOmittedOptionals) {
  Node node = make_node({});
  Value a = mx::array({1, 2, 3}, mx::int64), c = Value();
  NodeContext ctx(node, {&a, nullptr, &c}, mx::Device::cpu, nullptr);
  EXPECT_TRUE(ctx.has_input(0));
  EXPECT_FALSE(ctx.has_input(1));
  EXPECT_FALSE(ctx.has_input(2));  // an empty optional counts as absent
  EXPECT_FALSE(ctx.optional_input(1).has_value());
  EXPECT_EQ(ctx.host_ints(0), (std::vector<int64_t>{1, 2, 3}));
  try {
    ctx.input(1);
    FAIL();
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[Fake v17] node 'n1': input 1 is required but missing");
  }
}

TEST(NodeContext, AttributesWithDefaultsAndTypeChecks) {
  Node node = make_node({testing::int_attr("axis", -1), testing::floats_attr("scales", {1.5f, 2.f})});
  NodeContext ctx(node, {}, mx::Device::cpu, nullptr);
  EXPECT_EQ(ctx.attr_int("axis", 0), -1);
  EXPECT_EQ(ctx.attr_int("missing", 7), 7);
  EXPECT_EQ(ctx.attr_floats("scales"), (std::vector<float>{1.5f, 2.f}));
  EXPECT_THROW(ctx.attr_float("axis", 0.f), OpError);  // INT read as FLOAT
  EXPECT_THROW(ctx.required_int("missing"), OpError);
}

TEST(NodeContext, NormalizesAxes) {
  Node node = make_node({});
  NodeContext ctx(node, {}, mx::Device::cpu, nullptr);
  EXPECT_EQ(ctx.normalize_axis(-1, 4), 3);
  EXPECT_EQ(ctx.normalize_axis(2, 4), 2);
  EXPECT_THROW(ctx.normalize_axis(4, 4), OpError);
  EXPECT_THROW(ctx.normalize_axis(-5, 4), OpError);
}

TEST(NodeContext, HostValuesOfTracersAreRefused) {
  Node node = make_node({});
  auto traced = [&](const std::vector<mx::array>& args) {
    Value a = args[0];
    NodeContext ctx(node, {&a}, mx::Device::cpu, nullptr);
    EXPECT_THROW(ctx.host_ints(0), OpError);
    return args;
  };
  mx::compile(traced)({mx::array({1, 2})});
}

TEST(NodeContext, ToShapeRejectsNegativeAndHugeDims) {
  Node node = make_node({});
  NodeContext ctx(node, {}, mx::Device::cpu, nullptr);
  EXPECT_EQ(to_shape(ctx, {2, 3}), (mx::Shape{2, 3}));
  EXPECT_THROW(to_shape(ctx, {-1}), OpError);
  EXPECT_THROW(to_shape(ctx, {int64_t{1} << 40}), OpError);
}

TEST(NodeContext, CheckedShapeArithmeticThrowsInsteadOfWrapping) {
  Node node = make_node({});
  NodeContext ctx(node, {}, mx::Device::cpu, nullptr);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(to_int32(ctx, -5, "pad"), -5);
  EXPECT_EQ(testing::error_of<OpError>([&] { to_int32(ctx, int64_t{1} << 31, "pad"); }),
            "[Fake v17] node 'n1': pad 2147483648 does not fit in int32");
  EXPECT_EQ(checked_add(ctx, kMax - 1, 1, "sum"), kMax);
  EXPECT_EQ(testing::error_of<OpError>([&] { checked_add(ctx, kMax, 1, "sum"); }),
            "[Fake v17] node 'n1': sum 9223372036854775807 + 1 overflows int64");
  EXPECT_EQ(checked_mul(ctx, int64_t{1} << 31, int64_t{1} << 31, "size"), int64_t{1} << 62);
  EXPECT_THROW(checked_mul(ctx, int64_t{1} << 32, int64_t{1} << 31, "size"), OpError);
  EXPECT_EQ(checked_product(ctx, {}, "size"), 1);
  EXPECT_THROW(checked_product(ctx, {65536, 65536, 65536, 65536}, "size"), OpError);
}

TEST(NodeContext, ToShapeChecksDimsRankAndElementCount) {
  Node node = make_node({});
  NodeContext ctx(node, {}, mx::Device::cpu, nullptr);
  EXPECT_EQ(to_shape(ctx, {2, 0, 3}), (mx::Shape{2, 0, 3}));
  EXPECT_EQ(to_shape(ctx, std::vector<int64_t>(kMaxRank, 1)).size(), kMaxRank);
  EXPECT_THROW(to_shape(ctx, std::vector<int64_t>(kMaxRank + 1, 1)), OpError);
  EXPECT_THROW(to_shape(ctx, {int64_t{1} << 31}), OpError);
  EXPECT_THROW(to_shape(ctx, {-1}), OpError);
  // Each dim fits int32, but the element count wraps to 0 in 64 bits.
  EXPECT_THROW(to_shape(ctx, {65536, 65536, 65536, 65536}), OpError);
  // 2^60 elements of 8 bytes is 2^63 bytes: one past int64.
  EXPECT_THROW(to_shape(ctx, {1 << 30, 1 << 30, 1}), OpError);
  EXPECT_EQ(to_shape(ctx, {1 << 30, 1 << 29}).size(), 2u);
}

}  // namespace
}  // namespace transmuter
