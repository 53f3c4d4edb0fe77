// Float8, float4 and sub-byte integer values are held widened; their Value
// carries the ONNX element type through ops, compiled segments and graph
// breaks (issue 6, "exact dtypes").
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/transmuter.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::to_doubles;
using testing::to_ints;

TEST(Value, RemembersANarrowElementType) {
  Value int4(mx::array({-8, 7}, mx::int8), OnnxType::kInt4);
  EXPECT_TRUE(int4.is_widened());
  EXPECT_EQ(int4.element_type(), OnnxType::kInt4);
  EXPECT_EQ(int4.describe(), "tensor int4 (as int8)[2]");
  Value plain(mx::array({1.0f}), OnnxType::kFloat);
  EXPECT_FALSE(plain.is_widened());
  EXPECT_EQ(plain.element_type(), OnnxType::kFloat);
  EXPECT_EQ(Value(mx::array({1.0f})).element_type(), OnnxType::kFloat);
  // float8 is held as float32, never as int8.
  EXPECT_THROW(Value(mx::array({1}, mx::int8), OnnxType::kFloat8E4M3FN), Error);
  EXPECT_THROW(Value(mx::array({1.0f}), OnnxType::kInt32), Error);
}

// q = Cast(x -> float8e4m3fn); NonZero(x) is a graph break when compiled, so
// q crosses from one compiled segment into the next; r = Reshape(q);
// z = QuantizeLinear(x, 1, zero point w) with w declared int4; c = CastLike(x, w).
Model narrow_model() {
  Attribute to_f8 = int_attr("to", static_cast<int64_t>(OnnxType::kFloat8E4M3FN));
  return GraphBuilder(21)
      .input("x", OnnxType::kFloat, {4})
      .input("w", OnnxType::kInt4, {})
      .initializer("one", mx::array(1.0f))
      .initializer("shape", mx::array({2, 2}, {2}, mx::int64))
      .node("Cast", {"x"}, {"q"}, {to_f8})
      .node("NonZero", {"x"}, {"nz"})
      .node("Reshape", {"q", "shape"}, {"r"})
      .node("QuantizeLinear", {"x", "one", "w"}, {"z"})
      .node("CastLike", {"x", "w"}, {"c"})
      .output("r")
      .output("z")
      .output("c")
      .output("nz")
      .build();
}

void expect_narrow_outputs(const Outputs& out) {
  EXPECT_EQ(out.at("r").element_type(), OnnxType::kFloat8E4M3FN);
  EXPECT_EQ(to_doubles(out.tensor("r")), (std::vector<double>{0.3125, 448, -16, 9}));
  EXPECT_EQ(out.at("z").element_type(), OnnxType::kInt4);
  EXPECT_EQ(to_ints(out.tensor("z")), (std::vector<int64_t>{1, 7, -8, 7}));  // saturated to int4
  EXPECT_EQ(out.at("c").element_type(), OnnxType::kInt4);
  EXPECT_EQ(to_ints(out.tensor("c")), (std::vector<int64_t>{0, -8, -1, -7}));  // wrapped to int4
}

TEST(ElementTypes, CarriedThroughOpsEagerAndCompiled) {
  Model model = narrow_model();
  Inputs inputs = {{"x", mx::array({0.3f, 1000.0f, -17.0f, 9.0f})}, {"w", mx::array(1, mx::int8)}};
  expect_narrow_outputs(run(model, model.params(), inputs, {mx::Device::cpu}));
  CompiledModel compiled = compile(model, {}, {{}, 8, mx::Device::cpu});
  EXPECT_EQ(compiled.stats().graph_breaks, 1u);  // q crosses from one segment into the next
  expect_narrow_outputs(compiled(inputs));
  expect_narrow_outputs(compiled(inputs));  // the cached plan
}

TEST(ElementTypes, InputsOfAnotherNarrowTypeAreRefused) {
  Model model = narrow_model();
  Inputs inputs = {{"x", mx::zeros({4})}, {"w", Value(mx::array(1, mx::uint8), OnnxType::kUint4)}};
  EXPECT_THROW(run(model, model.params(), inputs, {mx::Device::cpu}), InputError);
  inputs["w"] = Value(mx::array(1, mx::int8), OnnxType::kInt2);
  EXPECT_THROW(run(model, model.params(), inputs, {mx::Device::cpu}), InputError);
}

}  // namespace
}  // namespace transmuter
