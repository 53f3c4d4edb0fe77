// BMP (Windows and OS/2 bitmaps), parsed here with every read bounds-checked.
// Covers uncompressed 1/4/8-bit palette, 16-bit (5-5-5 or bit fields), 24-bit
// and 32-bit (BGRX or bit fields) images, bottom-up or top-down; RLE
// compression is rejected. Bit-field channels of n bits scale to 8 bits as
// value * 255 / (2^n - 1), Pillow's "BGR;15"/"BGR;16" unpacking.
// https://learn.microsoft.com/en-us/windows/win32/gdi/bitmap-storage
#include <array>
#include <bit>
#include <string>
#include <vector>

#include "ops/onnx/image/codecs.h"

namespace transmuter::image {
namespace {

constexpr uint32_t kRgb = 0;
constexpr uint32_t kBitFields = 3;
constexpr uint32_t kAlphaBitFields = 6;

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> file) : file_(file) {}
  uint32_t u8(uint64_t at) const { return bytes(at, 1)[0]; }
  uint32_t u16(uint64_t at) const {
    const uint8_t* p = bytes(at, 2);
    return p[0] | (p[1] << 8);
  }
  uint32_t u32(uint64_t at) const {
    const uint8_t* p = bytes(at, 4);
    return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
  }
  int32_t i32(uint64_t at) const { return static_cast<int32_t>(u32(at)); }
  /** `count` bytes at `at`; throws when they lie past the end of the file. */
  const uint8_t* bytes(uint64_t at, uint64_t count) const {
    if (at > file_.size() || count > file_.size() - at) throw ImageDecodeError("BMP: file is truncated");
    return file_.data() + at;
  }

 private:
  std::span<const uint8_t> file_;
};

// One channel of a bit-field pixel: where its bits are and how to widen them.
struct BitField {
  uint32_t mask = 0;
  int shift = 0;
  uint32_t max = 0;  // the channel's largest value, 0 for an absent channel

  explicit BitField(uint32_t m) : mask(m) {
    if (mask == 0) return;
    shift = std::countr_zero(mask);
    const uint32_t bits = mask >> shift;
    if ((bits & (bits + 1)) != 0) throw ImageDecodeError("BMP: bit-field mask is not contiguous");
    max = bits;
  }
  uint8_t operator()(uint32_t pixel) const {
    if (max == 0) return 0;
    return static_cast<uint8_t>(static_cast<uint64_t>((pixel & mask) >> shift) * 255 / max);
  }
};

struct BmpHeader {
  int64_t width = 0;
  int64_t height = 0;  // positive; see top_down
  bool top_down = false;
  uint32_t bits = 0;
  uint32_t compression = kRgb;
  uint64_t pixel_offset = 0;
  std::array<uint32_t, 3> masks = {0, 0, 0};    // red, green, blue
  std::vector<std::array<uint8_t, 3>> palette;  // RGB
};

BmpHeader read_header(const ByteReader& in) {
  BmpHeader h;
  h.pixel_offset = in.u32(10);
  const uint32_t info_size = in.u32(14);
  uint64_t palette_at = 14 + static_cast<uint64_t>(info_size);
  int palette_entry = 4;  // BGRX
  uint32_t colors_used = 0;
  if (info_size == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit sizes, BGR palette
    h.width = in.u16(18);
    h.height = in.u16(20);
    h.bits = in.u16(24);
    palette_entry = 3;
  } else if (info_size >= 40) {
    h.width = in.i32(18);
    const int64_t height = in.i32(22);
    h.top_down = height < 0;
    h.height = height < 0 ? -height : height;
    h.bits = in.u16(28);
    h.compression = in.u32(30);
    colors_used = in.u32(46);
    if (h.compression == kBitFields || h.compression == kAlphaBitFields) {
      // In a 40-byte header the masks follow it; larger headers hold them.
      const uint64_t masks_at = 54;
      h.masks = {in.u32(masks_at), in.u32(masks_at + 4), in.u32(masks_at + 8)};
      if (info_size == 40) palette_at += h.compression == kAlphaBitFields ? 16 : 12;
    }
  } else {
    throw ImageDecodeError("BMP: unknown info header size " + std::to_string(info_size));
  }
  if (h.compression != kRgb && h.compression != kBitFields && h.compression != kAlphaBitFields) {
    throw ImageDecodeError("BMP: compression " + std::to_string(h.compression) +
                           " (RLE, JPEG, PNG) is not supported");
  }
  const bool fields = h.compression != kRgb;
  if (fields ? (h.bits != 16 && h.bits != 32)
             : (h.bits != 1 && h.bits != 4 && h.bits != 8 && h.bits != 16 && h.bits != 24 && h.bits != 32)) {
    throw ImageDecodeError("BMP: " + std::to_string(h.bits) + " bits per pixel is not supported");
  }
  if (h.compression == kRgb && h.bits == 16) h.masks = {0x7C00, 0x03E0, 0x001F};
  if (h.compression == kRgb && h.bits == 32) h.masks = {0xFF0000, 0x00FF00, 0x0000FF};
  if (h.bits <= 8) {
    const uint32_t full = 1u << h.bits;
    const uint32_t count = colors_used == 0 || colors_used > full ? full : colors_used;
    h.palette.resize(count);
    for (uint32_t i = 0; i < count; ++i) {
      const uint8_t* bgr = in.bytes(palette_at + static_cast<uint64_t>(i) * palette_entry, 3);
      h.palette[i] = {bgr[2], bgr[1], bgr[0]};
    }
  }
  return h;
}

// Unpacks one stored row into RGB.
void unpack_row(const BmpHeader& h, const uint8_t* row, uint8_t* out, const std::array<BitField, 3>& fields) {
  for (int64_t x = 0; x < h.width; ++x, out += 3) {
    if (h.bits <= 8) {
      const uint64_t bit = static_cast<uint64_t>(x) * h.bits;
      const uint32_t index = (row[bit / 8] >> (8 - h.bits - bit % 8)) & ((1u << h.bits) - 1);
      // An index past a short palette reads as black, as in a zero-padded palette.
      if (index < h.palette.size()) std::copy(h.palette[index].begin(), h.palette[index].end(), out);
    } else if (h.bits == 24) {
      const uint8_t* bgr = row + x * 3;
      out[0] = bgr[2];
      out[1] = bgr[1];
      out[2] = bgr[0];
    } else {
      const uint8_t* p = row + x * (h.bits / 8);
      const uint32_t pixel = h.bits == 16
                                 ? p[0] | (p[1] << 8)
                                 : p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
      for (int c = 0; c < 3; ++c) out[c] = fields[c](pixel);
    }
  }
}

}  // namespace

DecodedImage decode_bmp(std::span<const uint8_t> file, const DecodeLimits& limits) {
  const ByteReader in(file);
  const BmpHeader h = read_header(in);
  if (h.width <= 0 || h.height <= 0)
    throw ImageDecodeError("BMP: bad size " + std::to_string(h.width) + " x " + std::to_string(h.height));
  const std::array<BitField, 3> fields = {BitField(h.masks[0]), BitField(h.masks[1]), BitField(h.masks[2])};
  // Rows are padded to 4 bytes; the whole pixel array must be in the file.
  const uint64_t stride = (static_cast<uint64_t>(h.width) * h.bits + 31) / 32 * 4;
  uint64_t pixel_bytes = 0;
  if (__builtin_mul_overflow(stride, static_cast<uint64_t>(h.height), &pixel_bytes)) {
    throw ImageDecodeError("BMP: pixel array size overflows");
  }
  const uint8_t* pixels = in.bytes(h.pixel_offset, pixel_bytes);
  DecodedImage image;
  image.allocate(h.height, h.width, 3, limits);
  for (int64_t y = 0; y < h.height; ++y) {
    const int64_t stored = h.top_down ? y : h.height - 1 - y;
    unpack_row(h, pixels + static_cast<uint64_t>(stored) * stride, image.row(y), fields);
  }
  return image;
}

}  // namespace transmuter::image
