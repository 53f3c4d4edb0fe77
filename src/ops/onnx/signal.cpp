// Signal processing: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow,
// MelWeightMatrix.
// https://onnx.ai/onnx/operators/onnx__DFT.html (and the others)
//
// ONNX spells a complex tensor as a float tensor whose last dim is 2 (real,
// imaginary); a real signal has a last dim of 1. The transforms run on
// mx::fft in complex64 (MLX has no complex128), so float64 signals are
// transformed in float32 precision; the result has the input's dtype.
// Windows and mel matrices depend only on host values (sizes, rates) and are
// computed on the host in double precision.
#include <cmath>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include <mlx/fft.h>
#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"
#include "transmuter/dtype.h"

namespace transmuter {
namespace {

/** x [..., 1] (real) or [..., 2] (real, imaginary) -> complex64 [...]. */
mx::array to_complex(const NodeContext& ctx, const mx::array& x, mx::StreamOrDevice s) {
  if (!mx::issubdtype(x.dtype(), mx::floating))
    throw ctx.error("input must be a float tensor, got ", x.dtype());
  const int last = static_cast<int>(x.ndim()) - 1;
  if (last < 0 || (x.shape(last) != 1 && x.shape(last) != 2)) {
    throw ctx.error("the last dim must be 1 (real) or 2 (complex), got ", last < 0 ? 0 : x.shape(last));
  }
  auto part = [&](int index) {
    mx::array p = mx::take(x, mx::array(index), last, s);
    return mx::astype(mx::astype(p, mx::float32, s), mx::complex64, s);
  };
  if (x.shape(last) == 1) return part(0);
  return mx::add(part(0), mx::multiply(part(1), mx::array(mx::complex64_t{0.0f, 1.0f}), s), s);
}

/** complex [...] -> [..., 2] of `dtype`. */
mx::array from_complex(const mx::array& c, mx::Dtype dtype, mx::StreamOrDevice s) {
  return mx::astype(mx::stack({mx::real(c, s), mx::imag(c, s)}, -1, s), dtype, s);
}

struct DftOptions {
  int axis;  // of the input (never its last dim)
  std::optional<int64_t> length;
  bool inverse;
  bool onesided;
};

// The forward transform of a real signal through rfft, whose DC (and even
// length Nyquist) bins have an imaginary part of exactly 0, as the spec's
// reference has; the full spectrum appends the mirrored conjugates
// X[n - k] = conj(X[k]).
mx::array real_fft(const mx::array& signal, int n, const DftOptions& o, mx::StreamOrDevice s) {
  mx::array half = mx::fft::rfft(signal, n, o.axis, mx::fft::FFTNorm::Backward, s);  // n / 2 + 1 bins
  if (o.onesided || n <= 2) return half;
  // Bins n - n/2 - 1 ... 1 of the half spectrum, conjugated, for k = n/2 + 1 ... n - 1.
  const int mirrored = n - (n / 2 + 1);
  mx::array index = mx::subtract(mx::array(mirrored), mx::arange(mirrored, mx::int32, s), s);
  mx::array tail = mx::conjugate(mx::take(half, index, o.axis, s), s);
  return mx::concatenate({half, tail}, o.axis, s);
}

// The transform along `axis` of x [..., 1|2]:
//   forward            fft (rfft for real signals), output length dft_length
//   forward onesided   the first dft_length / 2 + 1 bins of that
//   inverse            ifft (1/n normalized), output length dft_length
//   inverse onesided   irfft: one-sided bins -> real [..., dft_length, ..., 1];
//                      default dft_length 2 * (bins - 1)
mx::array dft(const NodeContext& ctx, const mx::array& x, const DftOptions& o, mx::StreamOrDevice s) {
  const int rank = static_cast<int>(x.ndim());
  if (o.axis < 0 || o.axis >= rank - 1) {
    throw ctx.error("axis ", o.axis, " is out of range for a signal of rank ", rank,
                    " (the last dim holds real/imag)");
  }
  const int axis_size = x.shape(o.axis);
  const int64_t length =
      o.length.value_or(o.inverse && o.onesided ? 2 * (int64_t{axis_size} - 1) : axis_size);
  if (length < 1) throw ctx.error("dft_length must be positive, got ", length);
  const int n = to_int32(ctx, length, "dft_length");
  if (!o.inverse && x.shape(rank - 1) == 1) {
    if (!mx::issubdtype(x.dtype(), mx::floating))
      throw ctx.error("input must be a float tensor, got ", x.dtype());
    mx::array signal = mx::astype(mx::squeeze(x, rank - 1, s), mx::float32, s);
    return from_complex(real_fft(signal, n, o, s), x.dtype(), s);
  }
  mx::array c = to_complex(ctx, x, s);
  if (o.inverse && o.onesided) {
    mx::array signal = mx::fft::irfft(c, n, o.axis, mx::fft::FFTNorm::Backward, s);
    return mx::astype(mx::expand_dims(signal, -1, s), x.dtype(), s);
  }
  mx::array y = o.inverse ? mx::fft::ifft(c, n, o.axis, mx::fft::FFTNorm::Backward, s)
                          : mx::fft::fft(c, n, o.axis, mx::fft::FFTNorm::Backward, s);
  if (o.onesided) {
    mx::Shape stop = y.shape();
    stop[o.axis] = n / 2 + 1;
    y = mx::slice(y, mx::Shape(y.ndim(), 0), stop, s);
  }
  return from_complex(y, x.dtype(), s);
}

std::optional<int64_t> optional_host_int(const NodeContext& ctx, size_t index) {
  if (!ctx.has_input(index)) return std::nullopt;
  return ctx.host_int(index);
}

// v17: axis is an attribute (default 1).
OpOutputs dft_v17(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const int rank = static_cast<int>(x.ndim());
  const int axis = ctx.normalize_axis(ctx.attr_int("axis", 1), rank);
  return {dft(
      ctx, x,
      {axis, optional_host_int(ctx, 1), ctx.attr_int("inverse", 0) != 0, ctx.attr_int("onesided", 0) != 0},
      ctx.stream())};
}

// v20: axis is an input (default -2, the last signal axis).
OpOutputs dft_v20(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  const int rank = static_cast<int>(x.ndim());
  const int axis = ctx.normalize_axis(optional_host_int(ctx, 2).value_or(-2), rank);
  return {dft(
      ctx, x,
      {axis, optional_host_int(ctx, 1), ctx.attr_int("inverse", 0) != 0, ctx.attr_int("onesided", 0) != 0},
      ctx.stream())};
}

// STFT: frames = (signal_length - frame_length) / frame_step + 1 windows of
// the signal [batch, signal_length, 1|2], each multiplied by `window` and
// transformed; output [batch, frames, bins, 2].
OpOutputs stft(NodeContext& ctx) {
  auto s = ctx.stream();
  const mx::array& signal = ctx.input(0);
  if (signal.ndim() != 3)
    throw ctx.error("signal must have rank 3 ([batch, length, 1|2]), got ", signal.ndim());
  const int64_t signal_length = signal.shape(1);
  const int64_t step = ctx.host_int(1);
  if (step < 1) throw ctx.error("frame_step must be positive, got ", step);
  std::optional<mx::array> window = ctx.optional_input(2);
  if (window && window->ndim() != 1) throw ctx.error("window must be 1-D, got rank ", window->ndim());
  std::optional<int64_t> frame_length = optional_host_int(ctx, 3);
  if (window && frame_length && *frame_length != window->shape(0)) {
    throw ctx.error("window has ", window->shape(0), " elements but frame_length is ", *frame_length);
  }
  const int64_t length = frame_length.value_or(window ? window->shape(0) : signal_length);
  if (length < 1 || length > signal_length) {
    throw ctx.error("frame_length ", length, " must lie in [1, signal length ", signal_length, "]");
  }
  const int frames = to_int32(ctx, (signal_length - length) / step + 1, "frame count");
  const int frame = static_cast<int>(length);

  // Sample index of element l of frame f: f * step + l, gathered as [frames * frame].
  mx::array starts = mx::multiply(mx::arange(frames, mx::int32, s), mx::array(static_cast<int>(step)), s);
  mx::array offsets = mx::arange(frame, mx::int32, s);
  mx::array index = mx::reshape(mx::add(mx::expand_dims(starts, 1, s), offsets, s), {-1}, s);
  mx::array framed = mx::take(signal, index, 1, s);  // [B, frames * frame, C]
  framed = mx::reshape(framed, {signal.shape(0), frames, frame, signal.shape(2)}, s);
  if (window)
    framed =
        mx::multiply(framed, mx::reshape(mx::astype(*window, signal.dtype(), s), {1, 1, frame, 1}, s), s);
  const bool onesided = ctx.attr_int("onesided", 1) != 0;
  return {dft(ctx, framed, {2, frame, false, onesided}, s)};
}

// --- Windows -----------------------------------------------------------------

/** Refuses a host table of `count` doubles beyond the memory limit. */
void check_host_table(const NodeContext& ctx, int64_t count) {
  if (static_cast<uint64_t>(count) > ctx.memory_limit() / sizeof(double)) {
    throw ctx.error(count, " elements exceed the memory limit");
  }
}

/** `values` as a 1-D array of the output_datatype attribute (default float). */
mx::array host_vector(const NodeContext& ctx, const std::vector<double>& values) {
  const auto type = static_cast<OnnxType>(ctx.attr_int("output_datatype", 1));
  std::optional<mx::Dtype> dtype = to_mlx_dtype(type);
  if (!dtype || *dtype == mx::bool_ || mx::issubdtype(*dtype, mx::complexfloating)) {
    throw ctx.error("unsupported output_datatype ", onnx_type_name(type));
  }
  const int n = static_cast<int>(values.size());
  if (*dtype == mx::float64) return mx::array(values.data(), {n}, mx::float64);
  std::vector<float> narrow(values.begin(), values.end());
  return mx::astype(mx::array(narrow.data(), {n}, mx::float32), *dtype);
}

// w[k] = sum_i a_i cos(2 pi i k / N), N = size (periodic) or size - 1 (symmetric).
OpOutputs cosine_window(NodeContext& ctx, double a0, double a1, double a2) {
  const int64_t size = ctx.host_int(0);
  if (size < 0) throw ctx.error("size must be non-negative, got ", size);
  to_int32(ctx, size, "size");
  check_host_table(ctx, size);
  const bool periodic = ctx.attr_int("periodic", 1) != 0;
  const double denominator = static_cast<double>(periodic ? size : size - 1);
  std::vector<double> w(static_cast<size_t>(size));
  for (int64_t k = 0; k < size; ++k) {
    const double phase = denominator > 0 ? 2 * std::numbers::pi * static_cast<double>(k) / denominator : 0;
    w[k] = a0 - a1 * std::cos(phase) + a2 * std::cos(2 * phase);
  }
  return {host_vector(ctx, w)};
}

constexpr double kHammingAlpha = 25.0 / 46.0;

// --- MelWeightMatrix -----------------------------------------------------------

// [dft_length / 2 + 1, num_mel_bins] triangular filters with peak 1, placed at
// num_mel_bins + 2 points evenly spaced on the mel scale
// mel(f) = 2595 log10(1 + f / 700) between the edges; each point maps to
// spectrogram bin floor((dft_length + 1) * f / sample_rate), as in the ONNX
// reference and ONNX Runtime.
OpOutputs mel_weight_matrix(NodeContext& ctx) {
  const int64_t mel_bins = ctx.host_int(0);
  const int64_t dft_length = ctx.host_int(1);
  const int64_t sample_rate = ctx.host_int(2);
  const double lower = ctx.host_double(3);
  const double upper = ctx.host_double(4);
  if (mel_bins < 1 || dft_length < 1 || sample_rate < 1) {
    throw ctx.error("num_mel_bins, dft_length and sample_rate must be positive, got ", mel_bins, ", ",
                    dft_length, ", ", sample_rate);
  }
  if (!(lower >= 0 && lower < upper)) {
    throw ctx.error("need 0 <= lower_edge_hertz < upper_edge_hertz, got ", lower, " and ", upper);
  }
  const int64_t spectrogram_bins = dft_length / 2 + 1;
  const int64_t cells = checked_mul(ctx, spectrogram_bins, mel_bins, "mel matrix size");
  to_int32(ctx, cells, "mel matrix size");
  check_host_table(ctx, cells);
  auto to_mel = [](double hz) { return 2595 * std::log10(1 + hz / 700); };
  const double low_mel = to_mel(lower);
  const double mel_step = (to_mel(upper) - low_mel) / static_cast<double>(mel_bins + 2);
  std::vector<int64_t> points(static_cast<size_t>(mel_bins + 2));
  for (size_t i = 0; i < points.size(); ++i) {
    const double hz = 700 * (std::pow(10.0, (low_mel + mel_step * static_cast<double>(i)) / 2595) - 1);
    points[i] = static_cast<int64_t>(
        std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(sample_rate)));
  }
  std::vector<double> w(static_cast<size_t>(cells), 0.0);
  auto set = [&](int64_t bin, int64_t mel, double value) {
    if (bin >= 0 && bin < spectrogram_bins) w[static_cast<size_t>(bin * mel_bins + mel)] = value;
  };
  for (int64_t m = 0; m < mel_bins; ++m) {
    const int64_t left = points[m], center = points[m + 1], right = points[m + 2];
    if (center == left) {
      set(center, m, 1);
    } else {
      for (int64_t j = left; j <= center; ++j)
        set(j, m, static_cast<double>(j - left) / static_cast<double>(center - left));
    }
    for (int64_t j = center; j < right; ++j)
      set(j, m, static_cast<double>(right - j) / static_cast<double>(right - center));
  }
  return {mx::reshape(host_vector(ctx, w), {static_cast<int>(spectrogram_bins), static_cast<int>(mel_bins)})};
}

OpOutputs hann_window(NodeContext& ctx) { return cosine_window(ctx, 0.5, 0.5, 0.0); }
OpOutputs hamming_window(NodeContext& ctx) { return cosine_window(ctx, kHammingAlpha, 1.0 - kHammingAlpha, 0.0); }
OpOutputs blackman_window(NodeContext& ctx) { return cosine_window(ctx, 0.42, 0.5, 0.08); }

constexpr std::string_view kHostComputed = "computed on the host from host inputs";

}  // namespace

void register_signal(OpRegistry& r) {
  r.add({
      {.op_type = "DFT",
       .domain = kOnnx,
       .since = 17,
       .until = 19,
       .fn = dft_v17,
       .host_inputs = {1},
       .restrictions = "computed in complex64 (float64 signals in float32 precision)"},
      // v20: axis becomes an input.
      {.op_type = "DFT",
       .domain = kOnnx,
       .since = 20,
       .until = kOpen,
       .fn = dft_v20,
       .host_inputs = {1, 2},
       .restrictions = "computed in complex64 (float64 signals in float32 precision)"},
      {.op_type = "STFT",
       .domain = kOnnx,
       .since = 17,
       .until = kOpen,
       .fn = stft,
       .host_inputs = {1, 3},
       .restrictions = "computed in complex64 (float64 signals in float32 precision)"},
      {.op_type = "HannWindow",
       .domain = kOnnx,
       .since = 17,
       .until = kOpen,
       .fn = hann_window,
       .host_inputs = {0},
       .not_differentiable = kHostComputed},
      {.op_type = "HammingWindow",
       .domain = kOnnx,
       .since = 17,
       .until = kOpen,
       .fn = hamming_window,
       .host_inputs = {0},
       .not_differentiable = kHostComputed},
      {.op_type = "BlackmanWindow",
       .domain = kOnnx,
       .since = 17,
       .until = kOpen,
       .fn = blackman_window,
       .host_inputs = {0},
       .not_differentiable = kHostComputed},
      {.op_type = "MelWeightMatrix",
       .domain = kOnnx,
       .since = 17,
       .until = kOpen,
       .fn = mel_weight_matrix,
       .host_inputs = {0, 1, 2, 3, 4},
       .not_differentiable = kHostComputed},
  });
}

}  // namespace transmuter
