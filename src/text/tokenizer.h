// Qwen2/Qwen3 byte-level BPE tokenizer (tokenizer.json, or vocab.json + merges.txt).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace zest::text {

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json, else DIR/vocab.json + DIR/merges.txt (+ added tokens from
  // DIR/tokenizer_config.json); a path to a tokenizer.json file is also accepted. Malformed files
  // -> kCorrupt; none present -> kNotFound; a pipeline other than Qwen2's -> kUnsupported.
  static Result<Tokenizer> load(const std::string& model_dir);
  static Result<Tokenizer> from_tokenizer_json(const std::string& file);

  // NFC-normalises and encodes (ill-formed UTF-8 is first repaired to U+FFFD). With parse_special,
  // special token strings in the text become their ids (as transformers does); otherwise they are
  // encoded as plain text. Non-special added tokens (<think>, <tool_call>, ...) always match, as in
  // HF tokenizers with encode_special_tokens / transformers with split_special_tokens=True.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Decodes ids to UTF-8 (special tokens included as their text unless skip_special).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The text of one token id as raw bytes (byte-level decoded); empty for unknown ids.
  std::string token_bytes(int32_t id) const;
  // Id of an exact token string (regular or added), or -1.
  int32_t token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  // Number of ids (regular vocabulary + added tokens).
  int64_t size() const;

  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: feed ids one by one, get the text that became complete; never emits an
// incomplete UTF-8 sequence (bytes are held back until the character is whole).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special = true) : tok_(tok), skip_special_(skip_special) {}
  // Appends one id; returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  // Returns any held-back bytes at the end of a stream (invalid sequences become U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace zest::text
