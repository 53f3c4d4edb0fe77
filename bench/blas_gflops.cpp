// fp32 matmul throughput of MLX's CPU backend, and of cblas_sgemm called
// directly, in whatever BLAS the process binds `cblas_sgemm` to.
//
// The same source is built twice (bench/CMakeLists.txt):
//   blas_gflops_reference  links only `mlx`: the wheel's reference BLAS, as shipped;
//   blas_gflops            links `transmuter`: OpenBLAS is linked ahead of MLX, so
//                          MLX's cblas_sgemm calls bind to OpenBLAS.
// The direct call goes through dlsym(RTLD_DEFAULT, "cblas_sgemm"), the same global
// symbol lookup that resolves libmlx's undefined cblas_sgemm, so it is the ceiling
// MLX can reach with that BLAS.
//
// usage: blas_gflops [--warmup N] [--runs N] [--min-seconds S] [--max-seconds S] [--json FILE]
// Prints one row per size: GFLOPS (2*M*N*K / median time) of mx::matmul and of the
// direct call, their ratio, and "others": the share of the cores that other processes
// used meanwhile (a run with a high share measured a busy machine).

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "mlx/mlx.h"

namespace mx = mlx::core;

namespace {

// CBLAS enum values are fixed by the CBLAS standard (cblas.h).
constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;
using SgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

struct GemmShape {
  int m, k, n;
  std::string label;  // what the shape stands for
};

struct Options {
  int warmup = 2;
  int runs = 20;
  double min_seconds = 1.0;   // per size: small sizes run more often than `runs`, for a
                              // stable median and a meaningful OtherLoad share (10 ms ticks)
  double max_seconds = 16.0;  // per size; stops early (after >= 3 runs) on slow BLAS
  std::string json_path;
};

struct Timing {
  double median_ms = 0;
  int runs = 0;
};

struct Row {
  GemmShape shape;
  Timing mlx, direct;
  double max_abs_diff = 0;     // mx::matmul vs the direct call, same inputs
  double other_cpu_share = 0;  // cores used by other processes meanwhile (OtherLoad)
};

// CPU seconds all processes have spent busy since boot, over all cores (/proc/stat).
double busy_cpu_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return (user + nice + system + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds of this process, all threads (OpenBLAS's and MLX's included).
double own_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

// Share of the machine's cores that other processes used since construction: 0 means the
// benchmark had the machine to itself; 0.5 on 2 cores means a whole core went elsewhere,
// and 2-thread timings are then not comparable with a quiet run.
class OtherLoad {
 public:
  OtherLoad()
      : busy_(busy_cpu_seconds()), own_(own_cpu_seconds()), start_(std::chrono::steady_clock::now()) {}
  double share() const {
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    double other = (busy_cpu_seconds() - busy_) - (own_cpu_seconds() - own_);
    return std::max(0.0, other) / (wall * static_cast<double>(std::thread::hardware_concurrency()));
  }

 private:
  double busy_, own_;
  std::chrono::steady_clock::time_point start_;
};

double gflops(const GemmShape& s, double ms) { return 2.0 * s.m * s.n * s.k / (ms * 1e6); }

double elapsed_ms(const std::function<void()>& once) {
  auto t0 = std::chrono::steady_clock::now();
  once();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Timing median_of(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], static_cast<int>(ms.size())};
}

// Median wall times of `a` and `b`, after `warmup` untimed calls of each. The timed calls
// alternate a, b, a, b... so that load from other processes on the shared cores falls on
// both alike and their ratio stays meaningful.
std::pair<Timing, Timing> measure_pair(const std::function<void()>& a, const std::function<void()>& b,
                                       const Options& opt) {
  for (int i = 0; i < opt.warmup; ++i) {
    // One call of a second or more has warmed caches and thread pools; more only cost time.
    if (elapsed_ms(a) + elapsed_ms(b) > 2000.0) break;
  }
  std::vector<double> ms_a, ms_b;
  auto start = std::chrono::steady_clock::now();
  while (true) {
    ms_a.push_back(elapsed_ms(a));
    ms_b.push_back(elapsed_ms(b));
    double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int done = static_cast<int>(ms_a.size());
    if (done >= 3 && spent > opt.max_seconds) break;
    if (done >= opt.runs && spent >= opt.min_seconds) break;
  }
  return {median_of(ms_a), median_of(ms_b)};
}

std::vector<float> random_floats(size_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

Row bench_shape(const GemmShape& s, SgemmFn sgemm, const Options& opt) {
  std::vector<float> a = random_floats(static_cast<size_t>(s.m) * s.k, 1);
  std::vector<float> b = random_floats(static_cast<size_t>(s.k) * s.n, 2);
  std::vector<float> c(static_cast<size_t>(s.m) * s.n);

  mx::array xa(a.data(), {s.m, s.k}, mx::float32);
  mx::array xb(b.data(), {s.k, s.n}, mx::float32);
  mx::eval(xa, xb);

  Row row{s, {}, {}, 0, 0};
  // What a user of MLX pays: build the op and evaluate it (allocation included).
  auto mlx_matmul = [&] { mx::eval(mx::matmul(xa, xb)); };
  auto direct_sgemm = [&] {
    sgemm(kCblasRowMajor, kCblasNoTrans, kCblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n,
          0.0f, c.data(), s.n);
  };
  OtherLoad other;
  std::tie(row.mlx, row.direct) = measure_pair(mlx_matmul, direct_sgemm, opt);
  row.other_cpu_share = other.share();

  mx::array out = mx::matmul(xa, xb);
  out.eval();
  const float* got = out.data<float>();
  for (size_t i = 0; i < c.size(); ++i) {
    row.max_abs_diff = std::max(row.max_abs_diff, static_cast<double>(std::fabs(got[i] - c[i])));
  }
  return row;
}

// Shared object that defines `symbol` in this process, or "(not found)".
std::string library_of(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "(not found)";
  std::error_code ec;
  auto real = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::string(info.dli_fname) : real.string();
}

// "1.23 4.56 7.89": the machine's 1, 5 and 15 minute load averages (timings are only as
// good as the machine's idleness; the cores are shared).
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one, five, fifteen;
  f >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// OpenBLAS reports its thread count and kernel; reference BLAS has neither call.
struct BlasThreads {
  std::string env;
  int threads = 1;
  std::string config;
};

BlasThreads blas_threads() {
  BlasThreads t;
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  t.env = env ? env : "(unset)";
  using IntFn = int (*)();
  using TextFn = char* (*)();
  if (auto get = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) t.threads = get();
  if (auto config = reinterpret_cast<TextFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) t.config = config();
  if (auto core = reinterpret_cast<TextFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    t.config += std::string(" core=") + core();
  }
  if (t.config.empty()) t.config = "not OpenBLAS (single-threaded reference BLAS)";
  return t;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

void write_json(const std::string& path, const std::string& binary, const std::string& blas_lib,
                const BlasThreads& threads, const std::vector<Row>& rows) {
  std::ofstream f(path);
  f << std::setprecision(6) << "{\n  \"binary\": \"" << json_escape(binary)
    << "\",\n  \"load_average_end\": \"" << load_average() << "\",\n  \"cblas_sgemm_library\": \""
    << json_escape(blas_lib) << "\",\n  \"openblas_num_threads_env\": \"" << json_escape(threads.env)
    << "\",\n  \"blas_threads\": " << threads.threads << ",\n  \"blas_config\": \""
    << json_escape(threads.config) << "\",\n  \"results\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    f << "    {\"m\": " << r.shape.m << ", \"k\": " << r.shape.k << ", \"n\": " << r.shape.n
      << ", \"label\": \"" << r.shape.label << "\", \"mlx_median_ms\": " << r.mlx.median_ms
      << ", \"mlx_runs\": " << r.mlx.runs << ", \"mlx_gflops\": " << gflops(r.shape, r.mlx.median_ms)
      << ", \"direct_median_ms\": " << r.direct.median_ms << ", \"direct_runs\": " << r.direct.runs
      << ", \"direct_gflops\": " << gflops(r.shape, r.direct.median_ms)
      << ", \"mlx_over_direct\": " << r.direct.median_ms / r.mlx.median_ms
      << ", \"max_abs_diff\": " << r.max_abs_diff << ", \"other_cpu_share\": " << r.other_cpu_share << "}"
      << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + arg);
      return argv[++i];
    };
    if (arg == "--warmup")
      opt.warmup = std::stoi(next());
    else if (arg == "--runs")
      opt.runs = std::max(1, std::stoi(next()));
    else if (arg == "--max-seconds")
      opt.max_seconds = std::stod(next());
    else if (arg == "--min-seconds")
      opt.min_seconds = std::stod(next());
    else if (arg == "--json")
      opt.json_path = next();
    else
      throw std::invalid_argument(
          "unknown argument " + arg +
          "\nusage: blas_gflops [--warmup N] [--runs N] [--min-seconds S] [--max-seconds S] [--json FILE]");
  }
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  if (sgemm == nullptr) {
    std::cerr << "cblas_sgemm is not loaded in this process\n";
    return 1;
  }
  mx::set_default_device(mx::Device::cpu);

  std::string blas_lib = library_of("cblas_sgemm");
  BlasThreads threads = blas_threads();
  std::cout << "binary: " << argv[0] << "\n"
            << "cblas_sgemm resolves to: " << blas_lib << "\n"
            << "OPENBLAS_NUM_THREADS: " << threads.env << "  BLAS threads: " << threads.threads << "\n"
            << "BLAS config: " << threads.config << "\n"
            << "load average: " << load_average() << "\n"
            << "warmup " << opt.warmup << "; per size, the median of >= " << opt.runs
            << " alternating runs of each, run for >= " << opt.min_seconds << " s (at most "
            << opt.max_seconds << " s once 3 runs are done)\n\n";

  const std::vector<GemmShape> shapes = {
      {1024, 1024, 1024, "square 1024"},
      {512, 512, 512, "square 512"},
      {2048, 2048, 2048, "square 2048"},
      {128, 384, 1536, "BERT-small FFN, seq 128"},
  };
  std::vector<Row> rows;
  std::cout << std::left << std::setw(18) << "MxKxN" << std::right << std::setw(12) << "mlx GFLOPS"
            << std::setw(14) << "direct GFLOPS" << std::setw(12) << "mlx/direct" << std::setw(12)
            << "max|diff|" << std::setw(8) << "others" << "\n";
  for (const GemmShape& s : shapes) {
    Row r = bench_shape(s, sgemm, opt);
    rows.push_back(r);
    std::ostringstream dims;
    dims << s.m << "x" << s.k << "x" << s.n;
    std::cout << std::left << std::setw(18) << dims.str() << std::right << std::fixed << std::setprecision(1)
              << std::setw(12) << gflops(s, r.mlx.median_ms) << std::setw(14) << gflops(s, r.direct.median_ms)
              << std::setprecision(3) << std::setw(12) << r.direct.median_ms / r.mlx.median_ms
              << std::scientific << std::setprecision(1) << std::setw(12) << r.max_abs_diff << std::fixed
              << std::setw(7) << 100.0 * r.other_cpu_share << "%" << std::defaultfloat << "  (" << s.label
              << "; runs " << r.mlx.runs << "/" << r.direct.runs << ")\n"
              << std::flush;
  }
  if (!opt.json_path.empty()) write_json(opt.json_path, argv[0], blas_lib, threads, rows);
  return 0;
}
