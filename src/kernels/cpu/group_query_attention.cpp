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

// Where a step's new tokens go: batch row b's first one sits at first_position(b).
struct StepRows {
  const int32_t* seqlens;  // [B]
  int64_t sequence;
  bool first_prompt;

  int64_t valid_keys(int64_t b) const { return int64_t{seqlens[b]} + 1; }
  int64_t first_position(int64_t b) const { return first_prompt ? 0 : valid_keys(b) - sequence; }
};

// The rotary embedding: cos/sin rows [cache_rows, half]; half 0: none.
struct Rotary {
  const float *cos = nullptr, *sin = nullptr;
  int64_t cache_rows = 0, half = 0;
  bool interleaved = false;

  // y = x (dim features) with its first 2 * half features rotated by the cache row of `position`
  // (clamped into the cache), as rotate_pairs (ops/onnx/attention_common.h) computes.
  void rotate(const float* x, int64_t dim, int64_t position, float* y) const {
    std::memcpy(y, x, static_cast<size_t>(dim) * sizeof(float));
    if (half == 0) return;
    const int64_t row = std::clamp<int64_t>(position, 0, cache_rows - 1);
    const float* c = cos + row * half;
    const float* s = sin + row * half;
    for (int64_t t = 0; t < half; ++t) {
      const int64_t i1 = interleaved ? 2 * t : t, i2 = interleaved ? 2 * t + 1 : t + half;
      const float x1 = x[i1], x2 = x[i2];
      y[i1] = x1 * c[t] - x2 * s[t];
      y[i2] = x1 * s[t] + x2 * c[t];
    }
  }
};

// One cache write's pointers and sizes.
struct KvWriteArgs {
  const float* past;  // [B, Kv, past_rows, H]
  int64_t past_rows;
  const float* source;  // one row of `stride` floats per token, the heads from `column` on
  int64_t stride, column;
  StepRows rows;
  Rotary rotary;
  float* present;  // [B, Kv, capacity, H]; == past when it took the past's buffer
  int64_t batch, kv_heads, head_size, capacity;
};

// Present rows of batch row b, kv head g: the past's rows before the new tokens, the new (rotated)
// rows at their positions, zeros after. A present that took over the past's buffer has the past's
// rows already and keeps those after the new tokens as they are, as ONNX Runtime's shared buffer
// does (no query reads them): a decode step then writes its new row and nothing else.
inline void WritePresent(const KvWriteArgs& a, int64_t b, int64_t g) {
  const int64_t dim = a.head_size, rows = a.capacity;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  float* present = a.present + (b * a.kv_heads + g) * rows * dim;
  const int64_t start = a.rows.first_position(b);
  if (a.present != a.past) {
    const int64_t before = std::clamp<int64_t>(start, 0, rows);
    const int64_t kept = std::min(before, a.past_rows);
    if (kept > 0) std::memcpy(present, a.past + (b * a.kv_heads + g) * a.past_rows * dim, kept * row_bytes);
    std::memset(present + kept * dim, 0, (rows - kept) * row_bytes);
  }
  for (int64_t i = 0; i < a.rows.sequence; ++i) {
    const int64_t position = start + i;
    if (position < 0 || position >= rows) continue;  // a bad traced length writes nothing outside
    const int64_t token = b * a.rows.sequence + i;
    a.rotary.rotate(a.source + token * a.stride + a.column + g * dim, dim, position,
                    present + position * dim);
  }
}

// The attention's pointers and sizes.
struct GqaArgs {
  const float* q;  // one row of `q_stride` floats per token, the heads from `q_column` on
  int64_t q_stride, q_column;
  const float *key_cache, *value_cache;  // the presents [B, Kv, capacity, H]
  StepRows rows;
  Rotary rotary;
  const float* sink;  // [N] or null
  float* out;
  int64_t batch, heads, kv_heads, head_size, capacity;
  bool causal;
  int64_t window;
  float scale, softcap;
};

// Per-thread scratch: the rotated query and one row of scores (+ the sink), padded to whole vectors.
struct GqaScratch {
  std::vector<float> query, scores;
};

}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Query i of head h in batch row b, over the keys [lo, hi) it may see in the present buffer.
void AttendQuery(const GqaArgs& a, int64_t b, int64_t h, int64_t i, GqaScratch& scratch) {
  const int64_t dim = a.head_size;
  const int64_t token = b * a.rows.sequence + i;
  float* out = a.out + (token * a.heads + h) * dim;
  const int64_t position = a.rows.first_position(b) + i;
  int64_t hi = std::min(a.rows.valid_keys(b), a.capacity);
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
  a.rotary.rotate(a.q + token * a.q_stride + a.q_column + h * dim, dim, position, q);

  const int64_t g = h / (a.heads / a.kv_heads);
  const int64_t head_rows = (b * a.kv_heads + g) * a.capacity;
  ScoreRowInPlace(q, a.key_cache + (head_rows + lo) * dim, keys, dim, scores);
  for (int64_t j = 0; j < keys; ++j) {
    float score = scores[j] * a.scale;
    if (a.softcap > 0) score = a.softcap * std::tanh(score / a.softcap);
    scores[j] = score;
  }
  int64_t logits = keys;
  if (a.sink != nullptr) scores[logits++] = a.sink[h];  // weight for the sink, no value
  SoftmaxRow(scores, nullptr, 1.0f, logits, logits, EmptyRow::kZeros, scores);
  ValueRows<1>(scores, 0, keys, a.value_cache + (head_rows + lo) * dim, dim, out);
}

void AttendQueries(const GqaArgs& a, int64_t begin, int64_t end) {
  thread_local GqaScratch scratch;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t i = item % a.rows.sequence, head = item / a.rows.sequence;
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

Rotary rotary_of(bool rotate, bool interleaved, const mx::array& cos, const mx::array& sin) {
  if (!rotate) return {};
  return {cos.data<float>(), sin.data<float>(), cos.shape(0), cos.shape(1), interleaved};
}

class KvCacheWriteKernel : public CpuKernel {
 public:
  KvCacheWriteKernel(mx::Stream stream, Reference reference, KvCacheWriteSpec spec)
      : CpuKernel(stream, std::move(reference)), spec_(spec) {}
  const char* name() const override { return "transmuter::KvCacheWrite"; }

 protected:
  int donor_of(size_t) const override { return 0; }  // the past, when it has `capacity` rows

  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    KvWriteArgs a{};
    a.past = in[0].data<float>();
    a.past_rows = in[0].shape(2);
    a.source = in[1].data<float>();
    a.stride = in[1].shape(2);
    a.column = spec_.column;
    a.rows = {in[2].data<int32_t>(), in[1].shape(1), spec_.first_prompt};
    a.rotary = rotary_of(spec_.rotate, spec_.interleaved, in[3], in[4]);
    a.present = out[0].data<float>();
    a.batch = in[1].shape(0);
    a.kv_heads = spec_.kv_heads;
    a.head_size = spec_.head_size;
    a.capacity = spec_.capacity;
    return [a] {
      parallel_for(a.batch * a.kv_heads, grain_for(a.capacity * a.head_size),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t item = begin; item < end; ++item)
                       WritePresent(a, item / a.kv_heads, item % a.kv_heads);
                   });
    };
  }

 private:
  KvCacheWriteSpec spec_;
};

class GroupQueryAttentionKernel : public CpuKernel {
 public:
  GroupQueryAttentionKernel(mx::Stream stream, Reference reference, GroupQueryAttentionSpec spec)
      : CpuKernel(stream, std::move(reference)), spec_(spec) {}
  const char* name() const override { return "transmuter::GroupQueryAttention"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    GqaArgs a{};
    a.q = in[0].data<float>();
    a.q_stride = in[0].shape(2);
    a.q_column = spec_.q_column;
    a.key_cache = in[1].data<float>();
    a.value_cache = in[2].data<float>();
    a.rows = {in[3].data<int32_t>(), in[0].shape(1), spec_.first_prompt};
    a.rotary = rotary_of(spec_.rotary, spec_.interleaved, in[4], in[5]);
    a.sink = spec_.sink ? in[6].data<float>() : nullptr;
    a.out = out[0].data<float>();
    a.batch = in[0].shape(0);
    a.heads = spec_.heads;
    a.kv_heads = spec_.kv_heads;
    a.head_size = spec_.head_size;
    a.capacity = spec_.capacity;
    a.causal = spec_.causal;
    a.window = spec_.window;
    a.scale = spec_.scale;
    a.softcap = spec_.softcap;
    return [a] {
      const int64_t work = 2 * a.capacity * a.head_size;
      parallel_for(a.batch * a.heads * a.rows.sequence, grain_for(work), [&](int64_t begin, int64_t end) {
        HWY_DYNAMIC_DISPATCH(AttendQueries)(a, begin, end);
      });
    };
  }

 private:
  GroupQueryAttentionSpec spec_;
};

bool is_float_rank(const mx::array& x, size_t rank) { return x.dtype() == mx::float32 && x.ndim() == rank; }

// A source [B, S, >= column + heads * H] float32 of this batch and sequence.
bool fits_source(const mx::array& x, int batch, int sequence, int64_t column, int64_t heads, int64_t h) {
  return is_float_rank(x, 3) && x.shape(0) == batch && x.shape(1) == sequence &&
         x.shape(2) >= column + heads * h;
}

// A cache buffer [B, Kv, rows <= capacity (== capacity: exactly), H] float32.
bool fits_cache(const mx::array& x, int batch, int kv_heads, int head_size, int capacity, bool exactly) {
  return is_float_rank(x, 4) && x.shape(0) == batch && x.shape(1) == kv_heads && x.shape(3) == head_size &&
         (exactly ? x.shape(2) == capacity : x.shape(2) <= capacity);
}

bool fits_seqlens(const mx::array& x, int batch) {
  return x.dtype() == mx::int32 && x.shape() == mx::Shape{batch};
}

bool fits_rotary(const mx::array& cos, const mx::array& sin, int64_t head_size) {
  return is_float_rank(cos, 2) && sin.shape() == cos.shape() && sin.dtype() == mx::float32 &&
         cos.shape(0) > 0 && 2 * int64_t{cos.shape(1)} <= head_size;
}

// The inputs have the shapes and types the kernels read (else the reference runs).
bool fits_write(const std::vector<mx::array>& in, const KvCacheWriteSpec& spec) {
  if (in.size() != 5 || spec.kv_heads <= 0 || spec.head_size <= 0 || in[1].ndim() != 3) return false;
  const int batch = in[1].shape(0), sequence = in[1].shape(1);
  return fits_source(in[1], batch, sequence, spec.column, spec.kv_heads, spec.head_size) &&
         fits_cache(in[0], batch, spec.kv_heads, spec.head_size, spec.capacity, false) &&
         fits_seqlens(in[2], batch) && (!spec.rotate || fits_rotary(in[3], in[4], spec.head_size));
}

bool fits_attention(const std::vector<mx::array>& in, const GroupQueryAttentionSpec& spec) {
  if (in.size() != 7 || spec.heads <= 0 || spec.kv_heads <= 0 || spec.heads % spec.kv_heads != 0)
    return false;
  if (spec.head_size <= 0 || in[0].ndim() != 3) return false;
  const int batch = in[0].shape(0), sequence = in[0].shape(1);
  if (!fits_source(in[0], batch, sequence, spec.q_column, spec.heads, spec.head_size)) return false;
  for (int i : {1, 2}) {
    if (!fits_cache(in[i], batch, spec.kv_heads, spec.head_size, spec.capacity, true)) return false;
  }
  if (!fits_seqlens(in[3], batch)) return false;
  if (spec.rotary && !fits_rotary(in[4], in[5], spec.head_size)) return false;
  return !spec.sink || (in[6].dtype() == mx::float32 && in[6].shape() == mx::Shape{spec.heads});
}

}  // namespace

mx::array kv_cache_write(std::vector<mx::array> inputs, const KvCacheWriteSpec& spec,
                         const Reference& reference, mx::StreamOrDevice s) {
  if (!fits_write(inputs, spec)) return reference(inputs)[0];
  const mx::Shape present = {inputs[1].shape(0), spec.kv_heads, spec.capacity, spec.head_size};
  return make_cpu_kernel_outputs(
      [&](mx::Stream stream) { return std::make_shared<KvCacheWriteKernel>(stream, reference, spec); },
      reference, std::move(inputs), {present}, {mx::float32}, s)[0];
}

mx::array group_query_attention(std::vector<mx::array> inputs, const GroupQueryAttentionSpec& spec,
                                const Reference& reference, mx::StreamOrDevice s) {
  if (!fits_attention(inputs, spec)) return reference(inputs)[0];
  const int batch = inputs[0].shape(0), sequence = inputs[0].shape(1);
  return make_cpu_kernel_outputs(
      [&](mx::Stream stream) { return std::make_shared<GroupQueryAttentionKernel>(stream, reference, spec); },
      reference, std::move(inputs), {{batch, sequence, spec.heads * spec.head_size}}, {mx::float32}, s)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
