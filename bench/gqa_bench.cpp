// The GroupQueryAttention kernel (src/kernels/cpu/group_query_attention.h) at a decode step, on its
// own: one query token over a cache of K keys, as a decoder's layers call it.
//
// usage: gqa_bench [--runs N] [--layers L] [--heads N] [--kv-heads KV] [--head-size H] [KEYS ...]
// --layers L: L distinct caches used in turn (a 30-layer model's caches do not stay in the caches of
// the CPU between one layer's step and the next), default 30; shapes default to SmolLM2-135M's
// (9 heads on 3, head size 64, rotary halves).
// Prints one JSON object per KEYS: median and fastest microseconds of one call (mx::eval of
// kernels::group_query_attention on the CPU stream), and the cache bytes it reads.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernel_bench.h"
#include "kernels/cpu/group_query_attention.h"
#include "kernels/cpu/thread_pool.h"

namespace mx = mlx::core;
namespace tk = transmuter::kernels;

namespace {

struct Options {
  int runs = 300, layers = 30, heads = 9, kv_heads = 3, head_size = 64;
  std::vector<int> keys;
};

Options parse(int argc, char** argv) {
  Options o;
  transmuter::bench::parse_options(argc, argv, "gqa_bench",
                                   {{"--runs", &o.runs},
                                    {"--layers", &o.layers},
                                    {"--heads", &o.heads},
                                    {"--kv-heads", &o.kv_heads},
                                    {"--head-size", &o.head_size}},
                                   o.keys);
  if (o.keys.empty()) o.keys = {128, 512, 2048};
  return o;
}

void bench(const Options& o, int keys) {
  const int capacity = keys, h = o.head_size;
  tk::GroupQueryAttentionSpec spec{.heads = o.heads,
                                   .kv_heads = o.kv_heads,
                                   .head_size = h,
                                   .capacity = capacity,
                                   .scale = 0.125f,
                                   .rotary = true};
  mx::array q = mx::random::normal({1, 1, o.heads * h});
  mx::array seqlens = mx::array({keys - 1}, mx::int32);
  mx::array cos = mx::cos(mx::random::normal({capacity, h / 2}));
  mx::array sin = mx::sin(mx::random::normal({capacity, h / 2}));
  mx::array sink = mx::array(0.0f);
  std::vector<mx::array> key_caches, value_caches;
  for (int l = 0; l < o.layers; ++l) {
    key_caches.push_back(mx::random::normal({1, o.kv_heads, capacity, h}));
    value_caches.push_back(mx::random::normal({1, o.kv_heads, capacity, h}));
  }
  mx::eval({q, seqlens, cos, sin});
  mx::eval(key_caches);
  mx::eval(value_caches);
  tk::Reference no_reference = [](const std::vector<mx::array>&) -> std::vector<mx::array> {
    std::fprintf(stderr, "gqa_bench: the kernel did not take these inputs\n");
    std::exit(1);
  };
  const std::vector<double> us = transmuter::bench::sorted_eval_us(o.runs, [&](int run) {
    const int l = run % o.layers;
    return tk::group_query_attention({q, key_caches[l], value_caches[l], seqlens, cos, sin, sink}, spec,
                                     no_reference, mx::Device::cpu);
  });
  std::printf(
      "{\"keys\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_size\": %d, \"threads\": %d, \"layers\": %d, "
      "\"cache_bytes\": %lld, \"median_us\": %.2f, \"best_us\": %.2f}\n",
      keys, o.heads, o.kv_heads, h, tk::kernel_threads(), o.layers, 2LL * o.kv_heads * keys * h * 4,
      us[us.size() / 2], us.front());
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  for (int keys : o.keys) bench(o, keys);
  return 0;
}
