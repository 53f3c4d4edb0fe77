#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include <mlx/primitives.h>

#include "graph/graph.h"
#include "ops/node_context.h"
#include "ops/registry.h"
#include "ops/vectorized_exp.h"
#include "support/op_test_support.h"

namespace transmuter {
namespace {

// A GPU stream that is never evaluated: building the graph on it shows which
// primitives the GPU path uses, also on machines without a GPU.
const mx::Stream kGpu(0, mx::Device::gpu);

/** Names of the primitives in the graph that computes `a`. */
std::set<std::string> primitive_names(const mx::array& a) {
  std::set<std::string> names;
  std::function<void(const mx::array&)> visit = [&](const mx::array& x) {
    if (!x.has_primitive()) return;
    names.insert(x.primitive().name());
    for (const mx::array& in : x.inputs()) visit(in);
  };
  visit(a);
  return names;
}

/** Runs a default-domain op on `stream` without evaluating it. */
mx::array op_on_stream(const std::string& op_type, int opset, const mx::array& x, mx::StreamOrDevice stream,
                       std::vector<Attribute> attributes = {}) {
  Node node;
  node.name = "n";
  node.op_type = op_type;
  node.opset = opset;
  node.inputs = {"x"};
  node.outputs = {"y"};
  node.attributes = std::move(attributes);
  Value input = x;
  NodeContext ctx(node, {&input}, stream, nullptr);
  return builtin_registry().find("", op_type, opset)->fn(ctx)[0].tensor();
}

TEST(VectorizedExp, RelativeErrorBelowTwoTenMillionths) {
  const int n = 1000001;
  mx::array x = mx::linspace(-87.0, 88.0, n, mx::float32);
  std::vector<double> xs = testing::to_doubles(x);
  std::vector<double> ys = testing::to_doubles(exp_upto_88(x, mx::Device::cpu));
  double worst = 0;
  for (int i = 0; i < n; ++i) worst = std::max(worst, std::abs(ys[i] / std::exp(xs[i]) - 1));
  EXPECT_LT(worst, 2e-7);
}

TEST(VectorizedExp, UnderflowInfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<double> y =
      testing::to_doubles(exp_upto_88(mx::array({0.f, -88.f, -1000.f, -inf, std::nanf("")}), mx::Device::cpu));
  EXPECT_EQ(y[0], 1.0);
  EXPECT_EQ(y[1], 0.0);  // below 2^-126: flushed
  EXPECT_EQ(y[2], 0.0);
  EXPECT_EQ(y[3], 0.0);
  EXPECT_TRUE(std::isnan(y[4]));
}

TEST(VectorizedExp, SoftmaxMatchesMlxIncludingMaskedEntries) {
  const float inf = std::numeric_limits<float>::infinity();
  mx::array scores = mx::random::normal({4, 8, 16}, mx::float32, 0, 5, mx::random::key(3));
  // Mask the upper triangle of the last two axes with -inf, as causal attention does.
  mx::array mask = mx::triu(mx::full({8, 16}, -inf), 1);
  mx::array x = mx::add(scores, mask);
  std::vector<double> ours = testing::to_doubles(softmax_float32(x, {2}, mx::Device::cpu));
  std::vector<double> ref = testing::to_doubles(mx::softmax(x, std::vector<int>{2}, true, mx::Device::cpu));
  ASSERT_EQ(ours.size(), ref.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_NEAR(ours[i], ref[i], 1e-6) << i;
}

TEST(VectorizedExp, GradientIsTheOutputTimesTheCotangent) {
  mx::array x = mx::linspace(-20.0, 20.0, 401, mx::float32);
  auto [y, dy] = mx::vjp([](const mx::array& v) { return exp_upto_88(v, mx::Device::cpu); }, x, mx::full({401}, 3.0f));
  std::vector<double> xs = testing::to_doubles(x), g = testing::to_doubles(dy);
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(g[i] / (3 * std::exp(xs[i])), 1.0, 4e-7) << xs[i];
}

TEST(VectorizedExp, SoftmaxGradientMatchesMlxEagerAndCompiled) {
  mx::array x = mx::random::normal({3, 5, 9}, mx::float32, 0, 3, mx::random::key(1));
  mx::array cotangent = mx::random::normal({3, 5, 9}, mx::float32, 0, 1, mx::random::key(2));
  auto ours = [](const std::vector<mx::array>& v) {
    return std::vector<mx::array>{softmax_float32(v[0], {1, 2}, mx::Device::cpu)};
  };
  auto theirs = [](const std::vector<mx::array>& v) {
    return std::vector<mx::array>{mx::softmax(v[0], std::vector<int>{1, 2}, true, mx::Device::cpu)};
  };
  std::vector<double> ref = testing::to_doubles(mx::vjp(theirs, {x}, {cotangent}).second[0]);
  std::vector<double> eager = testing::to_doubles(mx::vjp(ours, {x}, {cotangent}).second[0]);
  std::vector<double> compiled = testing::to_doubles(mx::vjp(mx::compile(ours), {x}, {cotangent}).second[0]);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(eager[i], ref[i], 1e-6) << i;
    EXPECT_NEAR(compiled[i], ref[i], 1e-6) << i;
  }
}

TEST(VectorizedExp, CpuStreamsUseTheCompositionGpuStreamsStockMlx) {
  mx::array x = mx::zeros({2, 4});
  EXPECT_FALSE(primitive_names(exp_upto_88(x, mx::Device::cpu)).count("Exp"));
  EXPECT_EQ(std::string(exp_upto_88(x, kGpu).primitive().name()), "Exp");
  EXPECT_FALSE(primitive_names(softmax_float32(x, {1}, mx::Device::cpu)).count("Softmax"));
  EXPECT_EQ(std::string(softmax_float32(x, {1}, kGpu).primitive().name()), "Softmax");
}

TEST(VectorizedExp, SoftmaxOpUsesStockSoftmaxOnGpuStreams) {
  for (mx::Dtype dtype : {mx::float32, mx::float16}) {
    mx::array x = mx::zeros({2, 4}, dtype);
    EXPECT_TRUE(primitive_names(op_on_stream("Softmax", 13, x, kGpu)).count("Softmax"));
    EXPECT_FALSE(primitive_names(op_on_stream("Softmax", 13, x, mx::Device::cpu)).count("Softmax"));
  }
}

TEST(VectorizedExp, GeluAndErfOpsUseStockErfOnGpuStreams) {
  mx::array x = mx::zeros({2, 4});
  EXPECT_TRUE(primitive_names(op_on_stream("Erf", 13, x, kGpu)).count("Erf"));
  EXPECT_FALSE(primitive_names(op_on_stream("Erf", 13, x, mx::Device::cpu)).count("Erf"));
  EXPECT_TRUE(primitive_names(op_on_stream("Gelu", 20, x, kGpu)).count("Erf"));
  EXPECT_FALSE(primitive_names(op_on_stream("Gelu", 20, x, mx::Device::cpu)).count("Erf"));
}

}  // namespace
}  // namespace transmuter
