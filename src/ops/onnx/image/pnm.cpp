// Netpbm images (PBM, PGM, PPM; plain P1-P3 and raw P4-P6), parsed here with
// every read bounds-checked. A bitmap's 1 is black. Samples with a maxval
// other than 255 scale to 8 bits as round(value / maxval * 255) (half to
// even), as Pillow's PPM decoder computes them; 16-bit samples are big-endian.
// http://netpbm.sourceforge.net/doc/pnm.html
#include <cctype>
#include <cmath>
#include <string>

#include "ops/onnx/image/codecs.h"

namespace transmuter::image {
namespace {

// Nine digits keep width * height * 3 far inside uint64.
constexpr int64_t kMaxDecimalDigits = 9;

class PnmReader {
 public:
  explicit PnmReader(std::span<const uint8_t> file) : file_(file) {}

  // Skips whitespace and "#" comments (which run to the end of the line).
  void skip_space() {
    while (pos_ < file_.size()) {
      if (file_[pos_] == '#') {
        while (pos_ < file_.size() && file_[pos_] != '\n' && file_[pos_] != '\r') ++pos_;
      } else if (std::isspace(file_[pos_])) {
        ++pos_;
      } else {
        return;
      }
    }
  }
  /** The next decimal number; `what` names it in errors. */
  int64_t number(const char* what) {
    skip_space();
    int64_t value = 0;
    int64_t digits = 0;
    while (pos_ < file_.size() && std::isdigit(file_[pos_])) {
      if (++digits > kMaxDecimalDigits) throw ImageDecodeError(std::string("PNM: ") + what + " is too large");
      value = value * 10 + (file_[pos_++] - '0');
    }
    if (digits == 0) throw error(what);
    return value;
  }
  /** The next plain-bitmap digit, '0' or '1' (they need no separators). */
  int bit() {
    skip_space();
    if (pos_ >= file_.size() || (file_[pos_] != '0' && file_[pos_] != '1')) throw error("bitmap digit");
    return file_[pos_++] - '0';
  }
  /** The single whitespace byte that ends a raw header. */
  void header_end() {
    if (pos_ >= file_.size() || !std::isspace(file_[pos_])) throw error("whitespace after the header");
    ++pos_;
  }
  uint64_t remaining() const { return file_.size() - pos_; }
  /** The next `count` raw bytes. */
  const uint8_t* take(uint64_t count) {
    if (count > file_.size() - pos_) throw ImageDecodeError("PNM: file is truncated");
    const uint8_t* p = file_.data() + pos_;
    pos_ += count;
    return p;
  }

 private:
  ImageDecodeError error(const char* what) const {
    return ImageDecodeError(pos_ >= file_.size()
                                ? std::string("PNM: file is truncated")
                                : std::string("PNM: expected ") + what + " at byte " + std::to_string(pos_));
  }

  std::span<const uint8_t> file_;
  uint64_t pos_ = 2;  // past the magic number
};

uint8_t scale_sample(int64_t value, int64_t maxval) {
  if (value > maxval) throw ImageDecodeError("PNM: sample " + std::to_string(value) + " exceeds maxval");
  if (maxval == 255) return static_cast<uint8_t>(value);
  return static_cast<uint8_t>(
      std::nearbyint(static_cast<double>(value) / static_cast<double>(maxval) * 255.0));
}

}  // namespace

DecodedImage decode_pnm(std::span<const uint8_t> file, const DecodeLimits& limits) {
  const char kind = static_cast<char>(file[1]);
  const bool bitmap = kind == '1' || kind == '4';
  const bool plain = kind <= '3';
  const int channels = kind == '3' || kind == '6' ? 3 : 1;
  PnmReader in(file);
  const int64_t width = in.number("width");
  const int64_t height = in.number("height");
  const int64_t maxval = bitmap ? 1 : in.number("maxval");
  if (maxval < 1 || maxval > 65535)
    throw ImageDecodeError("PNM: maxval " + std::to_string(maxval) + " not in [1, 65535]");
  if (!plain) in.header_end();
  // The file must hold every sample before the image is allocated: a plain
  // sample takes at least one byte, a raw one 1/8, 1 or 2.
  if (width <= 0 || height <= 0) throw ImageDecodeError("PNM: image has no pixels");
  const uint64_t samples = static_cast<uint64_t>(width) * static_cast<uint64_t>(height) * channels;
  const uint64_t bytes = maxval < 256 ? 1 : 2;
  const uint64_t bitmap_stride = (static_cast<uint64_t>(width) + 7) / 8;
  const uint64_t needed = plain    ? samples
                          : bitmap ? bitmap_stride * static_cast<uint64_t>(height)
                                   : samples * bytes;
  if (needed > in.remaining()) throw ImageDecodeError("PNM: file is truncated");
  DecodedImage image;
  image.allocate(height, width, channels, limits);
  if (plain) {
    for (uint64_t i = 0; i < samples; ++i) {
      image.pixels[i] = bitmap ? (in.bit() ? 0 : 255) : scale_sample(in.number("sample"), maxval);
    }
  } else if (bitmap) {
    for (int64_t y = 0; y < height; ++y) {
      const uint8_t* row = in.take(bitmap_stride);
      uint8_t* out = image.row(y);
      for (int64_t x = 0; x < width; ++x) out[x] = (row[x / 8] >> (7 - x % 8)) & 1 ? 0 : 255;
    }
  } else {
    const uint8_t* raster = in.take(samples * bytes);
    for (uint64_t i = 0; i < samples; ++i) {
      const int64_t value = bytes == 1 ? raster[i] : (raster[2 * i] << 8) | raster[2 * i + 1];
      image.pixels[i] = scale_sample(value, maxval);
    }
  }
  return image;
}

}  // namespace transmuter::image
