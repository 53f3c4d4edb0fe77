// pack_matmul_nbits: MatMulNBits with constant weights becomes one
// ai.transmuter QuantizedMatMul on MLX's affine layout and gives the values of
// the unrewritten graph (eager dequantize + float32 matmul); layouts MLX lacks
// stay MatMulNBits.
#include <gtest/gtest.h>

#include <mlx/mlx.h>

#include "passes/pass_manager.h"
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

struct NBitsLayer {
  int k = 128, n = 24, bits = 4, block_size = 32;
  bool zero_points = true, float_zero_points = false, bias = false, g_idx = false;
  int accuracy_level = 0;
  OnnxType a_type = OnnxType::kFloat;
  std::vector<int> rows = {2, 3};  // A's dims before K: 6 rows run the CPU's dequantizing branch
};

// x [rows..., K] -> MatMulNBits -> y [rows..., N]; weights with small scales.
GraphBuilder nbits_graph(const NBitsLayer& c) {
  const int blocks = (c.k + c.block_size - 1) / c.block_size;
  const mx::Dtype t = c.a_type == OnnxType::kFloat ? mx::float32 : mx::float16;
  GraphBuilder b;
  std::vector<int64_t> dims(c.rows.begin(), c.rows.end());
  dims.push_back(c.k);
  b.input("x", c.a_type, dims)
      .initializer("B", random_bytes({c.n, blocks, c.block_size * c.bits / 8}, 1))
      .initializer(
          "scales",
          mx::astype(mx::random::uniform(0.005f, 0.02f, {c.n, blocks}, mx::float32, mx::random::key(2)), t));
  std::vector<std::string> inputs = {"x", "B", "scales", "", "", ""};
  if (c.zero_points) {
    mx::array zp = c.float_zero_points
                       ? mx::astype(mx::random::uniform(0.0f, float((1 << c.bits) - 1), {c.n, blocks},
                                                        mx::float32, mx::random::key(3)),
                                    t)
                       : random_bytes({c.n, (blocks * c.bits + 7) / 8}, 3);
    b.initializer("zp", zp);
    inputs[3] = "zp";
  }
  if (c.g_idx) {
    b.initializer("g_idx", mx::astype(mx::floor_divide(mx::arange(c.k), mx::array(c.block_size)), mx::int32));
    inputs[4] = "g_idx";
  }
  if (c.bias) {
    b.initializer("bias", mx::astype(random_array({c.n}, 4), t));
    inputs[5] = "bias";
  }
  while (inputs.back().empty()) inputs.pop_back();
  b.domain_node("com.microsoft", 1, "MatMulNBits", inputs, {"y"},
                {int_attr("K", c.k), int_attr("N", c.n), int_attr("bits", c.bits),
                 int_attr("block_size", c.block_size), int_attr("accuracy_level", c.accuracy_level)});
  return b.output("y");
}

mx::array run_y(const Model& model, const mx::array& x) {
  return run(model, model.params(), {{"x", x}}, {mx::Device::cpu}).tensor("y");
}

// Both sum K <= 256 float32 products (a few ulps of the largest output),
// and dequantize each weight one rounding apart ((q - zp) s against
// q s - zp s): within 1e-5 of the outputs' magnitude (up to ~50 for 8 bits).
void expect_same_outputs(const GraphBuilder& b, const NBitsLayer& c, float tolerance = 1e-5f) {
  Model packed = b.build();
  Model plain = b.build({.run_passes = false});
  mx::Shape shape(c.rows.begin(), c.rows.end());
  shape.push_back(c.k);
  mx::array x = random_array(shape, 5);
  if (c.a_type == OnnxType::kFloat16) x = mx::astype(x, mx::float16);
  mx::array want = run_y(plain, x);
  mx::array got = run_y(packed, x);
  EXPECT_EQ(got.dtype(), want.dtype());
  shape.back() = c.n;
  EXPECT_EQ(got.shape(), shape);
  const float magnitude = mx::max(mx::abs(mx::astype(want, mx::float32))).item<float>();
  EXPECT_GT(magnitude, 0.5f);  // not vacuous
  EXPECT_LT(max_abs_diff(got, want), tolerance * magnitude) << "largest output " << magnitude;
}

void expect_rewritten(const Model& model) {
  EXPECT_EQ(model.op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.QuantizedMatMul", 1}}));
  // The stored quantized weight is replaced by its MLX layout, never by floats.
  EXPECT_FALSE(model.params().contains("B"));
  ASSERT_TRUE(model.params().contains("B/mlx_affine"));
  EXPECT_EQ(model.params().at("B/mlx_affine").dtype(), mx::uint32);
}

TEST(PackMatmulNbits, EveryBitWidthAndBlockSizeMatchesTheEagerOp) {
  for (int bits : {2, 4, 8}) {
    for (int block_size : {32, 64, 128}) {
      SCOPED_TRACE(::testing::Message() << "bits " << bits << " block_size " << block_size);
      NBitsLayer c{.k = 256, .bits = bits, .block_size = block_size};
      GraphBuilder b = nbits_graph(c);
      Model model = b.build();
      EXPECT_EQ(model.passes_applied(), (std::vector<std::string>{"pack_matmul_nbits"}));
      expect_rewritten(model);
      expect_same_outputs(b, c);
    }
  }
}

TEST(PackMatmulNbits, DecodeRowsRunTheQuantizedKernel) {
  // Below 4 rows the CPU runs mx::quantized_matmul itself (above, it
  // dequantizes the call's weight for the float GEMM).
  for (NBitsLayer c : {NBitsLayer{.rows = {1, 1}}, NBitsLayer{.bits = 8, .rows = {3}},
                       NBitsLayer{.bits = 2, .bias = true, .rows = {2}}}) {
    GraphBuilder b = nbits_graph(c);
    expect_rewritten(b.build());
    expect_same_outputs(b, c);
  }
}

TEST(PackMatmulNbits, ZeroPointsAbsentOrFloatAndBias) {
  for (NBitsLayer c : {NBitsLayer{.zero_points = false}, NBitsLayer{.float_zero_points = true, .bias = true},
                       NBitsLayer{.bits = 8, .bias = true}}) {
    GraphBuilder b = nbits_graph(c);
    Model model = b.build();
    expect_rewritten(model);
    // A symmetric weight (no zero points) stores no biases: the kernel derives them from the scales.
    EXPECT_EQ(model.params().contains("B/mlx_affine_biases"), c.zero_points)
        << "zero points " << c.zero_points;
    expect_same_outputs(b, c);
  }
}

TEST(PackMatmulNbits, SymmetricWeightsOnEveryPath) {
  // Decode rows (the GEMV), prompt rows (the dequantized GEMM), 2 bits (MLX's kernel), compiled.
  for (NBitsLayer c : {NBitsLayer{.k = 512, .zero_points = false, .rows = {1, 1}},
                       NBitsLayer{.bits = 8, .zero_points = false, .rows = {3}},
                       NBitsLayer{.zero_points = false, .bias = true, .rows = {2, 9}},
                       NBitsLayer{.k = 512, .bits = 2, .zero_points = false, .rows = {2}}}) {
    SCOPED_TRACE(::testing::Message() << "bits " << c.bits << " rows " << c.rows.size());
    GraphBuilder b = nbits_graph(c);
    Model model = b.build();
    expect_rewritten(model);
    EXPECT_FALSE(model.params().contains("B/mlx_affine_biases"));
    expect_same_outputs(b, c);
  }
}

// accuracy_level 4 (ORT rounds A to int8 per block) survives the rewrite wherever ORT honours it,
// on the GEMV, the dequantized GEMM and MLX's 2-bit kernel; float zero points drop it, as ORT does.
TEST(PackMatmulNbits, AccuracyLevel4KeepsTheInt8RoundingOfA) {
  for (NBitsLayer c : {NBitsLayer{.zero_points = false, .accuracy_level = 4, .rows = {1}},
                       NBitsLayer{.bits = 8, .accuracy_level = 4, .rows = {2, 5}},
                       NBitsLayer{.k = 512, .bits = 2, .accuracy_level = 4, .rows = {2}},
                       NBitsLayer{.float_zero_points = true, .accuracy_level = 4, .rows = {1}}}) {
    SCOPED_TRACE(::testing::Message() << "bits " << c.bits << " float zero points " << c.float_zero_points);
    GraphBuilder b = nbits_graph(c);
    Model model = b.build();
    expect_rewritten(model);
    expect_same_outputs(b, c);
    // The unpacked op rounds A too: the float32 product of the same layer differs.
    NBitsLayer level0 = c;
    level0.accuracy_level = 0;
    Model plain = nbits_graph(level0).build({.run_passes = false});
    mx::Shape shape(c.rows.begin(), c.rows.end());
    shape.push_back(c.k);
    mx::array x = random_array(shape, 5);
    const float moved = max_abs_diff(run_y(model, x), run_y(plain, x));
    if (c.float_zero_points) {
      EXPECT_LT(moved, 1e-4f);
    } else {
      EXPECT_GT(moved, 1e-4f);
    }
  }
}

TEST(PackMatmulNbits, Float16IsComputedInFloat32) {
  NBitsLayer c{.bias = true, .a_type = OnnxType::kFloat16};
  GraphBuilder b = nbits_graph(c);
  expect_rewritten(b.build({.compute_type = ComputeType::kModel}));  // the float16 layer as written
  // Both round one float32 result to float16; a rounding boundary between
  // the two float32 sums moves it one float16 ulp (2^-10 relative).
  expect_same_outputs(b, c, 1e-3f);
}

TEST(PackMatmulNbits, LayoutsMlxLacksStayMatMulNBits) {
  for (NBitsLayer c : {NBitsLayer{.block_size = 16}, NBitsLayer{.block_size = 256}, NBitsLayer{.k = 100},
                       NBitsLayer{.g_idx = true}}) {
    GraphBuilder b = nbits_graph(c);
    Model model = b.build();
    EXPECT_EQ(model.op_histogram(), (std::map<std::string, size_t>{{"com.microsoft.MatMulNBits", 1}}));
    EXPECT_TRUE(model.params().contains("B"));
  }
  // A weight computed in the graph (not an initializer) stays as well.
  GraphBuilder b;
  b.input("x", OnnxType::kFloat, {1, 64})
      .input("B", OnnxType::kUint8, {8, 2, 16})
      .initializer("scales", mx::ones({8, 2}))
      .domain_node("com.microsoft", 1, "MatMulNBits", {"x", "B", "scales"}, {"y"},
                   {int_attr("K", 64), int_attr("N", 8), int_attr("bits", 4), int_attr("block_size", 32)})
      .output("y");
  EXPECT_EQ(b.build().op_histogram(), (std::map<std::string, size_t>{{"com.microsoft.MatMulNBits", 1}}));
}

TEST(PackMatmulNbits, SharedWeightIsConvertedOnce) {
  NBitsLayer c;
  GraphBuilder b = nbits_graph(c);
  b.domain_node("com.microsoft", 1, "MatMulNBits", {"x", "B", "scales", "zp"}, {"y2"},
                {int_attr("K", c.k), int_attr("N", c.n), int_attr("bits", 4), int_attr("block_size", 32)})
      .output("y2");
  Model model = b.build();
  EXPECT_EQ(model.op_histogram(), (std::map<std::string, size_t>{{"ai.transmuter.QuantizedMatMul", 2}}));
  size_t uint32_params = 0;
  for (const auto& [name, value] : model.params()) uint32_params += value.dtype() == mx::uint32;
  EXPECT_EQ(uint32_params, 1u);
  mx::array x = random_array({2, 3, c.k}, 6);
  Outputs out = run(model, model.params(), {{"x", x}}, {mx::Device::cpu});
  EXPECT_EQ(max_abs_diff(out.tensor("y"), out.tensor("y2")), 0.0f);
}

TEST(PackMatmulNbits, CompiledMatchesEager) {
  NBitsLayer c{.bias = true};
  Model model = nbits_graph(c).build();
  mx::array x = random_array({2, 3, c.k}, 7);
  CompiledModel compiled = compile(model, {{"x", x}});
  EXPECT_LT(max_abs_diff(compiled({{"x", x}}).tensor("y"), run_y(model, x)), 1e-6f);
}

}  // namespace
}  // namespace transmuter
