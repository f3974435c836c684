#include "text/unicode.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include <utf8proc.h>

namespace zest::text {
namespace {

struct Override {
  char32_t first, last;
  CharClass cls;
};

// Letters and numbers new in Unicode 16.0 (unassigned in utf8proc 2.8's Unicode 15 tables). HF
// tokenizers uses Oniguruma with Unicode 16 data; tests/text/data/hf_char_classes.json records its
// class of every code point and the tests check this classifier against it.
constexpr Override kUnicode16[] = {
    {0x01C89, 0x01C8A, CharClass::kLetter}, {0x0A7CB, 0x0A7CD, CharClass::kLetter},
    {0x0A7DA, 0x0A7DC, CharClass::kLetter}, {0x105C0, 0x105F3, CharClass::kLetter},
    {0x10D40, 0x10D49, CharClass::kNumber}, {0x10D4A, 0x10D65, CharClass::kLetter},
    {0x10D6F, 0x10D85, CharClass::kLetter}, {0x10EC2, 0x10EC4, CharClass::kLetter},
    {0x11380, 0x11389, CharClass::kLetter}, {0x1138B, 0x1138B, CharClass::kLetter},
    {0x1138E, 0x1138E, CharClass::kLetter}, {0x11390, 0x113B5, CharClass::kLetter},
    {0x113B7, 0x113B7, CharClass::kLetter}, {0x113D1, 0x113D1, CharClass::kLetter},
    {0x113D3, 0x113D3, CharClass::kLetter}, {0x116D0, 0x116E3, CharClass::kNumber},
    {0x11BC0, 0x11BE0, CharClass::kLetter}, {0x11BF0, 0x11BF9, CharClass::kNumber},
    {0x13460, 0x143FA, CharClass::kLetter}, {0x16100, 0x1611D, CharClass::kLetter},
    {0x16130, 0x16139, CharClass::kNumber}, {0x16D40, 0x16D6C, CharClass::kLetter},
    {0x16D70, 0x16D79, CharClass::kNumber}, {0x18CFF, 0x18CFF, CharClass::kLetter},
    {0x1CCF0, 0x1CCF9, CharClass::kNumber}, {0x1E5D0, 0x1E5ED, CharClass::kLetter},
    {0x1E5F0, 0x1E5F0, CharClass::kLetter}, {0x1E5F1, 0x1E5FA, CharClass::kNumber},
    {0x2EBF0, 0x2EE5D, CharClass::kLetter},
};

// Code points that take part in normalisation in utf8proc's Unicode 15 tables (combining class,
// composition) but are unassigned in the Unicode 9 tables of the NFC normaliser that HF tokenizers
// uses, so HF leaves them, and everything around them, as they are. Found by comparing the two
// normalisers on every code point (tools/make_tokenizer_cases.py records the probes).
constexpr std::pair<char32_t, char32_t> kHfNfcInert[] = {
    {0x007FD, 0x007FD}, {0x00898, 0x0089F}, {0x008CA, 0x008D3}, {0x009FE, 0x009FE}, {0x00C3C, 0x00C3C},
    {0x00D3B, 0x00D3C}, {0x00EBA, 0x00EBA}, {0x01715, 0x01715}, {0x01ABF, 0x01ACE}, {0x01DF6, 0x01DFA},
    {0x0A82C, 0x0A82C}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943},
    {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42},
    {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F},
    {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};

bool hf_nfc_inert(char32_t c) {
  if (c < 0x7FD) return false;
  const auto* end = std::end(kHfNfcInert);
  const auto* it = std::upper_bound(std::begin(kHfNfcInert), end, c,
                                    [](char32_t v, const std::pair<char32_t, char32_t>& r) { return v < r.first; });
  return it != std::begin(kHfNfcInert) && c <= (it - 1)->second;
}

std::string utf8proc_nfc(std::string_view s) {
  utf8proc_uint8_t* buf = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                   &buf, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);
  std::string out(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  std::free(buf);
  return out;
}

// Unicode White_Space (what \s means in Oniguruma and the Rust regex crate).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

CharClass classify_slow(char32_t c) {
  if (c == '\r' || c == '\n') return CharClass::kNewline;
  if (c == ' ') return CharClass::kSpace;
  if (is_white_space(c)) return CharClass::kWhite;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::kNumber;
    case UTF8PROC_CATEGORY_CN:
      for (const Override& o : kUnicode16) {
        if (c >= o.first && c <= o.last) return o.cls;
      }
      return CharClass::kOther;
    default:
      return CharClass::kOther;
  }
}

struct LatinTable {
  CharClass cls[0x800];
  LatinTable() {
    for (char32_t c = 0; c < 0x800; ++c) cls[c] = classify_slow(c);
  }
};

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

CharClass char_class(char32_t cp) {
  static const LatinTable table;
  if (cp < 0x800) return table.cls[cp];
  return classify_slow(cp);
}

void append_utf8(char32_t cp, std::string& out) {
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

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {Utf8Step::kValid, 1};
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Step::kInvalid, 1};
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= s.size()) return {Utf8Step::kTruncated, static_cast<int>(s.size() - i)};
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : is_cont(b);
    if (!ok) return {Utf8Step::kInvalid, k};
  }
  return {Utf8Step::kValid, need};
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step st = utf8_step(s, i);
    if (st.kind != Utf8Step::kValid) return false;
    i += st.len;
  }
  return true;
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step st = utf8_step(s, i);
    if (st.kind == Utf8Step::kValid) {
      out.append(s.substr(i, st.len));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += st.len;
  }
  return out;
}

std::string nfc(std::string_view s) {
  bool plain = true;
  for (char ch : s) {
    // Lead bytes 0xCC and above start code points >= U+0300; below that every text is NFC.
    if (static_cast<unsigned char>(ch) >= 0xCC) {
      plain = false;
      break;
    }
  }
  if (plain) return std::string(s);
  // Normalise the runs between HF-inert code points separately; those code points block every
  // reordering and composition across them, as in HF's tables.
  std::string out;
  out.reserve(s.size());
  size_t run = 0;
  for (size_t i = 0; i < s.size();) {
    int len;
    const char32_t cp = decode_utf8(s, i, len);
    if (cp >= 0x7FD && hf_nfc_inert(cp)) {
      if (i > run) out += utf8proc_nfc(s.substr(run, i - run));
      out.append(s.substr(i, static_cast<size_t>(len)));
      run = i + static_cast<size_t>(len);
    }
    i += static_cast<size_t>(len);
  }
  if (run < s.size()) out += utf8proc_nfc(s.substr(run));
  return out;
}

}  // namespace zest::text
