#include "text/pretokenize.h"

namespace zest::text {
namespace {

bool is_ws(CharClass c) { return c == CharClass::kNewline || c == CharClass::kSpace || c == CharClass::kWhite; }

// Case-insensitive match of one contraction letter; U+017F (long s) case-folds to 's'.
bool fold_eq(char32_t c, char lower) {
  if (c == static_cast<char32_t>(lower) || c == static_cast<char32_t>(lower - 'a' + 'A')) return true;
  return lower == 's' && c == 0x17F;
}

// Length in code points of the contraction match `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at i, or 0.
size_t match_contraction(const char32_t* cp, size_t i, size_t n) {
  if (cp[i] != '\'' || i + 1 >= n) return 0;
  const char32_t a = cp[i + 1];
  if (fold_eq(a, 's') || fold_eq(a, 't') || fold_eq(a, 'm') || fold_eq(a, 'd')) return 2;
  if (i + 2 >= n) return 0;
  const char32_t b = cp[i + 2];
  if ((fold_eq(a, 'r') && fold_eq(b, 'e')) || (fold_eq(a, 'v') && fold_eq(b, 'e')) ||
      (fold_eq(a, 'l') && fold_eq(b, 'l'))) {
    return 3;
  }
  return 0;
}

// End (exclusive, in code points) of the match that starts at i; every position matches one of
// the alternatives, so the result is always > i.
size_t match_at(const char32_t* cp, const CharClass* cls, size_t i, size_t n) {
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (const size_t k = match_contraction(cp, i, n)) return i + k;
  const CharClass c = cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t j = i;
  if (c != CharClass::kLetter && c != CharClass::kNumber && c != CharClass::kNewline && i + 1 < n &&
      cls[i + 1] == CharClass::kLetter) {
    j = i + 1;
  }
  if (cls[j] == CharClass::kLetter) {
    while (j < n && cls[j] == CharClass::kLetter) ++j;
    return j;
  }
  // \p{N}
  if (c == CharClass::kNumber) return i + 1;
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  j = i;
  if (c == CharClass::kSpace && i + 1 < n && cls[i + 1] == CharClass::kOther) j = i + 1;
  if (cls[j] == CharClass::kOther) {
    while (j < n && cls[j] == CharClass::kOther) ++j;
    while (j < n && cls[j] == CharClass::kNewline) ++j;
    return j;
  }
  // c is white space here. \s*[\r\n]+ matches up to the last newline of the white-space run.
  size_t end = i;
  size_t last_newline = n;
  while (end < n && is_ws(cls[end])) {
    if (cls[end] == CharClass::kNewline) last_newline = end;
    ++end;
  }
  if (last_newline != n) return last_newline + 1;
  // \s+(?!\S): the whole run at the end of text, else the run minus its last character.
  if (end == n) return end;
  if (end - 1 > i) return end - 1;
  // \s+
  return end;
}

}  // namespace

void split_qwen2(std::string_view text, PretokenizeScratch& scratch, std::vector<std::string_view>& pieces) {
  auto& cps = scratch.cps;
  auto& cls = scratch.cls;
  auto& offs = scratch.offs;
  cps.clear();
  cls.clear();
  offs.clear();
  for (size_t i = 0; i < text.size();) {
    int len;
    const char32_t cp = decode_utf8(text, i, len);
    cps.push_back(cp);
    cls.push_back(char_class(cp));
    offs.push_back(static_cast<uint32_t>(i));
    i += static_cast<size_t>(len);
  }
  offs.push_back(static_cast<uint32_t>(text.size()));
  const size_t n = cps.size();
  for (size_t i = 0; i < n;) {
    const size_t j = match_at(cps.data(), cls.data(), i, n);
    pieces.push_back(text.substr(offs[i], offs[j] - offs[i]));
    i = j;
  }
}

}  // namespace zest::text
