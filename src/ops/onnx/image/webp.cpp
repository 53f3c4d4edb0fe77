// WebP (lossy and lossless, still images) through libwebp, decoded straight
// into the RGB buffer with the library's default (fancy) upsampling, as
// Pillow's decoder does.
#include <string>

#include <webp/decode.h>

#include "ops/onnx/image/codecs.h"

namespace transmuter::image {
namespace {

const char* status_text(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "corrupt bitstream";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "file is truncated";
  }
  return "unknown error";
}

}  // namespace

DecodedImage decode_webp(std::span<const uint8_t> file, const DecodeLimits& limits) {
  WebPBitstreamFeatures features;
  VP8StatusCode status = WebPGetFeatures(file.data(), file.size(), &features);
  if (status != VP8_STATUS_OK) throw ImageDecodeError(std::string("WebP: ") + status_text(status));
  if (features.has_animation) throw ImageDecodeError("WebP: animated images are not supported");
  DecodedImage image;
  image.allocate(features.height, features.width, 3, limits);
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) throw ImageDecodeError("WebP: library version mismatch");
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = image.pixels.data();
  config.output.u.RGBA.stride = static_cast<int>(image.width * 3);
  config.output.u.RGBA.size = image.pixels.size();
  status = WebPDecode(file.data(), file.size(), &config);
  WebPFreeDecBuffer(&config.output);  // frees nothing of external memory; the call is the documented pairing
  if (status != VP8_STATUS_OK) throw ImageDecodeError(std::string("WebP: ") + status_text(status));
  return image;
}

}  // namespace transmuter::image
