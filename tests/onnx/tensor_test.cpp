#include "onnx/tensor.h"

#include <gtest/gtest.h>
#include <mlx/mlx.h>

#include <cmath>
#include <fstream>
#include <random>

#include "support/proto_writer.h"
#include "support/expect_error.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

namespace fs = std::filesystem;
using testing::ProtoWriter;
namespace proto = testing::proto;

using testing::error_of;

// Decodes `w` as a TensorProto held in a buffer that TensorSource::owner keeps.
struct Decoded {
  std::shared_ptr<std::vector<uint8_t>> buffer;
  NamedValue value;
};

Decoded decode(const ProtoWriter& w, ExternalDataStore* external = nullptr,
               size_t leading_pad = 0) {
  auto buffer = std::make_shared<std::vector<uint8_t>>(leading_pad);
  const std::string& data = w.data();
  buffer->insert(buffer->end(), data.begin(), data.end());
  MessagePath root("t.onnx");
  MessagePath path(root, "initializer", 0, "t");
  std::span<const uint8_t> bytes(buffer->data() + leading_pad, data.size());
  NamedValue value = read_tensor(bytes, path, TensorSource{{buffer, *buffer}, external});
  return {buffer, std::move(value)};
}

mx::array decode_array(const ProtoWriter& w) { return decode(w).value.value.tensor(); }

template <typename T>
std::vector<T> values_of(const mx::array& a) {
  mx::array c = mx::contiguous(a);
  mx::eval(c);
  return std::vector<T>(c.data<T>(), c.data<T>() + c.size());
}

std::vector<int> shape_of(const mx::array& a) { return {a.shape().begin(), a.shape().end()}; }

// --------------------------------------------------------------- raw_data

TEST(Tensor, FloatRawDataDecodesNameShapeValues) {
  const auto w = proto::raw_tensor("weights", OnnxType::kFloat, {2, 3},
                                   proto::raw({1.f, 2.f, 3.f, 4.f, 5.f, -6.f}));
  Decoded d = decode(w);
  EXPECT_EQ(d.value.name, "weights");
  const mx::array& a = d.value.value.tensor();
  EXPECT_EQ(a.dtype(), mx::float32);
  EXPECT_EQ(shape_of(a), (std::vector<int>{2, 3}));
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{1, 2, 3, 4, 5, -6}));
}

TEST(Tensor, ScalarHasEmptyShape) {
  const mx::array a = decode_array(proto::raw_tensor("s", OnnxType::kInt64, {}, proto::raw({int64_t{42}})));
  EXPECT_EQ(a.ndim(), 0u);
  EXPECT_EQ(values_of<int64_t>(a), (std::vector<int64_t>{42}));
}

TEST(Tensor, EmptyTensorHasZeroElements) {
  const mx::array a = decode_array(proto::raw_tensor("e", OnnxType::kFloat, {0, 4}, ""));
  EXPECT_EQ(shape_of(a), (std::vector<int>{0, 4}));
  EXPECT_EQ(a.size(), 0u);
}

// Finds a leading pad that puts the raw_data payload at an address aligned
// (or misaligned) to `alignment` inside the owner's buffer.
size_t pad_for(const ProtoWriter& w, std::string_view payload, size_t alignment, bool aligned,
               const std::vector<uint8_t>& probe) {
  const size_t offset = w.data().find(payload);
  const auto base = reinterpret_cast<uintptr_t>(probe.data());
  for (size_t pad = 0; pad < 2 * alignment; ++pad) {
    if (((base + pad + offset) % alignment == 0) == aligned) return pad;
  }
  return 0;
}

TEST(Tensor, AlignedRawDataIsZeroCopy) {
  const std::string payload = proto::raw({1.f, 2.f, 3.f, 4.f});
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {4}, payload);
  // malloc'ed buffers are 16-aligned, so the pad found for one is valid for all.
  std::vector<uint8_t> probe(64);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(probe.data()) % 16, 0u);
  const size_t pad = pad_for(w, payload, 4, true, probe);
  Decoded d = decode(w, nullptr, pad);
  const mx::array& a = d.value.value.tensor();
  const auto* p = static_cast<const uint8_t*>(a.data<void>());
  EXPECT_GE(p, d.buffer->data());
  EXPECT_LT(p, d.buffer->data() + d.buffer->size());
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Tensor, ZeroCopyKeepsTheOwnerAlive) {
  const std::string payload = proto::raw({7.f, 8.f});
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {2}, payload);
  std::vector<uint8_t> probe(64);
  const size_t pad = pad_for(w, payload, 4, true, probe);
  Decoded d = decode(w, nullptr, pad);
  std::weak_ptr<std::vector<uint8_t>> watch = d.buffer;
  mx::array a = d.value.value.tensor();
  d = Decoded{};
  EXPECT_FALSE(watch.expired()) << "the array must hold the buffer it aliases";
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{7, 8}));
  a = mx::array(0.f);
  EXPECT_TRUE(watch.expired()) << "the buffer must be released with the array";
}

TEST(Tensor, AliasedArraysWorkInMlxOpsAndCompile) {
  const std::string payload = proto::raw({1.f, 2.f, 3.f, 4.f});
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {2, 2}, payload);
  std::vector<uint8_t> probe(64);
  const size_t pad = pad_for(w, payload, 4, true, probe);
  mx::array a = decode(w, nullptr, pad).value.value.tensor();  // the array alone keeps the buffer
  // [[1,2],[3,4]] @ [[1,2],[3,4]] = [[7,10],[15,22]]; + 1 elementwise.
  EXPECT_EQ(values_of<float>(mx::add(mx::matmul(a, a), mx::array(1.f))),
            (std::vector<float>{8, 11, 16, 23}));
  EXPECT_EQ(values_of<float>(mx::transpose(a)), (std::vector<float>{1, 3, 2, 4}));
  auto square = mx::compile([](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::multiply(in[0], in[0])};
  });
  EXPECT_EQ(values_of<float>(square({a})[0]), (std::vector<float>{1, 4, 9, 16}));
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{1, 2, 3, 4})) << "inputs are never written";
}

TEST(Tensor, MisalignedRawDataIsCopied) {
  const std::string payload = proto::raw({1.f, 2.f, 3.f, 4.f});
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {4}, payload);
  std::vector<uint8_t> probe(64);
  const size_t pad = pad_for(w, payload, 4, false, probe);
  Decoded d = decode(w, nullptr, pad);
  const mx::array& a = d.value.value.tensor();
  const auto* p = static_cast<const uint8_t*>(a.data<void>());
  EXPECT_TRUE(p < d.buffer->data() || p >= d.buffer->data() + d.buffer->size());
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Tensor, NoOwnerMeansCopy) {
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {1}, proto::raw({1.f}));
  MessagePath path("t.onnx");
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(w.data().data()), w.data().size());
  const mx::array a = read_tensor(bytes, path, TensorSource{}).value.tensor();
  const auto* p = static_cast<const char*>(a.data<void>());
  EXPECT_TRUE(p < w.data().data() || p >= w.data().data() + w.data().size());
}

template <typename T>
void expect_raw_roundtrip(OnnxType type, mx::Dtype dtype, std::vector<T> values) {
  const mx::array a = decode_array(
      proto::raw_tensor("t", type, {static_cast<int64_t>(values.size())}, proto::raw(values)));
  EXPECT_EQ(a.dtype(), dtype) << onnx_type_name(type);
  EXPECT_EQ(values_of<T>(a), values) << onnx_type_name(type);
}

TEST(Tensor, RawDataOfEveryDirectType) {
  expect_raw_roundtrip<double>(OnnxType::kDouble, mx::float64, {1.5, -1e300});
  expect_raw_roundtrip<int8_t>(OnnxType::kInt8, mx::int8, {-128, 127});
  expect_raw_roundtrip<int16_t>(OnnxType::kInt16, mx::int16, {-32768, 5});
  expect_raw_roundtrip<int32_t>(OnnxType::kInt32, mx::int32, {-7, 1 << 30});
  expect_raw_roundtrip<int64_t>(OnnxType::kInt64, mx::int64, {-1, int64_t{1} << 40});
  expect_raw_roundtrip<uint8_t>(OnnxType::kUint8, mx::uint8, {0, 255});
  expect_raw_roundtrip<uint16_t>(OnnxType::kUint16, mx::uint16, {65535, 1});
  expect_raw_roundtrip<uint32_t>(OnnxType::kUint32, mx::uint32, {4000000000u, 3});
  expect_raw_roundtrip<uint64_t>(OnnxType::kUint64, mx::uint64, {~uint64_t{0}, 9});
}

TEST(Tensor, Float16AndBfloat16KeepTheirBits) {
  // fp16 0x3C00 = 1.0, 0xC000 = -2.0; bf16 0x3F80 = 1.0, 0xC040 = -3.0.
  const mx::array h = decode_array(
      proto::raw_tensor("h", OnnxType::kFloat16, {2}, proto::raw<uint16_t>({0x3C00, 0xC000})));
  EXPECT_EQ(h.dtype(), mx::float16);
  EXPECT_EQ(values_of<float>(mx::astype(h, mx::float32)), (std::vector<float>{1, -2}));
  const mx::array b = decode_array(
      proto::raw_tensor("b", OnnxType::kBfloat16, {2}, proto::raw<uint16_t>({0x3F80, 0xC040})));
  EXPECT_EQ(b.dtype(), mx::bfloat16);
  EXPECT_EQ(values_of<float>(mx::astype(b, mx::float32)), (std::vector<float>{1, -3}));
}

TEST(Tensor, BoolRawDataIsNormalized) {
  const mx::array a =
      decode_array(proto::raw_tensor("b", OnnxType::kBool, {3}, std::string("\x01\x00\x02", 3)));
  EXPECT_EQ(a.dtype(), mx::bool_);
  EXPECT_EQ(values_of<bool>(a), (std::vector<bool>{true, false, true}));
}

TEST(Tensor, Complex64RawData) {
  const mx::array a =
      decode_array(proto::raw_tensor("c", OnnxType::kComplex64, {1}, proto::raw({1.f, -2.f})));
  EXPECT_EQ(a.dtype(), mx::complex64);
  const auto v = values_of<std::complex<float>>(a);
  EXPECT_EQ(v[0], std::complex<float>(1, -2));
}

// ---------------------------------------------------- float8 and float4

TEST(Tensor, Float8DecodersMatchTheSpec) {
  EXPECT_EQ(float8e4m3fn_to_float(0x7E), 448.f);
  EXPECT_EQ(float8e4m3fn_to_float(0xFE), -448.f);
  EXPECT_EQ(float8e4m3fn_to_float(0x38), 1.f);
  EXPECT_EQ(float8e4m3fn_to_float(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(float8e4m3fn_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(float8e4m3fn_to_float(0xFF)));
  EXPECT_TRUE(std::signbit(float8e4m3fn_to_float(0x80)));

  EXPECT_EQ(float8e4m3fnuz_to_float(0x7F), 240.f);
  EXPECT_EQ(float8e4m3fnuz_to_float(0x40), 1.f);
  EXPECT_EQ(float8e4m3fnuz_to_float(0x01), std::ldexp(1.f, -10));
  EXPECT_TRUE(std::isnan(float8e4m3fnuz_to_float(0x80)));

  EXPECT_EQ(float8e5m2_to_float(0x7B), 57344.f);
  EXPECT_EQ(float8e5m2_to_float(0x3C), 1.f);
  EXPECT_EQ(float8e5m2_to_float(0x7C), INFINITY);
  EXPECT_EQ(float8e5m2_to_float(0xFC), -INFINITY);
  EXPECT_TRUE(std::isnan(float8e5m2_to_float(0x7D)));
  EXPECT_EQ(float8e5m2_to_float(0x01), std::ldexp(1.f, -16));

  EXPECT_EQ(float8e5m2fnuz_to_float(0x7F), 57344.f);
  EXPECT_EQ(float8e5m2fnuz_to_float(0xFF), -57344.f);
  EXPECT_EQ(float8e5m2fnuz_to_float(0x40), 1.f);
  EXPECT_TRUE(std::isnan(float8e5m2fnuz_to_float(0x80)));

  EXPECT_EQ(float8e8m0_to_float(127), 1.f);
  EXPECT_EQ(float8e8m0_to_float(128), 2.f);
  EXPECT_EQ(float8e8m0_to_float(0), std::ldexp(1.f, -127));
  EXPECT_TRUE(std::isnan(float8e8m0_to_float(0xFF)));

  const float fp4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int b = 0; b < 16; ++b) EXPECT_EQ(float4e2m1_to_float(static_cast<uint8_t>(b)), fp4[b]) << b;
}

// Sums over all 256 encodings, compared with ml_dtypes 0.6 (numbers computed
// once in Python: np.arange(256, dtype=uint8).view(fmt).astype(float64)).
TEST(Tensor, Float8DecodersAgreeWithMlDtypesOnAllEncodings) {
  struct Expected {
    float (*decode)(uint8_t);
    int nans, infs;
    double abs_sum;
  };
  const Expected formats[] = {
      {float8e4m3fn_to_float, 2, 0, 10815.75},
      {float8e4m3fnuz_to_float, 1, 0, 5887.875},
      {float8e5m2_to_float, 6, 2, 720895.99951171875},
      {float8e5m2fnuz_to_float, 1, 0, 720895.99975585938},
  };
  for (const Expected& f : formats) {
    int nans = 0, infs = 0;
    double sum = 0;
    for (int b = 0; b < 256; ++b) {
      const float v = f.decode(static_cast<uint8_t>(b));
      if (std::isnan(v)) {
        ++nans;
      } else if (std::isinf(v)) {
        ++infs;
      } else {
        sum += std::fabs(v);
      }
    }
    EXPECT_EQ(nans, f.nans);
    EXPECT_EQ(infs, f.infs);
    EXPECT_EQ(sum, f.abs_sum);
  }
}

TEST(Tensor, Float8RawDataDecodesToFloat32) {
  const mx::array a = decode_array(
      proto::raw_tensor("f8", OnnxType::kFloat8E4M3FN, {3}, std::string("\x7E\x38\xB8", 3)));
  EXPECT_EQ(a.dtype(), mx::float32);
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{448, 1, -1}));
}

TEST(Tensor, Float4E2M1PacksTwoPerByteLowNibbleFirst) {
  // Elements 1.0 (0x2), 6.0 (0x7), -0.5 (0x9): bytes 0x72, 0x09.
  const mx::array a = decode_array(
      proto::raw_tensor("f4", OnnxType::kFloat4E2M1, {3}, std::string("\x72\x09", 2)));
  EXPECT_EQ(a.dtype(), mx::float32);
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{1, 6, -0.5f}));
}

// ------------------------------------------------------------ sub-byte ints

TEST(Tensor, Int4AndUint4Unpack) {
  // Nibbles, low first: 1, 2, 8, 15 -> int4 1, 2, -8, -1.
  const std::string bytes("\x21\xF8", 2);
  const mx::array s = decode_array(proto::raw_tensor("i4", OnnxType::kInt4, {2, 2}, bytes));
  EXPECT_EQ(s.dtype(), mx::int8);
  EXPECT_EQ(shape_of(s), (std::vector<int>{2, 2}));
  EXPECT_EQ(values_of<int8_t>(s), (std::vector<int8_t>{1, 2, -8, -1}));
  const mx::array u = decode_array(proto::raw_tensor("u4", OnnxType::kUint4, {4}, bytes));
  EXPECT_EQ(u.dtype(), mx::uint8);
  EXPECT_EQ(values_of<uint8_t>(u), (std::vector<uint8_t>{1, 2, 8, 15}));
  // An odd count uses ceil(n/2) bytes; the last high nibble is padding.
  const mx::array odd = decode_array(proto::raw_tensor("i4", OnnxType::kInt4, {3}, bytes));
  EXPECT_EQ(values_of<int8_t>(odd), (std::vector<int8_t>{1, 2, -8}));
}

TEST(Tensor, Int2AndUint2Unpack) {
  // 0b11'10'01'00 = 0xE4: elements 0, 1, 2, 3 (uint2) / 0, 1, -2, -1 (int2).
  const mx::array u = decode_array(proto::raw_tensor("u2", OnnxType::kUint2, {5}, "\xE4\x01"));
  EXPECT_EQ(values_of<uint8_t>(u), (std::vector<uint8_t>{0, 1, 2, 3, 1}));
  const mx::array s = decode_array(proto::raw_tensor("i2", OnnxType::kInt2, {4}, "\xE4"));
  EXPECT_EQ(values_of<int8_t>(s), (std::vector<int8_t>{0, 1, -2, -1}));
}

// ----------------------------------------------------------- typed fields

TEST(Tensor, TypedFieldsOfEveryKind) {
  {
    auto w = proto::tensor("f", OnnxType::kFloat, {2});
    w.packed_floats(4, {1.5f, -2.f});
    EXPECT_EQ(values_of<float>(decode_array(w)), (std::vector<float>{1.5f, -2.f}));
  }
  {
    auto w = proto::tensor("d", OnnxType::kDouble, {1});
    w.packed_doubles(10, {0.1});
    EXPECT_EQ(values_of<double>(decode_array(w)), (std::vector<double>{0.1}));
  }
  {
    auto w = proto::tensor("i64", OnnxType::kInt64, {3});
    w.packed_int64s(7, {-1, 0, int64_t{1} << 50});
    EXPECT_EQ(values_of<int64_t>(decode_array(w)), (std::vector<int64_t>{-1, 0, int64_t{1} << 50}));
  }
  {
    auto w = proto::tensor("u32", OnnxType::kUint32, {1});
    w.packed_uint64s(11, {4000000000u});
    const mx::array a = decode_array(w);
    EXPECT_EQ(a.dtype(), mx::uint32);
    EXPECT_EQ(values_of<uint32_t>(a), (std::vector<uint32_t>{4000000000u}));
  }
  {
    auto w = proto::tensor("u64", OnnxType::kUint64, {1});
    w.packed_uint64s(11, {~uint64_t{0}});
    EXPECT_EQ(values_of<uint64_t>(decode_array(w)), (std::vector<uint64_t>{~uint64_t{0}}));
  }
  {
    auto w = proto::tensor("i8", OnnxType::kInt8, {2});
    w.packed_int32s(5, {-5, 100});
    const mx::array a = decode_array(w);
    EXPECT_EQ(a.dtype(), mx::int8);
    EXPECT_EQ(values_of<int8_t>(a), (std::vector<int8_t>{-5, 100}));
  }
  {
    auto w = proto::tensor("u16", OnnxType::kUint16, {1});
    w.packed_int32s(5, {65535});
    EXPECT_EQ(values_of<uint16_t>(decode_array(w)), (std::vector<uint16_t>{65535}));
  }
  {
    auto w = proto::tensor("i16", OnnxType::kInt16, {1});
    w.packed_int32s(5, {-300});
    EXPECT_EQ(values_of<int16_t>(decode_array(w)), (std::vector<int16_t>{-300}));
  }
  {
    auto w = proto::tensor("i32", OnnxType::kInt32, {2});
    w.int64(5, -9).int64(5, 9);  // unpacked repeated
    EXPECT_EQ(values_of<int32_t>(decode_array(w)), (std::vector<int32_t>{-9, 9}));
  }
  {
    auto w = proto::tensor("b", OnnxType::kBool, {2});
    w.packed_int32s(5, {1, 0});
    EXPECT_EQ(values_of<bool>(decode_array(w)), (std::vector<bool>{true, false}));
  }
  {
    auto w = proto::tensor("h", OnnxType::kFloat16, {1});
    w.packed_int32s(5, {0x3C00});
    EXPECT_EQ(values_of<float>(mx::astype(decode_array(w), mx::float32)), (std::vector<float>{1}));
  }
  {
    auto w = proto::tensor("bf", OnnxType::kBfloat16, {1});
    w.packed_int32s(5, {0xC040});
    EXPECT_EQ(values_of<float>(mx::astype(decode_array(w), mx::float32)), (std::vector<float>{-3}));
  }
  {
    auto w = proto::tensor("f8", OnnxType::kFloat8E5M2, {2});
    w.packed_int32s(5, {0x7B, 0xFC});
    EXPECT_EQ(values_of<float>(decode_array(w)), (std::vector<float>{57344, -INFINITY}));
  }
  {
    auto w = proto::tensor("i4", OnnxType::kInt4, {3});
    w.packed_int32s(5, {0x21, 0x0F});  // two elements per int32_data entry
    EXPECT_EQ(values_of<int8_t>(decode_array(w)), (std::vector<int8_t>{1, 2, -1}));
  }
  {
    auto w = proto::tensor("c", OnnxType::kComplex64, {1});
    w.packed_floats(4, {3.f, 4.f});
    EXPECT_EQ(values_of<std::complex<float>>(decode_array(w))[0], std::complex<float>(3, 4));
  }
}

TEST(Tensor, StringTensor) {
  auto w = proto::tensor("s", OnnxType::kString, {2});
  w.bytes(6, "hello").bytes(6, std::string("a\0b", 3));
  const Value v = decode(w).value.value;
  ASSERT_TRUE(v.is_strings());
  EXPECT_EQ(v.strings().shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(v.strings().data, (std::vector<std::string>{"hello", std::string("a\0b", 3)}));
}

// ------------------------------------------------------------------ errors

TEST(Tensor, RawDataSizeMismatchNamesTheTensor) {
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {2, 3}, proto::raw({1.f, 2.f}));
  const std::string message = error_of([&] { decode(w); });
  EXPECT_NE(message.find("t.onnx: initializer[0] 't': raw_data has 8 bytes, expected 24 for float32[2,3]"),
            std::string::npos)
      << message;
}

TEST(Tensor, NegativeDimension) {
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {2, -1}, "");
  const std::string message = error_of([&] { decode(w); });
  EXPECT_NE(message.find("negative dimension -1 at index 1"), std::string::npos) << message;
  EXPECT_NE(message.find("initializer[0] 't'"), std::string::npos) << message;
}

TEST(Tensor, DimensionBeyondInt32) {
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {int64_t{1} << 31}, "");
  EXPECT_NE(error_of([&] { decode(w); }).find("exceeds the int32 range"), std::string::npos);
}

TEST(Tensor, ElementCountOverflow) {
  const int64_t big = (int64_t{1} << 31) - 1;
  const auto w = proto::raw_tensor("w", OnnxType::kFloat, {big, big, big}, "");
  EXPECT_NE(error_of([&] { decode(w); }).find("overflows"), std::string::npos);
}

TEST(Tensor, ByteSizeOverflowIsRefused) {
  // 2^58 complex64 elements pass the element-count bound, but their bit
  // count (2^64) wrapped to 0 and matched an empty raw_data.
  const int64_t d = int64_t{1} << 29;
  const auto w = proto::raw_tensor("w", OnnxType::kComplex64, {d, d}, "");
  const std::string message = error_of([&] { decode(w); });
  EXPECT_NE(message.find("byte size of dims [536870912,536870912] overflows"), std::string::npos) << message;
}

TEST(Tensor, TypedFieldCountMismatch) {
  auto w = proto::tensor("w", OnnxType::kInt64, {3});
  w.packed_int64s(7, {1, 2});
  const std::string message = error_of([&] { decode(w); });
  EXPECT_NE(message.find("int64[3] expects 3 values in int64_data, found 2"), std::string::npos)
      << message;
}

TEST(Tensor, UnknownAndUnsupportedDataTypes) {
  EXPECT_NE(error_of([&] { decode(proto::raw_tensor("w", static_cast<OnnxType>(99), {1}, "x")); })
                .find("unknown tensor data_type 99"),
            std::string::npos);
  EXPECT_NE(error_of([&] { decode(proto::raw_tensor("w", OnnxType::kUndefined, {1}, "x")); })
                .find("UNDEFINED"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              decode(proto::raw_tensor("w", OnnxType::kComplex128, {1}, std::string(16, '\0')));
            }).find("complex128"),
            std::string::npos);
}

TEST(Tensor, SegmentedTensorIsRejected) {
  auto w = proto::raw_tensor("w", OnnxType::kFloat, {1}, proto::raw({1.f}));
  w.message(3, ProtoWriter().int64(1, 0).int64(2, 1));
  EXPECT_NE(error_of([&] { decode(w); }).find("segment"), std::string::npos);
}

// ------------------------------------------------------------ sparse tensors

TEST(Tensor, SparseTensorWithLinearIndicesIsDensified) {
  ProtoWriter sparse;
  sparse.message(1, proto::raw_tensor("sp", OnnxType::kFloat, {2}, proto::raw({5.f, 7.f})));
  sparse.message(2, proto::raw_tensor("", OnnxType::kInt64, {2}, proto::raw<int64_t>({1, 4})));
  sparse.packed_int64s(3, {2, 3});
  MessagePath path("t.onnx");
  std::vector<uint8_t> bytes = sparse.to_bytes();
  const NamedValue v = read_sparse_tensor(bytes, path, TensorSource{});
  EXPECT_EQ(v.name, "sp");
  EXPECT_EQ(shape_of(v.value.tensor()), (std::vector<int>{2, 3}));
  EXPECT_EQ(values_of<float>(v.value.tensor()), (std::vector<float>{0, 5, 0, 0, 7, 0}));
}

TEST(Tensor, SparseTensorWithCoordinatesAndBadIndex) {
  ProtoWriter sparse;
  sparse.message(1, proto::raw_tensor("sp", OnnxType::kInt32, {1}, proto::raw<int32_t>({9})));
  sparse.message(2, proto::raw_tensor("", OnnxType::kInt64, {1, 2}, proto::raw<int64_t>({1, 0})));
  sparse.packed_int64s(3, {2, 2});
  MessagePath path("t.onnx");
  const NamedValue v = read_sparse_tensor(sparse.to_bytes(), path, TensorSource{});
  EXPECT_EQ(values_of<int32_t>(v.value.tensor()), (std::vector<int32_t>{0, 0, 9, 0}));

  ProtoWriter bad;
  bad.message(1, proto::raw_tensor("sp", OnnxType::kInt32, {1}, proto::raw<int32_t>({9})));
  bad.message(2, proto::raw_tensor("", OnnxType::kInt64, {1}, proto::raw<int64_t>({4})));
  bad.packed_int64s(3, {2, 2});
  EXPECT_NE(error_of([&] { read_sparse_tensor(bad.to_bytes(), path, TensorSource{}); })
                .find("sparse index 4"),
            std::string::npos);
}

TEST(Tensor, SparseTensorWithHugeDenseShapeIsRefused) {
  // A 2^40-element dense shape for one value: 4 TiB from a few bytes.
  ProtoWriter sparse;
  sparse.message(1, proto::raw_tensor("sp", OnnxType::kFloat, {1}, proto::raw({1.f})));
  sparse.message(2, proto::raw_tensor("", OnnxType::kInt64, {1}, proto::raw<int64_t>({0})));
  sparse.packed_int64s(3, {int64_t{1} << 20, int64_t{1} << 20});
  MessagePath path("t.onnx");
  const std::string message =
      error_of([&] { read_sparse_tensor(sparse.to_bytes(), path, TensorSource{}); });
  EXPECT_NE(message.find("t.onnx: sparse tensor of dims [1048576,1048576] would densify to "
                         "4398046511104 bytes"),
            std::string::npos)
      << message;
}

TEST(Tensor, SparseTensorDenseCountOverflowIsRefused) {
  const int64_t big = (int64_t{1} << 31) - 1;
  ProtoWriter sparse;
  sparse.message(1, proto::raw_tensor("sp", OnnxType::kFloat, {1}, proto::raw({1.f})));
  sparse.message(2, proto::raw_tensor("", OnnxType::kInt64, {1}, proto::raw<int64_t>({0})));
  sparse.packed_int64s(3, {big, big, big});
  MessagePath path("t.onnx");
  const std::string message =
      error_of([&] { read_sparse_tensor(sparse.to_bytes(), path, TensorSource{}); });
  EXPECT_NE(message.find("overflows"), std::string::npos) << message;
}

// ------------------------------------------------------------- external data

class ExternalData : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("transmuter_ext_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "model");
    model_dir_ = root_ / "model";
  }
  void TearDown() override { fs::remove_all(root_); }

  static void write(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  fs::path root_, model_dir_;
};

TEST_F(ExternalData, ReadsAtOffsetZeroCopyAndMapsEachFileOnce) {
  std::string file(4096, '\0');
  const std::string a = proto::raw({1.f, 2.f, 3.f});
  const std::string b = proto::raw<int64_t>({-4, 5});
  file.replace(64, a.size(), a);
  file.replace(128, b.size(), b);
  write(model_dir_ / "weights.bin", file);

  ExternalDataStore store(model_dir_);
  const Decoded da = decode(proto::external_tensor("a", OnnxType::kFloat, {3}, "weights.bin", 64, 12), &store);
  const Decoded db = decode(proto::external_tensor("b", OnnxType::kInt64, {2}, "./weights.bin", 128, 16), &store);
  EXPECT_EQ(values_of<float>(da.value.value.tensor()), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(values_of<int64_t>(db.value.value.tensor()), (std::vector<int64_t>{-4, 5}));
  EXPECT_EQ(store.mapped_file_count(), 1u);

  MessagePath path("t.onnx");
  const auto mapped = store.read("weights.bin", 0, std::nullopt, path);
  const auto* p = static_cast<const uint8_t*>(da.value.value.tensor().data<void>());
  EXPECT_EQ(p, mapped.bytes.data() + 64) << "aligned external data must alias the mapping";
}

// The first tensor of a file (onnxruntime-genai puts a 113 MB embedding there) aliases it too: the
// mapping has a readable page before the file's bytes for the 8 bytes MLX's allocator reads.
TEST_F(ExternalData, TheTensorAtOffsetZeroAliasesTheMapping) {
  write(model_dir_ / "first.bin", proto::raw({7.f, 8.f}));
  ExternalDataStore store(model_dir_);
  const Decoded d = decode(proto::external_tensor("a", OnnxType::kFloat, {2}, "first.bin", 0, 8), &store);
  mx::array tensor = d.value.value.tensor();
  EXPECT_EQ(values_of<float>(tensor), (std::vector<float>{7, 8}));
  MessagePath path("t.onnx");
  const auto mapped = store.read("first.bin", 0, std::nullopt, path);
  EXPECT_EQ(static_cast<const uint8_t*>(tensor.data<void>()), mapped.bytes.data())
      << "a tensor at offset 0 must alias the mapping, not be copied";
}

TEST_F(ExternalData, LengthDefaultsToTheRestOfTheFile) {
  write(model_dir_ / "w.bin", "xxxx" + proto::raw({9.f}));
  ExternalDataStore store(model_dir_);
  const Decoded d = decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "w.bin", 4), &store);
  EXPECT_EQ(values_of<float>(d.value.value.tensor()), (std::vector<float>{9}));
}

TEST_F(ExternalData, PastTheEndOfTheFile) {
  write(model_dir_ / "w.bin", std::string(16, '\0'));
  ExternalDataStore store(model_dir_);
  std::string message = error_of([&] {
    decode(proto::external_tensor("a", OnnxType::kFloat, {4}, "w.bin", 8, 16), &store);
  });
  EXPECT_NE(message.find("runs past the end of 'w.bin' (16 bytes)"), std::string::npos) << message;
  EXPECT_NE(message.find("initializer[0] 't'"), std::string::npos) << message;
  message = error_of([&] {
    decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "w.bin", 17, 4), &store);
  });
  EXPECT_NE(message.find("offset 17 is past the end"), std::string::npos) << message;
}

TEST_F(ExternalData, LengthMustMatchTheTensor) {
  write(model_dir_ / "w.bin", std::string(16, '\0'));
  ExternalDataStore store(model_dir_);
  const std::string message = error_of([&] {
    decode(proto::external_tensor("a", OnnxType::kFloat, {3}, "w.bin", 0, 16), &store);
  });
  EXPECT_NE(message.find("external data has 16 bytes, expected 12"), std::string::npos) << message;
}

TEST_F(ExternalData, BadOffsetText) {
  write(model_dir_ / "w.bin", std::string(16, '\0'));
  ExternalDataStore store(model_dir_);
  auto w = proto::tensor("a", OnnxType::kFloat, {1});
  w.message(13, ProtoWriter().string(1, "location").string(2, "w.bin"));
  w.message(13, ProtoWriter().string(1, "offset").string(2, "12abc"));
  w.varint(14, 1);
  EXPECT_NE(error_of([&] { decode(w, &store); }).find("offset '12abc' is not a number"),
            std::string::npos);
}

TEST_F(ExternalData, AbsolutePathIsRejected) {
  write(root_ / "outside.bin", std::string(4, '\0'));
  ExternalDataStore store(model_dir_);
  const std::string message = error_of([&] {
    decode(proto::external_tensor("a", OnnxType::kFloat, {1}, (root_ / "outside.bin").string()), &store);
  });
  EXPECT_NE(message.find("is absolute"), std::string::npos) << message;
}

TEST_F(ExternalData, DotDotEscapeIsRejected) {
  write(root_ / "outside.bin", std::string(4, '\0'));
  ExternalDataStore store(model_dir_);
  const std::string message = error_of([&] {
    decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "../outside.bin"), &store);
  });
  EXPECT_NE(message.find("outside the model's folder"), std::string::npos) << message;
}

TEST_F(ExternalData, DotDotThatStaysInsideIsAllowed) {
  fs::create_directories(model_dir_ / "sub");
  write(model_dir_ / "w.bin", proto::raw({2.f}));
  ExternalDataStore store(model_dir_);
  const Decoded d = decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "sub/../w.bin"), &store);
  EXPECT_EQ(values_of<float>(d.value.value.tensor()), (std::vector<float>{2}));
}

TEST_F(ExternalData, SymlinkLeadingOutsideIsRejected) {
  write(root_ / "outside.bin", proto::raw({1.f}));
  fs::create_symlink(root_ / "outside.bin", model_dir_ / "link.bin");
  fs::create_directory_symlink(root_, model_dir_ / "linkdir");
  ExternalDataStore store(model_dir_);
  std::string message = error_of([&] {
    decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "link.bin"), &store);
  });
  EXPECT_NE(message.find("outside the model's folder"), std::string::npos) << message;
  message = error_of([&] {
    decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "linkdir/outside.bin"), &store);
  });
  EXPECT_NE(message.find("outside the model's folder"), std::string::npos) << message;
}

TEST_F(ExternalData, SymlinkInsideIsFollowed) {
  write(model_dir_ / "real.bin", proto::raw({3.f}));
  fs::create_symlink("real.bin", model_dir_ / "alias.bin");
  ExternalDataStore store(model_dir_);
  decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "real.bin"), &store);
  const Decoded d = decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "alias.bin"), &store);
  EXPECT_EQ(values_of<float>(d.value.value.tensor()), (std::vector<float>{3}));
  EXPECT_EQ(store.mapped_file_count(), 1u) << "a link and its target are one file";
}

TEST_F(ExternalData, MissingFileAndNoStore) {
  ExternalDataStore store(model_dir_);
  EXPECT_NE(error_of([&] {
              decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "nope.bin"), &store);
            }).find("nope.bin"),
            std::string::npos);
  EXPECT_NE(error_of([&] { decode(proto::external_tensor("a", OnnxType::kFloat, {1}, "w.bin")); })
                .find("not available"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
