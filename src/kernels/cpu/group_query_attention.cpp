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
#include <limits>
#include <vector>

#include "kernels/cpu/attention_rows-inl.h"
#include "kernels/cpu/lane_sums-inl.h"
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

// The keys split into blocks (flash decoding): a work item is one block of one (batch row, kv head)
// for all the query rows that share that kv head, so each key and value is read once per step and
// both threads stream the cache even when there are fewer kv heads than threads.
struct KeyBlocks {
  int64_t first = 0;       // the first key any query may see
  int64_t size = 0;        // keys per block
  int64_t count = 0;       // blocks per (batch row, kv head)
  int64_t group_rows = 0;  // query rows per kv head: (heads / kv_heads) x sequence
};

// Each item's results, per row of its group: the block's largest scaled score and the sum of
// exp(score - that max) (`stats`, 2 floats; max = kNoKeys when the row saw no key of the block), and
// sum_j exp(score_j - max) v_j (`values`, head_size floats). Item-major, then row.
struct Partials {
  float* stats;
  float* values;
};

// The keys [lo, hi) that query i of batch row b may see in the present buffer.
struct KeySpan {
  int64_t lo = 0, hi = 0;
};

inline KeySpan keys_of(const GqaArgs& a, int64_t b, int64_t i) {
  const int64_t position = a.rows.first_position(b) + i;
  int64_t hi = std::min(a.rows.valid_keys(b), a.capacity);
  if (a.causal) hi = std::min(hi, position + 1);
  const int64_t lo = a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0;
  return {lo, hi};
}

// Row r of a kv head's query rows: head kv_head * (heads / kv_heads) + r / S, query r % S.
struct GroupRow {
  int64_t head = 0, query = 0;
};

inline GroupRow group_row(const GqaArgs& a, int64_t kv_head, int64_t r) {
  return {kv_head * (a.heads / a.kv_heads) + r / a.rows.sequence, r % a.rows.sequence};
}

// A partial result's max when its row saw no keys in the block.
constexpr float kNoKeys = -std::numeric_limits<float>::infinity();

// Query row r of (batch row x kv head) `group`: its blocks' partial results merged into its output, the
// sink's logit (if any) in the denominator; zeros when it saw no keys, as the composition's fully
// masked rows.
inline void MergeRow(const GqaArgs& a, const KeyBlocks& blocks, const Partials& partials, int64_t group,
                     int64_t r) {
  const int64_t dim = a.head_size, b = group / a.kv_heads;
  const auto [h, i] = group_row(a, group % a.kv_heads, r);
  float* out = a.out + ((b * a.rows.sequence + i) * a.heads + h) * dim;
  auto row_of_block = [&](int64_t k) { return (group * blocks.count + k) * blocks.group_rows + r; };
  float top = kNoKeys;
  for (int64_t k = 0; k < blocks.count; ++k) top = std::max(top, partials.stats[2 * row_of_block(k)]);
  std::fill(out, out + dim, 0.0f);
  if (top == kNoKeys) return;
  if (a.sink != nullptr) top = std::max(top, a.sink[h]);
  float denominator = a.sink != nullptr ? std::exp(a.sink[h] - top) : 0.0f;
  for (int64_t k = 0; k < blocks.count; ++k) {
    const float* stats = partials.stats + 2 * row_of_block(k);
    if (stats[0] == kNoKeys) continue;
    const float weight = std::exp(stats[0] - top);
    denominator += weight * stats[1];
    const float* values = partials.values + row_of_block(k) * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] += weight * values[d];
  }
  for (int64_t d = 0; d < dim; ++d) out[d] /= denominator;
}

}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// scores[r * ld + j] = q_r . k_j for R query rows (head_size apart in q) over keys [0, n): each key row
// is loaded once for every row, four keys at a time (their sums across lanes reduced together: SumsOfFour).
template <int R>
HWY_INLINE void ScoreRows(const float* q, const float* k, int64_t n, int64_t dim, float* scores, int64_t ld) {
#if HWY_TARGET == HWY_SCALAR
  for (int r = 0; r < R; ++r) ScoreRowInPlace(q + r * dim, k, dim, n, dim, scores + r * ld);
#else
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t whole = dim / lanes * lanes;
  using Vec = hn::Vec<decltype(df)>;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* key = k + j * dim;
    Vec acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < 4; ++t) acc[r][t] = hn::Zero(df);
    for (int64_t d = 0; d < whole; d += lanes) {
      Vec kv[4];
      for (int t = 0; t < 4; ++t) kv[t] = hn::LoadU(df, key + t * dim + d);
      for (int r = 0; r < R; ++r) {
        const Vec qv = hn::LoadU(df, q + r * dim + d);
        for (int t = 0; t < 4; ++t) acc[r][t] = hn::MulAdd(qv, kv[t], acc[r][t]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* out = scores + r * ld + j;
      hn::StoreU(SumsOfFour(df, acc[r][0], acc[r][1], acc[r][2], acc[r][3]), hn::Full128<float>(), out);
      for (int64_t d = whole; d < dim; ++d) {  // a head size that is not a whole number of vectors
        for (int t = 0; t < 4; ++t) out[t] += q[r * dim + d] * key[t * dim + d];
      }
    }
  }
  if (j < n) {
    for (int r = 0; r < R; ++r)
      ScoreRowInPlace(q + r * dim, k + j * dim, dim, n - j, dim, scores + r * ld + j);
  }
#endif
}

// Rows this target scores (and weighs values) at once: four where there are 32 vector registers.
constexpr int kRowsAtOnce = HWY_MAX_BYTES >= 64 ? 4 : 2;

// ScoreRows over any number of rows.
void ScoreAllRows(const float* q, const float* k, int64_t rows, int64_t n, int64_t dim, float* scores,
                  int64_t ld) {
  int64_t r = 0;
  for (; r + kRowsAtOnce <= rows; r += kRowsAtOnce)
    ScoreRows<kRowsAtOnce>(q + r * dim, k, n, dim, scores + r * ld, ld);
  for (; r + 2 <= rows; r += 2) ScoreRows<2>(q + r * dim, k, n, dim, scores + r * ld, ld);
  if (r < rows) ScoreRows<1>(q + r * dim, k, n, dim, scores + r * ld, ld);
}

// scores[0, n) = softcap(scores * scale), -inf outside [lo, hi); returns their max.
float ScaleScores(const GqaArgs& a, float* scores, int64_t n, int64_t lo, int64_t hi) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < lo; ++j) scores[j] = kNoKeys;
  for (int64_t j = hi; j < n; ++j) scores[j] = kNoKeys;
  int64_t j = lo;
  float top = kNoKeys;
  if (a.softcap <= 0) {
    const auto scale = hn::Set(df, a.scale);
    auto vmax = hn::Set(df, kNoKeys);
    for (; j + lanes <= hi; j += lanes) {
      const auto v = hn::Mul(hn::LoadU(df, scores + j), scale);
      hn::StoreU(v, df, scores + j);
      vmax = hn::Max(vmax, v);
    }
    top = hn::GetLane(hn::MaxOfLanes(df, vmax));
  }
  for (; j < hi; ++j) {
    float score = scores[j] * a.scale;
    if (a.softcap > 0) score = a.softcap * std::tanh(score / a.softcap);
    scores[j] = score;
    top = std::max(top, score);
  }
  return top;
}

// sum_j p[r, j] v[j, :] for rows [0, rows) of p (leading dimension ld) into out[r, :] (head_size apart):
// up to 4 rows at once, so each value row loaded serves every row's accumulators, and wider column tiles
// for one or two rows, so that there are enough independent multiply-adds in flight.
void ValuesOfRows(const float* p, int64_t ld, int64_t rows, int64_t keys, const float* v, int64_t dim,
                  float* out) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) ValueRows<4>(p + r * ld, ld, keys, v, dim, dim, out + r * dim);
  if (rows - r == 3) ValueRows<3>(p + r * ld, ld, keys, v, dim, dim, out + r * dim);
  if (rows - r == 2) ValueRows<2, false, 4>(p + r * ld, ld, keys, v, dim, dim, out + r * dim);
  if (rows - r == 1) ValueRows<1, false, 4>(p + r * ld, ld, keys, v, dim, dim, out + r * dim);
}

// Work item `item` = (batch row x kv head) x blocks.count + block, for every query row of the group:
// the scores over the block's keys that any row sees (the others' -inf), their exponentials, and the
// products with the values.
void AttendBlock(const GqaArgs& a, const KeyBlocks& blocks, const float* queries, const Partials& partials,
                 int64_t item, std::vector<float>& scores) {
  const int64_t dim = a.head_size, rows = blocks.group_rows;
  const int64_t group = item / blocks.count, b = group / a.kv_heads, g = group % a.kv_heads;
  const int64_t start = blocks.first + item % blocks.count * blocks.size;
  const int64_t end = std::min(start + blocks.size, a.capacity);
  // The keys of the block that some row sees.
  int64_t lo = end, hi = start;
  for (int64_t i = 0; i < a.rows.sequence; ++i) {
    const KeySpan seen = keys_of(a, b, i);
    lo = std::min(lo, std::max(seen.lo, start));
    hi = std::max(hi, std::min(seen.hi, end));
  }
  float* stats = partials.stats + 2 * item * rows;
  for (int64_t r = 0; r < rows; ++r) stats[2 * r] = kNoKeys, stats[2 * r + 1] = 0.0f;
  if (hi <= lo) return;
  const int64_t keys = hi - lo;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const int64_t ld = (keys + lanes - 1) / lanes * lanes;
  scores.resize(static_cast<size_t>(rows * ld + lanes));
  const int64_t head_rows = (b * a.kv_heads + g) * a.capacity;
  ScoreAllRows(queries + group * rows * dim, a.key_cache + (head_rows + lo) * dim, rows, keys, dim,
               scores.data(), ld);
  bool any = false;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores.data() + r * ld;
    const KeySpan seen = keys_of(a, b, group_row(a, g, r).query);
    const int64_t row_lo = std::clamp(seen.lo, lo, hi) - lo, row_hi = std::clamp(seen.hi, lo, hi) - lo;
    const float top = row_hi > row_lo ? ScaleScores(a, row, keys, row_lo, row_hi) : kNoKeys;
    if (top == kNoKeys) {  // no key of the block for this row (or every score -inf): zero weights
      std::fill(row, row + keys, 0.0f);
      continue;
    }
    stats[2 * r] = top;
    stats[2 * r + 1] = ExpInto(row, keys, top, row);
    any = true;
  }
  if (any)
    ValuesOfRows(scores.data(), ld, rows, keys, a.value_cache + (head_rows + lo) * dim, dim,
                 partials.values + item * rows * dim);
}

// Work items [begin, end) (AttendBlock); `queries`: the step's rotated queries, each kv head's rows
// together [B, Kv, (N / Kv) x S, H] (rows as group_row numbers them).
void AttendBlocks(const GqaArgs& a, const KeyBlocks& blocks, const float* queries, const Partials& partials,
                  int64_t begin, int64_t end) {
  thread_local std::vector<float> scores;
  for (int64_t item = begin; item < end; ++item) AttendBlock(a, blocks, queries, partials, item, scores);
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/group_query_attention.h"

#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(AttendBlocks);

namespace {

// Items per chunk so that a chunk is worth handing to another thread (~64 K multiply-adds): a
// decode step's few rows stay on the calling thread instead of waking the pool.
int64_t grain_for(int64_t work_per_item) {
  constexpr int64_t kChunkWork = int64_t{1} << 16;
  return std::max<int64_t>(1, kChunkWork / std::max<int64_t>(1, work_per_item));
}

// The blocks a step's keys split into: about 8 items per thread over all (batch row, kv head) pairs, so
// the threads share the cache's reads evenly, in blocks of at least 64 keys (whole vectors): below that
// the per-block costs (scores' set-up, the exponentials' tail, the merge) outweigh the balance.
KeyBlocks key_blocks(const GqaArgs& a) {
  int64_t first = a.capacity, end = 0;
  for (int64_t b = 0; b < a.batch; ++b) {
    first = std::min(first, keys_of(a, b, 0).lo);
    for (int64_t i = 0; i < a.rows.sequence; ++i) end = std::max(end, keys_of(a, b, i).hi);
  }
  const int64_t span = std::max<int64_t>(end - first, 1);
  const int64_t groups = a.batch * a.kv_heads;
  const int64_t wanted = std::max<int64_t>(1, (8 * kernel_threads() + groups - 1) / groups);
  const int64_t size = std::max<int64_t>(64, ((span + wanted - 1) / wanted + 15) / 16 * 16);
  return {.first = std::min(first, end),
          .size = size,
          .count = (span + size - 1) / size,
          .group_rows = a.heads / a.kv_heads * a.rows.sequence};
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
      const KeyBlocks blocks = key_blocks(a);
      // The calling thread's buffer, passed by pointer (each pool thread has its own thread_local):
      // the rotated queries, then the partial results.
      thread_local std::vector<float> buffer;
      const int64_t groups = a.batch * a.kv_heads, query_rows = a.batch * a.rows.sequence * a.heads;
      const int64_t partial_rows = groups * blocks.count * blocks.group_rows;
      buffer.resize(static_cast<size_t>((query_rows + partial_rows) * a.head_size + 2 * partial_rows));
      float* queries = buffer.data();
      float* stats = queries + query_rows * a.head_size;
      const Partials partials{stats, stats + 2 * partial_rows};
      for (int64_t row = 0; row < query_rows; ++row) {  // group-major: AttendBlocks' layout
        const int64_t group = row / blocks.group_rows, b = group / a.kv_heads;
        const auto [h, i] = group_row(a, group % a.kv_heads, row % blocks.group_rows);
        const int64_t token = b * a.rows.sequence + i;
        a.rotary.rotate(a.q + token * a.q_stride + a.q_column + h * a.head_size, a.head_size,
                        a.rows.first_position(b) + i, queries + row * a.head_size);
      }
      const int64_t work = 2 * blocks.group_rows * blocks.size * a.head_size;
      parallel_for(groups * blocks.count, grain_for(work), [&](int64_t begin, int64_t end) {
        HWY_DYNAMIC_DISPATCH(AttendBlocks)(a, blocks, queries, partials, begin, end);
      });
      parallel_for(groups * blocks.group_rows, grain_for(blocks.count * a.head_size),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t item = begin; item < end; ++item)
                       MergeRow(a, blocks, partials, item / blocks.group_rows, item % blocks.group_rows);
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
