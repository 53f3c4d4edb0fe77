// fuse_rotary_embedding: transformers' apply_rotary_pos_emb as exported (rotate_half's Slice bounds
// computed from the input's shape) becomes one ai.transmuter RotateHalfRotary node with the unfused
// graph's values, eagerly and compiled; Slices that are not the two halves keep their meaning (the
// op reads the graph's rotate_half then); near misses stay as they are.
#include <gtest/gtest.h>

#include <limits>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::max_abs_diff;
using testing::random_array;

constexpr const char* kFused = "ai.transmuter.RotateHalfRotary";
constexpr int kBatch = 2, kHeads = 3, kSeq = 5, kDim = 8;

Value ints(std::vector<int64_t> v) { return Value(mx::array(v.begin(), {static_cast<int>(v.size())}, mx::int64)); }

struct Variant {
  int64_t divisor = 2;          // the split point is D / divisor (2: rotate_half)
  bool swap_operands = false;   // Add(rotated product, plain product), Mul(cos, x), Mul(sin, rotated)
  int64_t concat_axis = -1;
  bool plain_product_is_output = false;  // x * cos also a graph output (the Mul must stay)
};

// x [B, H, S, D]; cos, sin [B, S, D] unsqueezed at axis 1; the split from Shape(x)[3] / divisor.
GraphBuilder rotary_graph(const Variant& v) {
  GraphBuilder b(17);
  b.input("x", OnnxType::kFloat, {kBatch, kHeads, kSeq, kDim})
      .input("cos", OnnxType::kFloat, {kBatch, kSeq, kDim})
      .input("sin", OnnxType::kFloat, {kBatch, kSeq, kDim})
      .node("Constant", {}, {"one"}, {testing::tensor_attr("value", ints({1}))})
      .node("Constant", {}, {"zero_axis"}, {testing::tensor_attr("value", ints({0}))})
      .node("Constant", {}, {"zero"}, {testing::tensor_attr("value", ints({0}))})
      .node("Constant", {}, {"last"}, {testing::tensor_attr("value", ints({3}))})
      .node("Constant", {}, {"big"}, {testing::tensor_attr("value", ints({std::numeric_limits<int64_t>::max()}))})
      .node("Constant", {}, {"d_index"}, {testing::tensor_attr("value", Value(mx::array(int64_t{3})))})
      .node("Constant", {}, {"divisor"}, {testing::tensor_attr("value", Value(mx::array(v.divisor)))})
      .node("Unsqueeze", {"cos", "one"}, {"cos_u"})
      .node("Unsqueeze", {"sin", "one"}, {"sin_u"})
      .node("Shape", {"x"}, {"shape"})
      .node("Gather", {"shape", "d_index"}, {"d"}, {testing::int_attr("axis", 0)})
      .node("Div", {"d", "divisor"}, {"split"})
      .node("Unsqueeze", {"split", "zero_axis"}, {"split_1d"})
      .node("Slice", {"x", "zero", "split_1d", "last", "one"}, {"x1"})
      .node("Slice", {"x", "split_1d", "big", "last", "one"}, {"x2"})
      .node("Neg", {"x2"}, {"neg_x2"})
      .node("Concat", {"neg_x2", "x1"}, {"rotated"}, {testing::int_attr("axis", v.concat_axis)});
  if (v.swap_operands) {
    b.node("Mul", {"cos_u", "x"}, {"plain"}).node("Mul", {"sin_u", "rotated"}, {"turned"}).node("Add", {"turned", "plain"}, {"y"});
  } else {
    b.node("Mul", {"x", "cos_u"}, {"plain"}).node("Mul", {"rotated", "sin_u"}, {"turned"}).node("Add", {"plain", "turned"}, {"y"});
  }
  b.output("y");
  if (v.plain_product_is_output) b.output("plain");
  return b;
}

Inputs inputs() {
  return {{"x", Value(random_array({kBatch, kHeads, kSeq, kDim}, 1))},
          {"cos", Value(random_array({kBatch, kSeq, kDim}, 2))},
          {"sin", Value(random_array({kBatch, kSeq, kDim}, 3))}};
}

TEST(FuseRotaryEmbedding, FusesTransformersRotateHalfAndKeepsResults) {
  for (const Variant& v : {Variant{}, Variant{.swap_operands = true}, Variant{.divisor = 4},
                           Variant{.plain_product_is_output = true}}) {
    Model fused = rotary_graph(v).build();
    Model plain = rotary_graph(v).build({.run_passes = false});
    EXPECT_EQ(fused.passes_applied(), std::vector<std::string>{"fuse_rotary_embedding"});
    EXPECT_EQ(fused.op_histogram().at(kFused), 1u);
    EXPECT_EQ(fused.op_histogram().count("Add"), 0u);
    // Both Muls go, unless the plain product is also an output.
    EXPECT_EQ(fused.op_histogram().count("Mul") ? fused.op_histogram().at("Mul") : 0u,
              v.plain_product_is_output ? 1u : 0u);
    const Inputs in = inputs();
    mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
    mx::array eager = run(fused, fused.params(), in, {mx::Device::cpu}).tensor("y");
    CompiledModel compiled = compile(fused, in, {.device = mx::Device::cpu});
    mx::array traced = compiled(in).tensor("y");
    // The kernel rounds as the composition does; a split other than the halves reads the graph's Concat.
    EXPECT_EQ(max_abs_diff(eager, want), 0.0f) << "divisor " << v.divisor;
    EXPECT_EQ(max_abs_diff(traced, want), 0.0f) << "divisor " << v.divisor;
    EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);
  }
}

TEST(FuseRotaryEmbedding, LeavesNearMisses) {
  // A Concat along another axis is no rotate_half.
  Model model = rotary_graph(Variant{.concat_axis = 2}).build();
  EXPECT_EQ(model.op_histogram().count(kFused), 0u);
  EXPECT_EQ(model.op_histogram().at("Add"), 1u);
}

}  // namespace
}  // namespace transmuter
