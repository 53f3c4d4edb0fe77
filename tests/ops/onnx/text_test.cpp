#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::i64;
using testing::int_attr;
using testing::ints_attr;
using testing::floats_attr;
using testing::run_op;
using testing::string_attr;
using testing::strings_attr;
using testing::to_doubles;
using testing::to_ints;

Value strings(std::vector<std::string> data, std::vector<int64_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(data.size())};
  return StringTensor{shape, std::move(data)};
}

std::vector<bool> to_bools(const mx::array& a) {
  std::vector<bool> out;
  for (double d : to_doubles(a)) out.push_back(d != 0);
  return out;
}

TEST(StringNormalizer, RemovesStopwordsIgnoringCaseThenChangesCase) {
  auto out = run_op("StringNormalizer", 10, {strings({"Monday", "tuesday", "MONDAY", "Straße"}, {1, 4})},
                    {strings_attr("stopwords", {"monday"}), string_attr("case_change_action", "UPPER")});
  EXPECT_EQ(out[0].strings().shape, (std::vector<int64_t>{1, 2}));
  // Per code point: the lowercase sharp s has no single-code-point uppercase.
  EXPECT_EQ(out[0].strings().data, (std::vector<std::string>{"TUESDAY", "STRAßE"}));
}

TEST(StringNormalizer, LowercasesNonAsciiAndKeepsOneEmptyStringWhenAllAreRemoved) {
  auto lower = run_op("StringNormalizer", 10, {strings({"ÀÉÎ"})}, {string_attr("case_change_action", "LOWER")});
  EXPECT_EQ(lower[0].strings().data, (std::vector<std::string>{"àéî"}));
  auto empty = run_op("StringNormalizer", 10, {strings({"a", "A"})},
                      {strings_attr("stopwords", {"a"}), int_attr("is_case_sensitive", 0)});
  EXPECT_EQ(empty[0].strings().shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(empty[0].strings().data, (std::vector<std::string>{""}));
}

TEST(StringNormalizer, RejectsBadShapesAndActions) {
  EXPECT_NE(error_of<OpError>([] { run_op("StringNormalizer", 10, {strings({"a", "b"}, {2, 1})}); })
                .find("[1, C]"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] {
              run_op("StringNormalizer", 10, {strings({"a"})}, {string_attr("case_change_action", "TITLE")});
            }).find("case_change_action"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] { run_op("StringNormalizer", 10, {i64({1})}); }).find("string tensor"),
            std::string::npos);
}

TEST(StringSplit, PadsToTheMostPiecesAndCountsThem) {
  auto out = run_op("StringSplit", 20, {strings({"a,b,,c", "d", ""}, {3})}, {string_attr("delimiter", ",")}, 2);
  EXPECT_EQ(out[0].strings().shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(out[0].strings().data,
            (std::vector<std::string>{"a", "b", "", "c", "d", "", "", "", "", "", "", ""}));
  EXPECT_EQ(to_ints(out[1].tensor()), (std::vector<int64_t>{4, 1, 1}));
}

TEST(StringSplit, WhitespaceRunsWithoutDelimiterAndMaxsplit) {
  auto out = run_op("StringSplit", 20, {strings({"  one two   three "})}, {int_attr("maxsplit", 1)}, 2);
  EXPECT_EQ(out[0].strings().data, (std::vector<std::string>{"one", "two   three "}));
  EXPECT_EQ(to_ints(out[1].tensor()), (std::vector<int64_t>{2}));
}

TEST(StringConcat, BroadcastsLikeNumpy) {
  auto out = run_op("StringConcat", 20, {strings({"a", "b"}, {2, 1}), strings({"x", "y", "z"}, {3})});
  EXPECT_EQ(out[0].strings().shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(out[0].strings().data, (std::vector<std::string>{"ax", "ay", "az", "bx", "by", "bz"}));
  EXPECT_NE(error_of<OpError>([] { run_op("StringConcat", 20, {strings({"a", "b"}), strings({"x", "y", "z"})}); })
                .find("broadcast"),
            std::string::npos);
}

TEST(RegexFullMatch, MatchesWholeStringsAndRejectsUnparsablePatterns) {
  auto out = run_op("RegexFullMatch", 20, {strings({"abc123", "abc", "abc123!"})},
                    {string_attr("pattern", "[a-z]+\\d+")});
  EXPECT_EQ(to_bools(out[0].tensor()), (std::vector<bool>{true, false, false}));
  EXPECT_NE(error_of<OpError>([] {
              run_op("RegexFullMatch", 20, {strings({"a"})}, {string_attr("pattern", "(unclosed")});
            }).find("pattern"),
            std::string::npos);
}

std::vector<Attribute> tfidf_attrs(const std::string& mode, int64_t min_gram, int64_t max_gram, int64_t skip) {
  // Pool: unigrams {2, 3}, bigrams {(2, 3), (3, 4)}; output columns 0..3.
  return {string_attr("mode", mode), int_attr("min_gram_length", min_gram), int_attr("max_gram_length", max_gram),
          int_attr("max_skip_count", skip), ints_attr("ngram_counts", {0, 2}),
          ints_attr("ngram_indexes", {0, 1, 2, 3}), ints_attr("pool_int64s", {2, 3, 2, 3, 3, 4})};
}

TEST(TfIdfVectorizer, CountsUnigramsAndSkipBigramsPerRow) {
  // Row 0: 2 3 4 -> unigrams 2, 3; bigrams (2,3), (3,4); with skip 1 also (2,4) which is not pooled.
  // Row 1: 2 9 3 -> unigrams 2, 3; bigram (2,3) only with one skip.
  mx::array x = i64({2, 3, 4, 2, 9, 3}, {2, 3});
  auto no_skip = run_op("TfIdfVectorizer", 9, {x}, tfidf_attrs("TF", 1, 2, 0));
  EXPECT_EQ(to_doubles(no_skip[0].tensor()), (std::vector<double>{1, 1, 1, 1, 1, 1, 0, 0}));
  auto skip = run_op("TfIdfVectorizer", 9, {x}, tfidf_attrs("TF", 1, 2, 1));
  EXPECT_EQ(to_doubles(skip[0].tensor()), (std::vector<double>{1, 1, 1, 1, 1, 1, 1, 0}));
  auto bigrams = run_op("TfIdfVectorizer", 9, {x}, tfidf_attrs("TF", 2, 2, 1));
  EXPECT_EQ(to_doubles(bigrams[0].tensor()), (std::vector<double>{0, 0, 1, 1, 0, 0, 1, 0}));
}

TEST(TfIdfVectorizer, WeightsAndBadPools) {
  auto attrs = tfidf_attrs("TFIDF", 1, 1, 0);
  attrs.push_back(floats_attr("weights", {0.5f, 2.f, 1.f, 1.f}));
  auto out = run_op("TfIdfVectorizer", 9, {i64({2, 2, 3})}, attrs);
  EXPECT_EQ(to_doubles(out[0].tensor()), (std::vector<double>{1, 2, 0, 0}));
  auto bad = tfidf_attrs("TF", 1, 2, 0);
  bad[4] = ints_attr("ngram_counts", {0, 3});  // 3 unigrams leave 3 items for bigrams
  EXPECT_NE(error_of<OpError>([&] { run_op("TfIdfVectorizer", 9, {i64({2})}, bad); }).find("ngram_counts"),
            std::string::npos);
  EXPECT_NE(error_of<OpError>([] { run_op("TfIdfVectorizer", 9, {i64({2})}, tfidf_attrs("BM25", 1, 1, 0)); })
                .find("mode"),
            std::string::npos);
}

}  // namespace
}  // namespace transmuter
