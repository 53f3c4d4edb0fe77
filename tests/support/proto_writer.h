// A tiny protobuf wire-format WRITER for tests: builds ModelProto/TensorProto
// bytes in C++ so loader tests need no Python and no protoc. Header-only (the
// test CMakeLists compiles only listed support sources).
//
//   auto w = proto::tensor("w", OnnxType::kFloat, {2}).bytes(9, proto::raw({1.f, 2.f}));
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "transmuter/dtype.h"

namespace transmuter::testing {

/** Appends protobuf fields to a byte string. Each call writes one field. */
class ProtoWriter {
 public:
  ProtoWriter& tag(uint32_t field, uint32_t wire_type) {
    put_varint((static_cast<uint64_t>(field) << 3) | wire_type);
    return *this;
  }
  ProtoWriter& varint(uint32_t field, uint64_t value) {
    tag(field, 0);
    put_varint(value);
    return *this;
  }
  ProtoWriter& int64(uint32_t field, int64_t value) {
    return varint(field, static_cast<uint64_t>(value));
  }
  ProtoWriter& fixed32(uint32_t field, uint32_t value) {
    tag(field, 5);
    append(&value, 4);
    return *this;
  }
  ProtoWriter& fixed64(uint32_t field, uint64_t value) {
    tag(field, 1);
    append(&value, 8);
    return *this;
  }
  ProtoWriter& float32(uint32_t field, float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    return fixed32(field, bits);
  }
  ProtoWriter& bytes(uint32_t field, std::string_view payload) {
    tag(field, 2);
    put_varint(payload.size());
    data_.append(payload);
    return *this;
  }
  ProtoWriter& string(uint32_t field, std::string_view text) { return bytes(field, text); }
  ProtoWriter& message(uint32_t field, const ProtoWriter& sub) { return bytes(field, sub.data()); }
  ProtoWriter& packed_int64s(uint32_t field, const std::vector<int64_t>& values) {
    ProtoWriter payload;
    for (int64_t v : values) payload.put_varint(static_cast<uint64_t>(v));
    return bytes(field, payload.data());
  }
  ProtoWriter& packed_uint64s(uint32_t field, const std::vector<uint64_t>& values) {
    ProtoWriter payload;
    for (uint64_t v : values) payload.put_varint(v);
    return bytes(field, payload.data());
  }
  ProtoWriter& packed_int32s(uint32_t field, const std::vector<int32_t>& values) {
    ProtoWriter payload;  // int32 is sign-extended to 64 bits on the wire
    for (int32_t v : values) payload.put_varint(static_cast<uint64_t>(static_cast<int64_t>(v)));
    return bytes(field, payload.data());
  }
  ProtoWriter& packed_floats(uint32_t field, const std::vector<float>& values) {
    return bytes(field, std::string_view(reinterpret_cast<const char*>(values.data()),
                                         values.size() * sizeof(float)));
  }
  ProtoWriter& packed_doubles(uint32_t field, const std::vector<double>& values) {
    return bytes(field, std::string_view(reinterpret_cast<const char*>(values.data()),
                                         values.size() * sizeof(double)));
  }
  /** Appends bytes as they are (for malformed inputs). */
  ProtoWriter& raw(std::string_view bytes) {
    data_.append(bytes);
    return *this;
  }
  void put_varint(uint64_t value) {
    while (value >= 0x80) {
      data_.push_back(static_cast<char>((value & 0x7F) | 0x80));
      value >>= 7;
    }
    data_.push_back(static_cast<char>(value));
  }

  const std::string& data() const { return data_; }
  std::vector<uint8_t> to_bytes() const { return {data_.begin(), data_.end()}; }

 private:
  void append(const void* p, size_t n) { data_.append(static_cast<const char*>(p), n); }
  std::string data_;
};

/** Builders for the ONNX messages (field numbers from onnx/onnx.proto). */
namespace proto {

/** Little-endian element bytes of `values`, for raw_data. */
template <typename T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}
template <typename T>
std::string raw(std::initializer_list<T> values) {
  return raw(std::vector<T>(values));
}

/** TensorProto header: name, data_type, dims. Add data fields to it. */
inline ProtoWriter tensor(std::string_view name, OnnxType type, const std::vector<int64_t>& dims) {
  ProtoWriter w;
  for (int64_t d : dims) w.int64(1, d);
  w.varint(2, static_cast<uint64_t>(type));
  if (!name.empty()) w.string(8, name);
  return w;
}
/** TensorProto with raw_data. */
inline ProtoWriter raw_tensor(std::string_view name, OnnxType type, const std::vector<int64_t>& dims,
                              std::string_view raw_data) {
  return tensor(name, type, dims).bytes(9, raw_data);
}
/** TensorProto whose data lives in an external file. */
inline ProtoWriter external_tensor(std::string_view name, OnnxType type,
                                   const std::vector<int64_t>& dims, std::string_view location,
                                   int64_t offset = -1, int64_t length = -1) {
  ProtoWriter w = tensor(name, type, dims);
  auto entry = [&](std::string_view key, std::string_view value) {
    w.message(13, ProtoWriter().string(1, key).string(2, value));
  };
  entry("location", location);
  if (offset >= 0) entry("offset", std::to_string(offset));
  if (length >= 0) entry("length", std::to_string(length));
  w.varint(14, 1);  // data_location = EXTERNAL
  return w;
}

/** TypeProto.tensor_type; a negative dim becomes the symbol "N". */
inline ProtoWriter tensor_type(OnnxType elem, const std::vector<int64_t>& dims) {
  ProtoWriter shape;
  for (int64_t d : dims) {
    ProtoWriter dim;
    if (d >= 0) {
      dim.int64(1, d);
    } else {
      dim.string(2, "N");
    }
    shape.message(1, dim);
  }
  ProtoWriter tensor_t;
  tensor_t.varint(1, static_cast<uint64_t>(elem)).message(2, shape);
  return ProtoWriter().message(1, tensor_t);
}
inline ProtoWriter value_info(std::string_view name, const ProtoWriter& type) {
  return ProtoWriter().string(1, name).message(2, type);
}
inline ProtoWriter value_info(std::string_view name, OnnxType elem, const std::vector<int64_t>& dims) {
  return value_info(name, tensor_type(elem, dims));
}

inline ProtoWriter node(std::string_view op_type, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, std::string_view name = "",
                        std::string_view domain = "") {
  ProtoWriter w;
  for (const auto& in : inputs) w.string(1, in);
  for (const auto& out : outputs) w.string(2, out);
  if (!name.empty()) w.string(3, name);
  w.string(4, op_type);
  if (!domain.empty()) w.string(7, domain);
  return w;
}

// AttributeProto builders (type field 20 set as producers do).
inline ProtoWriter attr_int(std::string_view name, int64_t v) {
  return ProtoWriter().string(1, name).varint(20, 2).int64(3, v);
}
inline ProtoWriter attr_float(std::string_view name, float v) {
  return ProtoWriter().string(1, name).varint(20, 1).float32(2, v);
}
inline ProtoWriter attr_string(std::string_view name, std::string_view v) {
  return ProtoWriter().string(1, name).varint(20, 3).bytes(4, v);
}
inline ProtoWriter attr_ints(std::string_view name, const std::vector<int64_t>& v) {
  return ProtoWriter().string(1, name).varint(20, 7).packed_int64s(8, v);
}
inline ProtoWriter attr_floats(std::string_view name, const std::vector<float>& v) {
  return ProtoWriter().string(1, name).varint(20, 6).packed_floats(7, v);
}
inline ProtoWriter attr_strings(std::string_view name, const std::vector<std::string>& v) {
  ProtoWriter w;
  w.string(1, name).varint(20, 8);
  for (const auto& s : v) w.bytes(9, s);
  return w;
}
inline ProtoWriter attr_tensor(std::string_view name, const ProtoWriter& t) {
  return ProtoWriter().string(1, name).varint(20, 4).message(5, t);
}
inline ProtoWriter attr_graph(std::string_view name, const ProtoWriter& g) {
  return ProtoWriter().string(1, name).varint(20, 5).message(6, g);
}
/** An attribute of a function body node that takes the caller's `ref`. */
inline ProtoWriter attr_ref(std::string_view name, std::string_view ref, int type) {
  return ProtoWriter().string(1, name).varint(20, static_cast<uint64_t>(type)).string(21, ref);
}
/** A node with attributes appended (field 5). */
inline ProtoWriter with_attributes(ProtoWriter node, const std::vector<ProtoWriter>& attributes) {
  for (const auto& a : attributes) node.message(5, a);
  return node;
}

inline ProtoWriter opset(std::string_view domain, int64_t version) {
  return ProtoWriter().string(1, domain).int64(2, version);
}

/** GraphProto from its parts. */
struct GraphParts {
  std::string name = "g";
  std::vector<ProtoWriter> nodes;
  std::vector<ProtoWriter> initializers;
  std::vector<ProtoWriter> inputs;
  std::vector<ProtoWriter> outputs;
  std::vector<ProtoWriter> value_infos;
};
inline ProtoWriter graph(const GraphParts& parts) {
  ProtoWriter w;
  for (const auto& n : parts.nodes) w.message(1, n);
  w.string(2, parts.name);
  for (const auto& t : parts.initializers) w.message(5, t);
  for (const auto& i : parts.inputs) w.message(11, i);
  for (const auto& o : parts.outputs) w.message(12, o);
  for (const auto& v : parts.value_infos) w.message(13, v);
  return w;
}

/** ModelProto in the field order protobuf serializers use (graph before opsets). */
inline ProtoWriter model(const ProtoWriter& graph_proto,
                         const std::vector<std::pair<std::string, int64_t>>& opsets = {{"", 17}},
                         int64_t ir_version = 8, const std::vector<ProtoWriter>& functions = {}) {
  ProtoWriter w;
  w.int64(1, ir_version).string(2, "proto_writer").string(3, "1.0");
  w.message(7, graph_proto);
  for (const auto& [domain, version] : opsets) w.message(8, opset(domain, version));
  for (const auto& f : functions) w.message(25, f);
  return w;
}

}  // namespace proto
}  // namespace transmuter::testing
