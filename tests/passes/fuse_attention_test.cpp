// fuse_attention: the BERT attention subgraph becomes one
// ai.transmuter.ScaledDotProductAttention node with the same outputs, and
// near misses stay as they are.
#include <gtest/gtest.h>

#include <cmath>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;

constexpr const char* kFused = "ai.transmuter.ScaledDotProductAttention";
constexpr int kBatch = 2, kHeads = 3, kSeq = 10, kDim = 8;

mx::array normal(mx::Shape shape, uint64_t seed) {
  return mx::random::normal(shape, mx::float32, 0, 1, mx::random::key(seed));
}

struct Variant {
  bool position_bias = false;  // T5: Add(Add(scaled, bias [1, H, S, S]), mask)
  int softmax_axis = -1;
  bool scale_is_input = false;  // a Div by a graph input, not a constant
  bool scores_are_output = false;
  bool mul_scale = false;       // Mul(c, scores) instead of Div(scores, c)
  bool mask_first = false;      // Add(mask, scaled)
  int casts_after_softmax = 0;  // transformers' softmax(dtype=float32).to(dtype): Cast(to) nodes
  int64_t cast_to = 1;          // float (an identity here); 10 (float16) is not
};

// As PyTorch exports BERT self-attention: q [B, H, S, D]; k' [B, S, H, D]
// transposed to [B, H, D, S]; Div by sqrt(D); Add of a [B, 1, 1, S] mask;
// Softmax; MatMul with v [B, H, S, D].
GraphBuilder attention_graph(const Variant& v) {
  GraphBuilder b(17);
  b.input("q", OnnxType::kFloat, {kBatch, kHeads, kSeq, kDim})
      .input("k", OnnxType::kFloat, {kBatch, kSeq, kHeads, kDim})
      .input("v", OnnxType::kFloat, {kBatch, kHeads, kSeq, kDim})
      .input("mask", OnnxType::kFloat, {kBatch, 1, 1, kSeq})
      .node("Transpose", {"k"}, {"kt"}, {testing::ints_attr("perm", {0, 2, 3, 1})})
      .node("MatMul", {"q", "kt"}, {"scores"});
  if (v.scale_is_input) {
    b.input("c", OnnxType::kFloat, {});
  } else {
    const float c = v.mul_scale ? 1.0f / std::sqrt(float{kDim}) : std::sqrt(float{kDim});
    b.node("Constant", {}, {"c"}, {testing::tensor_attr("value", Value(mx::array(c)))});
  }
  if (v.mul_scale) {
    b.node("Mul", {"c", "scores"}, {"scaled"});
  } else {
    b.node("Div", {"scores", "c"}, {"scaled"});
  }
  std::string scaled = "scaled";
  if (v.position_bias) {
    b.initializer("bias", normal({1, kHeads, kSeq, kSeq}, 4));
    b.node("Add",
           v.mask_first ? std::vector<std::string>{"bias", "scaled"}
                        : std::vector<std::string>{"scaled", "bias"},
           {"biased"});
    scaled = "biased";
  }
  b.node("Add",
         v.mask_first ? std::vector<std::string>{"mask", scaled} : std::vector<std::string>{scaled, "mask"},
         {"masked"})
      .node("Softmax", {"masked"}, {"probs"}, {testing::int_attr("axis", v.softmax_axis)});
  std::string probs = "probs";
  for (int i = 0; i < v.casts_after_softmax; ++i) {
    b.node("Cast", {probs}, {probs + "_cast"}, {testing::int_attr("to", v.cast_to)});
    probs += "_cast";
  }
  if (v.cast_to != 1) {  // back to float for the MatMul with v, so the graph stays valid
    b.node("Cast", {probs}, {probs + "_float"}, {testing::int_attr("to", 1)});
    probs += "_float";
  }
  b.node("MatMul", {probs, "v"}, {"y"}).output("y");
  if (v.scores_are_output) b.output("scores");
  return b;
}

Inputs inputs(bool with_scale) {
  // A padding mask as BERT builds it: 0 for tokens, a large negative for padding.
  mx::array keep =
      mx::reshape(mx::array({1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}), {2, 1, 1, 10});
  mx::array mask =
      mx::multiply(mx::subtract(mx::array(1.0f), mx::astype(keep, mx::float32)), mx::array(-3.4e38f));
  Inputs in = {{"q", Value(normal({kBatch, kHeads, kSeq, kDim}, 1))},
               {"k", Value(normal({kBatch, kSeq, kHeads, kDim}, 2))},
               {"v", Value(normal({kBatch, kHeads, kSeq, kDim}, 3))},
               {"mask", Value(mask)}};
  if (with_scale) in["c"] = Value(mx::array(std::sqrt(float{kDim})));
  return in;
}

mx::array run_y(const Model& model, bool with_scale) {
  return run(model, model.params(), inputs(with_scale), {mx::Device::cpu}).tensor("y");
}

TEST(FuseAttention, FusesTheBertPatternAndKeepsResults) {
  for (const Variant& v : {Variant{}, Variant{.mul_scale = true}, Variant{.mask_first = true},
                           Variant{.mul_scale = true, .casts_after_softmax = 2}}) {
    Model fused = attention_graph(v).build();
    Model plain = attention_graph(v).build({.run_passes = false});
    EXPECT_EQ(fused.passes_applied(), std::vector<std::string>{"fuse_attention"});
    EXPECT_EQ(fused.op_histogram().at(kFused), 1u);
    for (const char* gone : {"MatMul", "Softmax", "Div", "Mul", "Add", "Constant", "Cast"}) {
      EXPECT_EQ(fused.op_histogram().count(gone), 0u) << gone;
    }
    EXPECT_EQ(fused.op_histogram().at("Transpose"), 1u);  // rewritten in place for K
    mx::array expected = run_y(plain, false);
    mx::array got = run_y(fused, false);
    EXPECT_LT(mx::max(mx::abs(mx::subtract(got, expected))).item<float>(), 1e-5f);
    EXPECT_GT(mx::max(mx::abs(expected)).item<float>(), 0.5f);  // the comparison is not vacuous
  }
}

// T5 adds a position bias, then the mask: the fused node reads their sum, one new Add.
TEST(FuseAttention, FusesAPositionBiasAndAMaskAsOneMask) {
  for (const Variant& v : {Variant{.position_bias = true, .mul_scale = true},
                           Variant{.position_bias = true, .mask_first = true}}) {
    Model fused = attention_graph(v).build();
    Model plain = attention_graph(v).build({.run_passes = false});
    EXPECT_EQ(fused.op_histogram().at(kFused), 1u);
    EXPECT_EQ(fused.op_histogram().at("Add"), 1u);  // bias + mask
    for (const char* gone : {"MatMul", "Softmax", "Div", "Mul"})
      EXPECT_EQ(fused.op_histogram().count(gone), 0u) << gone;
    mx::array expected = run_y(plain, false);
    mx::array got = run_y(fused, false);
    EXPECT_LT(mx::max(mx::abs(mx::subtract(got, expected))).item<float>(), 1e-5f);
    EXPECT_GT(mx::max(mx::abs(expected)).item<float>(), 0.5f);
  }
}

TEST(FuseAttention, LeavesNearMisses) {
  const std::vector<std::pair<Variant, const char*>> misses = {
      {Variant{.softmax_axis = 2}, "softmax over a non-last axis"},
      {Variant{.scale_is_input = true}, "a scale that is not a constant"},
      {Variant{.scores_are_output = true}, "scores also a graph output"},
      {Variant{.casts_after_softmax = 1, .cast_to = 10},
       "a Cast to float16 after the softmax (not an identity)"},
  };
  for (const auto& [v, why] : misses) {
    // The graph's own types: computing in float32 would make the Cast to float16 an identity.
    Model model = attention_graph(v).build({.compute_type = ComputeType::kModel});
    EXPECT_TRUE(model.passes_applied().empty()) << why;
    EXPECT_EQ(model.op_histogram().count(kFused), 0u) << why;
    EXPECT_EQ(model.op_histogram().at("Softmax"), 1u) << why;
  }
}

// A MatMul whose K^T does not come from a Transpose gets one added (4-D Kt
// known from the graph input), with the same results.
TEST(FuseAttention, AddsAKeyTransposeWhenKtIsAnInput) {
  auto build = [](bool passes) {
    GraphBuilder b(17);
    b.input("q", OnnxType::kFloat, {1, 2, 5, 4})
        .input("kt", OnnxType::kFloat, {1, 2, 4, 6})
        .input("v", OnnxType::kFloat, {1, 2, 6, 3})
        .node("MatMul", {"q", "kt"}, {"scores"})
        .node("Softmax", {"scores"}, {"probs"})
        .node("MatMul", {"probs", "v"}, {"y"})
        .output("y");
    return b.build({.run_passes = passes});
  };
  Model fused = build(true), plain = build(false);
  EXPECT_EQ(fused.op_histogram().at(kFused), 1u);
  EXPECT_EQ(fused.op_histogram().at("Transpose"), 1u);
  Inputs in = {{"q", Value(normal({1, 2, 5, 4}, 4))},
               {"kt", Value(normal({1, 2, 4, 6}, 5))},
               {"v", Value(normal({1, 2, 6, 3}, 6))}};
  mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
  mx::array got = run(fused, fused.params(), in, {mx::Device::cpu}).tensor("y");
  EXPECT_LT(mx::max(mx::abs(mx::subtract(got, want))).item<float>(), 1e-5f);
}


// transformers' repeat_kv before the attention of a grouped-query decoder: Kkv, Vkv [B, Hkv, S, D] ->
// Unsqueeze(axes [2]) -> Expand to [B, Hkv, r, S, D] -> Reshape to [B, Hkv * r, S, D]; K transposed by
// [0, 1, 3, 2]. The fused node also reads Kkv and Vkv (inputs 4, 5), so the repeats need not be computed,
// and gives the unfused graph's values, eagerly and compiled. An Unsqueeze on another axis is a different
// head order: the node then gets no grouped inputs.
GraphBuilder grouped_graph(int64_t unsqueeze_axis, bool with_mask) {
  constexpr int kKvHeads = 2, kRepeat = 3;
  GraphBuilder b(17);
  b.input("q", OnnxType::kFloat, {1, kKvHeads * kRepeat, 4, kDim})
      .input("k_kv", OnnxType::kFloat, {1, kKvHeads, kSeq, kDim})
      .input("v_kv", OnnxType::kFloat, {1, kKvHeads, kSeq, kDim})
      .input("mask", OnnxType::kFloat, {1, 1, 1, kSeq})
      .node("Constant", {}, {"axes"}, {testing::tensor_attr("value", Value(mx::array({unsqueeze_axis})))})
      .node("Constant", {}, {"expanded"},
            {testing::tensor_attr("value", Value(unsqueeze_axis == 2
                                                     ? mx::array({1, kKvHeads, kRepeat, kSeq, kDim})
                                                     : mx::array({1, kRepeat, kKvHeads, kSeq, kDim})))})
      .node("Constant", {}, {"merged"},
            {testing::tensor_attr("value", Value(mx::array({1, kKvHeads * kRepeat, kSeq, kDim})))});
  for (const std::string name : {"k", "v"}) {
    b.node("Unsqueeze", {name + "_kv", "axes"}, {name + "_5d"})
        .node("Expand", {name + "_5d", "expanded"}, {name + "_wide"})
        .node("Reshape", {name + "_wide", "merged"}, {name + "_rep"});
  }
  b.node("Transpose", {"k_rep"}, {"kt"}, {testing::ints_attr("perm", {0, 1, 3, 2})})
      .node("MatMul", {"q", "kt"}, {"scores"});
  std::string scores = "scores";
  if (with_mask) {
    b.node("Add", {"scores", "mask"}, {"masked"});
    scores = "masked";
  }
  b.node("Softmax", {scores}, {"probs"}).node("MatMul", {"probs", "v_rep"}, {"y"}).output("y");
  return b;
}

TEST(FuseAttention, ReadsTheKeyValueHeadsOfARepeatKv) {
  Inputs in = {{"q", Value(normal({1, 6, 4, kDim}, 7))},
               {"k_kv", Value(normal({1, 2, kSeq, kDim}, 8))},
               {"v_kv", Value(normal({1, 2, kSeq, kDim}, 9))},
               {"mask", Value(mx::concatenate({mx::zeros({1, 1, 1, 7}), mx::full({1, 1, 1, 3}, -1e9f)}, 3))}};
  for (bool with_mask : {true, false}) {
    for (int64_t axis : {2, 1}) {
      Model fused = grouped_graph(axis, with_mask).build();
      Model plain = grouped_graph(axis, with_mask).build({.run_passes = false});
      ASSERT_EQ(fused.op_histogram().at(kFused), 1u);
      std::shared_ptr<Graph> graph = grouped_graph(axis, with_mask).graph();
      ASSERT_EQ(fuse_attention(*graph), 1u);
      size_t fused_inputs = 0;
      for (const Node& node : graph->nodes)
        if (node.op_type == "ScaledDotProductAttention") fused_inputs = node.inputs.size();
      EXPECT_EQ(fused_inputs, axis == 2 ? 6u : (with_mask ? 4u : 3u)) << "axis " << axis << " mask " << with_mask;
      mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("y");
      mx::array got = run(fused, fused.params(), in, {mx::Device::cpu}).tensor("y");
      EXPECT_LT(mx::max(mx::abs(mx::subtract(got, want))).item<float>(), 1e-5f) << "axis " << axis;
      CompiledModel compiled = compile(fused, in, {.device = mx::Device::cpu});
      mx::array compiled_y = compiled(in).tensor("y");
      EXPECT_LT(mx::max(mx::abs(mx::subtract(compiled_y, want))).item<float>(), 1e-5f) << "axis " << axis;
      EXPECT_GT(mx::max(mx::abs(want)).item<float>(), 0.5f);
    }
  }
}

// A decode step over a cache: present = Concat(past, new, axis -2) per key and value (also graph
// outputs), then repeat_kv (`repeat`) or the heads as they are, then the attention over all rows.
GraphBuilder cache_graph(bool repeat) {
  constexpr int kKvHeads = 2, kPast = 9;
  const int heads = repeat ? 3 * kKvHeads : kKvHeads;
  GraphBuilder b(17);
  b.input("q", OnnxType::kFloat, {1, heads, 1, kDim}).input("mask", OnnxType::kFloat, {1, 1, 1, kPast + 1});
  for (const std::string name : {"k", "v"}) {
    b.input("past_" + name, OnnxType::kFloat, {1, kKvHeads, kPast, kDim})
        .input("new_" + name, OnnxType::kFloat, {1, kKvHeads, 1, kDim})
        .node("Concat", {"past_" + name, "new_" + name}, {"present_" + name}, {testing::int_attr("axis", -2)})
        .output("present_" + name);
  }
  if (repeat) {
    b.node("Constant", {}, {"axes"}, {testing::tensor_attr("value", Value(mx::array({int64_t{2}})))})
        .node("Constant", {}, {"expanded"},
              {testing::tensor_attr("value", Value(mx::array({1, kKvHeads, 3, kPast + 1, kDim})))})
        .node("Constant", {}, {"merged"},
              {testing::tensor_attr("value", Value(mx::array({1, heads, kPast + 1, kDim})))});
    for (const std::string name : {"k", "v"}) {
      b.node("Unsqueeze", {"present_" + name, "axes"}, {name + "_5d"})
          .node("Expand", {name + "_5d", "expanded"}, {name + "_wide"})
          .node("Reshape", {name + "_wide", "merged"}, {name + "_heads"});
    }
  }
  const std::string k_heads = repeat ? "k_heads" : "present_k", v_heads = repeat ? "v_heads" : "present_v";
  b.node("Transpose", {k_heads}, {"kt"}, {testing::ints_attr("perm", {0, 1, 3, 2})})
      .node("MatMul", {"q", "kt"}, {"scores"})
      .node("Add", {"scores", "mask"}, {"masked"})
      .node("Softmax", {"masked"}, {"probs"})
      .node("MatMul", {"probs", v_heads}, {"y"})
      .output("y");
  return b;
}

// The fused node reads the past and the new rows where they lie (inputs 4-7), so nothing computes
// the Concat unless something else reads it; with new_rows_outputs the presents are the new rows.
TEST(FuseAttention, ReadsACacheConcatAsTwoRuns) {
  for (bool repeat : {true, false}) {
    const int heads = repeat ? 6 : 2;
    Inputs in = {{"q", Value(normal({1, heads, 1, kDim}, 31))},
                 {"past_k", Value(normal({1, 2, 9, kDim}, 32))},
                 {"past_v", Value(normal({1, 2, 9, kDim}, 33))},
                 {"new_k", Value(normal({1, 2, 1, kDim}, 34))},
                 {"new_v", Value(normal({1, 2, 1, kDim}, 35))},
                 {"mask", Value(mx::concatenate({mx::zeros({1, 1, 1, 6}), mx::full({1, 1, 1, 3}, -1e9f),
                                                 mx::zeros({1, 1, 1, 1})}, 3))}};
    std::shared_ptr<Graph> graph = cache_graph(repeat).graph();
    ASSERT_EQ(fuse_attention(*graph), 1u) << "repeat " << repeat;
    for (const Node& node : graph->nodes) {
      if (node.op_type != "ScaledDotProductAttention") continue;
      ASSERT_EQ(node.inputs.size(), 8u);
      EXPECT_EQ(std::vector<std::string>(node.inputs.begin() + 4, node.inputs.end()),
                (std::vector<std::string>{"past_k", "past_v", "new_k", "new_v"}));
    }
    Model plain = cache_graph(repeat).build({.run_passes = false});
    Outputs want = run(plain, plain.params(), in, {mx::Device::cpu});
    for (bool new_rows : {false, true}) {
      LoadOptions options;
      if (new_rows) options.new_rows_outputs = {"present_*"};
      Model fused = cache_graph(repeat).build(options);
      ASSERT_EQ(fused.op_histogram().at(kFused), 1u);
      Outputs eager = run(fused, fused.params(), in, {mx::Device::cpu});
      Outputs compiled = compile(fused, in, {.device = mx::Device::cpu})(in);
      for (const Outputs* got : {&eager, &compiled}) {
        EXPECT_LT(mx::max(mx::abs(mx::subtract(got->tensor("y"), want.tensor("y")))).item<float>(), 1e-5f)
            << "repeat " << repeat << " new rows " << new_rows;
        for (const std::string name : {"k", "v"}) {
          const mx::array& expected = new_rows ? in.at("new_" + name).tensor() : want.tensor("present_" + name);
          EXPECT_TRUE(mx::array_equal(got->tensor("present_" + name), expected).item<bool>()) << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace transmuter
