#include "eval/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "text/unicode.h"

namespace zest::eval {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Strips one pair of matching surrounding quotes; false when there is none.
bool strip_quotes(std::string& s) {
  static const std::pair<std::string_view, std::string_view> kPairs[] = {
      {"\"", "\""}, {"'", "'"}, {"`", "`"}, {"\u201c", "\u201d"}, {"\u2018", "\u2019"}};
  for (const auto& [open, close] : kPairs) {
    if (s.size() >= open.size() + close.size() && s.starts_with(open) && ends_with(s, close)) {
      s = s.substr(open.size(), s.size() - open.size() - close.size());
      return true;
    }
  }
  return false;
}

void trim(std::string& s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  s.erase(0, std::min(s.find_first_not_of(' '), s.size()));
}

// Removes the commas of "d[dd](,ddd)+" numbers; other commas stay.
std::string drop_thousands_separators(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (!is_digit(s[i])) {
      out += s[i++];
      continue;
    }
    const bool number_start = i == 0 || s[i - 1] != ',';
    size_t j = i;
    while (j < s.size() && is_digit(s[j])) ++j;
    out.append(s, i, j - i);
    // A group is ",ddd" not followed by another digit.
    auto group_at = [&](size_t k) {
      return k + 3 < s.size() && s[k] == ',' && is_digit(s[k + 1]) && is_digit(s[k + 2]) && is_digit(s[k + 3]) &&
             (k + 4 == s.size() || !is_digit(s[k + 4]));
    };
    if (number_start && j - i <= 3 && group_at(j)) {
      for (; group_at(j); j += 4) out.append(s, j + 1, 3);
    }
    i = j;
  }
  return out;
}

std::u32string code_points(std::string_view s) {
  const std::string valid = text::repair_utf8(s);
  std::u32string out;
  for (size_t i = 0; i < valid.size();) {
    int len = 1;
    out.push_back(text::decode_utf8(valid, i, len));
    i += static_cast<size_t>(len);
  }
  return out;
}

template <typename Score>
double best_over(const std::vector<std::string>& answers, Score score) {
  double best = 0.0;
  for (const std::string& a : answers) best = std::max(best, score(a));
  return best;
}

}  // namespace

std::string normalize_answer(std::string_view in) {
  std::string s;
  bool space = false;
  for (char c : in) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = true;
      continue;
    }
    if (space && !s.empty()) s += ' ';
    space = false;
    s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (bool changed = true; changed;) {
    changed = false;
    while (!s.empty() && std::string_view(".,;:!?").find(s.back()) != std::string_view::npos) {
      s.pop_back();
      changed = true;
    }
    if (strip_quotes(s)) changed = true;
    trim(s);
  }
  return drop_thousands_separators(s);
}

std::optional<double> parse_number(std::string_view normalized) {
  std::string s(normalized);
  if (!s.empty() && s.back() == '%') s.pop_back();
  if (s.empty() || !std::any_of(s.begin(), s.end(), is_digit)) return std::nullopt;
  if (!std::all_of(s.begin(), s.end(), [](char c) { return is_digit(c) || c == '.' || c == '-' || c == '+' || c == 'e'; }))
    return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

double exact_match(std::string_view prediction, const std::vector<std::string>& answers) {
  const std::string p = normalize_answer(prediction);
  return best_over(answers, [&](const std::string& a) { return p == normalize_answer(a) ? 1.0 : 0.0; });
}

double relaxed_accuracy(std::string_view prediction, const std::vector<std::string>& answers) {
  const std::string p = normalize_answer(prediction);
  const std::optional<double> pv = parse_number(p);
  return best_over(answers, [&](const std::string& answer) {
    const std::string a = normalize_answer(answer);
    const std::optional<double> av = parse_number(a);
    if (!av) return p == a ? 1.0 : 0.0;
    if (!pv) return 0.0;
    return std::abs(*pv - *av) <= 0.05 * std::abs(*av) ? 1.0 : 0.0;
  });
}

size_t levenshtein(std::string_view a, std::string_view b) {
  const std::u32string x = code_points(a), y = code_points(b);
  std::vector<size_t> row(y.size() + 1);
  for (size_t j = 0; j <= y.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= x.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= y.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (x[i - 1] == y[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[y.size()];
}

double anls(std::string_view prediction, const std::vector<std::string>& answers) {
  const std::string p = normalize_answer(prediction);
  const size_t p_len = code_points(p).size();
  return best_over(answers, [&](const std::string& answer) {
    const std::string a = normalize_answer(answer);
    const size_t longest = std::max(p_len, code_points(a).size());
    if (longest == 0) return 1.0;
    const double nl = static_cast<double>(levenshtein(p, a)) / static_cast<double>(longest);
    return nl < 0.5 ? 1.0 - nl : 0.0;
  });
}

}  // namespace zest::eval
