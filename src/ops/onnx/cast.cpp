// Cast and CastLike.
// https://onnx.ai/onnx/operators/onnx__Cast.html
//
// Float8, float4 and sub-byte integer tensors are held widened at run time
// (see to_mlx_dtype: float8/float4 as float32, int4/int2 as int8, uint4/uint2
// as uint8). A cast *to* one of them therefore yields the widened dtype
// holding exactly the values the narrow type can represent, in a Value marked
// with the narrow type; a cast *from* one of them is a plain conversion of
// already-decoded values.
#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mlx/mlx.h>

#include "kernels/cpu/elementwise.h"
#include "ops/node_context.h"
#include "ops/onnx/narrow_types.h"
#include "ops/registry.h"
#include "transmuter/dtype.h"

namespace transmuter {
namespace {

mx::array u32(uint32_t v) { return mx::array(v, mx::uint32); }

/** float8e8m0: a bare power of two 2^(e - 127), e in 0..254, 255 is NaN. The
 * sign is dropped. Rounding of the float32 exponent follows `round_mode`
 * ("up" by default: any fraction rounds away from zero), as in
 * onnx.numpy_helper.to_float8e8m0. */
mx::array round_to_e8m0(const NodeContext& ctx, const mx::array& x, bool saturate,
                        const std::string& round_mode) {
  auto s = ctx.stream();
  mx::array bits = mx::view(x, mx::uint32, s);
  mx::array exponent = mx::bitwise_and(mx::right_shift(bits, u32(23), s), u32(0xFF), s);
  mx::array normal = mx::not_equal(exponent, u32(0xFF), s);
  auto bit_set = [&](uint32_t mask) { return mx::not_equal(mx::bitwise_and(bits, u32(mask), s), u32(0), s); };
  mx::array round_up = mx::array(false);
  if (round_mode == "up") {
    round_up = bit_set(0x7FFFFF);
  } else if (round_mode == "nearest") {
    mx::array lsb = mx::greater(exponent, u32(0), s);
    mx::array tail = mx::logical_or(mx::logical_or(bit_set(0x200000), bit_set(0x1FFFFF), s), lsb, s);
    round_up = mx::logical_and(bit_set(0x400000), tail, s);
  } else if (round_mode != "down") {
    throw ctx.error("attribute 'round_mode' must be \"up\", \"down\" or \"nearest\", got \"", round_mode,
                    "\"");
  }
  round_up = mx::logical_and(round_up, normal, s);
  if (saturate) round_up = mx::logical_and(round_up, mx::not_equal(exponent, u32(0xFE), s), s);
  exponent = mx::add(exponent, mx::astype(round_up, mx::uint32, s), s);
  // e == 0 is 2^-127, a float32 subnormal (bit 22 set); e == 255 is NaN.
  mx::array value_bits =
      mx::where(mx::equal(exponent, u32(0), s), u32(0x00400000u), mx::left_shift(exponent, u32(23), s), s);
  value_bits = mx::where(mx::equal(exponent, u32(0xFF), s), u32(0x7FC00000u), value_bits, s);
  // Piecewise constant like round_to_minifloat: gradient 0 (and no vjp of mx::view).
  return mx::stop_gradient(mx::view(value_bits, mx::float32, s), s);
}

// --- strings --------------------------------------------------------------------------

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

/** Parses one string for a cast to a number: plain or scientific notation,
 * and INF/+INF/-INF/NaN in any case (Cast spec; strtod/strtof accept them).
 * float32 parses with strtof so that no double rounding occurs. */
template <typename F>
F parse_number(const NodeContext& ctx, const std::string& text) {
  std::string key = lower(text);
  if (key == "true") return 1;
  if (key == "false") return 0;
  char* end = nullptr;
  F v = std::is_same_v<F, float> ? std::strtof(text.c_str(), &end) : std::strtod(text.c_str(), &end);
  if (end == text.c_str()) throw ctx.error("cannot parse \"", text, "\" as a number");
  return v;
}

template <typename T>
mx::array host_array(const std::vector<T>& values, const mx::Shape& shape, mx::Dtype dtype,
                     mx::Dtype target) {
  mx::array flat = mx::array(values.begin(), {static_cast<int>(values.size())}, dtype);
  return mx::astype(mx::reshape(flat, shape, mx::Device::cpu), target, mx::Device::cpu);
}

mx::array strings_to_numbers(const NodeContext& ctx, const StringTensor& in, mx::Dtype target) {
  mx::Shape shape = to_shape(ctx, in.shape);
  // Integers parse as integers so that int64 values beyond 2^53 stay exact;
  // "100.5" gives 100.
  if (mx::issubdtype(target, mx::integer)) {
    std::vector<int64_t> values;
    for (const std::string& text : in.data) {
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      bool whole = ec == std::errc() && ptr == text.data() + text.size();
      values.push_back(whole ? v : static_cast<int64_t>(parse_number<double>(ctx, text)));
    }
    return host_array(values, shape, mx::int64, target);
  }
  if (target == mx::float32) {
    std::vector<float> values;
    for (const std::string& text : in.data) values.push_back(parse_number<float>(ctx, text));
    return host_array(values, shape, mx::float32, target);
  }
  std::vector<double> values;
  for (const std::string& text : in.data) values.push_back(parse_number<double>(ctx, text));
  return host_array(values, shape, mx::float64, target);
}

/** Shortest decimal digits that read back as `v` in its own type, in
 * scientific form ("4.7892547e-01"). float16 has no to_chars overload, so its
 * digits are the fewest that round-trip through float16. */
std::string shortest_scientific(double v, mx::Dtype dtype) {
  std::array<char, 64> buf{};
  char* end = buf.data();
  if (dtype == mx::float64) {
    end = std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::scientific).ptr;
  } else if (dtype == mx::float16) {
    for (int precision = 0; precision < 8; ++precision) {
      end =
          std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::scientific, precision).ptr;
      double back = std::strtod(std::string(buf.data(), end).c_str(), nullptr);
      if (static_cast<float>(static_cast<mx::float16_t>(static_cast<float>(back))) == static_cast<float>(v))
        break;
    }
  } else {
    end = std::to_chars(buf.data(), buf.data() + buf.size(), static_cast<float>(v),
                        std::chars_format::scientific)
              .ptr;
  }
  return std::string(buf.data(), end);
}

/** A float spelled the way numpy's astype(str) (the ONNX reference) spells
 * it: shortest round-trip digits, positional when 1e-4 <= |v| < cutoff and
 * scientific with a two-digit exponent otherwise, "nan", "inf". numpy's
 * cutoff is 1e16 for float64, 1e6 for float32 and 1e3 for float16. */
std::string format_float(double v, mx::Dtype dtype) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  double cutoff = dtype == mx::float64 ? 1e16 : dtype == mx::float16 ? 1e3 : 1e6;
  std::string sci = shortest_scientific(v, dtype);
  std::string sign = std::signbit(v) ? "-" : "";
  if (!sign.empty()) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int n = static_cast<int>(digits.size());
  bool positional = v == 0 || (std::abs(v) >= 1e-4 && std::abs(v) < cutoff);
  if (!positional) {
    std::string mantissa = digits.substr(0, 1) + (n > 1 ? "." + digits.substr(1) : "");
    std::string exp_text = std::to_string(std::abs(exponent));
    if (exp_text.size() < 2) exp_text = "0" + exp_text;
    return sign + mantissa + "e" + (exponent < 0 ? "-" : "+") + exp_text;
  }
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  if (exponent >= n - 1) return sign + digits + std::string(exponent - n + 1, '0') + ".0";
  return sign + digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
}

StringTensor numbers_to_strings(const NodeContext& ctx, mx::array x) {
  if (x.is_tracer()) throw ctx.error("a cast to string needs the values on the host; run this op eagerly");
  StringTensor out;
  for (int d : x.shape()) out.shape.push_back(d);
  mx::array flat = mx::flatten(x, mx::Device::cpu);
  auto read = [&](mx::Dtype as) {
    mx::array a = mx::astype(flat, as, mx::Device::cpu);
    mx::eval(a);
    return a;
  };
  if (x.dtype() == mx::bool_) {
    mx::array a = read(mx::bool_);
    for (size_t i = 0; i < a.size(); ++i) out.data.push_back(a.data<bool>()[i] ? "True" : "False");
  } else if (x.dtype() == mx::uint64) {
    mx::array a = read(mx::uint64);
    for (size_t i = 0; i < a.size(); ++i) out.data.push_back(std::to_string(a.data<uint64_t>()[i]));
  } else if (mx::issubdtype(x.dtype(), mx::integer)) {
    mx::array a = read(mx::int64);
    for (size_t i = 0; i < a.size(); ++i) out.data.push_back(std::to_string(a.data<int64_t>()[i]));
  } else {
    mx::array a = read(mx::float64);
    for (size_t i = 0; i < a.size(); ++i) out.data.push_back(format_float(a.data<double>()[i], x.dtype()));
  }
  return out;
}

// --- the cast ---------------------------------------------------------------------------

struct CastOptions {
  bool saturate = true;
  std::string round_mode = "up";
};

Value cast_value(const NodeContext& ctx, const Value& in, OnnxType to, const CastOptions& options) {
  if (to == OnnxType::kString) {
    if (in.is_strings()) return in;
    return numbers_to_strings(ctx, in.tensor());
  }
  std::optional<mx::Dtype> target = to_mlx_dtype(to);
  if (!target) throw ctx.error("cannot cast to ", onnx_type_name(to));
  if (in.is_strings()) {
    if (*target == mx::float32 && to != OnnxType::kFloat) {
      // Narrow float targets: parse, then round to the narrow format.
      return cast_value(ctx, strings_to_numbers(ctx, in.strings(), mx::float32), to, options);
    }
    return strings_to_numbers(ctx, in.strings(), *target);
  }
  const mx::array& x = in.tensor();
  auto s = ctx.stream();
  auto as_float32 = [&] { return mx::astype(x, mx::float32, s); };
  if (is_narrow_float(to)) return round_to_narrow_float(x, to, options.saturate, s);
  switch (to) {
    case OnnxType::kFloat8E8M0:
      return round_to_e8m0(ctx, as_float32(), options.saturate, options.round_mode);
    case OnnxType::kInt4:
      return wrap_to_bits(x, 4, true, s);
    case OnnxType::kUint4:
      return wrap_to_bits(x, 4, false, s);
    case OnnxType::kInt2:
      return wrap_to_bits(x, 2, true, s);
    case OnnxType::kUint2:
      return wrap_to_bits(x, 2, false, s);
    default:
      // The common conversions through the CPU kernel (mx::astype's values; a kernel keeps a compiled
      // segment eligible for direct runs: an encoder's attention mask is cast so).
      return kernels::convert(x, *target, s);
  }
}

/** Cast 1-5 names the target type with a string ("FLOAT", "INT64", ...). */
OnnxType type_from_name(const NodeContext& ctx, const std::string& name) {
  std::string key = lower(name);
  for (int t = 1; t <= static_cast<int>(OnnxType::kInt2); ++t) {
    if (key == onnx_type_name(static_cast<OnnxType>(t))) return static_cast<OnnxType>(t);
  }
  // onnx_type_name spells float32/float64 where the attribute says FLOAT/DOUBLE.
  static const std::vector<std::pair<std::string, OnnxType>> kAliases = {
      {"float", OnnxType::kFloat}, {"double", OnnxType::kDouble}, {"float16", OnnxType::kFloat16}};
  for (const auto& [alias, type] : kAliases) {
    if (key == alias) return type;
  }
  throw ctx.error("unknown type name '", name, "' in attribute 'to'");
}

/** The cast's result, marked with its ONNX element type `to` (a float8 or
 * int4 result is held widened). */
Value typed_cast(const NodeContext& ctx, const Value& in, OnnxType to, const CastOptions& options) {
  Value out = cast_value(ctx, in, to, options);
  return out.is_tensor() ? Value(out.tensor(), to) : out;
}

OpOutputs cast_v1(NodeContext& ctx) {
  if (!ctx.has_input(0)) throw ctx.error("input 0 is required but missing");
  std::string name = ctx.attr_string("to", "");
  return {typed_cast(ctx, ctx.value(0), type_from_name(ctx, name), {})};
}

CastOptions options_from(const NodeContext& ctx) {
  return {ctx.attr_int("saturate", 1) != 0, ctx.attr_string("round_mode", "up")};
}

OpOutputs cast_op(NodeContext& ctx) {
  auto to = static_cast<OnnxType>(ctx.required_int("to"));
  if (!ctx.has_input(0)) throw ctx.error("input 0 is required but missing");
  return {typed_cast(ctx, ctx.value(0), to, options_from(ctx))};
}

// CastLike takes the target type from its second input, whose Value knows its
// narrow type (float8 held as float32, int4 as int8).
OpOutputs cast_like(NodeContext& ctx) {
  const Value& like = ctx.value(1);
  if (!ctx.has_input(0) || like.is_none()) throw ctx.error("needs two inputs");
  OnnxType to = like.is_strings() ? OnnxType::kString : like.element_type();
  return {typed_cast(ctx, ctx.value(0), to, options_from(ctx))};
}

// A Cast to STRING outputs a string tensor, which cannot cross a compiled
// boundary (opset 1 spells `to` as a string, later opsets as a type number).
bool casts_to_string(const Node& node) {
  const Attribute* to = node.find_attribute("to");
  if (to == nullptr) return false;
  return to->type == AttrType::kString ? to->s == "STRING" : to->i == static_cast<int64_t>(OnnxType::kString);
}

}  // namespace

void register_cast(OpRegistry& r) {
  r.add({
      {.op_type = "Cast", .domain = kOnnx, .since = 1, .until = 5, .fn = cast_v1,
       .makes_non_tensor = casts_to_string, .sets_element_types = true},
      // 6: `to` becomes an int; 19: `saturate` for float8; 24: `round_mode`
      // for float8e8m0. Absent attributes take the defaults, so one function
      // serves all.
      {.op_type = "Cast", .domain = kOnnx, .since = 6, .until = 18, .fn = cast_op,
       .makes_non_tensor = casts_to_string, .sets_element_types = true},
      {.op_type = "Cast", .domain = kOnnx, .since = 19, .until = kOpen, .fn = cast_op,
       .makes_non_tensor = casts_to_string, .sets_element_types = true},
      {.op_type = "CastLike", .domain = kOnnx, .since = 15, .until = 18, .fn = cast_like,
       .sets_element_types = true},
      {.op_type = "CastLike", .domain = kOnnx, .since = 19, .until = kOpen, .fn = cast_like,
       .sets_element_types = true},
  });
}

}  // namespace transmuter
