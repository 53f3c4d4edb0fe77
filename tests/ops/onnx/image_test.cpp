#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::float_attr;
using testing::ints_attr;
using testing::run_compiled;
using testing::run_op;
using testing::run_op_with_memory_limit;
using testing::string_attr;
using testing::to_doubles;
using testing::to_ints;

using Bytes = std::vector<uint8_t>;

// The node tests' inputs (onnx 1.23's ImageDecoder cases): one 32 x 32
// checkerboard of random colors, saved by Pillow in each format. JPEG and
// WebP are lossy; the others (JPEG 2000 included: Pillow saves it reversible)
// hold the same pixels.
const char* const kLossless[] = {"checkerboard.bmp", "checkerboard.png", "checkerboard.ppm",
                                 "checkerboard.tif", "checkerboard.jp2"};
const char* const kAll[] = {"checkerboard.bmp", "checkerboard.png", "checkerboard.ppm", "checkerboard.tif",
                            "checkerboard.jp2", "checkerboard.jpg", "checkerboard.webp"};

Bytes fixture(const std::string& name) {
  std::ifstream in(std::string(TRANSMUTER_SOURCE_DIR) + "/tests/ops/onnx/image_data/" + name,
                   std::ios::binary);
  EXPECT_TRUE(in) << name;
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

mx::array encoded(const Bytes& bytes) {
  return mx::array(bytes.begin(), {static_cast<int>(bytes.size())}, mx::uint8);
}

mx::array decode(const Bytes& bytes, const std::string& format = "RGB") {
  return run_op("ImageDecoder", 20, {encoded(bytes)}, {string_attr("pixel_format", format)})[0].tensor();
}

std::string decode_error(const Bytes& bytes) {
  return error_of<OpError>([&] { decode(bytes); });
}

// --- ImageDecoder: formats ------------------------------------------------------------------

TEST(ImageDecoder, LosslessFormatsGiveTheSamePixels) {
  const mx::array reference = decode(fixture(kLossless[0]));
  EXPECT_EQ(reference.shape(), (mx::Shape{32, 32, 3}));
  EXPECT_EQ(reference.dtype(), mx::uint8);
  for (const char* name : kLossless) {
    EXPECT_EQ(to_ints(decode(fixture(name))), to_ints(reference)) << name;
  }
}

TEST(ImageDecoder, LossyFormatsStayCloseToTheOriginal) {
  const std::vector<int64_t> reference = to_ints(decode(fixture("checkerboard.png")));
  for (const char* name : {"checkerboard.jpg", "checkerboard.webp"}) {
    const std::vector<int64_t> lossy = to_ints(decode(fixture(name)));
    ASSERT_EQ(lossy.size(), reference.size());
    double error = 0;
    for (size_t i = 0; i < lossy.size(); ++i) error += std::abs(lossy[i] - reference[i]);
    // Pillow's default qualities (JPEG 75, WebP 80) on 5-pixel tiles of random
    // colors, whose chroma 4:2:0 subsampling blurs: about 17 levels for WebP.
    EXPECT_LT(error / lossy.size(), 24.0) << name;
  }
}

TEST(ImageDecoder, BgrReversesChannelsAndGrayscaleIsPillowsLuma) {
  const Bytes jpeg = fixture("checkerboard.jpg");
  const std::vector<int64_t> rgb = to_ints(decode(jpeg));
  const std::vector<int64_t> bgr = to_ints(decode(jpeg, "BGR"));
  const mx::array gray = decode(jpeg, "Grayscale");
  EXPECT_EQ(gray.shape(), (mx::Shape{32, 32, 1}));
  const std::vector<int64_t> luma = to_ints(gray);
  for (size_t p = 0; p < luma.size(); ++p) {
    const int64_t* px = &rgb[3 * p];
    EXPECT_EQ(bgr[3 * p], px[2]);
    EXPECT_EQ(bgr[3 * p + 2], px[0]);
    EXPECT_EQ(luma[p], (px[0] * 19595 + px[1] * 38470 + px[2] * 7471 + 0x8000) >> 16) << "pixel " << p;
  }
}

Bytes text(const std::string& s) { return Bytes(s.begin(), s.end()); }

TEST(ImageDecoder, PnmVariants) {
  // Plain PPM, maxval 15: round(v / 15 * 255), half to even.
  EXPECT_EQ(to_ints(decode(text("P3\n# comment\n2 1 15\n0 1 15  7 8 9\n"))),
            (std::vector<int64_t>{0, 17, 255, 119, 136, 153}));
  // Plain bitmap: digits need no separators, 1 is black.
  EXPECT_EQ(to_ints(decode(text("P1 3 1 101"), "Grayscale")), (std::vector<int64_t>{0, 255, 0}));
  // Raw 16-bit PGM (big-endian), gray replicated into RGB.
  Bytes pgm = text("P5 2 1 65535\n");
  pgm.insert(pgm.end(), {0xFF, 0xFF, 0x80, 0x00});
  EXPECT_EQ(to_ints(decode(pgm)), (std::vector<int64_t>{255, 255, 255, 128, 128, 128}));
  // Raw bitmap rows pad to a byte.
  Bytes pbm = text("P4 3 2\n");
  pbm.insert(pbm.end(), {0b10100000, 0b01000000});
  EXPECT_EQ(to_ints(decode(pbm, "Grayscale")), (std::vector<int64_t>{0, 255, 0, 255, 0, 255}));
  EXPECT_NE(decode_error(text("P2 2 1 10\n3 11\n")).find("exceeds maxval"), std::string::npos);
}

void put16(Bytes& b, size_t at, uint32_t v) {
  b[at] = v & 0xFF;
  b[at + 1] = (v >> 8) & 0xFF;
}
void put32(Bytes& b, size_t at, uint32_t v) {
  put16(b, at, v & 0xFFFF);
  put16(b, at + 2, v >> 16);
}

// A BITMAPINFOHEADER file with `palette` and pixel `data` (already padded).
Bytes bmp(int32_t width, int32_t height, uint16_t bits, const Bytes& palette, const Bytes& data) {
  Bytes b(54, 0);
  b[0] = 'B';
  b[1] = 'M';
  put32(b, 10, static_cast<uint32_t>(54 + palette.size()));
  put32(b, 14, 40);
  put32(b, 18, static_cast<uint32_t>(width));
  put32(b, 22, static_cast<uint32_t>(height));
  put16(b, 26, 1);
  put16(b, 28, bits);
  // push_back rather than insert: GCC 12 warns (-Warray-bounds) on inserting
  // into this fixed-size vector, wrongly.
  for (uint8_t v : palette) b.push_back(v);
  for (uint8_t v : data) b.push_back(v);
  return b;
}

TEST(ImageDecoder, BmpVariants) {
  // 16-bit 5-5-5, top-down (negative height): blue in the low bits, 31 -> 255.
  EXPECT_EQ(to_ints(decode(bmp(2, -1, 16, {}, {0x1F, 0x00, 0x00, 0x7C}))),
            (std::vector<int64_t>{0, 0, 255, 255, 0, 0}));
  // 1-bit palette, bottom-up: the first stored row is the bottom one.
  const Bytes palette = {0, 0, 0, 0, 255, 128, 64, 0};  // BGRX: black, (64, 128, 255)
  EXPECT_EQ(to_ints(decode(bmp(1, 2, 1, palette, {0x80, 0, 0, 0, 0x00, 0, 0, 0}))),
            (std::vector<int64_t>{0, 0, 0, 64, 128, 255}));
  Bytes rle = bmp(1, 1, 8, Bytes(1024, 0), {0, 0, 0, 0});
  put32(rle, 30, 1);
  EXPECT_NE(decode_error(rle).find("compression 1"), std::string::npos);
}

// --- ImageDecoder: bad streams --------------------------------------------------------------

TEST(ImageDecoder, TruncatedStreamsAreErrorsNamingTheNode) {
  for (const char* name : kAll) {
    const Bytes file = fixture(name);
    for (size_t size :
         {size_t{1}, size_t{12}, file.size() / 4, file.size() / 2, file.size() * 3 / 4, file.size() - 1}) {
      const std::string message = decode_error(Bytes(file.begin(), file.begin() + size));
      EXPECT_NE(message.find("node 'test_ImageDecoder'"), std::string::npos) << name << " cut to " << size;
    }
  }
}

// Flipped header bytes must give either an image or an OpError, nothing else
// (a crash fails the whole test binary). A flipped size can declare gigabytes:
// the 64 MiB limit keeps the test fast on any machine.
TEST(ImageDecoder, CorruptHeadersDecodeOrFailCleanly) {
  for (const char* name : kAll) {
    const Bytes file = fixture(name);
    for (size_t at = 0; at < 64 && at < file.size(); ++at) {
      Bytes corrupt = file;
      corrupt[at] ^= 0xFF;
      try {
        const mx::array image =
            run_op_with_memory_limit("ImageDecoder", 20, {encoded(corrupt)}, {}, 64 << 20)[0].tensor();
        EXPECT_EQ(image.ndim(), 3) << name << " byte " << at;
        EXPECT_EQ(image.dtype(), mx::uint8);
      } catch (const OpError& e) {
        EXPECT_NE(std::string(e.what()).find("test_ImageDecoder"), std::string::npos);
      }
    }
  }
}

uint32_t crc32(const uint8_t* data, size_t size) {
  uint32_t crc = 0xFFFFFFFF;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320 & (0 - (crc & 1)));
  }
  return ~crc;
}

void put_be32(Bytes& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back((v >> shift) & 0xFF);
}

void png_chunk(Bytes& png, const char* type, const Bytes& data) {
  put_be32(png, static_cast<uint32_t>(data.size()));
  const size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  put_be32(png, crc32(png.data() + start, png.size() - start));
}

// A zlib stream of one stored (uncompressed) deflate block.
Bytes zlib_stored(const Bytes& data) {
  Bytes z = {0x78, 0x01, 0x01};
  const uint16_t size = static_cast<uint16_t>(data.size());
  z.insert(z.end(), {static_cast<uint8_t>(size & 0xFF), static_cast<uint8_t>(size >> 8),
                     static_cast<uint8_t>(~size & 0xFF), static_cast<uint8_t>((~size >> 8) & 0xFF)});
  z.insert(z.end(), data.begin(), data.end());
  uint32_t a = 1, b = 0;
  for (uint8_t v : data) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  put_be32(z, (b << 16) | a);
  return z;
}

// A one-row PNG: IHDR, optional PLTE and tRNS, one IDAT of `row` (filter byte included), IEND.
Bytes png_row(uint32_t width, uint8_t bit_depth, uint8_t color_type, const Bytes& row,
              const Bytes& palette = {}, const Bytes& transparency = {}) {
  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  Bytes header;
  put_be32(header, width);
  put_be32(header, 1);
  header.insert(header.end(), {bit_depth, color_type, 0, 0, 0});
  png_chunk(png, "IHDR", header);
  if (!palette.empty()) png_chunk(png, "PLTE", palette);
  if (!transparency.empty()) png_chunk(png, "tRNS", transparency);
  png_chunk(png, "IDAT", zlib_stored(row));
  png_chunk(png, "IEND", {});
  return png;
}

TEST(ImageDecoder, PngPaletteAndSixteenBitGray) {
  // Palette with a transparent entry: expanded to RGB, the alpha dropped.
  const Bytes palette = png_row(2, 8, 3, {0, 0, 1}, {10, 20, 30, 200, 100, 50}, {0, 255});
  EXPECT_EQ(to_ints(decode(palette)), (std::vector<int64_t>{10, 20, 30, 200, 100, 50}));
  EXPECT_EQ(to_ints(decode(palette, "Grayscale")),
            (std::vector<int64_t>{(10 * 19595 + 20 * 38470 + 30 * 7471 + 0x8000) >> 16,
                                  (200 * 19595 + 100 * 38470 + 50 * 7471 + 0x8000) >> 16}));
  // 16-bit gray keeps the high byte, replicated into RGB.
  const Bytes gray = png_row(2, 16, 0, {0, 0x12, 0x34, 0xAB, 0xCD});
  EXPECT_EQ(to_ints(decode(gray)), (std::vector<int64_t>{0x12, 0x12, 0x12, 0xAB, 0xAB, 0xAB}));
  EXPECT_EQ(to_ints(decode(gray, "Grayscale")), (std::vector<int64_t>{0x12, 0xAB}));
}

TEST(ImageDecoder, HugeDeclaredSizeIsRefusedBeforeAllocating) {
  // A valid PNG header claiming 100000 x 100000 RGB (30 GB), and no pixels.
  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  Bytes header;
  put_be32(header, 100000);
  put_be32(header, 100000);
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, not interlaced
  png_chunk(png, "IHDR", header);
  png_chunk(png, "IDAT", {});
  png_chunk(png, "IEND", {});
  const std::string message = error_of<OpError>(
      [&] { run_op_with_memory_limit("ImageDecoder", 20, {encoded(png)}, {}, uint64_t{1} << 30); });
  EXPECT_NE(message.find("node 'test_ImageDecoder'"), std::string::npos) << message;
  EXPECT_NE(message.find("memory limit"), std::string::npos) << message;
  // The output check applies too: a 32 x 32 image within 1 KiB of output is refused.
  EXPECT_NE(error_of<OpError>([&] {
              run_op_with_memory_limit("ImageDecoder", 20, {encoded(fixture("checkerboard.png"))}, {}, 1024);
            }).find("memory limit"),
            std::string::npos);
}

TEST(ImageDecoder, RejectsBadInputsAndAttributes) {
  EXPECT_NE(decode_error(text("GIF89a....")).find("unknown image format"), std::string::npos);
  EXPECT_NE(decode_error({}).find("unknown image format"), std::string::npos);
  EXPECT_NE(
      error_of<OpError>([] { run_op("ImageDecoder", 20, {mx::zeros({4}, mx::float32)}); }).find("uint8"),
      std::string::npos);
  EXPECT_NE(error_of<OpError>([] { run_op("ImageDecoder", 20, {mx::zeros({2, 2}, mx::uint8)}); }).find("1-D"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] { decode(fixture("checkerboard.png"), "RGBA"); }).find("pixel_format"),
            std::string::npos);
}

// --- MaxRoiPool -----------------------------------------------------------------------------

// The inputs of max_roi_pool_reference.py, which printed the expectations
// below from ONNX Runtime 1.31 (graph optimizations off).
mx::array roi_pool_input() {
  std::vector<float> x(2 * 3 * 6 * 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 8.0f;
  return mx::array(x.begin(), {2, 3, 6, 7}, mx::float32);
}

mx::array roi_pool_regions() {
  return mx::array({0.f, 0.f, 0.f, 6.f, 5.f, 1.f, 1.4f, 0.5f, 4.6f, 3.5f, 0.f, 3.f,  2.f,  12.f, 9.f,
                    1.f, 5.f, 4.f, 2.f, 1.f, 1.f, 2.f,  1.f,  3.f,  4.f,  0.f, 20.f, 20.f, 30.f, 30.f},
                   {6, 5});
}

TEST(MaxRoiPool, MatchesOnnxRuntime) {
  auto out =
      run_op("MaxRoiPool", 1, {roi_pool_input(), roi_pool_regions()}, {ints_attr("pooled_shape", {2, 3})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{6, 3, 2, 3}));
  EXPECT_EQ(to_doubles(out[0].tensor()),
            (std::vector<double>{
                11.75,  10.875, 12.125, 12.5,   12.5,   11.25, 12,     12.375, 12.375, 11.875, 11.875, 11.5,
                11.375, 11,     12.25,  12.125, 11.75,  11.75, 8.25,   10.375, 9.5,    9.875,  12,     11.125,
                10.625, 10.625, 11.875, 12.25,  12.25,  8.875, 10.875, 12.125, 12.125, 12.5,   11.625, 8.25,
                12.125, 11.25,  0,      0,      0,      0,     12.375, 10.625, 0,      0,      0,      0,
                11.75,  10,     0,      0,      0,      0,     3.125,  3.125,  3.125,  3.125,  3.125,  3.125,
                8,      8,      8,      8,      8,      8,     0.25,   0.25,   0.25,   0.25,   0.25,   0.25,
                5.75,   10.375, 10.375, 7.375,  12,     12,    10.625, 10.625, 9.75,   12.25,  12.25,  11.375,
                10,     10,     7.5,    11.625, 11.625, 9.125, 0,      0,      0,      0,      0,      0,
                0,      0,      0,      0,      0,      0,     0,      0,      0,      0,      0,      0}));
}

TEST(MaxRoiPool, ScaledCornersRoundHalfAwayFromZeroLikeOnnxRuntime) {
  const std::vector<Attribute> attrs = {ints_attr("pooled_shape", {3, 2}), float_attr("spatial_scale", 0.5f)};
  const std::vector<double> expected = {
      11.75,  9.25,   11.75,  10.875, 8.75,   10.875, 12,     8.625,  12,     8.625,  11.125, 10.25,
      9.75,   11,     11.375, 8,      11.375, 8,      6.625,  11.25,  1.125,  5.75,   8.25,   0.25,
      11.5,   3.5,    6,      10.625, 0.5,    5.125,  3.75,   8.375,  10.875, 2.875,  5.375,  10,
      10.875, 12.125, 12.5,   12.125, 12.5,   9.125,  12.375, 12.375, 12.375, 12.375, 11.875, 10.625,
      10.125, 10.125, 11.75,  11.75,  9.625,  10.875, 4.875,  4.875,  4.875,  4.875,  4.875,  4.875,
      9.75,   9.75,   9.75,   9.75,   9.75,   9.75,   2,      2,      2,      2,      2,      2,
      1.125,  5.75,   8.25,   5.75,   8.25,   0.25,   6,      10.625, 6,      10.625, 0.5,    5.125,
      10.875, 2.875,  10.875, 10,     5.375,  10,     0,      0,      0,      0,      0,      0,
      0,      0,      0,      0,      0,      0,      0,      0,      0,      0,      0,      0};
  auto eager = run_op("MaxRoiPool", 22, {roi_pool_input(), roi_pool_regions()}, attrs);
  EXPECT_EQ(to_doubles(eager[0].tensor()), expected);
  // X traced, regions known on the host (as the row's host_inputs ask).
  auto compiled = run_compiled("MaxRoiPool", 22, {roi_pool_input(), roi_pool_regions()}, {0}, attrs);
  EXPECT_EQ(to_doubles(compiled[0]), expected);
}

TEST(MaxRoiPool, RejectsBadRegionsAndAttributes) {
  const mx::array x = roi_pool_input();
  const std::vector<Attribute> attrs = {ints_attr("pooled_shape", {2, 2})};
  EXPECT_NE(error_of<OpError>([&] {
              run_op("MaxRoiPool", 1, {x, mx::array({2.f, 0.f, 0.f, 1.f, 1.f}, {1, 5})}, attrs);
            }).find("batch index 2"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([&] {
              run_op("MaxRoiPool", 1, {x, mx::zeros({1, 4})}, attrs);
            }).find("[num_rois, 5]"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([&] { run_op("MaxRoiPool", 1, {x, mx::zeros({1, 5})}); }).find("pooled_shape"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([&] {
              run_op("MaxRoiPool", 1, {mx::zeros({1, 6, 7}), mx::zeros({1, 5})}, attrs);
            }).find("4-D"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
