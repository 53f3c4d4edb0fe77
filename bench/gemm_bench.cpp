// The packed-weight GEMM (src/kernels/cpu/gemm.h) against MLX's matmul
// (OpenBLAS sgemm, which packs the weights on every call) on the products of
// the benchmarked encoders, alternating the two call by call.
//
// usage: gemm_bench [--runs N] [--packed-only] [--direct] [--cold] [--weights W] [MxKxN ...]
// --direct calls the kernel (run_gemm) on raw buffers, without MLX's graph
// and evaluation around it: the kernel's own speed on small products.
// --cold writes 64 MiB of other memory before each timed call, so that the
// operands start outside the caches, as a layer's do inside a whole model.
// --weights W multiplies by W distinct packed weights in turn (default 1): with W large enough that
// they do not fit the last-level cache, each call reads its weights from memory while its
// left-hand side stays cached, as a model's layers do (a layer's activations were just written).
// Prints per shape: median milliseconds of each, their ratio (packed / mlx),
// GFLOPS of the packed kernel (at the median and at the fastest call), and the max abs difference of the
// results.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/gemm.h"

namespace mx = mlx::core;
namespace tk = transmuter::kernels;

namespace {

struct Shape {
  int m, k, n;
};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 30;
  bool packed_only = false;  // no OpenBLAS call in between (its threads spin after each call)
  bool direct = false;
  bool cold = false;
  int weights = 1;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (arg == "--packed-only") {
      packed_only = true;
    } else if (arg == "--direct") {
      direct = packed_only = true;
    } else if (arg == "--cold") {
      cold = true;
    } else if (arg == "--weights" && i + 1 < argc) {
      weights = std::max(1, std::atoi(argv[++i]));
    } else {
      Shape s{};
      if (std::sscanf(arg.c_str(), "%dx%dx%d", &s.m, &s.k, &s.n) != 3) {
        std::fprintf(
            stderr,
            "usage: gemm_bench [--runs N] [--packed-only] [--direct] [--cold] [--weights W] [MxKxN ...]\n");
        return 2;
      }
      shapes.push_back(s);
    }
  }
  if (shapes.empty()) {
    // MiniLM (384, FFN 1536) and BERT-base/ViT-base (768, FFN 3072) at batch 1
    // and sequence 128 or 197, the short query (16 rows), a decoder step (1 row),
    // and MiniLM at batch 32.
    shapes = {{128, 384, 384},   {128, 384, 1536}, {128, 1536, 384}, {16, 384, 384},   {16, 384, 1536},
              {1, 384, 1536},    {1, 1536, 384},   {128, 768, 768},  {128, 768, 3072}, {128, 3072, 768},
              {197, 768, 768},   {4096, 384, 384}, {4096, 384, 1536}};
  }
  mx::set_default_device(mx::Device::cpu);
  std::vector<char> eviction(cold ? size_t{64} << 20 : 0);
  auto evict = [&] {
    for (size_t i = 0; i < eviction.size(); i += 64) eviction[i] = static_cast<char>(eviction[i] + 1);
  };
  std::printf("%-16s %10s %10s %8s %8s %8s %10s\n", "MxKxN", "mlx_ms", "packed_ms", "ratio", "GFLOPS", "best", "max_diff");
  for (const Shape& s : shapes) {
    mx::array a = mx::random::normal({s.m, s.k});
    mx::array b = mx::random::normal({s.k, s.n});
    mx::eval({a, b});
    std::vector<mx::array> packs = {tk::pack_gemm_rhs(b, false)};
    for (int w = 1; w < weights; ++w)
      packs.push_back(tk::pack_gemm_rhs(mx::random::normal({s.k, s.n}), false));
    mx::eval(packs);
    const mx::array& packed = packs.front();
    std::vector<double> mlx_times, packed_times;
    // The agreement check calls MLX's matmul too; after any OpenBLAS call its
    // worker thread spins for a while, so --packed-only skips it.
    float diff = 0.0f;
    if (!packed_only) {
      mx::array y_mlx = mx::matmul(a, b), y_packed = tk::packed_matmul(a, packed, std::nullopt, s.n);
      diff = mx::max(mx::abs(mx::subtract(y_mlx, y_packed))).item<float>();
    }
    std::vector<float> y(static_cast<size_t>(s.m) * s.n);
    tk::GemmArgs g;
    g.a = a.data<float>();
    g.lda = g.k = s.k;
    g.packed = packed.data<float>();
    g.y = y.data();
    g.ldy = g.n = s.n;
    g.m = s.m;
    for (int r = 0; r < runs + 3; ++r) {
      const double t_mlx = packed_only ? 0.0 : seconds_of([&] { mx::eval(mx::matmul(a, b)); });
      evict();
      const mx::array& weight = packs[static_cast<size_t>(r % weights)];
      g.packed = weight.data<float>();
      const double t_packed =
          direct ? seconds_of([&] { tk::run_gemm(g); })
                 : seconds_of([&] { mx::eval(tk::packed_matmul(a, weight, std::nullopt, s.n)); });
      if (r >= 3) {
        mlx_times.push_back(t_mlx);
        packed_times.push_back(t_packed);
      }
    }
    const double m_mlx = median(mlx_times), m_packed = median(packed_times);
    char name[32];
    std::snprintf(name, sizeof(name), "%dx%dx%d", s.m, s.k, s.n);
    const double best_packed = *std::min_element(packed_times.begin(), packed_times.end());
    std::printf("%-16s %10.3f %10.3f %8.2f %8.1f %8.1f %10.2g\n", name, m_mlx * 1e3, m_packed * 1e3,
                m_packed / m_mlx, 2.0 * s.m * s.k * s.n / m_packed * 1e-9, 2.0 * s.m * s.k * s.n / best_packed * 1e-9,
                diff);
  }
  return 0;
}
