// Image codecs for ImageDecoder: each turns a whole encoded file into 8-bit
// interleaved pixels, rows top to bottom. JPEG, PNG, TIFF, WebP and
// JPEG 2000 go through the system libraries' C APIs (libjpeg-turbo, libpng,
// libtiff, libwebp, OpenJPEG); BMP and PNM are parsed here, bounds-checked.
//
// What each codec gives matches what Pillow's np.array(Image.open(f)) gives
// for 8-bit RGB and grayscale files (the reference of the ONNX node tests);
// where Pillow's mode differs (palette, 16-bit samples), the codec expands to
// 8-bit gray or RGB the way Pillow's convert() would.
//
// A codec never allocates more than DecodeLimits::max_bytes for the pixels:
// the declared size is checked before the buffer exists. Every failure (short
// or corrupt data, unsupported variant, size beyond the limit) throws
// ImageDecodeError; none ends the process (libjpeg and libpng report through
// error managers that jump back, never through exit()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

namespace transmuter::image {

/** A decode failure; the op turns it into an OpError naming the node. */
class ImageDecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DecodeLimits {
  uint64_t max_bytes;  // largest pixel buffer (or library working raster) allowed
};

/** An uninitialized byte buffer: a decoder that fails early (a corrupt file
 * declaring a large size) never touches, so never commits, most of it. */
class PixelBuffer {
 public:
  void allocate(size_t size) {
    data_ = std::make_unique_for_overwrite<uint8_t[]>(size);
    size_ = size;
  }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  uint8_t& operator[](size_t i) { return data_[i]; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
};

/** Decoded pixels: channels 1 (gray), 2 (gray, alpha), 3 (RGB) or 4 (RGBA). */
struct DecodedImage {
  int64_t height = 0;
  int64_t width = 0;
  int channels = 0;
  PixelBuffer pixels;  // height * width * channels, row-major

  /** Sizes `pixels` for the given geometry; throws ImageDecodeError when a
   * dim is not positive or the buffer would exceed `limits`. */
  void allocate(int64_t height, int64_t width, int channels, const DecodeLimits& limits);
  uint8_t* row(int64_t y) { return pixels.data() + y * width * channels; }
};

/** Throws ImageDecodeError when `count` elements of `element_bytes` exceed the
 * limit (or overflow); `what` names the buffer in the message. */
void check_allocation(uint64_t count, uint64_t element_bytes, const DecodeLimits& limits, const char* what);

DecodedImage decode_jpeg(std::span<const uint8_t> file, const DecodeLimits& limits);
DecodedImage decode_png(std::span<const uint8_t> file, const DecodeLimits& limits);
DecodedImage decode_tiff(std::span<const uint8_t> file, const DecodeLimits& limits);
DecodedImage decode_webp(std::span<const uint8_t> file, const DecodeLimits& limits);
DecodedImage decode_jpeg2000(std::span<const uint8_t> file, const DecodeLimits& limits);
DecodedImage decode_bmp(std::span<const uint8_t> file, const DecodeLimits& limits);
DecodedImage decode_pnm(std::span<const uint8_t> file, const DecodeLimits& limits);

/** The codec for the file's signature bytes, or null when none matches. */
using Decoder = DecodedImage (*)(std::span<const uint8_t>, const DecodeLimits&);
Decoder find_decoder(std::span<const uint8_t> file);

}  // namespace transmuter::image
