// Answer scoring for `zest eval`: exact match after normalisation, ChartQA's relaxed accuracy and
// DocVQA's ANLS, each the best over a list of accepted answers. Pure functions (docs/quality.md).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zest::eval {

// Lowercase (ASCII), trim, collapse runs of whitespace to one space, then repeatedly strip trailing
// punctuation (. , ; : ! ?) and one pair of surrounding quotes (" ' ` or “ ” ‘ ’), and finally remove the
// thousands separators of numbers written with them ("1,234,567" -> "1234567"; "1,23" is left alone).
std::string normalize_answer(std::string_view s);

// The value of a normalised answer that is a plain decimal number ("-3", "4.50", "1e3", "12%": the '%' is
// dropped), else nothing.
std::optional<double> parse_number(std::string_view normalized);

// 1 when the normalised prediction equals one normalised answer, else 0.
double exact_match(std::string_view prediction, const std::vector<std::string>& answers);

// ChartQA: for an answer that parses as a number, 1 when the prediction does too and lies within 5% of it
// (|p - a| <= 0.05 |a|; a = 0 needs p = 0); for any other answer, exact match. Best over the answers.
double relaxed_accuracy(std::string_view prediction, const std::vector<std::string>& answers);

// DocVQA: per answer, NL = Levenshtein distance / the longer length (in code points, both normalised);
// the score is 1 - NL when NL < 0.5, else 0 (two empty strings score 1). Best over the answers.
double anls(std::string_view prediction, const std::vector<std::string>& answers);

// Levenshtein distance in Unicode code points (invalid UTF-8 bytes count as U+FFFD).
size_t levenshtein(std::string_view a, std::string_view b);

}  // namespace zest::eval
