#include "kernels/cpu/conv2d.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

namespace {

// One call's pointers and geometry, captured by value by the task.
struct Conv2dArgs {
  const float* x;     // [N, C, in_h, in_w]
  const float* w;     // [M, C, kernel_h, kernel_w]
  const float* bias;  // [M] or null
  float* y;           // [N, M, out_h, out_w]
  int64_t batch, channels, out_channels;
  int64_t in_h, in_w, out_h, out_w;
  int64_t kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left;
  ConvActivation activation;
  float clip_min, clip_max;

  int64_t positions() const { return out_h * out_w; }
  int64_t depth() const { return channels * kernel_h * kernel_w; }  // the GEMM's K
  bool needs_unfold() const {
    return kernel_h != 1 || kernel_w != 1 || stride_h != 1 || stride_w != 1 || pad_top != 0 || pad_left != 0 ||
           out_h != in_h || out_w != in_w;
  }
};

// Output columns ox whose input column ox * sW - padLeft + reach lies in
// [0, in_w): [first, last).
void valid_columns(const Conv2dArgs& a, int64_t reach, int64_t& first, int64_t& last) {
  const int64_t shift = reach - a.pad_left;  // ix = ox * sW + shift
  first = shift >= 0 ? 0 : (-shift + a.stride_w - 1) / a.stride_w;
  const int64_t room = a.in_w - shift;  // ix < in_w  <=>  ox * sW < room
  last = room <= 0 ? 0 : std::min(a.out_w, (room + a.stride_w - 1) / a.stride_w);
  first = std::min(first, last);
}

// Row `row` = (c * kH + ky) * kW + kx of one image's unfolded input: for
// every output position, the input value under kernel tap (ky, kx) of channel
// c, zero where the tap falls in the padding.
void unfold_row(const Conv2dArgs& a, const float* image, float* dst, int64_t row) {
  const int64_t kx = row % a.kernel_w, ky = (row / a.kernel_w) % a.kernel_h, c = row / (a.kernel_w * a.kernel_h);
  const float* plane = image + c * a.in_h * a.in_w;
  int64_t first, last;
  valid_columns(a, kx * a.dilation_w, first, last);
  const int64_t shift = kx * a.dilation_w - a.pad_left;
  for (int64_t oy = 0; oy < a.out_h; ++oy, dst += a.out_w) {
    const int64_t iy = oy * a.stride_h - a.pad_top + ky * a.dilation_h;
    if (iy < 0 || iy >= a.in_h || first >= last) {
      std::memset(dst, 0, static_cast<size_t>(a.out_w) * sizeof(float));
      continue;
    }
    std::fill(dst, dst + first, 0.0f);
    std::fill(dst + last, dst + a.out_w, 0.0f);
    const float* src = plane + iy * a.in_w + shift;
    if (a.stride_w == 1) {
      std::memcpy(dst + first, src + first, static_cast<size_t>(last - first) * sizeof(float));
    } else {
      for (int64_t ox = first; ox < last; ++ox) dst[ox] = src[ox * a.stride_w];
    }
  }
}

// Rows [begin, end) of the GEMM's right-hand side [depth, positions] (the
// image itself for a pointwise conv, else its unfolded rows) copied into the
// GEMM's panels: packed[p, row, j] = B[row, p * width + j], zero past the
// last position. Read in place, B's rows lie `positions` floats apart, which
// maps a panel's 256-row slice onto a few L1 sets; the panels are contiguous.
void pack_rows(const Conv2dArgs& a, const float* image, bool unfold, float* packed, int64_t begin, int64_t end) {
  thread_local std::vector<float> row_buffer;
  const int64_t positions = a.positions(), depth = a.depth(), width = gemm_panel_width();
  if (unfold) row_buffer.resize(static_cast<size_t>(positions));
  for (int64_t row = begin; row < end; ++row) {
    const float* src = image + row * positions;
    if (unfold) {
      unfold_row(a, image, row_buffer.data(), row);
      src = row_buffer.data();
    }
    for (int64_t p = 0, col = 0; col < positions; ++p, col += width) {
      copy_panel_row(packed + (p * depth + row) * width, src + col, std::min(width, positions - col), width);
    }
  }
}

// The panel buffer of the evaluating (stream) thread, kept between calls so
// that steady-state inference allocates (and page-faults) nothing; one larger
// than kKeepBytes is released after the call.
constexpr size_t kKeepBytes = size_t{64} << 20;

void run_conv2d(const Conv2dArgs& a) {
  thread_local std::vector<float> panel_buffer;
  const int64_t positions = a.positions(), depth = a.depth(), width = gemm_panel_width();
  const bool unfold = a.needs_unfold();
  panel_buffer.resize(static_cast<size_t>(depth * ((positions + width - 1) / width) * width));
  const int64_t plane_in = a.channels * a.in_h * a.in_w, plane_out = a.out_channels * positions;
  // About 32K values a chunk: enough work to pay for waking a thread.
  const int64_t pack_grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, positions));
  for (int64_t n = 0; n < a.batch; ++n) {
    const float* image = a.x + n * plane_in;
    float* out = a.y + n * plane_out;
    float* packed = panel_buffer.data();
    parallel_for(depth, pack_grain,
                 [&](int64_t begin, int64_t end) { pack_rows(a, image, unfold, packed, begin, end); });
    GemmArgs product;
    product.packed = packed;
    product.a = a.w;
    product.lda = product.k = depth;
    product.n = product.ldy = positions;
    product.row_bias = a.bias;
    product.y = out;
    product.m = a.out_channels;
    product.conv_activation = a.activation;
    product.clip_min = a.clip_min;
    product.clip_max = a.clip_max;
    run_gemm(product);
  }
  if (panel_buffer.capacity() * sizeof(float) > kKeepBytes) std::vector<float>().swap(panel_buffer);
}

// The composition the kernel replaces (the grouped-conv reference with one
// group); inputs {x, w[, bias]} in ONNX layout.
mx::array conv2d_reference(const std::vector<mx::array>& in, const Conv2dOptions& o, mx::Stream s) {
  const DepthwiseConvOptions one_group{.strides = o.strides,
                                       .pads_begin = o.pads_begin,
                                       .pads_end = o.pads_end,
                                       .dilations = o.dilations,
                                       .groups = 1,
                                       .activation = o.activation,
                                       .clip_min = o.clip_min,
                                       .clip_max = o.clip_max};
  return grouped_conv_reference(in, one_group, s);
}

class Conv2dKernel : public CpuKernel {
 public:
  Conv2dKernel(mx::Stream stream, Reference reference, Conv2dOptions options)
      : CpuKernel(stream, std::move(reference)), options_(std::move(options)) {}
  const char* name() const override { return "transmuter::Conv2d"; }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array& x = in[0];
    const mx::array& w = in[1];
    const mx::array& y = out[0];
    Conv2dArgs args{};
    args.x = x.data<float>();
    args.w = w.data<float>();
    args.bias = in.size() > 2 ? in[2].data<float>() : nullptr;
    args.y = out[0].data<float>();
    args.batch = x.shape(0);
    args.channels = x.shape(1);
    args.out_channels = w.shape(0);
    args.in_h = x.shape(2);
    args.in_w = x.shape(3);
    args.out_h = y.shape(2);
    args.out_w = y.shape(3);
    args.kernel_h = w.shape(2);
    args.kernel_w = w.shape(3);
    args.stride_h = options_.strides[0];
    args.stride_w = options_.strides[1];
    args.dilation_h = options_.dilations[0];
    args.dilation_w = options_.dilations[1];
    args.pad_top = options_.pads_begin[0];
    args.pad_left = options_.pads_begin[1];
    args.activation = options_.activation;
    args.clip_min = options_.clip_min;
    args.clip_max = options_.clip_max;
    return [args] { run_conv2d(args); };
  }

 private:
  Conv2dOptions options_;
};

// Output length of one spatial axis, or <= 0 when the window does not fit.
int64_t output_length(int64_t in, int64_t k, int stride, int pad_begin, int pad_end, int dilation) {
  const int64_t room = in + pad_begin + pad_end - static_cast<int64_t>(dilation) * (k - 1) - 1;
  return room < 0 ? 0 : room / stride + 1;  // (division truncates toward zero: test the sign first)
}

bool all_at_least(const std::vector<int>& v, int minimum) {
  return std::all_of(v.begin(), v.end(), [minimum](int x) { return x >= minimum; });
}

mx::Shape output_shape(const mx::array& x, const mx::array& w, const Conv2dOptions& o) {
  mx::Shape shape = {x.shape(0), w.shape(0)};
  for (int i = 0; i < 2; ++i) {
    shape.push_back(static_cast<int>(output_length(x.shape(2 + i), w.shape(2 + i), o.strides[i], o.pads_begin[i],
                                                   o.pads_end[i], o.dilations[i])));
  }
  return shape;
}

}  // namespace

bool conv2d_fits(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                 const Conv2dOptions& o) {
  if (x.ndim() != 4 || w.ndim() != 4 || x.dtype() != mx::float32 || w.dtype() != mx::float32) return false;
  if (o.strides.size() != 2 || o.dilations.size() != 2 || o.pads_begin.size() != 2 || o.pads_end.size() != 2 ||
      !all_at_least(o.strides, 1) || !all_at_least(o.dilations, 1) || !all_at_least(o.pads_begin, 0) ||
      !all_at_least(o.pads_end, 0)) {
    return false;
  }
  if (w.shape(1) != x.shape(1) || x.size() == 0 || w.size() == 0) return false;
  if (bias && (bias->ndim() != 1 || bias->shape(0) != w.shape(0) || bias->dtype() != mx::float32)) return false;
  int64_t positions = 1;
  for (int i = 0; i < 2; ++i) {
    const int64_t length = output_length(x.shape(2 + i), w.shape(2 + i), o.strides[i], o.pads_begin[i],
                                         o.pads_end[i], o.dilations[i]);
    if (length <= 0 || length > std::numeric_limits<int32_t>::max()) return false;
    positions *= length;
  }
  // The GEMM's dimensions are BLAS ints.
  const int64_t depth = static_cast<int64_t>(w.shape(1)) * w.shape(2) * w.shape(3);
  const int64_t int_max = std::numeric_limits<int>::max();
  return positions <= int_max && depth <= int_max && depth * positions <= int_max * int64_t{64};
}

size_t conv2d_unfold_bytes(const mx::array& x, const mx::array& w, const Conv2dOptions& o) {
  const mx::Shape y = output_shape(x, w, o);
  const size_t width = static_cast<size_t>(gemm_panel_width());
  const size_t positions = static_cast<size_t>(y[2]) * y[3];
  const size_t padded_positions = (positions + width - 1) / width * width;
  return static_cast<size_t>(w.shape(1)) * w.shape(2) * w.shape(3) * padded_positions * sizeof(float);
}

mx::array conv2d(const mx::array& x, const mx::array& w, const std::optional<mx::array>& bias,
                 const Conv2dOptions& options, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {x, w};
  if (bias) inputs.push_back(*bias);
  if (!conv2d_fits(x, w, bias, options)) return conv2d_reference(inputs, options, stream);
  Reference reference = [options, stream](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{conv2d_reference(in, options, stream)};
  };
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) { return std::make_shared<Conv2dKernel>(kernel_stream, reference, options); },
      reference, inputs, {output_shape(x, w, options)}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
