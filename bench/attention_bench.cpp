// The ScaledDotProductAttention kernel (src/kernels/cpu/attention.h) on its own, at an encoder's shapes:
// every query of a sequence over its keys, all heads, as one layer of BERT or ViT calls it.
//
// usage: attention_bench [--runs N] [--layers L] [--heads H] [--head-size D] [--mask] [--transposed]
// [SEQUENCE ...]
// --layers L: L distinct q, k, v sets used in turn (one layer's inputs are in the caches of the CPU
// after the products that wrote them, but not its neighbour's), default 12; --mask adds a [1, 1, 1, S]
// additive mask (a padded batch's). Shapes default to BERT-base's and ViT-base's (12 heads of 64).
// Prints one JSON object per SEQUENCE: median and fastest microseconds of one call (mx::eval of
// kernels::scaled_dot_product_attention on the CPU stream), and the rate of its two products.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernel_bench.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace mx = mlx::core;
namespace tk = transmuter::kernels;

namespace {

struct Options {
  int runs = 200, layers = 12, heads = 12, head_size = 64;
  bool mask = false;
  bool transposed = false;
  std::vector<int> sequences;
};

Options parse(int argc, char** argv) {
  Options o;
  transmuter::bench::parse_options(argc, argv, "attention_bench",
                                   {{"--runs", &o.runs},
                                    {"--layers", &o.layers},
                                    {"--heads", &o.heads},
                                    {"--head-size", &o.head_size},
                                    {"--mask", nullptr, &o.mask},
                                    {"--transposed", nullptr, &o.transposed}},
                                   o.sequences);
  if (o.sequences.empty()) o.sequences = {128, 197};
  return o;
}

void bench(const Options& o, int sequence) {
  // [1, H, S, D], or (--transposed) a [1, S, H, D] array seen as [1, H, S, D], as a graph's
  // projections give them.
  auto input = [&] {
    if (!o.transposed) return mx::random::normal({1, o.heads, sequence, o.head_size});
    mx::array rows = mx::random::normal({1, sequence, o.heads, o.head_size});
    mx::eval(rows);
    return mx::transpose(rows, {0, 2, 1, 3});
  };
  std::vector<mx::array> qs, ks, vs;
  for (int l = 0; l < o.layers; ++l) {
    qs.push_back(input());
    ks.push_back(input());
    vs.push_back(input());
  }
  std::optional<mx::array> mask;
  if (o.mask) mask = mx::zeros({1, 1, 1, sequence});
  mx::eval(qs);
  mx::eval(ks);
  mx::eval(vs);
  if (mask) mx::eval(*mask);
  const tk::SoftmaxOptions options{.scale = 0.125f};
  const std::vector<double> us = transmuter::bench::sorted_eval_us(o.runs, [&](int run) {
    const int l = run % o.layers;
    return tk::scaled_dot_product_attention(qs[l], ks[l], vs[l], mask, options, mx::Device::cpu);
  });
  const double flops = 4.0 * o.heads * sequence * static_cast<double>(sequence) * o.head_size;
  std::printf(
      "{\"sequence\": %d, \"heads\": %d, \"head_size\": %d, \"mask\": %s, \"threads\": %d, \"layers\": %d, "
      "\"transposed\": %s, \"median_us\": %.2f, \"best_us\": %.2f, \"gflops\": %.1f}\n",
      sequence, o.heads, o.head_size, o.mask ? "true" : "false", tk::kernel_threads(), o.layers,
      o.transposed ? "true" : "false", us[us.size() / 2], us.front(), flops / us[us.size() / 2] / 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  for (int sequence : o.sequences) bench(o, sequence);
  return 0;
}
