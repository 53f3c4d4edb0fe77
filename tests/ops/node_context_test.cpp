#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "ops/node_context.h"
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

}  // namespace
}  // namespace transmuter
