// Row products of attention shared by the attention kernels (attention.cpp,
// group_query_attention.cpp) as Highway per-target code. Include it after
// hwy/highway.h inside a file that foreach_target re-includes (the include
// guard below toggles per target, Highway's "-inl.h" convention).
#if defined(TRANSMUTER_KERNELS_CPU_ATTENTION_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TRANSMUTER_KERNELS_CPU_ATTENTION_ROWS_INL_H_
#undef TRANSMUTER_KERNELS_CPU_ATTENTION_ROWS_INL_H_
#else
#define TRANSMUTER_KERNELS_CPU_ATTENTION_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// scores[j] = q . k[j] for one query row, the keys (rows ldk apart) read where they are: for the few
// rows of a decode step, transposing every key first costs more than the products. Four keys at a
// time, each a vector of partial sums over the head's lanes, then summed across the lanes.
inline void ScoreRowInPlace(const float* q, const float* k, int64_t ldk, int64_t keys, int64_t dim,
                            float* scores) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t whole = dim / lanes * lanes;
  auto dot_tail = [&](const float* key) {
    float total = 0.0f;
    for (int64_t d = whole; d < dim; ++d) total += q[d] * key[d];
    return total;
  };
  int64_t j = 0;
  for (; j + 4 <= keys; j += 4) {
    const float* key = k + j * ldk;
    auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    for (int64_t d = 0; d < whole; d += lanes) {
      const auto qv = hn::LoadU(df, q + d);
      a0 = hn::MulAdd(qv, hn::LoadU(df, key + d), a0);
      a1 = hn::MulAdd(qv, hn::LoadU(df, key + ldk + d), a1);
      a2 = hn::MulAdd(qv, hn::LoadU(df, key + 2 * ldk + d), a2);
      a3 = hn::MulAdd(qv, hn::LoadU(df, key + 3 * ldk + d), a3);
    }
    scores[j] = hn::GetLane(hn::SumOfLanes(df, a0)) + dot_tail(key);
    scores[j + 1] = hn::GetLane(hn::SumOfLanes(df, a1)) + dot_tail(key + ldk);
    scores[j + 2] = hn::GetLane(hn::SumOfLanes(df, a2)) + dot_tail(key + 2 * ldk);
    scores[j + 3] = hn::GetLane(hn::SumOfLanes(df, a3)) + dot_tail(key + 3 * ldk);
  }
  for (; j < keys; ++j) {
    const float* key = k + j * ldk;
    auto acc = hn::Zero(df);
    for (int64_t d = 0; d < whole; d += lanes)
      acc = hn::MulAdd(hn::LoadU(df, q + d), hn::LoadU(df, key + d), acc);
    scores[j] = hn::GetLane(hn::SumOfLanes(df, acc)) + dot_tail(key);
  }
}

// out[r, c..c + V * lanes) = sum_j p[r, j] * v[j, c..], v's rows ldv apart and out's ldo: R x V
// accumulators (independent chains of multiply-adds: R x V of at least 8 keeps both FMA units busy).
// Accumulate adds the sum to what `out` holds (the values of a second run of keys).
template <int R, int V, bool Accumulate = false>
HWY_INLINE void ValueTile(const float* p, int64_t ld, int64_t keys, const float* v, int64_t ldv, int64_t c0,
                          float* out, int64_t ldo) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  using Vec = hn::Vec<decltype(df)>;
  Vec acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < V; ++c)
      acc[r][c] = Accumulate ? hn::LoadU(df, out + r * ldo + c0 + c * lanes) : hn::Zero(df);
  }
  for (int64_t j = 0; j < keys; ++j) {
    Vec value[V];
    for (int c = 0; c < V; ++c) value[c] = hn::LoadU(df, v + j * ldv + c0 + c * lanes);
    for (int r = 0; r < R; ++r) {
      const Vec pv = hn::Set(df, p[r * ld + j]);
      for (int c = 0; c < V; ++c) acc[r][c] = hn::MulAdd(pv, value[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < V; ++c) hn::StoreU(acc[r][c], df, out + r * ldo + c0 + c * lanes);
  }
}

// out[r, 0..dim) for R rows of p (rows ld apart): ValueTiles over the columns, out's rows ldo apart
// (dim by default).
template <int R, bool Accumulate = false, int V = 2>
HWY_INLINE void ValueRows(const float* p, int64_t ld, int64_t keys, const float* v, int64_t ldv, int64_t dim,
                          float* out, int64_t ldo = 0) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  if (ldo == 0) ldo = dim;
  int64_t c = 0;
  for (; c + V * lanes <= dim; c += V * lanes) ValueTile<R, V, Accumulate>(p, ld, keys, v, ldv, c, out, ldo);
  if constexpr (V > 2) {
    for (; c + 2 * lanes <= dim; c += 2 * lanes)
      ValueTile<R, 2, Accumulate>(p, ld, keys, v, ldv, c, out, ldo);
  }
  for (; c + lanes <= dim; c += lanes) ValueTile<R, 1, Accumulate>(p, ld, keys, v, ldv, c, out, ldo);
  for (; c < dim; ++c) {  // a head size that is not a whole number of vectors
    for (int r = 0; r < R; ++r) {
      float total = Accumulate ? out[r * ldo + c] : 0.0f;
      for (int64_t j = 0; j < keys; ++j) total += p[r * ld + j] * v[j * ldv + c];
      out[r * ldo + c] = total;
    }
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TRANSMUTER_KERNELS_CPU_ATTENTION_ROWS_INL_H_ toggle
