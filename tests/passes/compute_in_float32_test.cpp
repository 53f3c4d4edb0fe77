// compute_in_float32 and keep_float32_islands (LoadOptions::compute_type).
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include <cmath>
#include <optional>

#include "passes/pass_manager.h"
#include "runtime/model_state.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;

// Each pass alone: the fusions and weight packing would rewrite these graphs further.
const LoadOptions kFloat32{.only_passes = {"compute_in_float32"}, .compute_type = ComputeType::kFloat32};
const LoadOptions kModelTypes{.only_passes = {"keep_float32_islands"}, .compute_type = ComputeType::kModel};
const LoadOptions kNoPasses{.run_passes = false};

mx::array uniform(mx::Shape shape, float low, float high, uint64_t seed, mx::Dtype dtype = mx::float32) {
  return mx::astype(mx::random::uniform(low, high, shape, mx::float32, mx::random::key(seed)), dtype);
}

mx::Dtype mlx_type(OnnxType t) { return to_mlx_dtype(t).value(); }

// x[2,8] -> MatMul(W[8,4]) -> Add(Constant b[4]) -> Softmax -> y, all of type
// `t`, the weights values of type `values` (a float32 model with float16 weights).
GraphBuilder dense_softmax(OnnxType t, std::optional<OnnxType> values = std::nullopt) {
  const mx::Dtype d = mlx_type(t);
  const mx::Dtype v = mlx_type(values.value_or(t));
  GraphBuilder b;
  b.input("x", t, {2, 8})
      .initializer("W", mx::astype(uniform({8, 4}, -1, 1, 1, v), d))
      .node("Constant", {}, {"b"}, {testing::tensor_attr("value", mx::astype(uniform({4}, -1, 1, 2, v), d))})
      .node("MatMul", {"x", "W"}, {"h"})
      .node("Add", {"h", "b"}, {"a"})
      .node("Softmax", {"a"}, {"y"})
      .output("y");
  return b;
}

// The graph of `b` with every output declared a tensor of type `t`.
Model with_output_types(const GraphBuilder& b, OnnxType t, const LoadOptions& options) {
  std::shared_ptr<Graph> graph = b.graph();
  for (ValueInfo& v : graph->outputs) {
    v.kind = ValueInfo::Kind::kTensor;
    v.elem_type = t;
  }
  return make_model(graph, "test-graph", options);
}

mx::array run_output(const Model& model, const Inputs& inputs, const std::string& name = "y") {
  return run(model, model.params(), inputs, {mx::Device::cpu}).tensor(name);
}

float max_abs_diff(const mx::array& a, const mx::array& b) {
  return mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), mx::astype(b, mx::float32)))).item<float>();
}

// The `to` of every Cast of the model's graph, in node order.
std::vector<int64_t> cast_targets(const Model& model) {
  std::vector<int64_t> targets;
  for (const Node& node : model.internal_state().graph->nodes) {
    if (node.op_type == "Cast") targets.push_back(node.find_attribute("to")->i);
  }
  return targets;
}

constexpr int64_t kFloat = static_cast<int64_t>(OnnxType::kFloat);
constexpr int64_t kFloat16 = static_cast<int64_t>(OnnxType::kFloat16);

TEST(ComputeInFloat32, KeepsTheInterfaceAndComputesInFloat32) {
  for (OnnxType t : {OnnxType::kFloat16, OnnxType::kBfloat16}) {
    SCOPED_TRACE(onnx_type_name(t));
    const mx::Dtype d = mlx_type(t);
    Model converted = dense_softmax(t).build(kFloat32);
    Model plain = dense_softmax(t).build(kNoPasses);
    Model reference = dense_softmax(OnnxType::kFloat, t).build(kNoPasses);

    EXPECT_EQ(converted.passes_applied().front(), "compute_in_float32");
    ASSERT_EQ(converted.inputs().size(), 1u);
    EXPECT_EQ(converted.inputs()[0].elem_type, t);  // the interface is the file's
    EXPECT_EQ(converted.params().at("W").dtype(), mx::float32);
    EXPECT_EQ(plain.params().at("W").dtype(), d);
    // One Cast up at the input, one Cast back at the output; nothing else changes.
    EXPECT_EQ(cast_targets(converted), (std::vector<int64_t>{kFloat, static_cast<int64_t>(t)}));
    EXPECT_EQ(testing::op_count(plain, "Cast"), 0u);
    EXPECT_EQ(converted.node_count(), plain.node_count() + 2);

    mx::array x = uniform({2, 8}, -2, 2, 3, d);
    mx::array got = run_output(converted, {{"x", x}});
    mx::array half = run_output(plain, {{"x", x}});
    // The float32 model with the same (rounded) weights and inputs: equal
    // within one rounding to the output type (softmax outputs < 1: half an
    // ulp is 2^-12 for float16, 2^-9 for bfloat16) plus float32 summation noise.
    mx::array expected = run_output(reference, {{"x", mx::astype(x, mx::float32)}});
    EXPECT_EQ(got.dtype(), d);
    EXPECT_EQ(half.dtype(), d);
    const float half_ulp = t == OnnxType::kFloat16 ? std::ldexp(1.0f, -12) : std::ldexp(1.0f, -9);
    EXPECT_LE(max_abs_diff(got, expected), half_ulp + 1e-6f);
    EXPECT_GT(mx::max(mx::astype(got, mx::float32)).item<float>(), 0.3f);  // not vacuous
    // The graph run in its own type rounds after every op: further off, yet close.
    EXPECT_LE(max_abs_diff(half, expected), 0.1f);
  }
}

TEST(ComputeInFloat32, DeclaredOutputTypesAreKept) {
  Model converted = with_output_types(dense_softmax(OnnxType::kFloat16), OnnxType::kFloat16, kFloat32);
  EXPECT_EQ(converted.outputs()[0].elem_type, OnnxType::kFloat16);
  EXPECT_EQ(cast_targets(converted), (std::vector<int64_t>{kFloat, kFloat16}));
  mx::array got = run_output(converted, {{"x", uniform({2, 8}, -2, 2, 3, mx::float16)}});
  EXPECT_EQ(got.dtype(), mx::float16);
}

TEST(ComputeInFloat32, RemovesCastPairsThatBecomeIdentities) {
  // x16 -> Cast(FLOAT) -> Softmax -> Cast(FLOAT16) -> Add(c16) -> Cast(FLOAT) -> Exp -> Cast(FLOAT16) -> y16:
  // the float32 islands of a converter's block list.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat16, {2, 5})
      .initializer("c", uniform({5}, -1, 1, 4, mx::float16))
      .node("Cast", {"x"}, {"x32"}, {testing::int_attr("to", kFloat)})
      .node("Softmax", {"x32"}, {"s32"})
      .node("Cast", {"s32"}, {"s16"}, {testing::int_attr("to", kFloat16)})
      .node("Add", {"s16", "c"}, {"a16"})
      .node("Cast", {"a16"}, {"a32"}, {testing::int_attr("to", kFloat)})
      .node("Exp", {"a32"}, {"e32"})
      .node("Cast", {"e32"}, {"y"}, {testing::int_attr("to", kFloat16)})
      .output("y");
  Model converted = b.build(kFloat32);
  Model plain = b.build(kNoPasses);
  // The inserted input Cast and the final Cast (the interface, kept as written).
  EXPECT_EQ(cast_targets(converted), (std::vector<int64_t>{kFloat, kFloat16}));
  EXPECT_EQ(converted.node_count(), 5u);
  EXPECT_EQ(converted.params().at("c").dtype(), mx::float32);

  mx::array x = uniform({2, 5}, -3, 3, 5, mx::float16);
  mx::array got = run_output(converted, {{"x", x}});
  mx::array expected = run_output(plain, {{"x", x}});
  EXPECT_EQ(got.dtype(), mx::float16);
  // exp(a) < e^2 ~ 7.4: float16 ulp 2^-8 there; the plain graph rounds s and a too.
  EXPECT_LE(max_abs_diff(got, expected), 3 * std::ldexp(1.0f, -8));
}

TEST(ComputeInFloat32, AWeightReadThroughACastKeepsOneFloat32Copy) {
  // x32 -> MatMul(Cast(W16 -> FLOAT)) -> y32: W becomes float32 once, the Cast goes.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {3, 8})
      .initializer("W", uniform({8, 4}, -1, 1, 6, mx::float16))
      .node("Cast", {"W"}, {"W32"}, {testing::int_attr("to", kFloat)})
      .node("MatMul", {"x", "W32"}, {"y"})
      .output("y");
  Model converted = b.build(kFloat32);
  Model plain = b.build(kNoPasses);
  EXPECT_EQ(testing::op_count(converted, "Cast"), 0u);
  EXPECT_EQ(converted.params().size(), 1u);
  EXPECT_EQ(converted.params().at("W").dtype(), mx::float32);
  mx::array x = uniform({3, 8}, -1, 1, 7);
  mx::array got = run_output(converted, {{"x", x}});
  EXPECT_EQ(got.dtype(), mx::float32);
  EXPECT_LE(max_abs_diff(got, run_output(plain, {{"x", x}})), 1e-5f);  // the same float32 products
}

TEST(ComputeInFloat32, ConvertsConstantOfShapeAndTypeAttributes) {
  // y16 = x16 * ConstantOfShape([3,3], value=0.5 float16) + EyeLike(x16, dtype=FLOAT16)
  GraphBuilder b;
  b.input("x", OnnxType::kFloat16, {3, 3})
      .initializer("shape", testing::i64({3, 3}, {2}))
      .node("ConstantOfShape", {"shape"}, {"half"},
            {testing::tensor_attr("value", mx::array({0.5f}, {1}, mx::float16))})
      .node("EyeLike", {"x"}, {"eye"}, {testing::int_attr("dtype", kFloat16)})
      .node("Mul", {"x", "half"}, {"m"})
      .node("Add", {"m", "eye"}, {"y"})
      .output("y");
  Model converted = b.build(kFloat32);
  Model plain = b.build(kNoPasses);
  for (const Node& node : converted.internal_state().graph->nodes) {
    if (node.op_type == "EyeLike") {
      EXPECT_EQ(node.find_attribute("dtype")->i, kFloat);
    }
    if (node.op_type == "ConstantOfShape") {
      EXPECT_EQ(node.find_attribute("value")->t.tensor().dtype(), mx::float32);
    }
  }
  mx::array x = uniform({3, 3}, -4, 4, 8, mx::float16);
  mx::array got = run_output(converted, {{"x", x}});
  EXPECT_EQ(got.dtype(), mx::float16);
  EXPECT_EQ(max_abs_diff(got, run_output(plain, {{"x", x}})), 0.0f);  // x/2 + I is exact in float16
}

TEST(ComputeInFloat32, AnOutputCastToFloat16StaysAndInternalReadersGetFloat32) {
  // x32 -> Cast(FLOAT16) -> y16 (output), also read by Relu -> z16 (output).
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {4})
      .node("Cast", {"x"}, {"y"}, {testing::int_attr("to", kFloat16)})
      .node("Relu", {"y"}, {"z"})
      .output("y")
      .output("z");
  Model converted = b.build(kFloat32);
  Model plain = b.build(kNoPasses);
  mx::array x = mx::array({-1.0f, 0.1f, 2.0f, 70000.0f});
  Outputs got = run(converted, converted.params(), {{"x", x}}, {mx::Device::cpu});
  Outputs expected = run(plain, plain.params(), {{"x", x}}, {mx::Device::cpu});
  for (const char* name : {"y", "z"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(got.tensor(name).dtype(), mx::float16);
    // Equal, including 70000 -> inf: one rounding in both.
    EXPECT_TRUE(mx::array_equal(got.tensor(name), expected.tensor(name)).item<bool>());
  }
}

// y16 = If(cond, then: x + Constant(c16), else: Identity(x)), x captured by both branches.
GraphBuilder if_graph() {
  GraphBuilder then_branch, else_branch;
  then_branch
      .node("Constant", {}, {"c"}, {testing::tensor_attr("value", mx::array({0.25f, 8.0f}, mx::float16))})
      .node("Add", {"x", "c"}, {"t"})
      .output("t");
  else_branch.node("Identity", {"x"}, {"e"}).output("e");
  GraphBuilder b;
  b.input("x", OnnxType::kFloat16, {2})
      .input("cond", OnnxType::kBool, {})
      .node("If", {"cond"}, {"y"},
            {testing::graph_attr("then_branch", then_branch.graph()),
             testing::graph_attr("else_branch", else_branch.graph())})
      .output("y");
  return b;
}

TEST(ComputeInFloat32, ConvertsSubgraphsAndTheirCaptures) {
  Model converted = with_output_types(if_graph(), OnnxType::kFloat16, kFloat32);
  Model plain = with_output_types(if_graph(), OnnxType::kFloat16, kNoPasses);
  EXPECT_EQ(cast_targets(converted), (std::vector<int64_t>{kFloat, kFloat16}));
  const Node& if_node = converted.internal_state().graph->nodes[1];
  ASSERT_EQ(if_node.op_type, "If");
  const Graph& then_branch = *if_node.find_attribute("then_branch")->g;
  EXPECT_EQ(then_branch.nodes[0].find_attribute("value")->t.tensor().dtype(), mx::float32);
  EXPECT_EQ(then_branch.nodes[1].inputs[0], "x/float32");
  // The plain model's branch (shared by the builder's copies) is not rewritten.
  const Graph& plain_then = *plain.internal_state().graph->nodes[0].find_attribute("then_branch")->g;
  EXPECT_EQ(plain_then.nodes[0].find_attribute("value")->t.tensor().dtype(), mx::float16);

  mx::array x = mx::array({1.5f, -3.0f}, mx::float16);
  for (bool cond : {true, false}) {
    Inputs inputs{{"x", x}, {"cond", mx::array(cond)}};
    mx::array got = run_output(converted, inputs);
    EXPECT_EQ(got.dtype(), mx::float16);
    EXPECT_TRUE(mx::array_equal(got, run_output(plain, inputs)).item<bool>());  // exact sums
  }
  // An If output of undeclared type: the interface cannot be known, the pass stays out.
  EXPECT_TRUE(if_graph().build(kFloat32).passes_applied().empty());
}

TEST(ComputeInFloat32, LeavesFloat32GraphsAndRunsOnlyWhenAsked) {
  EXPECT_TRUE(dense_softmax(OnnxType::kFloat).build(kFloat32).passes_applied().empty());
  // The graph as written: compute_in_float32 is not run for kModel or without passes.
  for (const LoadOptions& options : {kModelTypes, kNoPasses}) {
    Model model = dense_softmax(OnnxType::kFloat16).build(options);
    EXPECT_TRUE(model.passes_applied().empty());
    EXPECT_EQ(model.params().at("W").dtype(), mx::float16);
    EXPECT_EQ(run_output(model, {{"x", uniform({2, 8}, -2, 2, 3, mx::float16)}}).dtype(), mx::float16);
  }
  // kAuto: float32 when MLX's default device is the CPU at load.
  Model automatic = dense_softmax(OnnxType::kFloat16).build({.only_passes = {"compute_in_float32"}});
  const bool on_cpu = mx::default_device() == mx::Device::cpu;
  EXPECT_EQ(automatic.params().at("W").dtype(), on_cpu ? mx::float32 : mx::float16);
}

// x16 -> Pow(x, 2) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Div(x, .) -> y16: RMSNorm written out.
GraphBuilder decomposed_rms_norm() {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat16, {2, 16})
      .initializer("two", mx::array(2.0f, mx::float16))
      .initializer("eps", mx::array(1e-5f, mx::float16))
      .initializer("axes", testing::i64({-1}, {1}))
      .node("Pow", {"x", "two"}, {"sq"})
      .node("ReduceMean", {"sq", "axes"}, {"ms"})
      .node("Add", {"ms", "eps"}, {"var"})
      .node("Sqrt", {"var"}, {"rms"})
      .node("Div", {"x", "rms"}, {"y"})
      .output("y");
  return b;
}

TEST(ComputeInFloat32Islands, ComputesADecomposedNormInFloat32) {
  Model islands = decomposed_rms_norm().build(kModelTypes);
  Model plain = decomposed_rms_norm().build(kNoPasses);
  EXPECT_EQ(islands.passes_applied(), std::vector<std::string>{"keep_float32_islands"});
  EXPECT_EQ(cast_targets(islands), (std::vector<int64_t>{kFloat, kFloat16}));
  EXPECT_EQ(islands.params().at("eps/float32").dtype(), mx::float32);  // eps for the float32 Add

  // |x| up to 1000: x^2 overflows float16 (65504), the norm does not.
  mx::array x = uniform({2, 16}, -1000, 1000, 9, mx::float16);
  mx::array got = run_output(islands, {{"x", x}});
  mx::array overflowed = run_output(plain, {{"x", x}});
  mx::array x32 = mx::astype(x, mx::float32);
  mx::array expected =
      mx::divide(x32, mx::sqrt(mx::add(mx::mean(mx::square(x32), -1, true), mx::array(1e-5f))));
  EXPECT_EQ(got.dtype(), mx::float16);
  EXPECT_TRUE(mx::all(mx::isfinite(got)).item<bool>());
  EXPECT_GT(max_abs_diff(overflowed, expected), 0.5f);  // as written, x / inf = 0
  // Outputs ~1 (|y| < 4): the rms rounded to float16 and the division's rounding.
  EXPECT_LE(max_abs_diff(got, expected), 4 * std::ldexp(1.0f, -10));
}

TEST(ComputeInFloat32Islands, EveryComputeTypeNormalizesLargeFloat16Inputs) {
  // With all passes the norm may be fused (SimplifiedLayerNormalization computes
  // in float32) or wrapped; in float32 it is computed so anyway.
  mx::array x = uniform({2, 16}, -1000, 1000, 9, mx::float16);
  mx::array x32 = mx::astype(x, mx::float32);
  mx::array expected =
      mx::divide(x32, mx::sqrt(mx::add(mx::mean(mx::square(x32), -1, true), mx::array(1e-5f))));
  for (ComputeType compute : {ComputeType::kFloat32, ComputeType::kModel}) {
    Model model = decomposed_rms_norm().build({.compute_type = compute});
    mx::array got = run_output(model, {{"x", x}});
    EXPECT_EQ(got.dtype(), mx::float16);
    EXPECT_LE(max_abs_diff(got, expected), 4 * std::ldexp(1.0f, -10));
  }
}

TEST(ComputeInFloat32Islands, LeavesFloat32AndFusedNorms) {
  // Inputs already float32 (transformers' RMSNorm casts up itself): nothing to do.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {2, 16})
      .initializer("axes", testing::i64({-1}, {1}))
      .node("Mul", {"x", "x"}, {"sq"})
      .node("ReduceMean", {"sq", "axes"}, {"ms"})
      .node("Sqrt", {"ms"}, {"y"})
      .output("y");
  EXPECT_EQ(keep_float32_islands(*b.graph()), 0u);
  // LayerNormalization computes float16 in float32 itself (stash_type 1).
  GraphBuilder ln;
  ln.input("x", OnnxType::kFloat16, {2, 16})
      .initializer("scale", mx::ones({16}, mx::float16))
      .node("LayerNormalization", {"x", "scale"}, {"y"})
      .output("y");
  EXPECT_EQ(keep_float32_islands(*ln.graph()), 0u);
  Model model = ln.build(kModelTypes);
  mx::array got = run_output(model, {{"x", uniform({2, 16}, -1000, 1000, 10, mx::float16)}});
  EXPECT_TRUE(mx::all(mx::isfinite(got)).item<bool>());
}

}  // namespace
}  // namespace transmuter
