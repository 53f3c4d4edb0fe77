#include "ops/onnx/image/codecs.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

namespace transmuter::image {

void check_allocation(uint64_t count, uint64_t element_bytes, const DecodeLimits& limits, const char* what) {
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, element_bytes, &bytes) || bytes > limits.max_bytes) {
    throw ImageDecodeError(std::string(what) + " of " + std::to_string(count) + " x " +
                           std::to_string(element_bytes) + " bytes exceeds the memory limit of " +
                           std::to_string(limits.max_bytes) + " bytes");
  }
}

void DecodedImage::allocate(int64_t rows, int64_t columns, int samples, const DecodeLimits& limits) {
  if (rows <= 0 || columns <= 0) {
    throw ImageDecodeError("image of " + std::to_string(columns) + " x " + std::to_string(rows) +
                           " pixels has no pixels");
  }
  uint64_t area = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(rows), static_cast<uint64_t>(columns), &area)) {
    area = std::numeric_limits<uint64_t>::max();
  }
  check_allocation(area, static_cast<uint64_t>(samples), limits, "decoded image");
  height = rows;
  width = columns;
  channels = samples;
  pixels.allocate(area * static_cast<uint64_t>(samples));
}

namespace {
bool starts_with(std::span<const uint8_t> file, std::initializer_list<uint8_t> signature) {
  return file.size() >= signature.size() && std::equal(signature.begin(), signature.end(), file.begin());
}
}  // namespace

Decoder find_decoder(std::span<const uint8_t> file) {
  if (starts_with(file, {0xFF, 0xD8, 0xFF})) return decode_jpeg;
  if (starts_with(file, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'})) return decode_png;
  if (starts_with(file, {'I', 'I', '*', 0}) || starts_with(file, {'M', 'M', 0, '*'}) ||
      starts_with(file, {'I', 'I', '+', 0}) || starts_with(file, {'M', 'M', 0, '+'})) {
    return decode_tiff;
  }
  if (file.size() >= 12 && starts_with(file, {'R', 'I', 'F', 'F'}) &&
      std::memcmp(file.data() + 8, "WEBP", 4) == 0) {
    return decode_webp;
  }
  // A JP2 file starts with its signature box; a bare codestream with SOC SIZ.
  if (starts_with(file, {0, 0, 0, 0x0C, 'j', 'P', ' ', ' ', '\r', '\n', 0x87, '\n'}) ||
      starts_with(file, {0xFF, 0x4F, 0xFF, 0x51})) {
    return decode_jpeg2000;
  }
  if (starts_with(file, {'B', 'M'})) return decode_bmp;
  if (file.size() >= 2 && file[0] == 'P' && file[1] >= '1' && file[1] <= '6') return decode_pnm;
  return nullptr;
}

}  // namespace transmuter::image
