// UTF-8 and Unicode helpers for the tokenizer: decoding, character classes, NFC, lossy repair.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace zest::text {

// Character classes used by the Qwen2 pre-tokenizer regex.
enum class CharClass : uint8_t {
  kLetter,   // \p{L}
  kNumber,   // \p{N}
  kNewline,  // '\r' or '\n'
  kSpace,    // ' ' (U+0020)
  kWhite,    // any other Unicode White_Space character (\s)
  kOther,    // everything else
};

// Class of one code point, with the Unicode 16.0 letters/numbers that HF tokenizers (Oniguruma)
// knows and the packaged utf8proc (Unicode 15) does not yet.
CharClass char_class(char32_t cp);

// Decodes the code point starting at s[i] of a valid UTF-8 string; sets `len` to its byte length.
inline char32_t decode_utf8(std::string_view s, size_t i, int& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    len = 2;
    return (char32_t(b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
  }
  if (b0 < 0xF0) {
    len = 3;
    return (char32_t(b0 & 0x0F) << 12) | (char32_t(static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3F);
  }
  len = 4;
  return (char32_t(b0 & 0x07) << 18) | (char32_t(static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
         (char32_t(static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) |
         (static_cast<unsigned char>(s[i + 3]) & 0x3F);
}

// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(char32_t cp, std::string& out);

// What starts at byte i of a UTF-8 string: a well-formed character of `len` bytes, an ill-formed
// maximal subpart of `len` bytes (one U+FFFD when repaired), or a truncated prefix of a
// well-formed character that runs to the end of the string.
struct Utf8Step {
  enum Kind : uint8_t { kValid, kInvalid, kTruncated } kind;
  int len;
};
Utf8Step utf8_step(std::string_view s, size_t i);

// True when `s` is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

// Replaces each maximal ill-formed subpart with U+FFFD (the Unicode "substitution of maximal
// subparts" practice, as Python's errors="replace" and Rust's from_utf8_lossy do).
std::string repair_utf8(std::string_view s);

// Canonical composition (NFC) of valid UTF-8 text as HF tokenizers computes it (utf8proc, with the
// combining marks newer than HF's Unicode 9 tables left alone); text without code points at or
// above U+0300 is returned unchanged (it is already NFC).
std::string nfc(std::string_view s);

}  // namespace zest::text
