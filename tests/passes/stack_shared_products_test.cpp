// stack_shared_products: packed products reading one input (q, k, v projections) become one product over
// their stacked panels and a Split, with the unfused graph's values; a product whose columns do not fill
// its last panel ends a group (its padding would sit between two members' columns).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

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

constexpr int kK = 96;

// x [2, 3, K] -> MatMul by weights of `widths` columns -> each product added to a graph output.
GraphBuilder products(const std::vector<int>& widths, int64_t opset) {
  GraphBuilder b(opset);
  b.input("x", OnnxType::kFloat, {2, 3, kK});
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string w = "w" + std::to_string(i), y = "y" + std::to_string(i);
    b.initializer(w, random_array({kK, widths[i]}, 30 + i, 0.1f)).node("MatMul", {"x", w}, {y}).output(y);
  }
  return b;
}

void expect_same_outputs(const GraphBuilder& b, size_t outputs) {
  Model fused = b.build();
  Model plain = b.build({.run_passes = false});
  const Inputs in = {{"x", Value(random_array({2, 3, kK}, 40))}};
  Outputs want = run(plain, plain.params(), in, {mx::Device::cpu});
  Outputs got = run(fused, fused.params(), in, {mx::Device::cpu});
  CompiledModel compiled = compile(fused, in, {.device = mx::Device::cpu});
  Outputs traced = compiled(in);
  for (size_t i = 0; i < outputs; ++i) {
    const std::string y = "y" + std::to_string(i);
    // The packed GEMM sums in another order than MLX's matmul.
    EXPECT_LT(max_abs_diff(got.tensor(y), want.tensor(y)), 1e-5f) << y;
    EXPECT_LT(max_abs_diff(traced.tensor(y), want.tensor(y)), 1e-5f) << y;
    EXPECT_EQ(got.tensor(y).shape(), want.tensor(y).shape()) << y;
  }
}

TEST(StackSharedProducts, StacksProjectionsOfOneInput) {
  for (int64_t opset : {17, 11}) {  // Split's sizes as an input (13+) or an attribute
    GraphBuilder b = products({64, 32, 32}, opset);
    Model model = b.build();
    EXPECT_EQ(model.op_histogram(),
              (std::map<std::string, size_t>{{"ai.transmuter.PackedMatMul", 1}, {"Split", 1}}))
        << "opset " << opset;
    size_t weights = 0;
    for (const auto& [name, value] : model.params())
      if (value.ndim() == 3) ++weights;
    EXPECT_EQ(weights, 1u);  // the three packed weights it was made of are gone
    expect_same_outputs(b, 3);
  }
}

TEST(StackSharedProducts, ARaggedProductEndsAGroup) {
  // 40 columns do not fill a panel: [64, 40] stack (the ragged one last), the next product starts anew.
  GraphBuilder b = products({64, 40, 32, 64}, 17);
  Model model = b.build();
  EXPECT_EQ(model.op_histogram().at("ai.transmuter.PackedMatMul"), 2u);
  EXPECT_EQ(model.op_histogram().at("Split"), 2u);
  expect_same_outputs(b, 4);
  // A single product is left as it is.
  EXPECT_EQ(products({64}, 17).build().op_histogram().count("Split"), 0u);
}

}  // namespace
}  // namespace transmuter
