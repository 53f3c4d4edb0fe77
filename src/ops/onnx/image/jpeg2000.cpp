// JPEG 2000 (JP2 files and bare J2K codestreams) through OpenJPEG, read from
// memory by stream callbacks, in strict mode so that a truncated codestream
// is an error rather than a partial image. Components map to channels like
// Pillow's decoder: 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA; a signed component
// is offset by half its range and every component is shifted to 8 bits.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include <openjpeg.h>

#include "ops/onnx/image/codecs.h"

namespace transmuter::image {
namespace {

struct Jp2Source {
  std::span<const uint8_t> file;
  uint64_t offset = 0;
  std::string error;  // the first error OpenJPEG reported
};

OPJ_SIZE_T read_jp2(void* out, OPJ_SIZE_T count, void* user) {
  auto* source = static_cast<Jp2Source*>(user);
  const uint64_t left = source->file.size() - source->offset;
  if (left == 0) return static_cast<OPJ_SIZE_T>(-1);  // OpenJPEG's end of stream
  const uint64_t n = std::min<uint64_t>(left, count);
  std::memcpy(out, source->file.data() + source->offset, n);
  source->offset += n;
  return static_cast<OPJ_SIZE_T>(n);
}

OPJ_OFF_T skip_jp2(OPJ_OFF_T count, void* user) {
  auto* source = static_cast<Jp2Source*>(user);
  const int64_t size = static_cast<int64_t>(source->file.size());
  const int64_t target = std::clamp<int64_t>(static_cast<int64_t>(source->offset) + count, 0, size);
  const int64_t skipped = target - static_cast<int64_t>(source->offset);
  source->offset = static_cast<uint64_t>(target);
  return skipped == count ? skipped : -1;
}

OPJ_BOOL seek_jp2(OPJ_OFF_T position, void* user) {
  auto* source = static_cast<Jp2Source*>(user);
  if (position < 0 || static_cast<uint64_t>(position) > source->file.size()) return OPJ_FALSE;
  source->offset = static_cast<uint64_t>(position);
  return OPJ_TRUE;
}

void on_jp2_error(const char* message, void* user) {
  auto* source = static_cast<Jp2Source*>(user);
  if (!source->error.empty()) return;
  source->error = message;
  while (!source->error.empty() && source->error.back() == '\n') source->error.pop_back();
}

void on_jp2_quiet(const char*, void*) {}

struct CodecFree {
  void operator()(opj_codec_t* codec) const { opj_destroy_codec(codec); }
};
struct StreamFree {
  void operator()(opj_stream_t* stream) const { opj_stream_destroy(stream); }
};
struct ImageFree {
  void operator()(opj_image_t* image) const { opj_image_destroy(image); }
};

[[noreturn]] void fail(const Jp2Source& source, const std::string& what) {
  throw ImageDecodeError("JPEG 2000: " + what + (source.error.empty() ? "" : " (" + source.error + ")"));
}

// Every component must cover the whole image at full resolution.
void check_components(const Jp2Source& source, const opj_image_t& image, uint32_t width, uint32_t height) {
  if (image.numcomps < 1 || image.numcomps > 4)
    fail(source, std::to_string(image.numcomps) + " components (1 to 4 supported)");
  for (uint32_t c = 0; c < image.numcomps; ++c) {
    const opj_image_comp_t& comp = image.comps[c];
    if (comp.w != width || comp.h != height || comp.dx != 1 || comp.dy != 1) {
      fail(source, "subsampled components are not supported");
    }
    if (comp.prec < 1 || comp.prec > 31) fail(source, "bad component precision " + std::to_string(comp.prec));
  }
}

}  // namespace

DecodedImage decode_jpeg2000(std::span<const uint8_t> file, const DecodeLimits& limits) {
  Jp2Source source;
  source.file = file;
  const bool codestream = file.size() >= 2 && file[0] == 0xFF && file[1] == 0x4F;
  std::unique_ptr<opj_codec_t, CodecFree> codec(
      opj_create_decompress(codestream ? OPJ_CODEC_J2K : OPJ_CODEC_JP2));
  if (!codec) fail(source, "cannot create the decoder");
  opj_set_error_handler(codec.get(), on_jp2_error, &source);
  opj_set_warning_handler(codec.get(), on_jp2_quiet, nullptr);
  opj_set_info_handler(codec.get(), on_jp2_quiet, nullptr);
  opj_dparameters_t parameters;
  opj_set_default_decoder_parameters(&parameters);
  if (!opj_setup_decoder(codec.get(), &parameters) || !opj_decoder_set_strict_mode(codec.get(), OPJ_TRUE)) {
    fail(source, "cannot set up the decoder");
  }
  std::unique_ptr<opj_stream_t, StreamFree> stream(opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_TRUE));
  if (!stream) fail(source, "cannot create the stream");
  opj_stream_set_user_data(stream.get(), &source, nullptr);
  opj_stream_set_user_data_length(stream.get(), file.size());
  opj_stream_set_read_function(stream.get(), read_jp2);
  opj_stream_set_skip_function(stream.get(), skip_jp2);
  opj_stream_set_seek_function(stream.get(), seek_jp2);

  opj_image_t* header = nullptr;
  const bool header_read = opj_read_header(stream.get(), codec.get(), &header);
  std::unique_ptr<opj_image_t, ImageFree> decoded(header);
  if (!header_read || !decoded) fail(source, "cannot read the header");
  if (decoded->x1 <= decoded->x0 || decoded->y1 <= decoded->y0) fail(source, "empty image area");
  const uint32_t width = decoded->x1 - decoded->x0;
  const uint32_t height = decoded->y1 - decoded->y0;
  check_components(source, *decoded, width, height);
  // OpenJPEG decodes into one int32 plane per component.
  check_allocation(static_cast<uint64_t>(width) * height * decoded->numcomps, sizeof(OPJ_INT32), limits,
                   "JPEG 2000 component planes");
  if (!opj_decode(codec.get(), stream.get(), decoded.get()) ||
      !opj_end_decompress(codec.get(), stream.get())) {
    fail(source, "cannot decode the image data");
  }
  check_components(source, *decoded, width, height);
  if (decoded->color_space == OPJ_CLRSPC_SYCC || decoded->color_space == OPJ_CLRSPC_EYCC ||
      decoded->color_space == OPJ_CLRSPC_CMYK) {
    fail(source, "YCC and CMYK color spaces are not supported");
  }

  DecodedImage image;
  const int channels = static_cast<int>(decoded->numcomps);
  image.allocate(height, width, channels, limits);
  const uint64_t area = static_cast<uint64_t>(width) * height;
  for (int c = 0; c < channels; ++c) {
    const opj_image_comp_t& comp = decoded->comps[c];
    if (comp.data == nullptr) fail(source, "a component has no data");
    const int64_t offset = comp.sgnd ? int64_t{1} << (comp.prec - 1) : 0;
    const int shift = 8 - static_cast<int>(comp.prec);
    for (uint64_t i = 0; i < area; ++i) {
      int64_t value = comp.data[i] + offset;
      value = shift >= 0 ? value << shift : value >> -shift;
      image.pixels[i * channels + c] = static_cast<uint8_t>(std::clamp<int64_t>(value, 0, 255));
    }
  }
  return image;
}

}  // namespace transmuter::image
