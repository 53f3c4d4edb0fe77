// JPEG through libjpeg(-turbo), with the decoder settings Pillow uses by
// default: accurate integer IDCT (JDCT_ISLOW) and "fancy" (smooth) chroma
// upsampling, the two libjpeg defaults, and RGB output converted by libjpeg.
//
// libjpeg reports a fatal error by calling error_exit, which must not return
// (the default one calls exit()). Ours keeps the message and longjmps back to
// the setjmp of the phase that called into libjpeg. Each phase is a function
// of its own that calls setjmp before anything else and holds no object with
// a destructor, so the jump skips no C++ cleanup; the decompressor is
// destroyed by its owner's destructor.
#include <algorithm>
#include <climits>
#include <csetjmp>
#include <cstddef>
#include <cstdio>  // jpeglib.h uses FILE and size_t without including them
#include <string>

#include <jerror.h>
#include <jpeglib.h>

#include "ops/onnx/image/codecs.h"

namespace transmuter::image {
namespace {

struct JpegErrorManager {
  jpeg_error_mgr base;  // first member: libjpeg sees &base as cinfo->err
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_jpeg_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (corrupt but decodable data) are ignored, as Pillow ignores them,
// except a premature end: libjpeg would pad a truncated file with gray where
// Pillow reports it as truncated.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) on_jpeg_error(cinfo);
}

struct JpegDecompressor {
  jpeg_decompress_struct cinfo{};  // zeroed: destroying it before create is a no-op
  JpegErrorManager err{};

  JpegDecompressor() {
    cinfo.err = jpeg_std_error(&err.base);
    err.base.error_exit = on_jpeg_error;
    err.base.emit_message = on_jpeg_message;
  }
  ~JpegDecompressor() { jpeg_destroy_decompress(&cinfo); }
  JpegDecompressor(const JpegDecompressor&) = delete;
  JpegDecompressor& operator=(const JpegDecompressor&) = delete;
};

bool read_jpeg_header(JpegDecompressor& d, const uint8_t* data, size_t size, uint64_t max_bytes) {
  if (setjmp(d.err.jump)) return false;
  jpeg_create_decompress(&d.cinfo);
  // Caps libjpeg's own buffers too (a progressive file keeps every
  // coefficient of the image): beyond it libjpeg fails, having no backing store.
  d.cinfo.mem->max_memory_to_use = static_cast<long>(std::min<uint64_t>(max_bytes, LONG_MAX));
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d.cinfo, TRUE);
  return true;
}

// Decodes every scanline into `image`, sized from the header.
bool read_jpeg_pixels(JpegDecompressor& d, DecodedImage& image) {
  if (setjmp(d.err.jump)) return false;
  jpeg_start_decompress(&d.cinfo);
  if (static_cast<int64_t>(d.cinfo.output_width) != image.width ||
      static_cast<int64_t>(d.cinfo.output_height) != image.height ||
      d.cinfo.output_components != image.channels) {
    std::snprintf(d.err.message, sizeof d.err.message, "output geometry differs from the header");
    return false;
  }
  while (d.cinfo.output_scanline < d.cinfo.output_height) {
    JSAMPROW row = image.row(d.cinfo.output_scanline);
    if (jpeg_read_scanlines(&d.cinfo, &row, 1) != 1) {
      std::snprintf(d.err.message, sizeof d.err.message, "decoder returned no scanline");
      return false;
    }
  }
  jpeg_finish_decompress(&d.cinfo);
  return true;
}

}  // namespace

DecodedImage decode_jpeg(std::span<const uint8_t> file, const DecodeLimits& limits) {
  JpegDecompressor d;
  if (!read_jpeg_header(d, file.data(), file.size(), limits.max_bytes))
    throw ImageDecodeError(std::string("JPEG: ") + d.err.message);
  int channels = 3;
  switch (d.cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
      d.cinfo.out_color_space = JCS_GRAYSCALE;
      channels = 1;
      break;
    case JCS_YCbCr:
    case JCS_RGB:
      d.cinfo.out_color_space = JCS_RGB;
      break;
    default:
      throw ImageDecodeError("JPEG: CMYK and YCCK images are not supported");
  }
  DecodedImage image;
  image.allocate(d.cinfo.image_height, d.cinfo.image_width, channels, limits);
  if (!read_jpeg_pixels(d, image)) throw ImageDecodeError(std::string("JPEG: ") + d.err.message);
  return image;
}

}  // namespace transmuter::image
