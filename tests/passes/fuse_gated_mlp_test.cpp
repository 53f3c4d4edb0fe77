// fuse_gated_mlp: the gate and up products of a Llama-style MLP over packed MatMulNBits weights, or
// plain MatMuls by constant float weights, become one product of stacked weights and an ai.transmuter
// SwiGlu, with the values of the unfused graph; patterns it must not take stay as they are.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include <map>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/graph_builder.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"
#include "transmuter/runtime.h"

namespace transmuter {
namespace {

using testing::GraphBuilder;
using testing::int_attr;
using testing::max_abs_diff;
using testing::random_array;
using testing::random_bytes;

constexpr int kK = 256, kN = 40, kBlock = 32;

struct MlpOptions {
  bool zero_points = false;    // genai's symmetric weights have none
  bool swap_operands = false;  // Mul(Sigmoid(g), g) and Mul(up, silu)
  bool gate_read_elsewhere = false;
  std::vector<int64_t> rows = {2, 3};  // x's dims before K: 6 rows run the dequantized GEMM, 1 the GEMV
};

// x [2, 3, K] -> gate, up (MatMulNBits, 4 bits) -> silu(gate) * up -> y [2, 3, N].
GraphBuilder mlp_graph(const MlpOptions& o) {
  GraphBuilder b;
  std::vector<int64_t> dims = o.rows;
  dims.push_back(kK);
  b.input("x", OnnxType::kFloat, dims);
  for (const char* name : {"gate", "up"}) {
    const std::string w = std::string(name) + "_w", s = std::string(name) + "_s",
                      zp = std::string(name) + "_zp";
    const uint64_t seed = name[0];
    b.initializer(w, random_bytes({kN, kK / kBlock, kBlock / 2}, seed))
        .initializer(
            s, mx::random::uniform(0.005f, 0.02f, {kN, kK / kBlock}, mx::float32, mx::random::key(seed + 1)));
    std::vector<std::string> inputs = {"x", w, s};
    if (o.zero_points) {
      b.initializer(zp, random_bytes({kN, kK / kBlock / 2}, seed + 2));
      inputs.push_back(zp);
    }
    b.domain_node(
        "com.microsoft", 1, "MatMulNBits", inputs, {name},
        {int_attr("K", kK), int_attr("N", kN), int_attr("bits", 4), int_attr("block_size", kBlock)});
  }
  b.node("Sigmoid", {"gate"}, {"sig"});
  b.node("Mul",
         o.swap_operands ? std::vector<std::string>{"sig", "gate"} : std::vector<std::string>{"gate", "sig"},
         {"silu"});
  b.node("Mul",
         o.swap_operands ? std::vector<std::string>{"up", "silu"} : std::vector<std::string>{"silu", "up"},
         {"y"});
  b.output("y");
  if (o.gate_read_elsewhere) b.output("gate");
  return b;
}

// The fused and the unfused graph (pack_matmul_nbits alone) on the same x: each output column is
// the same GEMV; SwiGlu's sigmoid (Highway's exp, 1 ulp) against MLX's: within 1e-6 of the
// outputs (|y| ~ 1).
void expect_same_outputs(const GraphBuilder& b, const mx::Shape& shape) {
  Model fused = b.build();
  Model unfused = b.build({.only_passes = {"pack_matmul_nbits"}});
  mx::array x = random_array(shape, 9);
  mx::array want = run(unfused, unfused.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
  mx::array got = run(fused, fused.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
  const float magnitude = mx::max(mx::abs(want)).item<float>();
  EXPECT_GT(magnitude, 0.1f);  // not vacuous
  EXPECT_LT(max_abs_diff(got, want), 1e-6f * std::max(1.0f, magnitude));
  CompiledModel compiled = compile(fused, {{"x", x}});
  EXPECT_LT(max_abs_diff(compiled({{"x", x}}).tensor("y"), want), 1e-6f * std::max(1.0f, magnitude));
}

TEST(FuseGatedMlp, StacksTheProductsAndRunsSwiGlu) {
  for (MlpOptions o : {MlpOptions{}, MlpOptions{.swap_operands = true}, MlpOptions{.zero_points = true}}) {
    SCOPED_TRACE(::testing::Message() << "swap " << o.swap_operands << " zero points " << o.zero_points);
    GraphBuilder b = mlp_graph(o);
    Model model = b.build();
    EXPECT_EQ(model.op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.QuantizedMatMul", 1},
                                                                   {"ai.transmuter.SwiGlu", 1}}));
    EXPECT_EQ(model.passes_applied(), (std::vector<std::string>{"pack_matmul_nbits", "fuse_gated_mlp"}));
    // One stacked weight [2N, words]; the two it was made of are gone.
    size_t weights = 0;
    for (const auto& [name, value] : model.params()) {
      if (value.dtype() == mx::uint32) {
        ++weights;
        EXPECT_EQ(value.shape(0), 2 * kN) << name;
      }
    }
    EXPECT_EQ(weights, 1u);
    expect_same_outputs(b, {2, 3, kK});
  }
}

TEST(FuseGatedMlp, DecodeRow) {
  GraphBuilder b = mlp_graph({.rows = {1, 1}});
  EXPECT_EQ(b.build().op_histogram().count("ai.transmuter.SwiGlu"), 1u);
  expect_same_outputs(b, {1, 1, kK});  // one row: the GEMV
}

TEST(FuseGatedMlp, GateReadElsewhereIsLeftAlone) {
  Model model = mlp_graph({.gate_read_elsewhere = true}).build();
  EXPECT_EQ(model.op_histogram().count("ai.transmuter.SwiGlu"), 0u);
  EXPECT_EQ(model.op_histogram().at("ai.transmuter.QuantizedMatMul"), 2u);
}

// A PyTorch export's MLP: MatMul by constant float32 [K, N] weights. pack_matmul_weights packs each into
// panels; the two packed weights are stacked panel after panel (the packing of [Wg | Wu] when Wg's N is a
// multiple of the panel width: 64 is, for 16- and 32-wide panels), and the outputs are the unfused graph's.
constexpr int kFloatN = 64;

GraphBuilder float_mlp_graph(int64_t gate_n) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {2, 3, kK})
      .initializer("gate_w", random_array({kK, gate_n}, 21, 0.1f))
      .initializer("up_w", random_array({kK, gate_n}, 22, 0.1f))
      .node("MatMul", {"x", "gate_w"}, {"gate"})
      .node("MatMul", {"x", "up_w"}, {"up"})
      .node("Sigmoid", {"gate"}, {"sig"})
      .node("Mul", {"gate", "sig"}, {"silu"})
      .node("Mul", {"silu", "up"}, {"y"})
      .output("y");
  return b;
}

TEST(FuseGatedMlp, StacksPackedFloatWeights) {
  GraphBuilder b = float_mlp_graph(kFloatN);
  Model fused = b.build();
  EXPECT_EQ(fused.op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.PackedMatMul", 1},
                                                                  {"ai.transmuter.SwiGlu", 1}}));
  EXPECT_EQ(fused.passes_applied(), (std::vector<std::string>{"pack_matmul_weights", "fuse_gated_mlp"}));
  size_t packed = 0;
  for (const auto& [name, value] : fused.params()) {
    ++packed;
    EXPECT_EQ(value.ndim(), 3) << name;  // [panels, K, P]
    EXPECT_EQ(value.shape(0) * value.shape(2), 2 * kFloatN) << name;
  }
  EXPECT_EQ(packed, 1u);  // the two packed weights it was made of are gone
  Model plain = b.build({.run_passes = false});
  mx::array x = random_array({2, 3, kK}, 23);
  mx::array want = run(plain, plain.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
  const float magnitude = mx::max(mx::abs(want)).item<float>();
  EXPECT_GT(magnitude, 0.1f);
  mx::array got = run(fused, fused.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
  // The products' sums in another order (packed GEMM vs MLX's matmul) and SwiGlu's exp (1 ulp).
  EXPECT_LT(max_abs_diff(got, want), 1e-5f * std::max(1.0f, magnitude));
  CompiledModel compiled = compile(fused, {{"x", x}});
  EXPECT_LT(max_abs_diff(compiled({{"x", x}}).tensor("y"), want), 1e-5f * std::max(1.0f, magnitude));
  // A gate whose columns end inside a panel (N = 40): its panels' padding would sit between gate and up.
  Model ragged = float_mlp_graph(40).build();
  EXPECT_EQ(ragged.op_histogram().count("ai.transmuter.SwiGlu"), 0u);
  EXPECT_EQ(ragged.op_histogram().at("ai.transmuter.PackedMatMul"), 2u);
}

TEST(FuseGatedMlp, SwiGluRejectsAnOddWidth) {
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {2, 5}).domain_node("ai.transmuter", 1, "SwiGlu", {"x"}, {"y"}).output("y");
  Model model = b.build();
  const std::string message = testing::error_of<OpError>([&] {
    run(model, model.params(), {{"x", random_array({2, 5}, 1)}}, {mx::Device::cpu});
  });
  EXPECT_NE(message.find("even last axis"), std::string::npos) << message;
}

}  // namespace
}  // namespace transmuter
