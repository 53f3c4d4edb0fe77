// Image ops: ImageDecoder, MaxRoiPool.
// https://onnx.ai/onnx/operators/onnx__ImageDecoder.html
// https://onnx.ai/onnx/operators/onnx__MaxRoiPool.html
#include <algorithm>
#include <cmath>
#include <new>
#include <span>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "mlx_bridge/buffers.h"
#include "ops/node_context.h"
#include "ops/onnx/image/codecs.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

// --- ImageDecoder ---------------------------------------------------------------------------

enum class PixelFormat { kRgb, kBgr, kGrayscale };

PixelFormat read_pixel_format(const NodeContext& ctx) {
  const std::string name = ctx.attr_string("pixel_format", "RGB");
  if (name == "RGB") return PixelFormat::kRgb;
  if (name == "BGR") return PixelFormat::kBgr;
  if (name == "Grayscale") return PixelFormat::kGrayscale;
  throw ctx.error("pixel_format '", name, "' is not one of RGB, BGR, Grayscale");
}

// Pillow's convert("L"), which made the reference outputs: ITU-R 601-2 luma
// in 16-bit fixed point, rounded half up (libImaging/Convert.c, L24). The
// weights sum to 65536, so a gray pixel keeps its level.
uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

// [H, W, 3] RGB or BGR, or [H, W, 1] luma, from decoded gray or RGB pixels;
// alpha is dropped (Pillow's RGBA -> RGB/L conversions ignore it too).
mx::array to_pixel_format(const NodeContext& ctx, const image::DecodedImage& decoded, PixelFormat format) {
  const int out_channels = format == PixelFormat::kGrayscale ? 1 : 3;
  const int64_t count = checked_mul(ctx, checked_mul(ctx, decoded.height, decoded.width, "image size"),
                                    out_channels, "image size");
  if (static_cast<uint64_t>(count) > ctx.memory_limit()) {
    throw ctx.error("decoded image of ", count, " bytes exceeds the memory limit of ", ctx.memory_limit(),
                    " bytes");
  }
  const mx::Shape shape = to_shape(ctx, {decoded.height, decoded.width, out_channels});
  std::optional<MlxBuffer> buffer;
  try {
    buffer.emplace(static_cast<size_t>(count), BufferLifetime::kRun);
  } catch (const AllocationFailure& failure) {
    throw ctx.error("cannot allocate ", failure.nbytes, " bytes for the decoded image");
  }
  uint8_t* out = buffer->as<uint8_t>();
  const bool color = decoded.channels >= 3;
  const uint8_t* in = decoded.pixels.data();
  for (int64_t i = 0; i < decoded.height * decoded.width; ++i, in += decoded.channels) {
    if (format == PixelFormat::kGrayscale) {
      *out++ = color ? luma(in) : in[0];
      continue;
    }
    const uint8_t r = in[0];
    const uint8_t g = color ? in[1] : in[0];
    const uint8_t b = color ? in[2] : in[0];
    *out++ = format == PixelFormat::kBgr ? b : r;
    *out++ = g;
    *out++ = format == PixelFormat::kBgr ? r : b;
  }
  return buffer->into_array(shape, mx::uint8);
}

// The spec says a stream that cannot be decoded gives an empty matrix; here
// it is an error naming the node, so that a bad file never passes silently.
OpOutputs image_decoder(NodeContext& ctx) {
  const mx::array& encoded = ctx.input(0);
  if (encoded.dtype() != mx::uint8) throw ctx.error("encoded_stream must be uint8, got ", encoded.dtype());
  if (encoded.ndim() != 1) throw ctx.error("encoded_stream must be 1-D, got rank ", encoded.ndim());
  const PixelFormat format = read_pixel_format(ctx);
  mx::array bytes = mx::contiguous(encoded, false, mx::Device::cpu);
  mx::eval(bytes);
  const std::span<const uint8_t> file(bytes.data<uint8_t>(), bytes.size());
  const image::Decoder decode = image::find_decoder(file);
  if (decode == nullptr) {
    throw ctx.error("unknown image format (", file.size(),
                    " bytes); BMP, JPEG, JPEG 2000, PNG, PNM, TIFF and WebP are supported");
  }
  image::DecodedImage decoded;
  try {
    decoded = decode(file, image::DecodeLimits{ctx.memory_limit()});
  } catch (const image::ImageDecodeError& e) {
    throw ctx.error(e.what());
  } catch (const std::bad_alloc&) {
    throw ctx.error("out of memory while decoding the image");
  }
  return {to_pixel_format(ctx, decoded, format)};
}

// --- MaxRoiPool -----------------------------------------------------------------------------

// The windows of one region, in input pixels: ONNX Runtime's (and Caffe's)
// RoI pooling. Corners are rounded after scaling, a region is at least one
// pixel, bins split it evenly (floor for starts, ceil for ends) and are
// clipped to the input. Arithmetic in float, as ONNX Runtime does it.
struct RoiBins {
  int64_t batch = 0;
  std::vector<int64_t> row_start, row_end;  // per pooled row
  std::vector<int64_t> col_start, col_end;  // per pooled column
};

void split_region(float start, float end, int64_t pooled, int64_t size, std::vector<int64_t>& starts,
                  std::vector<int64_t>& ends) {
  const float extent = std::max(end - start + 1.0f, 1.0f);
  const float bin = extent / static_cast<float>(pooled);
  for (int64_t p = 0; p < pooled; ++p) {
    const float lo = std::floor(static_cast<float>(p) * bin) + start;
    const float hi = std::ceil(static_cast<float>(p + 1) * bin) + start;
    starts.push_back(static_cast<int64_t>(std::clamp(lo, 0.0f, static_cast<float>(size))));
    ends.push_back(static_cast<int64_t>(std::clamp(hi, 0.0f, static_cast<float>(size))));
  }
}

// Largest span of a bin, at least 1: every bin reads that many indices.
int64_t widest(const std::vector<RoiBins>& rois, bool rows) {
  int64_t most = 1;
  for (const RoiBins& r : rois) {
    const auto& starts = rows ? r.row_start : r.col_start;
    const auto& ends = rows ? r.row_end : r.col_end;
    for (size_t i = 0; i < starts.size(); ++i) most = std::max(most, ends[i] - starts[i]);
  }
  return most;
}

// X [N, C, H, W], rois [R, 5] (batch, x1, y1, x2, y2) -> [R, C, PH, PW].
// The regions are read on the host; each bin gathers a fixed window of
// widest-bin size from X (indices past the bin's end repeat its first one,
// which leaves the max unchanged) and takes the max. Empty bins give 0.
OpOutputs max_roi_pool(NodeContext& ctx) {
  const mx::array& x = ctx.input(0);
  if (x.ndim() != 4) throw ctx.error("X must be 4-D [N, C, H, W], got rank ", x.ndim());
  if (!mx::issubdtype(x.dtype(), mx::floating)) throw ctx.error("X must be a float tensor, got ", x.dtype());
  const std::vector<int64_t> pooled = ctx.attr_ints("pooled_shape");
  if (pooled.size() != 2 || pooled[0] <= 0 || pooled[1] <= 0) {
    throw ctx.error("pooled_shape must hold two positive values (height, width)");
  }
  const float scale = ctx.attr_float("spatial_scale", 1.0f);
  const mx::array& rois_tensor = ctx.input(1);
  if (rois_tensor.ndim() != 2 || rois_tensor.shape(1) != 5) {
    throw ctx.error("rois must be [num_rois, 5], got rank ", rois_tensor.ndim());
  }
  const std::vector<double> values = ctx.host_doubles(1);
  const int64_t n = x.shape(0), channels = x.shape(1), height = x.shape(2), width = x.shape(3);
  const int64_t num_rois = rois_tensor.shape(0);

  std::vector<RoiBins> rois(num_rois);
  for (int64_t r = 0; r < num_rois; ++r) {
    const double* roi = &values[r * 5];
    const float batch = static_cast<float>(roi[0]);
    if (!(batch >= 0 && batch < static_cast<float>(n))) {
      throw ctx.error("roi ", r, " has batch index ", roi[0], ", outside [0, ", n, ")");
    }
    auto corner = [&](double v) { return std::round(static_cast<float>(v) * scale); };
    rois[r].batch = static_cast<int64_t>(batch);
    split_region(corner(roi[2]), corner(roi[4]), pooled[0], height, rois[r].row_start, rois[r].row_end);
    split_region(corner(roi[1]), corner(roi[3]), pooled[1], width, rois[r].col_start, rois[r].col_end);
  }
  const int64_t kh = widest(rois, true), kw = widest(rois, false);
  const int64_t gathered =
      checked_product(ctx, {num_rois, pooled[0], kh, pooled[1], kw, channels}, "gather size");
  const int64_t gathered_bytes =
      checked_mul(ctx, gathered, static_cast<int64_t>(x.itemsize()), "gather size");
  if (static_cast<uint64_t>(gathered_bytes) > ctx.memory_limit()) {
    throw ctx.error("the regions' windows (", gathered_bytes, " bytes) exceed the memory limit");
  }

  // Flat indices into X as [N * H * W, C], ordered [R, PH, KH, PW, KW].
  std::vector<int32_t> index;
  std::vector<uint8_t> empty;
  index.reserve(static_cast<size_t>(gathered / channels));
  for (const RoiBins& r : rois) {
    for (int64_t ph = 0; ph < pooled[0]; ++ph) {
      for (int64_t i = 0; i < kh; ++i) {
        const int64_t row = r.row_start[ph] + i < r.row_end[ph] ? r.row_start[ph] + i : r.row_start[ph];
        for (int64_t pw = 0; pw < pooled[1]; ++pw) {
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t col = r.col_start[pw] + j < r.col_end[pw] ? r.col_start[pw] + j : r.col_start[pw];
            // Clamped: an empty bin may start at H or W; its value is replaced by 0 below.
            const int64_t flat =
                (r.batch * height + std::min(row, height - 1)) * width + std::min(col, width - 1);
            index.push_back(to_int32(ctx, flat, "input position"));
          }
        }
      }
    }
    for (int64_t ph = 0; ph < pooled[0]; ++ph) {
      for (int64_t pw = 0; pw < pooled[1]; ++pw) {
        empty.push_back(r.row_end[ph] <= r.row_start[ph] || r.col_end[pw] <= r.col_start[pw]);
      }
    }
  }
  const int r = to_int32(ctx, num_rois, "num_rois");
  const int ph = to_int32(ctx, pooled[0], "pooled height"), pw = to_int32(ctx, pooled[1], "pooled width");
  const int c = static_cast<int>(channels);
  auto s = ctx.stream();
  mx::array pixels = mx::reshape(mx::transpose(x, {0, 2, 3, 1}, s), {-1, c}, s);  // [N*H*W, C]
  mx::array indices(index.begin(), {r, ph, static_cast<int>(kh), pw, static_cast<int>(kw)}, mx::int32);
  mx::array windows = mx::take(pixels, indices, 0, s);    // [R, PH, KH, PW, KW, C]
  mx::array maxima = mx::max(windows, {2, 4}, false, s);  // [R, PH, PW, C]
  mx::array is_empty = mx::reshape(mx::array(empty.begin(), {r, ph, pw}, mx::bool_), {r, ph, pw, 1}, s);
  maxima = mx::where(is_empty, mx::zeros({}, x.dtype()), maxima, s);
  return {mx::transpose(maxima, {0, 3, 1, 2}, s)};
}

}  // namespace

void register_image(OpRegistry& r) {
  r.add({
      {.op_type = "ImageDecoder", .domain = kOnnx, .since = 20, .until = kOpen, .fn = image_decoder,
       .eager_only = true,
       .restrictions = "decodes on the host; no CMYK JPEG, subsampled or YCC JPEG 2000, animated WebP "
                       "or RLE BMP; a stream that cannot be decoded is an error, not an empty tensor",
       .not_differentiable = "integer output decoded on the host"},
      // v22 added bfloat16. The regions are read on the host; the gradient
      // with respect to them is zero (rounded corners), as it should be.
      {.op_type = "MaxRoiPool", .domain = kOnnx, .since = 1, .until = kOpen, .fn = max_roi_pool,
       .host_inputs = {1}},
  });
}

}  // namespace transmuter
