// TIFF through libtiff, read from memory by client procedures. The first
// directory is read with libtiff's RGBA image reader, which handles every
// photometric interpretation, bit depth and compression libtiff knows, and
// gives 8-bit RGB(A) top row first. Errors and warnings go to per-handle
// handlers (never to stderr), and libtiff's own allocations are capped at the
// memory limit.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include <tiffio.h>

#include "ops/onnx/image/codecs.h"

namespace transmuter::image {
namespace {

struct TiffSource {
  std::span<const uint8_t> file;
  uint64_t offset = 0;
  std::string error;  // the first error libtiff reported
};

tmsize_t read_tiff(thandle_t handle, void* out, tmsize_t count) {
  auto* source = static_cast<TiffSource*>(handle);
  if (count < 0) return -1;
  const uint64_t left = source->offset < source->file.size() ? source->file.size() - source->offset : 0;
  const uint64_t n = std::min<uint64_t>(left, static_cast<uint64_t>(count));
  if (n > 0) std::memcpy(out, source->file.data() + source->offset, n);
  source->offset += n;
  return static_cast<tmsize_t>(n);
}

tmsize_t write_tiff(thandle_t, void*, tmsize_t) { return -1; }

toff_t seek_tiff(thandle_t handle, toff_t offset, int whence) {
  auto* source = static_cast<TiffSource*>(handle);
  uint64_t base = 0;
  if (whence == SEEK_CUR) base = source->offset;
  if (whence == SEEK_END) base = source->file.size();
  uint64_t target = 0;
  if (__builtin_add_overflow(base, static_cast<uint64_t>(offset), &target)) return static_cast<toff_t>(-1);
  source->offset = target;  // past the end is allowed; reads there return nothing
  return target;
}

int close_tiff(thandle_t) { return 0; }
toff_t size_tiff(thandle_t handle) { return static_cast<TiffSource*>(handle)->file.size(); }
int map_tiff(thandle_t, void**, toff_t*) { return 0; }
void unmap_tiff(thandle_t, void*, toff_t) {}

int on_tiff_error(TIFF*, void* user, const char* module, const char* format, va_list args) {
  auto* source = static_cast<TiffSource*>(user);
  if (source->error.empty()) {
    char text[512];
    std::vsnprintf(text, sizeof text, format, args);
    source->error = std::string(module != nullptr ? module : "libtiff") + ": " + text;
  }
  return 1;  // handled: libtiff's global handler (stderr) is not called
}

int on_tiff_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

struct TiffCloser {
  void operator()(TIFF* tif) const { TIFFClose(tif); }
};
struct TiffOptionsFree {
  void operator()(TIFFOpenOptions* options) const { TIFFOpenOptionsFree(options); }
};

[[noreturn]] void fail(const TiffSource& source, const std::string& what) {
  throw ImageDecodeError("TIFF: " + what + (source.error.empty() ? "" : " (" + source.error + ")"));
}

}  // namespace

DecodedImage decode_tiff(std::span<const uint8_t> file, const DecodeLimits& limits) {
  TiffSource source;
  source.file = file;
  std::unique_ptr<TIFFOpenOptions, TiffOptionsFree> options(TIFFOpenOptionsAlloc());
  if (!options) throw ImageDecodeError("TIFF: cannot allocate the open options");
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), on_tiff_error, &source);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), on_tiff_warning, nullptr);
  TIFFOpenOptionsSetMaxSingleMemAlloc(
      options.get(), static_cast<tmsize_t>(std::min<uint64_t>(
                         limits.max_bytes, static_cast<uint64_t>(std::numeric_limits<tmsize_t>::max()))));
  // "m": no memory mapping, every read goes through read_tiff's bounds.
  std::unique_ptr<TIFF, TiffCloser> tif(TIFFClientOpenExt("image", "rm", &source, read_tiff, write_tiff,
                                                          seek_tiff, close_tiff, size_tiff, map_tiff,
                                                          unmap_tiff, options.get()));
  if (!tif) fail(source, "cannot read the header");
  uint32_t width = 0;
  uint32_t height = 0;
  if (!TIFFGetField(tif.get(), TIFFTAG_IMAGEWIDTH, &width) ||
      !TIFFGetField(tif.get(), TIFFTAG_IMAGELENGTH, &height)) {
    fail(source, "no image size");
  }
  char reason[1024] = "";
  if (!TIFFRGBAImageOK(tif.get(), reason)) fail(source, std::string("unsupported layout: ") + reason);
  const uint64_t area = static_cast<uint64_t>(width) * height;
  check_allocation(area, sizeof(uint32_t), limits, "TIFF RGBA raster");
  DecodedImage image;
  image.allocate(height, width, 3, limits);
  auto raster = std::make_unique_for_overwrite<uint32_t[]>(area);
  if (!TIFFReadRGBAImageOriented(tif.get(), width, height, raster.get(), ORIENTATION_TOPLEFT,
                                 /*stop_on_error=*/1)) {
    fail(source, "cannot decode the image data");
  }
  // Alpha, if any, is dropped (RGB output); libtiff premultiplies unassociated alpha.
  uint8_t* out = image.pixels.data();
  for (uint64_t i = 0; i < area; ++i) {
    const uint32_t abgr = raster[i];
    *out++ = static_cast<uint8_t>(TIFFGetR(abgr));
    *out++ = static_cast<uint8_t>(TIFFGetG(abgr));
    *out++ = static_cast<uint8_t>(TIFFGetB(abgr));
  }
  return image;
}

}  // namespace transmuter::image
