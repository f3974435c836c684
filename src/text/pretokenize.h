// The Qwen2 pre-tokenizer: splits text into the pieces that HF tokenizers' Split pre-tokenizer
// produces with the regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (leftmost-first alternation, behavior "Isolated"), implemented by hand.
#pragma once
#include <string_view>
#include <vector>

#include "text/unicode.h"

namespace zest::text {

// The exact pattern string that tokenizer.json must carry for this pre-tokenizer.
inline constexpr std::string_view kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Reusable scratch space for split_qwen2 (avoids allocations across calls).
struct PretokenizeScratch {
  std::vector<char32_t> cps;
  std::vector<CharClass> cls;
  std::vector<uint32_t> offs;  // byte offset of each code point, plus the end offset
};

// Splits valid UTF-8 `text` into pieces (views into `text`) appended to `pieces`; their
// concatenation is `text`.
void split_qwen2(std::string_view text, PretokenizeScratch& scratch, std::vector<std::string_view>& pieces);

}  // namespace zest::text
