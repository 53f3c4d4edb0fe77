// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); group_query_attention picks the best target at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/group_query_attention.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_rows-inl.h"
#include "kernels/cpu/softmax_row-inl.h"

#ifndef TRANSMUTER_KERNELS_CPU_GROUP_QUERY_ATTENTION_ARGS
#define TRANSMUTER_KERNELS_CPU_GROUP_QUERY_ATTENTION_ARGS
namespace transmuter::kernels {
// One call's pointers and sizes (outside the per-target namespaces).
struct GqaArgs {
  const float *q, *k, *v;                // sources: one row of `*_stride` floats per token
  int64_t q_stride, k_stride, v_stride;  // floats per source row
  int64_t q_column, k_column, v_column;  // where Q, K, V start within a row
  const float *past_key, *past_value;    // [B, Kv, past_rows, H]
  int64_t past_rows;
  const int32_t* seqlens;  // [B]
  const float *cos, *sin;  // [cache_rows, half]; half 0: no rotary
  int64_t cache_rows, half;
  bool interleaved;
  const float* sink;  // [N] or null
  float *out, *present_key, *present_value;
  int64_t batch, sequence, heads, kv_heads, head_size, capacity;
  bool first_prompt, causal;
  int64_t window;
  float scale, softcap;
};

// Per-thread scratch: the rotated query and one row of scores (+ the sink), padded to whole vectors.
struct GqaScratch {
  std::vector<float> query, scores;
};

inline int64_t valid_keys(const GqaArgs& a, int64_t b) { return int64_t{a.seqlens[b]} + 1; }

// The position of batch row b's first new token.
inline int64_t first_position(const GqaArgs& a, int64_t b) {
  return a.first_prompt ? 0 : valid_keys(a, b) - a.sequence;
}

// y = x (head_size features) with its first 2 * half features rotated by the cache row of `position`
// (clamped into the cache), as rotate_pairs (ops/onnx/attention_common.h) computes.
inline void RotateHead(const GqaArgs& a, const float* x, int64_t position, float* y) {
  std::memcpy(y, x, static_cast<size_t>(a.head_size) * sizeof(float));
  if (a.half == 0) return;
  const int64_t row = std::clamp<int64_t>(position, 0, a.cache_rows - 1);
  const float* c = a.cos + row * a.half;
  const float* s = a.sin + row * a.half;
  for (int64_t t = 0; t < a.half; ++t) {
    const int64_t i1 = a.interleaved ? 2 * t : t, i2 = a.interleaved ? 2 * t + 1 : t + a.half;
    const float x1 = x[i1], x2 = x[i2];
    y[i1] = x1 * c[t] - x2 * s[t];
    y[i2] = x1 * s[t] + x2 * c[t];
  }
}

// Present rows of batch row b, kv head g: the past's rows before the new tokens, the new (rotated)
// keys and values at their positions, zeros elsewhere.
inline void WritePresents(const GqaArgs& a, int64_t b, int64_t g) {
  const int64_t dim = a.head_size, rows = a.capacity;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  float* key = a.present_key + (b * a.kv_heads + g) * rows * dim;
  float* value = a.present_value + (b * a.kv_heads + g) * rows * dim;
  const int64_t start = first_position(a, b);
  const int64_t before = std::clamp<int64_t>(start, 0, rows);
  const int64_t copied = std::min(before, a.past_rows);
  if (copied > 0) {
    const int64_t from = (b * a.kv_heads + g) * a.past_rows * dim;
    std::memcpy(key, a.past_key + from, copied * row_bytes);
    std::memcpy(value, a.past_value + from, copied * row_bytes);
  }
  std::memset(key + copied * dim, 0, (rows - copied) * row_bytes);
  std::memset(value + copied * dim, 0, (rows - copied) * row_bytes);
  for (int64_t i = 0; i < a.sequence; ++i) {
    const int64_t position = start + i;
    if (position < 0 || position >= rows) continue;  // a bad traced length writes nothing outside
    const int64_t token = b * a.sequence + i;
    RotateHead(a, a.k + token * a.k_stride + a.k_column + g * dim, position, key + position * dim);
    std::memcpy(value + position * dim, a.v + token * a.v_stride + a.v_column + g * dim, row_bytes);
  }
}

}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Query i of head h in batch row b, over the keys [lo, hi) it may see in the present buffer.
void AttendQuery(const GqaArgs& a, int64_t b, int64_t h, int64_t i, GqaScratch& scratch) {
  const int64_t dim = a.head_size;
  const int64_t token = b * a.sequence + i;
  float* out = a.out + (token * a.heads + h) * dim;
  const int64_t position = first_position(a, b) + i;
  int64_t hi = std::min(valid_keys(a, b), a.capacity);
  if (a.causal) hi = std::min(hi, position + 1);
  const int64_t lo = a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0;
  if (hi <= lo) {  // nothing to attend: zeros, as the composition's fully masked rows
    std::fill(out, out + dim, 0.0f);
    return;
  }
  const int64_t keys = hi - lo;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  scratch.query.resize(static_cast<size_t>(dim));
  scratch.scores.resize(static_cast<size_t>(keys + 1 + lanes));
  float* q = scratch.query.data();
  float* scores = scratch.scores.data();
  RotateHead(a, a.q + token * a.q_stride + a.q_column + h * dim, position, q);

  const int64_t g = h / (a.heads / a.kv_heads);
  const int64_t head_rows = (b * a.kv_heads + g) * a.capacity;
  ScoreRowInPlace(q, a.present_key + (head_rows + lo) * dim, keys, dim, scores);
  for (int64_t j = 0; j < keys; ++j) {
    float score = scores[j] * a.scale;
    if (a.softcap > 0) score = a.softcap * std::tanh(score / a.softcap);
    scores[j] = score;
  }
  int64_t logits = keys;
  if (a.sink != nullptr) scores[logits++] = a.sink[h];  // weight for the sink, no value
  SoftmaxRow(scores, nullptr, 1.0f, logits, logits, EmptyRow::kZeros, scores);
  ValueRows<1>(scores, 0, keys, a.present_value + (head_rows + lo) * dim, dim, out);
}

void AttendQueries(const GqaArgs& a, int64_t begin, int64_t end) {
  thread_local GqaScratch scratch;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t i = item % a.sequence, head = item / a.sequence;
    AttendQuery(a, head / a.heads, head % a.heads, i, scratch);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/group_query_attention.h"

#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(AttendQueries);

namespace {

// Items per chunk so that a chunk is worth handing to another thread (~64 K multiply-adds): a
// decode step's few rows stay on the calling thread instead of waking the pool.
int64_t grain_for(int64_t work_per_item) {
  constexpr int64_t kChunkWork = int64_t{1} << 16;
  return std::max<int64_t>(1, kChunkWork / std::max<int64_t>(1, work_per_item));
}

class GroupQueryAttentionKernel : public CpuKernel {
 public:
  GroupQueryAttentionKernel(mx::Stream stream, Reference reference, GroupQueryAttentionSpec spec)
      : CpuKernel(stream, std::move(reference)), spec_(spec) {}
  const char* name() const override { return "transmuter::GroupQueryAttention"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    GqaArgs a{};
    a.q = in[0].data<float>();
    a.k = in[1].data<float>();
    a.v = in[2].data<float>();
    a.q_stride = in[0].shape(2);
    a.k_stride = in[1].shape(2);
    a.v_stride = in[2].shape(2);
    a.q_column = spec_.q_column;
    a.k_column = spec_.k_column;
    a.v_column = spec_.v_column;
    a.past_key = in[3].data<float>();
    a.past_value = in[4].data<float>();
    a.past_rows = in[3].shape(2);
    a.seqlens = in[5].data<int32_t>();
    if (spec_.rotary) {
      a.cos = in[6].data<float>();
      a.sin = in[7].data<float>();
      a.cache_rows = in[6].shape(0);
      a.half = in[6].shape(1);
    }
    a.interleaved = spec_.interleaved;
    a.sink = spec_.sink ? in[8].data<float>() : nullptr;
    a.out = out[0].data<float>();
    a.present_key = out[1].data<float>();
    a.present_value = out[2].data<float>();
    a.batch = in[0].shape(0);
    a.sequence = in[0].shape(1);
    a.heads = spec_.heads;
    a.kv_heads = spec_.kv_heads;
    a.head_size = spec_.head_size;
    a.capacity = spec_.capacity;
    a.first_prompt = spec_.first_prompt;
    a.causal = spec_.causal;
    a.window = spec_.window;
    a.scale = spec_.scale;
    a.softcap = spec_.softcap;
    return [a] {
      const int64_t rows = a.capacity * a.head_size;
      parallel_for(a.batch * a.kv_heads, grain_for(rows), [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) WritePresents(a, item / a.kv_heads, item % a.kv_heads);
      });
      parallel_for(a.batch * a.heads * a.sequence, grain_for(2 * rows), [&](int64_t begin, int64_t end) {
        HWY_DYNAMIC_DISPATCH(AttendQueries)(a, begin, end);
      });
    };
  }

 private:
  GroupQueryAttentionSpec spec_;
};

bool is_float_rank(const mx::array& x, size_t rank) { return x.dtype() == mx::float32 && x.ndim() == rank; }

// The inputs have the shapes and types the kernel reads (else the reference runs).
bool fits_kernel(const std::vector<mx::array>& in, const GroupQueryAttentionSpec& spec) {
  if (in.size() != 9 || spec.heads <= 0 || spec.kv_heads <= 0 || spec.heads % spec.kv_heads != 0)
    return false;
  if (spec.head_size <= 0) return false;
  const int batch = in[0].ndim() == 3 ? in[0].shape(0) : -1;
  const int sequence = in[0].ndim() == 3 ? in[0].shape(1) : -1;
  const int64_t h = spec.head_size;
  const int64_t needed[3] = {spec.q_column + spec.heads * h, spec.k_column + spec.kv_heads * h,
                             spec.v_column + spec.kv_heads * h};
  for (int i = 0; i < 3; ++i) {
    if (!is_float_rank(in[i], 3) || in[i].shape(0) != batch || in[i].shape(1) != sequence ||
        in[i].shape(2) < needed[i]) {
      return false;
    }
  }
  for (int i : {3, 4}) {
    if (!is_float_rank(in[i], 4) || in[i].shape() != in[3].shape() || in[i].shape(0) != batch ||
        in[i].shape(1) != spec.kv_heads || in[i].shape(3) != h || in[i].shape(2) > spec.capacity) {
      return false;
    }
  }
  if (in[5].dtype() != mx::int32 || in[5].shape() != mx::Shape{batch}) return false;
  if (spec.rotary) {
    if (!is_float_rank(in[6], 2) || in[7].shape() != in[6].shape() || in[7].dtype() != mx::float32 ||
        in[6].shape(0) == 0 || 2 * int64_t{in[6].shape(1)} > h) {
      return false;
    }
  }
  return !spec.sink || (in[8].dtype() == mx::float32 && in[8].shape() == mx::Shape{spec.heads});
}

}  // namespace

std::vector<mx::array> group_query_attention(std::vector<mx::array> inputs,
                                             const GroupQueryAttentionSpec& spec, const Reference& reference,
                                             mx::StreamOrDevice s) {
  if (!fits_kernel(inputs, spec)) return reference(inputs);
  const int batch = inputs[0].shape(0), sequence = inputs[0].shape(1);
  const mx::Shape present = {batch, spec.kv_heads, spec.capacity, spec.head_size};
  return make_cpu_kernel_outputs(
      [&](mx::Stream stream) { return std::make_shared<GroupQueryAttentionKernel>(stream, reference, spec); },
      reference, std::move(inputs), {{batch, sequence, spec.heads * spec.head_size}, present, present},
      {mx::float32, mx::float32, mx::float32}, s);
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
