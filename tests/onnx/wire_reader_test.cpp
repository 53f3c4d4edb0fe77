#include "onnx/wire_reader.h"

#include <gtest/gtest.h>

#include <limits>

#include "support/proto_writer.h"
#include "support/expect_error.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::ProtoWriter;

std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

using testing::error_of;

TEST(WireReader, ReadsVarintsOfEveryLength) {
  const std::vector<uint64_t> values = {0, 1, 127, 128, 300, 1ull << 35,
                                        std::numeric_limits<uint64_t>::max()};
  ProtoWriter w;
  for (uint64_t v : values) w.varint(1, v);
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  for (uint64_t v : values) {
    ASSERT_TRUE(r.next());
    EXPECT_EQ(r.field(), 1u);
    EXPECT_EQ(r.wire_type(), WireType::kVarint);
    EXPECT_EQ(r.varint(), v);
  }
  EXPECT_FALSE(r.next());
}

TEST(WireReader, NegativeInt64AndInt32UseTenBytes) {
  ProtoWriter w;
  w.int64(2, -5).int64(3, -7);
  EXPECT_EQ(w.data().size(), 2u * (1 + 10));
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  EXPECT_EQ(r.int64(), -5);
  ASSERT_TRUE(r.next());
  EXPECT_EQ(r.int32(), -7);
}

TEST(WireReader, RejectsVarintLongerThanTenBytes) {
  ProtoWriter w;
  w.tag(1, 0).raw(std::string(10, '\x80')).raw("\x01");
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  EXPECT_NE(error_of([&] { r.varint(); }).find("varint field 1 longer than 10 bytes"), std::string::npos);
}

TEST(WireReader, RejectsVarintOverflowingSixtyFourBits) {
  ProtoWriter w;
  w.tag(1, 0).raw(std::string(9, '\xFF')).raw("\x02");
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  EXPECT_NE(error_of([&] { r.varint(); }).find("varint field 1 overflows 64 bits"), std::string::npos);
}

TEST(WireReader, NamesTheFieldOfATruncatedLength) {
  ProtoWriter w;
  w.tag(2, 2).raw("\x80");  // a length whose varint never ends
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  EXPECT_NE(error_of([&] { r.bytes(); }).find("m.onnx: truncated length of field 2"), std::string::npos);
}

TEST(WireReader, ReadsFixedAndFloatFields) {
  ProtoWriter w;
  w.fixed32(1, 0xDEADBEEF).fixed64(2, 0x0123456789ABCDEFull).float32(3, 1.5f);
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  EXPECT_EQ(r.fixed32(), 0xDEADBEEFu);
  ASSERT_TRUE(r.next());
  EXPECT_EQ(r.wire_type(), WireType::kFixed64);
  EXPECT_EQ(r.fixed64(), 0x0123456789ABCDEFull);
  ASSERT_TRUE(r.next());
  EXPECT_EQ(r.float32(), 1.5f);
  EXPECT_FALSE(r.next());
}

TEST(WireReader, LengthDelimitedIsASubSpanWithoutCopy) {
  ProtoWriter w;
  w.bytes(9, "payload");
  const std::string& data = w.data();
  MessagePath path("m.onnx");
  WireReader r(span_of(data), path);
  ASSERT_TRUE(r.next());
  const auto payload = r.bytes();
  ASSERT_EQ(payload.size(), 7u);
  EXPECT_EQ(reinterpret_cast<const char*>(payload.data()), data.data() + 2);
}

TEST(WireReader, SkipsUnknownFieldsOfEveryWireType) {
  ProtoWriter w;
  w.varint(10, 1234567).fixed64(11, 1).bytes(12, "skip me").fixed32(13, 2).string(1, "kept");
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  std::string kept;
  int skipped = 0;
  while (r.next()) {
    if (r.field() == 1) {
      kept = r.string();
    } else {
      r.skip();
      ++skipped;
    }
  }
  EXPECT_EQ(kept, "kept");
  EXPECT_EQ(skipped, 4);
}

TEST(WireReader, RejectsGroupAndInvalidWireTypes) {
  for (uint32_t type : {3u, 4u, 6u, 7u}) {
    ProtoWriter w;
    w.tag(5, type).raw("\x01\x02");
    MessagePath path("m.onnx");
    WireReader r(span_of(w.data()), path);
    const std::string message = error_of([&] { r.next(); });
    EXPECT_NE(message.find("wire type " + std::to_string(type)), std::string::npos) << message;
    EXPECT_NE(message.find("field 5"), std::string::npos) << message;
  }
}

TEST(WireReader, RejectsFieldNumberZero) {
  ProtoWriter w;
  w.tag(0, 0).raw("\x01");
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  EXPECT_NE(error_of([&] { r.next(); }).find("invalid field number 0"), std::string::npos);
}

TEST(WireReader, TruncatedLengthDelimitedNamesThePath) {
  ProtoWriter w;
  w.tag(9, 2).put_varint(100);  // 100 bytes declared, none present
  w.raw("abc");
  MessagePath root("model.onnx");
  MessagePath graph(root, "graph");
  MessagePath initializer(graph, "initializer", 3, "w");
  WireReader r(span_of(w.data()), initializer);
  ASSERT_TRUE(r.next());
  const std::string message = error_of([&] { r.bytes(); });
  EXPECT_EQ(message.rfind("model.onnx: graph.initializer[3] 'w': truncated length-delimited field 9",
                          0),
            0u)
      << message;
}

TEST(WireReader, TruncatedFixedFieldsThrow) {
  for (uint32_t type : {1u, 5u}) {
    ProtoWriter w;
    w.tag(2, type).raw("\x01\x02\x03");
    MessagePath path("m.onnx");
    WireReader r(span_of(w.data()), path);
    ASSERT_TRUE(r.next());
    EXPECT_NE(error_of([&] { r.skip(); }).find("truncated"), std::string::npos);
  }
}

TEST(WireReader, WrongWireTypeForAFieldIsAnError) {
  ProtoWriter w;
  w.varint(8, 5);
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  const std::string message = error_of([&] { r.string(); });
  EXPECT_NE(message.find("field 8 has wire type varint, expected length-delimited"),
            std::string::npos)
      << message;
}

TEST(WireReader, RepeatedScalarsPackedAndUnpacked) {
  ProtoWriter w;
  w.packed_int64s(1, {1, -2, 300}).int64(1, 4);
  w.packed_floats(2, {0.5f, 2.f}).float32(2, 3.f);
  w.packed_doubles(3, {1.25});
  w.packed_int32s(4, {-1, 7});
  w.packed_uint64s(5, {std::numeric_limits<uint64_t>::max()});
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<double> doubles;
  std::vector<int32_t> int32s;
  std::vector<uint64_t> uint64s;
  while (r.next()) {
    switch (r.field()) {
      case 1: r.append_int64s(ints); break;
      case 2: r.append_floats(floats); break;
      case 3: r.append_doubles(doubles); break;
      case 4: r.append_int32s(int32s); break;
      case 5: r.append_uint64s(uint64s); break;
      default: r.skip();
    }
  }
  EXPECT_EQ(ints, (std::vector<int64_t>{1, -2, 300, 4}));
  EXPECT_EQ(floats, (std::vector<float>{0.5f, 2.f, 3.f}));
  EXPECT_EQ(doubles, (std::vector<double>{1.25}));
  EXPECT_EQ(int32s, (std::vector<int32_t>{-1, 7}));
  EXPECT_EQ(uint64s, (std::vector<uint64_t>{std::numeric_limits<uint64_t>::max()}));
}

TEST(WireReader, PackedFixedWithPartialElementIsAnError) {
  ProtoWriter w;
  w.bytes(4, "12345");  // 5 bytes: not a whole number of floats
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  std::vector<float> out;
  EXPECT_NE(error_of([&] { r.append_floats(out); }).find("not a multiple of 4"), std::string::npos);
}

TEST(WireReader, PackedVarintCannotRunPastItsPayload) {
  ProtoWriter w;
  w.bytes(1, "\x80").varint(2, 1);  // payload ends mid-varint; next field follows
  MessagePath path("m.onnx");
  WireReader r(span_of(w.data()), path);
  ASSERT_TRUE(r.next());
  std::vector<int64_t> out;
  EXPECT_NE(error_of([&] { r.append_int64s(out); }).find("truncated packed varint field 1"),
            std::string::npos);
}

TEST(WireReader, PeekStringFieldFindsNameAndNeverThrows) {
  ProtoWriter w;
  w.varint(2, 1).bytes(9, "data").string(8, "tensor_name");
  EXPECT_EQ(peek_string_field(std::span<const uint8_t>(w.to_bytes()), 8), "tensor_name");
  const std::string garbage = "\x0f\xff\xff";
  EXPECT_EQ(peek_string_field(span_of(garbage), 8), "");
}

TEST(MessagePath, RendersFramesAndLimitsDepth) {
  MessagePath root("model.onnx");
  EXPECT_EQ(root.text(), "model.onnx");
  MessagePath graph(root, "graph");
  MessagePath node(graph, "node", 2, "conv");
  MessagePath attribute(node, "attribute", 0, "then_branch");
  EXPECT_EQ(attribute.text(), "model.onnx: graph.node[2] 'conv'.attribute[0] 'then_branch'");

  std::vector<std::unique_ptr<MessagePath>> chain;
  chain.push_back(std::make_unique<MessagePath>("deep.onnx"));
  std::string message;
  try {
    for (int i = 0; i <= MessagePath::kMaxDepth; ++i) {
      chain.push_back(std::make_unique<MessagePath>(*chain.back(), "g"));
    }
  } catch (const ModelFormatError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("nest deeper than"), std::string::npos);
}

}  // namespace
}  // namespace transmuter
