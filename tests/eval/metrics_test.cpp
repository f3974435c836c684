// The answer metrics against hand-worked cases.
#include <gtest/gtest.h>

#include "eval/metrics.h"

namespace zest::eval {
namespace {

TEST(Normalize, CaseSpacePunctuationQuotes) {
  EXPECT_EQ(normalize_answer("  The  New York\tTimes. "), "the new york times");
  EXPECT_EQ(normalize_answer("\"Yes.\""), "yes");
  EXPECT_EQ(normalize_answer("'hello'!"), "hello");
  EXPECT_EQ(normalize_answer("\u201cParis\u201d"), "paris");
  EXPECT_EQ(normalize_answer("e.g."), "e.g");
  EXPECT_EQ(normalize_answer("3.5"), "3.5");
  EXPECT_EQ(normalize_answer("  ...  "), "");
}

TEST(Normalize, ThousandsSeparators) {
  EXPECT_EQ(normalize_answer("1,234,567"), "1234567");
  EXPECT_EQ(normalize_answer("12,345.5 people"), "12345.5 people");
  EXPECT_EQ(normalize_answer("1,23"), "1,23");
  EXPECT_EQ(normalize_answer("1,2345"), "1,2345");
  EXPECT_EQ(normalize_answer("1234,567"), "1234,567");
  EXPECT_EQ(normalize_answer("a, b"), "a, b");
  EXPECT_EQ(normalize_answer("3, 4"), "3, 4");
}

TEST(ParseNumber, PlainDecimalsOnly) {
  EXPECT_DOUBLE_EQ(*parse_number("-3.5"), -3.5);
  EXPECT_DOUBLE_EQ(*parse_number("12%"), 12.0);
  EXPECT_DOUBLE_EQ(*parse_number("1e3"), 1000.0);
  EXPECT_FALSE(parse_number("abc"));
  EXPECT_FALSE(parse_number("3 apples"));
  EXPECT_FALSE(parse_number(""));
  EXPECT_FALSE(parse_number("inf"));
  EXPECT_FALSE(parse_number("."));
  EXPECT_FALSE(parse_number("1-2"));
}

TEST(ExactMatch, AnyAcceptedAnswer) {
  EXPECT_EQ(exact_match("New York Times.", {"The New York Times", "New York Times"}), 1.0);
  EXPECT_EQ(exact_match("York", {"The New York Times", "New York Times"}), 0.0);
  EXPECT_EQ(exact_match("1,000", {"1000"}), 1.0);
  EXPECT_EQ(exact_match("1000.0", {"1000"}), 0.0);  // numbers compare as written
}

TEST(RelaxedAccuracy, FivePercentOnNumbers) {
  EXPECT_EQ(relaxed_accuracy("47", {"48"}), 1.0);    // |47 - 48| = 1 <= 2.4
  EXPECT_EQ(relaxed_accuracy("45", {"48"}), 0.0);    // 3 > 2.4
  EXPECT_EQ(relaxed_accuracy("-47", {"48"}), 0.0);
  EXPECT_EQ(relaxed_accuracy("0", {"0"}), 1.0);
  EXPECT_EQ(relaxed_accuracy("0.01", {"0"}), 0.0);  // an answer of 0 needs exactly 0
  EXPECT_EQ(relaxed_accuracy("1,000", {"1020"}), 1.0);  // 20 <= 51
  EXPECT_EQ(relaxed_accuracy("forty", {"40"}), 0.0);
  EXPECT_EQ(relaxed_accuracy("Yes.", {"yes"}), 1.0);  // not numbers: exact match
  EXPECT_EQ(relaxed_accuracy("no", {"yes"}), 0.0);
  EXPECT_EQ(relaxed_accuracy("12.5", {"blue", "12"}), 1.0);  // 0.5 <= 0.6
  EXPECT_EQ(relaxed_accuracy("12.7", {"blue", "12"}), 0.0);  // 0.7 > 0.6
}

TEST(Levenshtein, CodePoints) {
  EXPECT_EQ(levenshtein("kitten", "sitting"), 3u);
  EXPECT_EQ(levenshtein("", "abc"), 3u);
  EXPECT_EQ(levenshtein("caf\u00e9", "cafe"), 1u);  // one code point, two bytes
}

TEST(Anls, ThresholdAndBestAnswer) {
  EXPECT_DOUBLE_EQ(anls("New York Tmes", {"new york times"}), 13.0 / 14.0);  // distance 1 over 14
  EXPECT_DOUBLE_EQ(anls("abcd", {"abcx"}), 0.75);
  EXPECT_DOUBLE_EQ(anls("ab", {"ax"}), 0.0);  // NL = 0.5 is not below the threshold
  EXPECT_DOUBLE_EQ(anls("abc", {"xyz"}), 0.0);
  EXPECT_DOUBLE_EQ(anls("times", {"the new york times", "Times"}), 1.0);
  EXPECT_DOUBLE_EQ(anls("", {"abc"}), 0.0);
  EXPECT_DOUBLE_EQ(anls("", {"."}), 1.0);  // both empty after normalisation
  EXPECT_DOUBLE_EQ(anls("caf\u00e9", {"cafe"}), 0.75);  // 1 - 1/4 in code points (bytes would give 0.6)
}

}  // namespace
}  // namespace zest::eval
