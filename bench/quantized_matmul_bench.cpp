// The quantized-weight kernel (src/kernels/cpu/quantized_matmul.h) on its own,
// without a model around it, and the machine's memory read bandwidth, its
// ceiling; bench/q4_bench.py runs it beside ONNX Runtime.
//
// usage: quantized_matmul_bench [--runs N] [--bits B] [--group G] [--copies C] [--int8] [--mlx] [--bandwidth]
// [MxKxN
// ...]
// --copies C: C distinct weights, used in turn (more than the caches hold: each call reads its weight
// from memory, as a decoder's layers do).
// Prints one JSON object per line:
//   {"bandwidth": ...}: read GB/s of a 1 GiB buffer summed by the kernel threads
//     (parallel_for, as the kernel splits its work) and by one thread, median of 5 passes;
//   {"shape": ...} per shape: median and fastest ms of the kernel (mx::eval of
//     kernels::quantized_matmul on the CPU stream) and, with --mlx, of
//     mx::quantized_matmul (MLX's scalar kernel), and their max abs difference.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/quantized_matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace mx = mlx::core;
namespace tk = transmuter::kernels;

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Sums 64-bit words (vectorized by the compiler: integer adds reassociate).
uint64_t sum_words(const uint64_t* p, int64_t count) {
  uint64_t s = 0;
  for (int64_t i = 0; i < count; ++i) s += p[i];
  return s;
}

void bandwidth() {
  const int64_t bytes = int64_t{1} << 30;
  const int64_t words = bytes / 8;
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[words]);
  for (int64_t i = 0; i < words; ++i) buffer[i] = static_cast<uint64_t>(i);  // resident, not the zero page
  std::atomic<uint64_t> sink{0};
  std::vector<double> threads_s, one_s;
  for (int pass = 0; pass < 5; ++pass) {
    threads_s.push_back(seconds_of([&] {
      const int64_t block = int64_t{1} << 20;  // 8 MiB per chunk
      tk::parallel_for(words / block, 1, [&](int64_t begin, int64_t end) {
        sink += sum_words(buffer.get() + begin * block, (end - begin) * block);
      });
    }));
    one_s.push_back(seconds_of([&] { sink += sum_words(buffer.get(), words); }));
  }
  std::printf(
      "{\"bandwidth\": {\"bytes\": %lld, \"threads\": %d, \"read_gbps\": %.3f, \"read_gbps_best\": %.3f, "
      "\"read_gbps_one_thread\": %.3f, \"checksum\": %llu}}\n",
      static_cast<long long>(bytes), tk::kernel_threads(), bytes / median(threads_s) * 1e-9,
      bytes / *std::min_element(threads_s.begin(), threads_s.end()) * 1e-9, bytes / median(one_s) * 1e-9,
      static_cast<unsigned long long>(sink.load() & 0xff));
}

struct Shape {
  int m, k, n;
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 30, bits = 4, group = 32, copies = 1;
  bool with_mlx = false, with_bandwidth = false;
  // --int8: x rounded to int8 per group (MatMulNBits accuracy_level 4), the int8 GEMV where the CPU has it.
  tk::Activations activations = tk::Activations::float32;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (arg == "--bits" && i + 1 < argc) {
      bits = std::atoi(argv[++i]);
    } else if (arg == "--group" && i + 1 < argc) {
      group = std::atoi(argv[++i]);
    } else if (arg == "--copies" && i + 1 < argc) {
      copies = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--int8") {
      activations = tk::Activations::int8_per_group;
    } else if (arg == "--mlx") {
      with_mlx = true;
    } else if (arg == "--bandwidth") {
      with_bandwidth = true;
    } else {
      Shape s{};
      if (std::sscanf(arg.c_str(), "%dx%dx%d", &s.m, &s.k, &s.n) != 3) {
        std::fprintf(
            stderr,
            "usage: quantized_matmul_bench [--runs N] [--bits B] [--group G] [--copies C] [--int8] [--mlx] "
            "[--bandwidth] "
            "[MxKxN ...]\n");
        return 2;
      }
      shapes.push_back(s);
    }
  }
  mx::set_default_device(mx::Device::cpu);
  if (with_bandwidth) bandwidth();
  for (const Shape& s : shapes) {
    mx::array x = mx::random::normal({s.m, s.k});
    std::vector<std::vector<mx::array>> weights;
    for (int c = 0; c < copies; ++c) {
      weights.push_back(mx::quantize(mx::random::normal({s.n, s.k}), group, bits, "affine"));
      mx::eval(weights.back());
    }
    mx::eval(x);
    int call = 0;
    auto kernel = [&] {
      const std::vector<mx::array>& q = weights[call++ % copies];
      return tk::quantized_matmul(x, q[0], q[1], q[2], group, bits, {}, activations);
    };
    const std::vector<mx::array>& q = weights[0];
    auto mlx = [&] { return mx::quantized_matmul(x, q[0], q[1], q[2], true, group, bits, "affine"); };
    std::vector<double> kernel_s, mlx_s;
    for (int i = 0; i < 3; ++i) mx::eval(kernel());
    for (int i = 0; i < runs; ++i) kernel_s.push_back(seconds_of([&] { mx::eval(kernel()); }));
    float diff = -1.0f;
    if (with_mlx) {
      const int mlx_runs = std::max(3, runs / 10);  // scalar: slow
      for (int i = 0; i < mlx_runs; ++i) mlx_s.push_back(seconds_of([&] { mx::eval(mlx()); }));
      call = 0;
      diff = mx::max(mx::abs(mx::subtract(kernel(), mlx()))).item<float>();
    }
    std::printf(
        "{\"shape\": \"%dx%dx%d\", \"bits\": %d, \"group\": %d, \"copies\": %d, \"int8\": %s, \"threads\": "
        "%d, "
        "\"gemm_rows\": %lld, \"kernel_ms\": %.4f, \"kernel_best_ms\": %.4f",
        s.m, s.k, s.n, bits, group, copies, activations == tk::Activations::int8_per_group ? "true" : "false",
        tk::kernel_threads(), static_cast<long long>(tk::quantized_matmul_gemm_rows()),
        median(kernel_s) * 1e3, *std::min_element(kernel_s.begin(), kernel_s.end()) * 1e3);
    if (with_mlx) std::printf(", \"mlx_ms\": %.4f, \"max_abs_diff\": %.3g", median(mlx_s) * 1e3, diff);
    std::printf("}\n");
    std::fflush(stdout);
  }
  return 0;
}
