// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file); scaled_dot_product_attention picks the best target at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_rows-inl.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mask_rows.h"
#include "kernels/cpu/softmax_row-inl.h"

#ifndef TRANSMUTER_KERNELS_CPU_ATTENTION_ARGS
#define TRANSMUTER_KERNELS_CPU_ATTENTION_ARGS
namespace transmuter::kernels {
// Where the rows of a [B, H, S, D] input lie: element (b, h, s, d) at b * batch + h * head + s * row + d
// (a row-contiguous array, or a [B, S, H, D] projection seen through a transpose).
struct HeadStrides {
  int64_t batch, head, row;
};

// One call's pointers and sizes (outside the per-target namespaces).
struct AttentionArgs {
  const float* q;
  const float* k;
  const float* v;
  HeadStrides q_at, k_at, v_at;
  // Keys and values appended after k's and v's rows (null: none): the attention runs over
  // keys - more_keys rows of k, then more_keys rows of k_more (likewise v).
  const float* k_more;
  const float* v_more;
  int64_t more_keys;
  const float* mask;  // null: no mask
  MaskRows mask_rows;
  float* out;  // [B, Hq, Sq, Dv] laid out as [B, Sq, Hq, Dv] (AttentionKernel::output_strides)
  int64_t batch, q_heads, kv_heads, queries, keys, head_dim, value_dim;
  int64_t query_block;  // queries per work item
  float scale;
  bool causal;
  int64_t causal_offset;
  bool zero_empty_rows;
};

// Scratch of one thread: K^T of the current head and the scores of a block,
// both with rows padded to whole vectors.
struct AttentionScratch {
  std::vector<float> key_t, scores;
  std::vector<const uint8_t*> key_rows;  // TransposeKeys' row pointers
};
}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kt[d * ld + j] = k[j * ldk + d] for the first `first` keys, then k_more's rows (dim apart) up to `keys`,
// padded with zeros up to ld: the GEMM packer's 4 x 4 register transposes (a scalar gather before; ViT-base's
// attention kernel took 0.95 of its time after the change).
void TransposeKeys(const float* k, int64_t ldk, int64_t first, const float* k_more, int64_t keys, int64_t dim,
                   int64_t ld, float* kt, std::vector<const uint8_t*>& rows) {
  rows.resize(static_cast<size_t>(keys));
  for (int64_t j = 0; j < keys; ++j) {
    const float* row = j < first ? k + j * ldk : k_more + (j - first) * dim;
    rows[static_cast<size_t>(j)] = reinterpret_cast<const uint8_t*>(row);
  }
  transpose_rows_into_panel(rows.data(), keys, dim, ld, kt);
  for (int64_t d = 0; d < dim; ++d) std::fill(kt + d * ld + keys, kt + (d + 1) * ld, 0.0f);
}

// scores[r, j] = sum_d q[r * ldq + d] * kt[d, j] for R query rows and the columns
// [j0, j0 + V * lanes): R x V accumulators, one broadcast of q per row and d.
template <int R, int V>
HWY_INLINE void ScoreTile(const float* q, int64_t ldq, int64_t dim, const float* kt, int64_t ld, int64_t j0,
                          float* scores) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  using Vec = hn::Vec<decltype(df)>;
  Vec acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < V; ++c) acc[r][c] = hn::Zero(df);
  }
  for (int64_t d = 0; d < dim; ++d) {
    Vec key[V];
    for (int c = 0; c < V; ++c) key[c] = hn::Load(df, kt + d * ld + j0 + c * lanes);
    for (int r = 0; r < R; ++r) {
      const Vec qv = hn::Set(df, q[r * ldq + d]);
      for (int c = 0; c < V; ++c) acc[r][c] = hn::MulAdd(qv, key[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < V; ++c) hn::Store(acc[r][c], df, scores + r * ld + j0 + c * lanes);
  }
}

// The widest register tile a target's registers hold: with AVX-512's 32, 4 rows x 4 vectors (16
// accumulators, each loaded key vector feeding four rows and each broadcast four vectors); with 16
// registers 4 x 2.
#if HWY_TARGET <= HWY_AVX3
constexpr int kWideVecs = 4;
#else
constexpr int kWideVecs = 2;
#endif
// Query rows of the products' widest tile: 6 with AVX-512 (6 x 4 = 24 accumulators beside 4 loaded
// vectors and a broadcast), else 4.
constexpr int kWideRows = kWideVecs > 2 ? 6 : 4;

template <int R>
HWY_INLINE void ScoreRows(const float* q, int64_t ldq, int64_t dim, const float* kt, int64_t ld,
                          float* scores) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  int64_t j = 0;
  if constexpr (kWideVecs > 2) {
    for (; j + kWideVecs * lanes <= ld; j += kWideVecs * lanes)
      ScoreTile<R, kWideVecs>(q, ldq, dim, kt, ld, j, scores);
  }
  for (; j + 2 * lanes <= ld; j += 2 * lanes) ScoreTile<R, 2>(q, ldq, dim, kt, ld, j, scores);
  for (; j < ld; j += lanes) ScoreTile<R, 1>(q, ldq, dim, kt, ld, j, scores);
}

// An additive mask value at or below this rules its key out: exp(v - max) is exactly 0 beside any key
// the mask lets through (transformers masks with the float's lowest value, others with -inf).
constexpr float kRuledOut = -1e30f;

// How many keys at the start of the first run a decode row needs: the run less the keys at its end that
// its mask rules out (a static cache's empty slots, between the filled ones and the new rows). All of
// them when no key of the row is let through, so that such a row stays what the composition gives.
int64_t OwnKeysInUse(const float* mask, int64_t own_keys, int64_t more_keys) {
  if (mask == nullptr) return own_keys;
  int64_t in_use = own_keys;
  while (in_use > 0 && mask[in_use - 1] <= kRuledOut) --in_use;
  if (in_use > 0) return in_use;
  for (int64_t j = own_keys; j < own_keys + more_keys; ++j) {
    if (mask[j] > kRuledOut) return 0;
  }
  return own_keys;
}

// One work item: query rows [first, first + rows) of head (b, h).
void AttendBlock(const AttentionArgs& a, int64_t b, int64_t h, int64_t first, int64_t rows,
                 AttentionScratch& scratch) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const int64_t ld = (a.keys + lanes - 1) / lanes * lanes;
  const int64_t kv_head = h / (a.q_heads / a.kv_heads);
  const int64_t head = b * a.kv_heads + kv_head;
  const int64_t own_keys = a.keys - a.more_keys;  // rows of k and v; then a.more_keys of k_more, v_more
  const int64_t ldq = a.q_at.row, ldk = a.k_at.row, ldv = a.v_at.row;
  const float* q = a.q + b * a.q_at.batch + h * a.q_at.head + first * ldq;
  const float* k = a.k + b * a.k_at.batch + kv_head * a.k_at.head;
  const float* v = a.v + b * a.v_at.batch + kv_head * a.v_at.head;
  const float* k_more = a.more_keys > 0 ? a.k_more + head * a.more_keys * a.head_dim : nullptr;
  const float* v_more = a.more_keys > 0 ? a.v_more + head * a.more_keys * a.value_dim : nullptr;
  const int64_t ldo = a.q_heads * a.value_dim;  // output rows: a query's heads side by side
  float* out = a.out + (b * a.queries + first) * ldo + h * a.value_dim;

  if (rows >= 4) scratch.key_t.resize(static_cast<size_t>(a.head_dim * ld) + lanes);
  scratch.scores.resize(static_cast<size_t>(rows * ld) + lanes);
  // Whole vectors from aligned starts: round the buffers' starts up.
  auto align = [&](std::vector<float>& buffer) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(buffer.data());
    const uintptr_t bytes = static_cast<uintptr_t>(lanes) * sizeof(float);
    return reinterpret_cast<float*>((at + bytes - 1) / bytes * bytes);
  };
  float* scores = align(scratch.scores);
  auto mask_row = [&](int64_t r) -> const float* {
    return a.mask != nullptr ? a.mask + a.mask_rows.offset((b * a.q_heads + h) * a.queries + first + r) : nullptr;
  };
  int64_t r = 0;
  int64_t own_scored = own_keys;  // keys of the first run that some row of the block scores
  if (rows < 4) {
    // Decode rows: the first run's ruled-out keys at its end get -inf scores, not products.
    own_scored = 0;
    for (; r < rows; ++r) {
      float* row = scores + r * ld;
      const int64_t in_use = OwnKeysInUse(mask_row(r), own_keys, a.more_keys);
      own_scored = std::max(own_scored, in_use);
      ScoreRowInPlace(q + r * ldq, k, ldk, in_use, a.head_dim, row);
      std::fill(row + in_use, row + own_keys, -std::numeric_limits<float>::infinity());
      if (k_more) ScoreRowInPlace(q + r * ldq, k_more, a.head_dim, a.more_keys, a.head_dim, row + own_keys);
    }
  } else {
    float* kt = align(scratch.key_t);
    TransposeKeys(k, ldk, own_keys, k_more, a.keys, a.head_dim, ld, kt, scratch.key_rows);
    for (; r + kWideRows <= rows; r += kWideRows)
      ScoreRows<kWideRows>(q + r * ldq, ldq, a.head_dim, kt, ld, scores + r * ld);
    for (; r + 4 <= rows; r += 4) ScoreRows<4>(q + r * ldq, ldq, a.head_dim, kt, ld, scores + r * ld);
    for (; r < rows; ++r) ScoreRows<1>(q + r * ldq, ldq, a.head_dim, kt, ld, scores + r * ld);
  }

  const EmptyRow empty = a.zero_empty_rows ? EmptyRow::kZeros : EmptyRow::kNaN;
  int64_t used_keys = 0;  // keys any row of the block attends (causal: fewer)
  for (r = 0; r < rows; ++r) {
    const int64_t i = first + r;
    int64_t allowed = a.keys;
    if (a.causal) allowed = std::clamp<int64_t>(i + a.causal_offset + 1, 0, a.keys);
    used_keys = std::max(used_keys, allowed);
    float* row = scores + r * ld;
    SoftmaxRow(row, mask_row(r), a.scale, a.keys, allowed, empty, row);
  }

  // The values of k's rows, then (added to them) those of k_more's.
  const int64_t own_used = std::min(used_keys, own_scored);
  const int64_t more_used = std::max<int64_t>(used_keys - own_keys, 0);
  const int64_t dv = a.value_dim;
  r = 0;
  if (more_used == 0) {
    for (; r + kWideRows <= rows; r += kWideRows)
      ValueRows<kWideRows, false, kWideVecs>(scores + r * ld, ld, own_used, v, ldv, dv, out + r * ldo, ldo);
  }
  for (; r + 4 <= rows; r += 4) {
    ValueRows<4, false, kWideVecs>(scores + r * ld, ld, own_used, v, ldv, dv, out + r * ldo, ldo);
    if (more_used > 0)
      ValueRows<4, true>(scores + r * ld + own_keys, ld, more_used, v_more, dv, dv, out + r * ldo, ldo);
  }
  for (; r < rows; ++r) {
    ValueRows<1>(scores + r * ld, ld, own_used, v, ldv, dv, out + r * ldo, ldo);
    if (more_used > 0)
      ValueRows<1, true>(scores + r * ld + own_keys, ld, more_used, v_more, dv, dv, out + r * ldo, ldo);
  }
}

void AttendItems(const AttentionArgs& a, int64_t begin, int64_t end) {
  thread_local AttentionScratch scratch;
  const int64_t blocks = (a.queries + a.query_block - 1) / a.query_block;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t block = item % blocks, head = item / blocks;
    const int64_t first = block * a.query_block;
    const int64_t rows = std::min(a.query_block, a.queries - first);
    AttendBlock(a, head / a.q_heads, head % a.q_heads, first, rows, scratch);
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/attention.h"

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

HWY_EXPORT(AttendItems);

namespace {

// Queries per work item: whole heads when there are enough of them to keep
// every thread busy, else blocks of at least 16 queries.
int64_t query_block_size(int64_t heads, int64_t queries) {
  const int64_t wanted_items = 2 * static_cast<int64_t>(kernel_threads());
  if (heads >= wanted_items || queries <= 16) return std::max<int64_t>(queries, 1);
  const int64_t blocks_per_head = (wanted_items + heads - 1) / heads;
  return std::max<int64_t>(16, (queries + blocks_per_head - 1) / blocks_per_head);
}

HeadStrides head_strides(const mx::array& x) {
  return {static_cast<int64_t>(x.strides(0)), static_cast<int64_t>(x.strides(1)),
          static_cast<int64_t>(x.strides(2))};
}

// q, k and v may be views whose rows are whole vectors (last axis contiguous) anywhere: the heads of a
// [B, S, H, D] projection seen as [B, H, S, D] are read where they lie instead of being copied first.
bool rows_readable_in_place(const mx::array& x) { return x.ndim() == 4 && x.strides(3) == 1; }

class AttentionKernel : public CpuKernel {
 public:
  AttentionKernel(mx::Stream stream, Reference reference, SoftmaxOptions options, bool has_mask, bool has_more)
      : CpuKernel(stream, std::move(reference)), options_(options), has_mask_(has_mask), has_more_(has_more) {}
  const char* name() const override { return "transmuter::ScaledDotProductAttention"; }

 protected:
  bool reads_view(size_t index, const mx::array& input) const override {
    return index < 3 && rows_readable_in_place(input);
  }
  // [B, H, S, Dv] written as [B, S, H, Dv]: every exported attention is followed by the transpose back and
  // the reshape to [B, S, H * Dv] that the next product reads, which then copy nothing (ViT-base: the
  // output projection's input had been copied from the heads, element by element, in every layer).
  std::optional<mx::Strides> output_strides(size_t, const mx::Shape& shape) const override {
    const int64_t heads = shape[1], queries = shape[2], dv = shape[3];
    return mx::Strides{queries * heads * dv, dv, heads * dv, 1};
  }

  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array &q = in[0], &k = in[1], &v = in[2];
    AttentionArgs a{};
    a.q = q.data<float>();
    a.k = k.data<float>();
    a.v = v.data<float>();
    a.q_at = head_strides(q);
    a.k_at = head_strides(k);
    a.v_at = head_strides(v);
    a.out = out[0].data<float>();
    a.batch = q.shape(0);
    a.q_heads = q.shape(1);
    a.kv_heads = k.shape(1);
    a.queries = q.shape(2);
    a.keys = k.shape(2);
    if (has_more_) {  // after the mask, when there is one
      const mx::array &k_more = in[has_mask_ ? 4 : 3], &v_more = in[has_mask_ ? 5 : 4];
      a.k_more = k_more.data<float>();
      a.v_more = v_more.data<float>();
      a.more_keys = k_more.shape(2);
      a.keys += a.more_keys;
    }
    a.head_dim = q.shape(3);
    a.value_dim = v.shape(3);
    a.query_block = query_block_size(a.batch * a.q_heads, a.queries);
    if (has_mask_) {
      a.mask = in[3].data<float>();
      a.mask_rows = *MaskRows::of({q.shape(0), q.shape(1), q.shape(2), static_cast<int>(a.keys)}, in[3].shape());
    }
    a.scale = options_.scale;
    a.causal = options_.causal;
    a.causal_offset = options_.causal_offset;
    a.zero_empty_rows = options_.zero_fully_masked_rows;
    const int64_t blocks = a.queries == 0 ? 0 : (a.queries + a.query_block - 1) / a.query_block;
    const int64_t items = a.keys == 0 || a.value_dim == 0 ? 0 : a.batch * a.q_heads * blocks;
    return [a, items] {
      if (items == 0) {
        // No keys: a sum over nothing, as the composition's matmul gives.
        std::fill(a.out, a.out + a.batch * a.q_heads * a.queries * a.value_dim, 0.0f);
        return;
      }
      parallel_for(items, 1, [&](int64_t begin, int64_t end) {
        HWY_DYNAMIC_DISPATCH(AttendItems)(a, begin, end);
      });
    };
  }

 private:
  SoftmaxOptions options_;
  bool has_mask_;
  bool has_more_;
};

bool fits_kernel(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<KeyValueRows>& more,
                 const std::optional<mx::array>& mask) {
  for (const mx::array* t : {&q, &k, &v}) {
    if (t->dtype() != mx::float32 || t->ndim() != 4) return false;
  }
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(1) != v.shape(1) ||
      k.shape(2) != v.shape(2) || k.shape(3) != q.shape(3) || k.shape(1) == 0 ||
      q.shape(1) % k.shape(1) != 0) {
    return false;
  }
  int keys = k.shape(2);
  if (more) {
    const mx::array &k_more = more->keys, &v_more = more->values;
    for (const mx::array* t : {&k_more, &v_more}) {
      if (t->dtype() != mx::float32 || t->ndim() != 4 || t->shape(0) != k.shape(0) || t->shape(1) != k.shape(1))
        return false;
    }
    if (k_more.shape(3) != k.shape(3) || v_more.shape(3) != v.shape(3) || k_more.shape(2) != v_more.shape(2))
      return false;
    keys += k_more.shape(2);
  }
  if (!mask) return true;
  return mask->dtype() == mx::float32 &&
         MaskRows::of({q.shape(0), q.shape(1), q.shape(2), keys}, mask->shape()).has_value();
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<KeyValueRows>& more,
                    const std::optional<mx::array>& mask, const SoftmaxOptions& options, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  const bool has_mask = mask.has_value(), has_more = more.has_value();
  // Inputs: q, k, v, [mask], [k_more, v_more].
  Reference reference = [options, has_mask, has_more, stream](const std::vector<mx::array>& in) {
    std::optional<mx::array> m = has_mask ? std::optional<mx::array>(in[3]) : std::nullopt;
    mx::array keys = in[1], values = in[2];
    if (has_more) {
      const size_t at = has_mask ? 4 : 3;
      keys = mx::concatenate({keys, in[at]}, 2, stream);
      values = mx::concatenate({values, in[at + 1]}, 2, stream);
    }
    return std::vector<mx::array>{scaled_dot_product_attention_reference(in[0], keys, values, m, options, stream)};
  };
  std::vector<mx::array> inputs = {q, k, v};
  if (mask) inputs.push_back(*mask);
  if (more) inputs.insert(inputs.end(), {more->keys, more->values});
  if (!fits_kernel(q, k, v, more, mask)) return reference(inputs)[0];
  const mx::Shape shape = {q.shape(0), q.shape(1), q.shape(2), v.shape(3)};
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<AttentionKernel>(kernel_stream, reference, options, has_mask, has_more);
      },
      reference, inputs, {shape}, {mx::float32}, stream)[0];
}

}  // namespace

mx::array scaled_dot_product_attention_reference(const mx::array& q, const mx::array& k, const mx::array& v,
                                                 const std::optional<mx::array>& mask,
                                                 const SoftmaxOptions& options, mx::StreamOrDevice s) {
  // GQA by grouping query heads: Q [B, Hkv, G, Sq, D] against K [B, Hkv, 1, Sk, D].
  const int batch = q.shape(0), q_heads = q.shape(1), queries = q.shape(2);
  const int kv_heads = k.shape(1), keys = k.shape(2);
  const int group = q_heads / kv_heads;
  mx::array grouped_q = mx::reshape(q, {batch, kv_heads, group, queries, q.shape(3)}, s);
  mx::array key_t = mx::swapaxes(mx::expand_dims(k, 2, s), -1, -2, s);
  mx::array scores = mx::reshape(mx::matmul(grouped_q, key_t, s), {batch, q_heads, queries, keys}, s);
  mx::array probs = softmax_last_axis_reference(scores, mask, options, s);
  mx::array grouped_p = mx::reshape(probs, {batch, kv_heads, group, queries, keys}, s);
  mx::array out = mx::matmul(grouped_p, mx::expand_dims(v, 2, s), s);
  return mx::reshape(out, {batch, q_heads, queries, v.shape(3)}, s);
}

mx::array scaled_dot_product_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                                       const std::optional<mx::array>& mask, const SoftmaxOptions& options,
                                       mx::StreamOrDevice s) {
  return attention(q, k, v, std::nullopt, mask, options, s);
}

mx::array scaled_dot_product_attention(const mx::array& q, const KeyValueRows& first, const KeyValueRows& appended,
                                       const std::optional<mx::array>& mask, const SoftmaxOptions& options,
                                       mx::StreamOrDevice s) {
  return attention(q, first.keys, first.values, appended, mask, options, s);
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
