// pack_qmoe_weights: a com.microsoft QMoE whose expert weights are constants becomes ai.transmuter
// PackedQMoE (each routed pair on its expert's packed weight) with the outputs of the QMoE op as written,
// eager and compiled, for a decode step (fewer pairs than experts), a few tokens, and a prefill whose
// experts get enough rows for the dequantized GEMM; weights it cannot take (2 bits, blocks of 16) stay.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::string_attr;

constexpr int kExperts = 8, kHidden = 64, kInter = 64;

mx::array random_bytes(mx::Shape shape, uint64_t seed) {
  return mx::astype(mx::random::randint(0, 256, shape, mx::int32, mx::random::key(seed)), mx::uint8);
}

struct Layout {
  int bits = 4, block_size = 0;
  bool zero_points = false, fc3 = false;
};

// One projection's initializers fcJ_experts_weights, fcJ_scales[, fcJ_zero_points] of [E, n, k].
void add_projection(GraphBuilder& b, const std::string& prefix, int n, int k, const Layout& l,
                    uint64_t seed) {
  const int blocks = l.block_size > 0 ? k / l.block_size : 1;
  b.initializer(prefix + "_experts_weights", random_bytes({kExperts, n, k * l.bits / 8}, seed));
  b.initializer(prefix + "_scales",
                mx::random::uniform(
                    0.01f, 0.05f, l.block_size > 0 ? mx::Shape{kExperts, n, blocks} : mx::Shape{kExperts, n},
                    mx::float32, mx::random::key(seed + 1)));
  if (l.zero_points) {
    b.initializer(prefix + "_zero_points",
                  l.block_size > 0 ? random_bytes({kExperts, n, (blocks * l.bits + 7) / 8}, seed + 2)
                                   : random_bytes({kExperts, (n * l.bits + 7) / 8}, seed + 2));
  }
}

// input [T, H], router_probs [T, E] -> QMoE (k = 2, fc1 biases; relu, or silu gated by fc3) -> output.
GraphBuilder qmoe_graph(const Layout& l) {
  GraphBuilder b(17);
  b.input("input", OnnxType::kFloat, {-1, kHidden}).input("router_probs", OnnxType::kFloat, {-1, kExperts});
  add_projection(b, "fc1", kInter, kHidden, l, 10);
  add_projection(b, "fc2", kHidden, kInter, l, 20);
  if (l.fc3) add_projection(b, "fc3", kInter, kHidden, l, 30);
  b.initializer("fc1_experts_bias", testing::random_array({kExperts, kInter}, 40, 0.1f));
  const std::string zp1 = l.zero_points ? "fc1_zero_points" : "",
                    zp2 = l.zero_points ? "fc2_zero_points" : "";
  const std::string zp3 = l.zero_points && l.fc3 ? "fc3_zero_points" : "";
  std::vector<std::string> inputs = {"input",
                                     "router_probs",
                                     "fc1_experts_weights",
                                     "fc1_scales",
                                     "fc1_experts_bias",
                                     "fc2_experts_weights",
                                     "fc2_scales",
                                     "",
                                     l.fc3 ? "fc3_experts_weights" : "",
                                     l.fc3 ? "fc3_scales" : "",
                                     "",
                                     zp1,
                                     zp2,
                                     zp3};
  while (inputs.back().empty()) inputs.pop_back();
  std::vector<Attribute> attrs = {int_attr("k", 2), string_attr("activation_type", l.fc3 ? "silu" : "relu"),
                                  int_attr("expert_weight_bits", l.bits),
                                  int_attr("normalize_routing_weights", 1)};
  if (l.block_size > 0) attrs.push_back(int_attr("block_size", l.block_size));
  b.domain_node("com.microsoft", 1, "QMoE", inputs, {"output"}, attrs).output("output");
  return b;
}

TEST(PackQmoeWeights, RoutedPairsOnPackedWeightsEqualTheQMoEOp) {
  for (int bits : {4, 8}) {
    for (int block_size : {0, 32}) {
      for (bool zero_points : {false, true}) {
        for (bool fc3 : {false, true}) {
          const Layout l{bits, block_size, zero_points, fc3};
          Model packed = qmoe_graph(l).build();
          Model plain = qmoe_graph(l).build({.run_passes = false});
          ASSERT_EQ(packed.op_histogram().count("ai.transmuter.PackedQMoE"), 1u);
          EXPECT_EQ(packed.op_histogram().count("com.microsoft.QMoE"), 0u);
          // 1 token: 2 pairs of 8 experts (only the routed experts); 3 tokens; 40 tokens: experts with
          // 6 rows or more take the dequantized GEMM.
          for (int tokens : {1, 3, 40}) {
            const uint64_t seed = static_cast<uint64_t>(tokens * 100 + bits * 10 + block_size);
            const Inputs in = {
                {"input", Value(testing::random_array({tokens, kHidden}, seed))},
                {"router_probs", Value(testing::random_array({tokens, kExperts}, seed + 1, 2.0f))}};
            mx::array want = run(plain, plain.params(), in, {mx::Device::cpu}).tensor("output");
            mx::array eager = run(packed, packed.params(), in, {mx::Device::cpu}).tensor("output");
            mx::array compiled = compile(packed, in, {.device = mx::Device::cpu})(in).tensor("output");
            // One float32 rounding apart per weight (scale * q + bias against (q - zp) * scale), sums in
            // another order: 1e-5 of the largest output.
            const float scale = mx::max(mx::abs(want)).item<float>();
            ASSERT_GT(scale, 0.0f);
            const float tolerance = 1e-5f * std::max(scale, 1.0f);
            EXPECT_LT(testing::max_abs_diff(eager, want), tolerance)
                << "bits " << bits << " block " << block_size << " zp " << zero_points << " fc3 " << fc3
                << " tokens " << tokens;
            EXPECT_LT(testing::max_abs_diff(compiled, want), tolerance) << "compiled, tokens " << tokens;
          }
        }
      }
    }
  }
}

TEST(PackQmoeWeights, LayoutsTheKernelLacksStayQMoE) {
  for (const Layout& l : {Layout{2, 32, false, false}, Layout{4, 16, true, false}}) {
    Model model = qmoe_graph(l).build();
    EXPECT_EQ(model.op_histogram().count("com.microsoft.QMoE"), 1u)
        << l.bits << " bits, block " << l.block_size;
    EXPECT_EQ(model.op_histogram().count("ai.transmuter.PackedQMoE"), 0u);
  }
}

}  // namespace
}  // namespace transmuter
