// PNG through libpng's progressive-free read API, with the transforms that give
// what Pillow gives: palette expanded to RGB, gray below 8 bits scaled to 8,
// 16-bit samples cut to their high byte (Pillow's "RGB;16B" unpacking), no
// gamma or background handling (Pillow ignores gAMA and keeps alpha apart).
//
// libpng reports a fatal error through its error function, which must not
// return. Ours keeps the message and longjmps to png_jmpbuf, which the phase
// that called into libpng set first; phases hold no object with a destructor
// (see jpeg.cpp), and the read structs are freed by their owner's destructor.
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <png.h>

#include "ops/onnx/image/codecs.h"

namespace transmuter::image {
namespace {

struct PngSource {
  std::span<const uint8_t> file;
  size_t offset = 0;
  char message[256] = "";
};

[[noreturn]] void on_png_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof source->message, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

void read_png_bytes(png_structp png, png_bytep out, size_t count) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (count > source->file.size() - source->offset) png_error(png, "file is truncated");
  std::memcpy(out, source->file.data() + source->offset, count);
  source->offset += count;
}

struct PngDecompressor {
  PngSource source;
  png_structp png = nullptr;
  png_infop info = nullptr;

  explicit PngDecompressor(std::span<const uint8_t> file) {
    source.file = file;
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, on_png_error, on_png_warning);
    if (png != nullptr) info = png_create_info_struct(png);
    if (info == nullptr) {
      png_destroy_read_struct(&png, nullptr, nullptr);
      throw ImageDecodeError("PNG: cannot create the libpng read structs");
    }
  }
  ~PngDecompressor() { png_destroy_read_struct(&png, &info, nullptr); }
  PngDecompressor(const PngDecompressor&) = delete;
  PngDecompressor& operator=(const PngDecompressor&) = delete;
};

bool read_png_header(PngDecompressor& d) {
  if (setjmp(png_jmpbuf(d.png))) return false;
  png_set_read_fn(d.png, &d.source, read_png_bytes);
  png_read_info(d.png, d.info);
  const int color_type = png_get_color_type(d.png, d.info);
  const int bit_depth = png_get_bit_depth(d.png, d.info);
  if (bit_depth == 16) png_set_strip_16(d.png);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(d.png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(d.png);
  png_set_interlace_handling(d.png);
  png_read_update_info(d.png, d.info);
  return true;
}

// Reads all rows, then the chunks up to IEND: a file cut anywhere is an error.
bool read_png_pixels(PngDecompressor& d, png_bytepp rows) {
  if (setjmp(png_jmpbuf(d.png))) return false;
  png_read_image(d.png, rows);
  png_read_end(d.png, nullptr);
  return true;
}

}  // namespace

DecodedImage decode_png(std::span<const uint8_t> file, const DecodeLimits& limits) {
  PngDecompressor d(file);
  if (!read_png_header(d)) throw ImageDecodeError(std::string("PNG: ") + d.source.message);
  const png_uint_32 width = png_get_image_width(d.png, d.info);
  const png_uint_32 height = png_get_image_height(d.png, d.info);
  const int channels = png_get_channels(d.png, d.info);
  if (png_get_bit_depth(d.png, d.info) != 8 || channels < 1 || channels > 4 ||
      png_get_rowbytes(d.png, d.info) != static_cast<size_t>(width) * channels) {
    throw ImageDecodeError("PNG: unexpected sample layout after expansion");
  }
  DecodedImage image;
  image.allocate(height, width, channels, limits);
  std::vector<png_bytep> rows(height);
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = image.row(y);
  if (!read_png_pixels(d, rows.data())) throw ImageDecodeError(std::string("PNG: ") + d.source.message);
  return image;
}

}  // namespace transmuter::image
