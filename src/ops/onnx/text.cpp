// Operators on text: StringNormalizer, StringSplit, StringConcat, RegexFullMatch,
// TfIdfVectorizer. https://onnx.ai/onnx/operators/
//
// String tensors live on the host (StringTensor), so these ops loop there and
// their rows are eager_only: a compiled model breaks its graph around them.
// TfIdfVectorizer also takes integer token ids; it counts n-grams on the host
// as well (a hash lookup per position, no MLX formulation that pays off).
#include <algorithm>
#include <cstdint>
#include <locale>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"
#include "ops/string_tensors.h"

namespace transmuter {
namespace {

const StringTensor& string_input(const NodeContext& ctx, size_t i) {
  const Value& v = ctx.value(i);
  if (!v.is_strings()) throw ctx.error("input ", i, " must be a string tensor, got ", v.describe());
  return v.strings();
}

// --- UTF-8 case mapping ----------------------------------------------------------

/** Code points of a UTF-8 string; an invalid byte is kept as itself (U+00xx)
 * so no input is rejected or silently shortened. */
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    auto byte = static_cast<unsigned char>(s[i]);
    int extra = byte < 0x80 ? 0 : (byte >> 5) == 6 ? 1 : (byte >> 4) == 14 ? 2 : (byte >> 3) == 30 ? 3 : -1;
    if (extra < 0 || (extra > 0 && i + extra >= s.size())) {
      out.push_back(byte);
      ++i;
      continue;
    }
    char32_t cp = extra == 0 ? byte : byte & (0x3F >> extra);
    bool valid = true;
    for (int k = 1; k <= extra; ++k) {
      auto next = static_cast<unsigned char>(s[i + k]);
      if ((next >> 6) != 2) valid = false;
      cp = (cp << 6) | (next & 0x3F);
    }
    if (!valid) {
      out.push_back(byte);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

std::string encode_utf8(const std::u32string& s) {
  std::string out;
  for (char32_t cp : s) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

/** The C.UTF-8 locale's wide ctype (Unicode simple case mapping), or the
 * classic one (ASCII only) where C.UTF-8 does not exist. Never the global
 * locale: that belongs to the application. */
const std::ctype<wchar_t>& unicode_ctype() {
  static const std::locale locale = [] {
    try {
      return std::locale("C.UTF-8");
    } catch (const std::runtime_error&) {
      return std::locale::classic();
    }
  }();
  return std::use_facet<std::ctype<wchar_t>>(locale);
}

enum class CaseChange { kNone, kLower, kUpper };

std::string change_case(const std::string& s, CaseChange change) {
  if (change == CaseChange::kNone) return s;
  const auto& ctype = unicode_ctype();
  std::u32string cps = decode_utf8(s);
  for (char32_t& cp : cps) {
    auto wc = static_cast<wchar_t>(cp);
    cp = static_cast<char32_t>(change == CaseChange::kLower ? ctype.tolower(wc) : ctype.toupper(wc));
  }
  return encode_utf8(cps);
}

// --- StringNormalizer --------------------------------------------------------------

// Removes stopwords (compared case-insensitively unless is_case_sensitive),
// then changes case. Input [C] or [1, C]; when every string is removed the
// output is [1] (or [1, 1]) holding "", as the spec requires.
OpOutputs string_normalizer(NodeContext& ctx) {
  const StringTensor& x = string_input(ctx, 0);
  const bool matrix = x.shape.size() == 2;
  if (!(x.shape.size() == 1 || (matrix && x.shape[0] == 1))) {
    throw ctx.error("input must have shape [C] or [1, C], got rank ", x.shape.size());
  }
  const std::string action = ctx.attr_string("case_change_action", "NONE");
  CaseChange change = action == "LOWER" ? CaseChange::kLower : action == "UPPER" ? CaseChange::kUpper
                      : action == "NONE" ? CaseChange::kNone
                                         : throw ctx.error("case_change_action must be LOWER, UPPER or NONE, got '",
                                                           action, "'");
  const bool case_sensitive = ctx.attr_int("is_case_sensitive", 0) != 0;
  std::set<std::string> stopwords;
  for (const std::string& w : ctx.attr_strings("stopwords")) {
    stopwords.insert(case_sensitive ? w : change_case(w, CaseChange::kLower));
  }
  std::vector<std::string> kept;
  for (const std::string& s : x.data) {
    const std::string key = case_sensitive ? s : change_case(s, CaseChange::kLower);
    if (!stopwords.contains(key)) kept.push_back(change_case(s, change));
  }
  if (kept.empty()) kept.emplace_back();
  const auto count = static_cast<int64_t>(kept.size());
  std::vector<int64_t> shape = matrix ? std::vector<int64_t>{1, count} : std::vector<int64_t>{count};
  return {StringTensor{shape, std::move(kept)}};
}

// --- StringSplit ---------------------------------------------------------------------

/** Python's str.split(): runs of whitespace separate, no empty pieces. */
std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t i = 0;
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (i < s.size()) {
    while (i < s.size() && space(s[i])) ++i;
    if (i == s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(s.substr(i));  // the rest, trailing whitespace included (as Python)
      break;
    }
    size_t j = i;
    while (j < s.size() && !space(s[j])) ++j;
    parts.push_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

/** Python's str.split(delimiter, maxsplit): every occurrence separates. */
std::vector<std::string> split_on(const std::string& s, const std::string& delimiter, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    size_t at = s.find(delimiter, start);
    if (at == std::string::npos) break;
    parts.push_back(s.substr(start, at - start));
    start = at + delimiter.size();
  }
  parts.push_back(s.substr(start));
  return parts;
}

// Y: X.shape + [most pieces], padded with ""; Z: the piece count per string.
OpOutputs string_split(NodeContext& ctx) {
  const StringTensor& x = string_input(ctx, 0);
  const std::string delimiter = ctx.attr_string("delimiter", "");
  const int64_t maxsplit = ctx.has_attr("maxsplit") ? ctx.attr_int("maxsplit", -1) : -1;
  std::vector<std::vector<std::string>> pieces;
  size_t widest = 0;
  for (const std::string& s : x.data) {
    pieces.push_back(delimiter.empty() ? split_whitespace(s, maxsplit) : split_on(s, delimiter, maxsplit));
    widest = std::max(widest, pieces.back().size());
  }
  std::vector<int64_t> y_shape = x.shape;
  y_shape.push_back(static_cast<int64_t>(widest));
  checked_product(ctx, y_shape, "output element count");
  std::vector<std::string> y;
  y.reserve(pieces.size() * widest);
  std::vector<int64_t> counts;
  for (auto& p : pieces) {
    counts.push_back(static_cast<int64_t>(p.size()));
    p.resize(widest);
    for (auto& piece : p) y.push_back(std::move(piece));
  }
  mx::array z = mx::reshape(
      mx::array(counts.begin(), mx::Shape{to_int32(ctx, static_cast<int64_t>(counts.size()), "count")}, mx::int64),
      to_shape(ctx, x.shape), mx::Device::cpu);
  return {StringTensor{y_shape, std::move(y)}, z};
}

// --- StringConcat / RegexFullMatch ---------------------------------------------------

OpOutputs string_concat(NodeContext& ctx) {
  const StringTensor& a = string_input(ctx, 0);
  const StringTensor& b = string_input(ctx, 1);
  std::vector<int64_t> shape = broadcast_shapes(ctx, a.shape, b.shape);
  const int64_t count = checked_product(ctx, shape, "output element count");
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(count));
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t flat = 0; flat < count; ++flat, next_index(index, shape)) {
    out.push_back(a.data[broadcast_offset(a.shape, index)] + b.data[broadcast_offset(b.shape, index)]);
  }
  return {StringTensor{shape, std::move(out)}};
}

// ONNX names RE2 syntax; std::regex's ECMAScript grammar agrees on the common
// subset (classes, \w \d \s \b, groups, alternation, counted repeats). A pattern
// it cannot parse (RE2-only syntax such as (?P<name>...)) is an OpError.
OpOutputs regex_full_match(NodeContext& ctx) {
  const StringTensor& x = string_input(ctx, 0);
  const std::string pattern = ctx.attr_string("pattern", "");
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ctx.error("pattern '", pattern, "' is not supported: ", e.what());
  }
  std::vector<bool> matches;
  matches.reserve(x.data.size());
  for (const std::string& s : x.data) matches.push_back(std::regex_match(s, re));
  return {bool_tensor(ctx, x.shape, matches)};
}

// --- TfIdfVectorizer -------------------------------------------------------------------

using Token = std::variant<int64_t, std::string>;
using Ngram = std::vector<Token>;

struct NgramPool {
  std::map<Ngram, int64_t> output_index;  // n-gram -> output column
  int64_t width = 0;                       // max(ngram_indexes) + 1
};

// The pool lists n-grams grouped by length: ngram_counts[k] is where the
// (k+1)-grams start. Only lengths in [min_gram, max_gram] are looked up, but
// every pool entry consumes its ngram_indexes slot, in order.
NgramPool build_pool(const NodeContext& ctx, int64_t min_gram, int64_t max_gram) {
  const std::vector<int64_t> ints = ctx.attr_ints("pool_int64s");
  const std::vector<std::string> strings = ctx.attr_strings("pool_strings");
  if (!ints.empty() && !strings.empty()) throw ctx.error("pool_int64s and pool_strings are exclusive");
  const bool use_strings = !strings.empty();
  const int64_t total = use_strings ? static_cast<int64_t>(strings.size()) : static_cast<int64_t>(ints.size());
  const std::vector<int64_t> counts = ctx.attr_ints("ngram_counts");
  const std::vector<int64_t> indexes = ctx.attr_ints("ngram_indexes");
  NgramPool pool;
  for (int64_t i : indexes) {
    if (i < 0) throw ctx.error("ngram_indexes holds a negative index ", i);
    pool.width = std::max(pool.width, i + 1);
  }
  size_t ngram_id = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    const int64_t n = static_cast<int64_t>(k) + 1;
    const int64_t begin = counts[k];
    const int64_t end = k + 1 < counts.size() ? counts[k + 1] : total;
    if (begin < 0 || end < begin || end > total || (end - begin) % n != 0) {
      throw ctx.error("ngram_counts[", k, "] = ", begin, " does not split the pool into ", n, "-grams");
    }
    for (int64_t at = begin; at < end; at += n, ++ngram_id) {
      if (ngram_id >= indexes.size()) throw ctx.error("ngram_indexes has fewer entries than the pool has n-grams");
      if (n < min_gram || n > max_gram) continue;
      Ngram gram;
      for (int64_t j = at; j < at + n; ++j) {
        gram.push_back(use_strings ? Token{strings[static_cast<size_t>(j)]} : Token{ints[static_cast<size_t>(j)]});
      }
      pool.output_index[std::move(gram)] = indexes[ngram_id];
    }
  }
  return pool;
}

/** The tokens of input 0, strings or integers, as host values. */
std::vector<Token> read_tokens(const NodeContext& ctx, std::vector<int64_t>& shape) {
  const Value& v = ctx.value(0);
  std::vector<Token> tokens;
  if (v.is_strings()) {
    shape = v.strings().shape;
    for (const std::string& s : v.strings().data) tokens.emplace_back(s);
    return tokens;
  }
  const mx::array& x = ctx.input(0);
  if (x.dtype() != mx::int32 && x.dtype() != mx::int64) {
    throw ctx.error("input must be string, int32 or int64, got ", x.dtype());
  }
  shape.assign(x.shape().begin(), x.shape().end());
  for (int64_t t : ctx.host_ints(0)) tokens.emplace_back(t);
  return tokens;
}

// Counts, per row, the n-grams of the pool found in the row: for each skip
// distance d in 1..max_skip_count+1, the n-gram starting at p is
// tokens[p], tokens[p+d], ..., tokens[p+(n-1)d]. Unigrams do not depend on
// the skip, so they are counted on the first distance only.
OpOutputs tfidf_vectorizer(NodeContext& ctx) {
  const int64_t min_gram = ctx.required_int("min_gram_length");
  const int64_t max_gram = ctx.required_int("max_gram_length");
  const int64_t max_skip = ctx.required_int("max_skip_count");
  if (min_gram < 1 || max_gram < min_gram || max_skip < 0) {
    throw ctx.error("needs 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0, got ", min_gram,
                    ", ", max_gram, ", ", max_skip);
  }
  const std::string mode = ctx.attr_string("mode", "");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") throw ctx.error("mode must be TF, IDF or TFIDF, got '", mode, "'");
  const NgramPool pool = build_pool(ctx, min_gram, max_gram);
  std::vector<float> weights = ctx.attr_floats("weights");
  if (!weights.empty() && static_cast<int64_t>(weights.size()) < pool.width) {
    throw ctx.error("weights has ", weights.size(), " entries for ", pool.width, " outputs");
  }

  std::vector<int64_t> shape;
  const std::vector<Token> tokens = read_tokens(ctx, shape);
  if (shape.size() > 2) throw ctx.error("input must have rank 0, 1 or 2, got ", shape.size());
  const int64_t rows = shape.size() == 2 ? shape[0] : 1;
  const int64_t row_length = shape.empty() ? 1 : shape.back();
  std::vector<int64_t> out_shape = shape.size() == 2 ? std::vector<int64_t>{rows, pool.width}
                                                     : std::vector<int64_t>{pool.width};
  const int64_t out_count = checked_product(ctx, out_shape, "output element count");
  std::vector<float> counts(static_cast<size_t>(out_count), 0.0f);

  for (int64_t r = 0; r < rows; ++r) {
    const Token* row = tokens.data() + r * row_length;
    float* out = counts.data() + r * pool.width;
    for (int64_t distance = 1; distance <= max_skip + 1; ++distance) {
      const int64_t shortest = distance == 1 ? min_gram : std::max<int64_t>(min_gram, 2);
      for (int64_t start = 0; start < row_length; ++start) {
        Ngram gram;
        for (int64_t n = 1, at = start; n <= max_gram && at < row_length; ++n, at += distance) {
          gram.push_back(row[at]);
          if (n < shortest) continue;
          auto hit = pool.output_index.find(gram);
          if (hit != pool.output_index.end()) out[hit->second] += 1.0f;
        }
      }
      if (max_gram == 1) break;  // unigrams only: more distances add nothing
    }
  }
  for (int64_t i = 0; i < out_count; ++i) {
    float& c = counts[static_cast<size_t>(i)];
    const float w = weights.empty() ? 1.0f : weights[static_cast<size_t>(i % pool.width)];
    if (mode == "IDF") c = c > 0 ? w : 0.0f;
    if (mode == "TFIDF") c *= w;
  }
  mx::array flat(counts.begin(), mx::Shape{to_int32(ctx, out_count, "output element count")}, mx::float32);
  return {mx::reshape(flat, to_shape(ctx, out_shape), mx::Device::cpu)};
}

constexpr std::string_view kHostStrings = "string results are computed on the host";

}  // namespace

void register_text(OpRegistry& r) {
  r.add({
      {"StringNormalizer", kOnnx, 10, kOpen, string_normalizer, {}, true,
       "case mapping per code point with the C.UTF-8 locale; the locale attribute is not read", kHostStrings},
      {"StringSplit", kOnnx, 20, kOpen, string_split, {}, true, {}, kHostStrings},
      {"StringConcat", kOnnx, 20, kOpen, string_concat, {}, true, {}, kHostStrings},
      {"RegexFullMatch", kOnnx, 20, kOpen, regex_full_match, {}, true,
       "patterns in the subset of RE2 that std::regex's ECMAScript grammar shares", kHostStrings},
      {"TfIdfVectorizer", kOnnx, 9, kOpen, tfidf_vectorizer, {}, true, {},
       "n-gram counts are computed on the host"},
  });
}

}  // namespace transmuter
