// The 8-bit channels-last convolutions (src/kernels/cpu/qlinear_conv.h) on their own, without a model
// around them: microseconds per call of a pointwise, k x k or depthwise QLinearConvNhwc on one image
// (bench/ort_node_profile.py gives ONNX Runtime's QLinearConv per node for comparison).
//
// usage: qlinear_conv_bench [--runs N] [HxWxCxM[:kK][:sS][:dw] ...]
//   e.g. 56x56x24x144 (pointwise), 112x112x3x32:k3:s2 (a stem), 56x56x144x144:k3:dw (depthwise)
// Prints one JSON object per line: the shape, median and fastest microseconds (mx::eval of the kernel on
// the CPU stream, input and weights prepared beforehand).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/qlinear_conv.h"

namespace mx = mlx::core;
namespace tk = transmuter::kernels;

namespace {

struct Shape {
  int h = 0, w = 0, c = 0, m = 0, k = 1, stride = 1;
  bool depthwise = false;
};

std::optional<Shape> parse(const std::string& s) {
  Shape shape;
  if (std::sscanf(s.c_str(), "%dx%dx%dx%d", &shape.h, &shape.w, &shape.c, &shape.m) != 4) return std::nullopt;
  for (size_t at = s.find(':'); at != std::string::npos; at = s.find(':', at + 1)) {
    const std::string part = s.substr(at + 1, s.find(':', at + 1) - at - 1);
    if (part == "dw")
      shape.depthwise = true;
    else if (part[0] == 'k')
      shape.k = std::atoi(part.c_str() + 1);
    else if (part[0] == 's')
      shape.stride = std::atoi(part.c_str() + 1);
    else
      return std::nullopt;
  }
  return shape;
}

mx::array bytes(mx::Shape shape, mx::Dtype type, uint64_t seed) {
  const int lo = type == mx::int8 ? -100 : 0, hi = type == mx::int8 ? 100 : 256;
  return mx::astype(mx::random::randint(lo, hi, shape, mx::int32, mx::random::key(seed)), type);
}

void run(const Shape& s, int runs) {
  tk::NhwcConvOptions o;
  o.kernel = {s.k, s.k};
  o.strides = {s.stride, s.stride};
  o.pads_begin = o.pads_end = {s.k / 2, s.k / 2};
  const mx::array x = bytes({1, s.h, s.w, s.c}, mx::uint8, 1);
  const mx::array x_zero(static_cast<uint8_t>(128));
  const int per_group = s.depthwise ? 1 : s.c;
  const mx::array w = bytes({s.m, per_group, s.k, s.k}, mx::int8, 2);
  const tk::QLinearRequantize r{mx::full({s.m}, 0.001f), mx::zeros({s.m}, mx::int32),
                                mx::array(static_cast<uint8_t>(3))};
  std::function<mx::array()> call;
  if (s.depthwise) {
    const mx::array dw = tk::qlinear_depthwise_weight(w, std::nullopt);
    mx::eval(dw);
    call = [=] { return tk::qlinear_depthwise_conv_nhwc(x, x_zero, dw, r, o, mx::Device::cpu); };
  } else {
    mx::array rows = mx::contiguous(tk::qlinear_conv_weight_rows(w));
    mx::eval(rows);
    const tk::PackedIntegerRhs packed = tk::pack_integer_gemm_rhs(rows, std::nullopt);
    call = [=] { return tk::qlinear_conv_nhwc(x, x_zero, packed, s.m, r, o, mx::Device::cpu); };
  }
  mx::eval(x);
  for (int i = 0; i < 20; ++i) mx::eval(call());
  std::vector<double> us;
  for (int i = 0; i < runs; ++i) {
    mx::array y = call();
    const auto t0 = std::chrono::steady_clock::now();
    mx::eval(y);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("{\"shape\": \"%dx%dx%dx%d k%d s%d%s\", \"median_us\": %.1f, \"min_us\": %.1f}\n", s.h, s.w,
              s.c, s.m, s.k, s.stride, s.depthwise ? " dw" : "", us[us.size() / 2], us.front());
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 200;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (std::optional<Shape> s = parse(arg)) {
      shapes.push_back(*s);
    } else {
      std::fprintf(stderr, "usage: qlinear_conv_bench [--runs N] [HxWxCxM[:kK][:sS][:dw] ...]\n");
      return 2;
    }
  }
  if (shapes.empty()) {
    for (const char* s : {"112x112x16x96", "56x56x24x144", "14x14x96x576", "28x28x32x192",
                          "56x56x144x144:k3:dw", "112x112x32x32:k3:dw", "224x224x3x32:k3:s2"})
      shapes.push_back(*parse(s));
  }
  for (const Shape& s : shapes) run(s, runs);
  return 0;
}
