// com.microsoft Attention, MultiHeadAttention, GroupQueryAttention and
// RotaryEmbedding: the forms ONNX Runtime's CPU kernels refuse (checked against
// equivalent forms it accepts) and the errors. Their values against ONNX
// Runtime are the contrib cases of scripts/contrib_cases/attention.py.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "support/random_arrays.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::int_attr;
using testing::max_abs_diff;
using testing::out0;
using testing::random_array;

std::vector<Value> run_ms(const std::string& op, const std::vector<Value>& inputs,
                          const std::vector<Attribute>& attributes, int outputs = 1) {
  return testing::run_domain_op("com.microsoft", op, 1, inputs, attributes, outputs);
}

// Both sides compute the same float32 products in the same order but through
// different ops (kernel vs composition); a few ulps of unit-scale outputs.
constexpr float kTolerance = 1e-5f;

mx::array i32(std::vector<int32_t> v, mx::Shape shape) {
  return mx::reshape(mx::array(v.data(), {static_cast<int>(v.size())}, mx::int32), shape);
}

// Error messages name the op, the node and the offending input.
void expect_message(const std::string& message, const std::string& op, const std::string& part) {
  EXPECT_NE(message.find("node 'test_" + op + "'"), std::string::npos) << message;
  EXPECT_NE(message.find(part), std::string::npos) << message;
}

TEST(MicrosoftAttention, FourDimensionalMaskReadsRowsAfterThePast) {
  // [B, 1, M, M] (Megatron): rows P..P+S and columns 0..T of it are the 3-D
  // mask [B, S, T]. ONNX Runtime's CPU kernel refuses the 4-D form.
  const int batch = 2, seq = 3, past = 2, total = past + seq, max = 6, hidden = 16;
  mx::array x = random_array({batch, seq, hidden}, 1), w = random_array({hidden, 3 * hidden}, 2, 0.3f);
  mx::array b = random_array({3 * hidden}, 3), state = random_array({2, batch, 2, past, 8}, 4);
  std::vector<int32_t> full(batch * max * max);
  for (size_t i = 0; i < full.size(); ++i) full[i] = (i * 7 + i / 5) % 3 != 0 || i % max == 0;
  mx::array mask4 = i32(full, {batch, 1, max, max});
  mx::array mask3 =
      mx::reshape(mx::slice(mask4, {0, 0, past, 0}, {batch, 1, past + seq, total}), {batch, seq, total});
  const std::vector<Attribute> attrs = {int_attr("num_heads", 2)};
  std::vector<Value> four = run_ms("Attention", {x, w, b, mask4, state}, attrs, 2);
  std::vector<Value> three = run_ms("Attention", {x, w, b, mask3, state}, attrs, 2);
  EXPECT_LT(max_abs_diff(four[0].tensor(), three[0].tensor()), kTolerance);
  EXPECT_EQ(four[1].tensor().shape(), (mx::Shape{2, batch, 2, total, 8}));
  // A mask that does mask something: the result differs from no mask.
  mx::array unmasked = out0(run_ms("Attention", {x, w, b, Value(), state}, attrs));
  EXPECT_GT(max_abs_diff(four[0].tensor(), unmasked), 1e-3f);
}

TEST(MicrosoftAttention, MultiHeadAttentionPackedFormsMatchSeparateInputs) {
  // Packed QKV [B, S, N, 3, H] and packed KV [B, L, N, 2, H] (refused by ONNX
  // Runtime's CPU kernel) against the same Q, K, V given separately.
  const int batch = 2, seq = 4, heads = 2, head = 8;
  mx::array packed = random_array({batch, seq, heads, 3, head}, 5);
  auto part = [&](const mx::array& p, int i) {
    mx::array one = mx::slice(p, {0, 0, 0, i, 0}, {batch, seq, heads, i + 1, head});
    return mx::reshape(one, {batch, seq, heads * head});
  };
  mx::array bias = random_array({3 * heads * head}, 6);
  const std::vector<Attribute> attrs = {int_attr("num_heads", heads), int_attr("unidirectional", 1)};
  mx::array separate =
      out0(run_ms("MultiHeadAttention", {part(packed, 0), part(packed, 1), part(packed, 2), bias}, attrs));
  mx::array qkv = out0(run_ms("MultiHeadAttention", {packed, Value(), Value(), bias}, attrs));
  EXPECT_LT(max_abs_diff(qkv, separate), kTolerance);
  mx::array kv_packed = mx::slice(packed, {0, 0, 0, 1, 0}, {batch, seq, heads, 3, head});
  mx::array kv = out0(run_ms("MultiHeadAttention", {part(packed, 0), kv_packed, Value(), bias}, attrs));
  EXPECT_LT(max_abs_diff(kv, separate), kTolerance);
}

TEST(MicrosoftAttention, MultiHeadAttentionQkIsTheBiasedScoresBeforeTheSoftmax) {
  // Output 3 (qk): scale * Q K^T plus the mask and attention_bias, [B, N, S, T];
  // softmax(qk) V is the output.
  const int batch = 2, seq = 3, kv_seq = 5, heads = 2, head = 8;
  mx::array q = random_array({batch, seq, heads * head}, 30),
            k = random_array({batch, kv_seq, heads * head}, 31);
  mx::array v = random_array({batch, kv_seq, heads * head}, 32),
            bias = random_array({1, heads, seq, kv_seq}, 33);
  std::vector<Value> out = run_ms("MultiHeadAttention", {q, k, v, Value(), i32({4, 5}, {2}), bias},
                                  {int_attr("num_heads", heads), float_attr("scale", 0.5f)}, 4);
  ASSERT_EQ(out.size(), 4u);
  auto heads_of = [&](const mx::array& x, int length) {
    return mx::transpose(mx::reshape(x, {batch, length, heads, head}), {0, 2, 1, 3});
  };
  mx::array key_position = mx::reshape(mx::arange(kv_seq), {1, 1, 1, kv_seq});
  mx::array lengths = mx::reshape(mx::array({4, 5}), {batch, 1, 1, 1});
  mx::array padding = mx::where(key_position >= lengths, mx::array(-10000.0f), mx::array(0.0f));
  mx::array scores =
      mx::matmul(heads_of(q, seq), mx::swapaxes(heads_of(k, kv_seq), -1, -2)) * 0.5f + padding + bias;
  EXPECT_LT(max_abs_diff(out[3].tensor(), scores), kTolerance);
  mx::array y = mx::matmul(mx::softmax(scores, -1, true), heads_of(v, kv_seq));
  y = mx::reshape(mx::transpose(y, {0, 2, 1, 3}), {batch, seq, heads * head});
  EXPECT_LT(max_abs_diff(out[0].tensor(), y), kTolerance);
}

TEST(MicrosoftAttention, AttentionErrorsNameTheInput) {
  mx::array x = random_array({2, 3, 16}, 7), w = random_array({16, 48}, 8), b = random_array({48}, 9);
  const std::vector<Attribute> attrs = {int_attr("num_heads", 2)};
  expect_message(error_of<OpError>([&] { run_ms("Attention", {x}, attrs); }), "Attention",
                 "weights (input 1) is required");
  expect_message(error_of<OpError>([&] {
                   run_ms("Attention", {x, random_array({8, 48}, 10), b}, attrs);
                 }),
                 "Attention", "weights must be 2-D [16, q + k + v hidden], got (8,48)");
  expect_message(error_of<OpError>([&] {
                   run_ms("Attention", {x, w, random_array({40}, 11)}, attrs);
                 }),
                 "Attention", "bias must be [48], got (40)");
  expect_message(error_of<OpError>([&] {
                   run_ms("Attention", {x, w, b, i32({1, 2, 3}, {3})}, attrs);
                 }),
                 "Attention", "mask_index has shape (3)");
  expect_message(error_of<OpError>([&] {
                   run_ms("Attention", {x, w, b}, {int_attr("num_heads", 3)});
                 }),
                 "Attention", "hidden size 16 is not divisible by 3 heads");
  expect_message(error_of<OpError>([&] {
                   run_ms("Attention", {x, w, b}, {int_attr("num_heads", 2), int_attr("do_rotary", 1)});
                 }),
                 "Attention", "do_rotary is not supported");
  expect_message(error_of<OpError>([&] {
                   run_ms("Attention", {x, w, b, Value(), random_array({2, 2, 2, 3, 4}, 12)}, attrs);
                 }),
                 "Attention", "past must be [2, 2, 2, past_sequence, 8]");
  expect_message(error_of<OpError>([&] {
                   run_ms("Attention", {x, w, b}, {});
                 }),
                 "Attention", "required attribute 'num_heads' is missing");
}

TEST(MicrosoftAttention, MultiHeadAttentionErrorsNameTheInput) {
  mx::array q = random_array({2, 3, 16}, 13), k = random_array({2, 5, 16}, 14);
  const std::vector<Attribute> attrs = {int_attr("num_heads", 2)};
  expect_message(error_of<OpError>([&] { run_ms("MultiHeadAttention", {q}, attrs); }), "MultiHeadAttention",
                 "key is required unless the query is packed QKV");
  expect_message(error_of<OpError>([&] {
                   run_ms("MultiHeadAttention", {q, k}, attrs);
                 }),
                 "MultiHeadAttention", "value is required");
  expect_message(error_of<OpError>([&] {
                   run_ms("MultiHeadAttention", {q, random_array({2, 5, 12}, 15), k}, attrs);
                 }),
                 "MultiHeadAttention", "do not fit query (2,3,16)");
  expect_message(error_of<OpError>([&] {
                   run_ms("MultiHeadAttention", {q, k, k, Value(), i32({1, 1, 1, 1}, {2, 2})}, attrs);
                 }),
                 "MultiHeadAttention", "key_padding_mask has shape (2,2)");
  expect_message(
      error_of<OpError>([&] {
        run_ms("MultiHeadAttention", {q, k, k, Value(), Value(), random_array({2, 2, 3, 4}, 16)}, attrs);
      }),
      "MultiHeadAttention", "attention_bias must be [2 or 1, 2 or 1, 3, 5], got (2,2,3,4)");
  expect_message(error_of<OpError>([&] {
                   run_ms("MultiHeadAttention", {q, k, mx::astype(k, mx::float16)}, attrs);
                 }),
                 "MultiHeadAttention", "value has dtype float16 but the query has float32");
}

TEST(MicrosoftAttention, GroupQueryAttentionErrorsNameTheInput) {
  mx::array q = random_array({1, 4, 32}, 17), k = random_array({1, 4, 16}, 18);
  mx::array seqlens = i32({3}, {1}), total = i32({4}, {});
  const std::vector<Attribute> attrs = {int_attr("num_heads", 4), int_attr("kv_num_heads", 2)};
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention", {q, k, k}, attrs);
                 }),
                 "GroupQueryAttention", "seqlens_k (input 5) is required");
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention", {q, k, k, Value(), Value(), seqlens, total},
                          {int_attr("num_heads", 4), int_attr("kv_num_heads", 3)});
                 }),
                 "GroupQueryAttention", "num_heads 4 is not a multiple of kv_num_heads 3");
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention",
                          {q, random_array({1, 4, 12}, 19), k, Value(), Value(), seqlens, total}, attrs);
                 }),
                 "GroupQueryAttention", "must be [1, 4, 16]");
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention", {q, k, k, Value(), Value(), i32({3, 3}, {2}), total}, attrs);
                 }),
                 "GroupQueryAttention", "seqlens_k must be an int32 vector of the batch size 1");
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention", {q, k, k, Value(), Value(), seqlens, i32({6}, {})}, attrs);
                 }),
                 "GroupQueryAttention", "no past_key/past_value");
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention", {q, k, k, Value(), Value(), i32({4}, {1}), total}, attrs);
                 }),
                 "GroupQueryAttention", "seqlens_k + 1 must lie in [1, 4] (total_sequence_length), got 5");
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention", {q, k, k, Value(), Value(), seqlens, total},
                          {int_attr("num_heads", 4), int_attr("kv_num_heads", 2), int_attr("do_rotary", 1)});
                 }),
                 "GroupQueryAttention", "do_rotary needs cos_cache and sin_cache");
  expect_message(error_of<OpError>([&] {
                   run_ms("GroupQueryAttention", {q, k, k, Value(), Value(), seqlens, total},
                          {int_attr("num_heads", 4), int_attr("kv_num_heads", 2), int_attr("causal", 0),
                           int_attr("local_window_size", 2)});
                 }),
                 "GroupQueryAttention", "local_window_size must be -1 when causal is 0");
  expect_message(error_of<OpError>([&] {
                   run_ms(
                       "GroupQueryAttention", {q, k, k, Value(), Value(), seqlens, total},
                       {int_attr("num_heads", 4), int_attr("kv_num_heads", 2), float_attr("softcap", -1.0f)});
                 }),
                 "GroupQueryAttention", "softcap must be nonnegative");
  // sliding_window_cache: a window, and buffers at least as long as it.
  const std::vector<Attribute> windowed = {int_attr("num_heads", 4), int_attr("kv_num_heads", 2),
                                           int_attr("sliding_window_cache", 1),
                                           int_attr("local_window_size", 4)};
  expect_message(
      error_of<OpError>([&] {
        run_ms("GroupQueryAttention", {q, k, k, Value(), Value(), seqlens, total},
               {int_attr("num_heads", 4), int_attr("kv_num_heads", 2), int_attr("sliding_window_cache", 1)});
      }),
      "GroupQueryAttention", "sliding_window_cache needs local_window_size > 0, got -1");
  mx::array short_past = random_array({1, 2, 3, 8}, 24);
  expect_message(
      error_of<OpError>([&] {
        run_ms("GroupQueryAttention", {q, k, k, short_past, short_past, seqlens, total}, windowed);
      }),
      "GroupQueryAttention",
      "sliding_window_cache needs past_key/past_value buffers of at least local_window_size 4 rows, got 3");
}

TEST(MicrosoftAttention, GroupQueryAttentionSharedBufferKeepsItsLength) {
  // Token generation into a buffer of 6 rows holding 2 (batch 0) and 4
  // (batch 1) past tokens: present keeps 6 rows, past rows up to P_b, the new
  // row at P_b, zeros after.
  mx::array q = random_array({2, 1, 32}, 20), k = random_array({2, 1, 16}, 21),
            v = random_array({2, 1, 16}, 22);
  mx::array past = random_array({2, 2, 6, 8}, 23);
  std::vector<Value> out =
      run_ms("GroupQueryAttention", {q, k, v, past, past, i32({2, 4}, {2}), i32({5}, {})},
             {int_attr("num_heads", 4), int_attr("kv_num_heads", 2)}, 3);
  const mx::array& present = out[1].tensor();
  ASSERT_EQ(present.shape(), (mx::Shape{2, 2, 6, 8}));
  mx::array new_key = mx::transpose(mx::reshape(k, {2, 1, 2, 8}), {0, 2, 1, 3});
  EXPECT_EQ(max_abs_diff(mx::slice(present, {0, 0, 0, 0}, {1, 2, 2, 8}),
                         mx::slice(past, {0, 0, 0, 0}, {1, 2, 2, 8})),
            0.0f);
  EXPECT_EQ(max_abs_diff(mx::slice(present, {0, 0, 2, 0}, {1, 2, 3, 8}),
                         mx::slice(new_key, {0, 0, 0, 0}, {1, 2, 1, 8})),
            0.0f);
  EXPECT_EQ(max_abs_diff(mx::slice(present, {0, 0, 3, 0}, {1, 2, 6, 8}), mx::zeros({1, 2, 3, 8})), 0.0f);
  EXPECT_EQ(max_abs_diff(mx::slice(present, {1, 0, 4, 0}, {2, 2, 5, 8}),
                         mx::slice(new_key, {1, 0, 0, 0}, {2, 2, 1, 8})),
            0.0f);
}

TEST(MicrosoftAttention, RotaryEmbeddingErrorsNameTheInput) {
  mx::array x = random_array({1, 3, 16}, 24), ids = testing::i64({0, 1, 2}, {1, 3});
  mx::array cos = random_array({8, 4}, 25);
  const std::vector<Attribute> attrs = {int_attr("num_heads", 2)};
  expect_message(error_of<OpError>([&] {
                   run_ms("RotaryEmbedding", {x, ids}, attrs);
                 }),
                 "RotaryEmbedding", "cos_cache (input 2) is required");
  expect_message(
      error_of<OpError>([&] {
        run_ms("RotaryEmbedding", {x, ids, random_array({8, 3}, 26), random_array({8, 3}, 27)}, attrs);
      }),
      "RotaryEmbedding", "cos_cache has 3 columns, expected rotary_embedding_dim / 2 = 4");
  expect_message(error_of<OpError>([&] {
                   run_ms("RotaryEmbedding", {x, ids, cos, cos}, {int_attr("rotary_embedding_dim", 8)});
                 }),
                 "RotaryEmbedding", "rotary_embedding_dim needs the num_heads attribute");
  expect_message(error_of<OpError>([&] {
                   run_ms("RotaryEmbedding", {x, testing::i64({0, 1}, {1, 2}), cos, cos}, attrs);
                 }),
                 "RotaryEmbedding", "position_ids must hold one offset or be [batch, sequence] = [1, 3]");
  expect_message(error_of<OpError>([&] {
                   run_ms("RotaryEmbedding", {x, testing::i64({0, 1, 9}, {1, 3}), cos, cos}, attrs);
                 }),
                 "RotaryEmbedding", "position id 9 out of range for cos_cache with 8 positions");
  expect_message(error_of<OpError>([&] {
                   run_ms("RotaryEmbedding", {random_array({3, 16}, 28), ids, cos, cos}, attrs);
                 }),
                 "RotaryEmbedding", "input must be 3-D");
}

}  // namespace
}  // namespace transmuter
