#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/bpe.h"
#include "text/pretokenize.h"
#include "text/unicode.h"

namespace zest::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Largest id accepted from a vocabulary file (guards against absurd allocations).
constexpr int64_t kMaxId = int64_t{1} << 24;
// Word cache entries kept before the cache is cleared.
constexpr size_t kCacheCapacity = 1 << 16;
// Pieces longer than this (bytes) are not cached.
constexpr size_t kCacheMaxPiece = 64;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

Result<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return corrupt("read error in " + path.string());
  return ss.str();
}

Result<json> read_json(const fs::path& path) {
  ZEST_ASSIGN_OR_RETURN(std::string text, read_file(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(path.string() + " is not valid JSON; re-download the tokenizer files");
  return j;
}

}  // namespace

struct Tokenizer::Impl {
  StringMap vocab;                       // regular token string (byte-level form) -> id
  StringMap added_map;                   // added token content -> id
  std::vector<std::string> id_to_token;  // token string per id ("" for holes)
  std::vector<std::string> id_to_bytes;  // raw bytes per id
  std::vector<uint8_t> special;          // 1 for special added tokens
  std::vector<AddedToken> added;
  // Indices into `added` by first byte, longest first; separate lists for raw / normalized matching.
  std::array<std::vector<uint16_t>, 256> added_raw_by_byte, added_norm_by_byte;
  bool has_raw_added = false, has_norm_added = false;
  int32_t byte_id[256] = {};
  MergeTable merges;
  bool nfc = true;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  Status finish(const std::string& source);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  // Leftmost-longest added token in text[from..]: returns its start or npos; sets index into `added`.
  size_t find_added(std::string_view text, size_t from, bool normalized, size_t& which) const;
  template <typename Fn>
  void split_added(std::string_view text, bool normalized, bool parse_special, Fn&& on_text,
                   std::vector<int32_t>& out) const;
};

// Builds the id tables, byte ids and added-token lookup after vocab/merges/added are read.
Status Tokenizer::Impl::finish(const std::string& source) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& a : added) max_id = std::max<int64_t>(max_id, a.id);
  if (max_id < 0) return corrupt(source + ": the vocabulary is empty");
  id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  id_to_bytes.assign(static_cast<size_t>(max_id + 1), std::string());
  special.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [tok, id] : vocab) {
    id_to_token[id] = tok;
    id_to_bytes[id] = byte_level_decode(tok);
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(byte_to_unicode()[b], ch);
    auto it = vocab.find(ch);
    if (it == vocab.end()) {
      return corrupt(source + ": the vocabulary lacks the byte-level token for byte " + std::to_string(b) +
                     "; this is not a byte-level BPE vocabulary");
    }
    byte_id[b] = it->second;
  }
  if (added.size() > 0xFFFF) return corrupt(source + ": too many added tokens");
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    if (a.content.empty()) return corrupt(source + ": added token " + std::to_string(a.id) + " has empty content");
    id_to_token[a.id] = a.content;
    id_to_bytes[a.id] = a.content;
    special[a.id] = a.special ? 1 : 0;
    added_map[a.content] = a.id;
    auto& lists = a.normalized ? added_norm_by_byte : added_raw_by_byte;
    lists[static_cast<unsigned char>(a.content[0])].push_back(static_cast<uint16_t>(i));
    (a.normalized ? has_norm_added : has_raw_added) = true;
  }
  for (auto* lists : {&added_raw_by_byte, &added_norm_by_byte}) {
    for (auto& v : *lists) {
      std::stable_sort(v.begin(), v.end(),
                       [&](uint16_t x, uint16_t y) { return added[x].content.size() > added[y].content.size(); });
    }
  }
  return Status::ok();
}

size_t Tokenizer::Impl::find_added(std::string_view text, size_t from, bool normalized, size_t& which) const {
  const auto& lists = normalized ? added_norm_by_byte : added_raw_by_byte;
  for (size_t p = from; p < text.size(); ++p) {
    const auto& cands = lists[static_cast<unsigned char>(text[p])];
    for (uint16_t idx : cands) {
      const std::string& c = added[idx].content;
      if (text.compare(p, c.size(), c) == 0) {
        which = idx;
        return p;
      }
    }
  }
  return std::string_view::npos;
}

template <typename Fn>
void Tokenizer::Impl::split_added(std::string_view text, bool normalized, bool parse_special, Fn&& on_text,
                                  std::vector<int32_t>& out) const {
  size_t start = 0;  // start of the pending plain-text run
  size_t from = 0;
  while (true) {
    size_t which = 0;
    const size_t p = find_added(text, from, normalized, which);
    if (p == std::string_view::npos) break;
    const AddedToken& a = added[which];
    from = p + a.content.size();
    // Without parse_special, special tokens stay plain text (HF's encode_special_tokens).
    if (a.special && !parse_special) continue;
    if (p > start) on_text(text.substr(start, p - start));
    out.push_back(a.id);
    start = from;
  }
  if (start < text.size()) on_text(text.substr(start));
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kCacheMaxPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) ids[i] = byte_id[static_cast<unsigned char>(piece[i])];
  bpe_merge(merges, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kCacheCapacity) cache.clear();
    cache.emplace(std::string(piece), std::move(ids));
  }
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  thread_local PretokenizeScratch scratch;
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  split_qwen2(text, scratch, pieces);
  for (std::string_view p : pieces) encode_piece(p, out);
}

void Tokenizer::Impl::encode_normalized(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  const std::string normal = nfc ? zest::text::nfc(text) : std::string(text);
  if (!has_norm_added) {
    encode_text(normal, out);
    return;
  }
  split_added(
      normal, /*normalized=*/true, parse_special, [&](std::string_view t) { encode_text(t, out); }, out);
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

// Reads one added-token record ({"content", "special", "normalized", "lstrip", ...}).
Status parse_added(const json& j, int64_t id, const std::string& where, AddedToken& out) {
  if (!j.is_object() || !j.contains("content") || !j["content"].is_string()) {
    return corrupt(where + ": an added token needs a string \"content\"");
  }
  if (id < 0 || id >= kMaxId) return corrupt(where + ": added token id " + std::to_string(id) + " is out of range");
  out.content = j["content"].get<std::string>();
  out.id = static_cast<int32_t>(id);
  out.special = j.value("special", false);
  out.normalized = j.contains("normalized") && j["normalized"].is_boolean() ? j["normalized"].get<bool>() : !out.special;
  for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
    if (j.contains(flag) && j[flag].is_boolean() && j[flag].get<bool>()) {
      return unsupported(where + ": added token \"" + out.content + "\" sets " + flag +
                         ", which zest's tokenizer does not implement");
    }
  }
  return Status::ok();
}

Status parse_vocab(const json& v, const std::string& where, StringMap& vocab) {
  if (!v.is_object()) return corrupt(where + ": the vocabulary must be a JSON object of token -> id");
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer()) return corrupt(where + ": the id of token \"" + it.key() + "\" is not an integer");
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= kMaxId) return corrupt(where + ": token \"" + it.key() + "\" has out-of-range id " + std::to_string(id));
    vocab.emplace(it.key(), static_cast<int32_t>(id));
  }
  return Status::ok();
}

Status add_merge(const StringMap& vocab, std::string_view a, std::string_view b, int32_t rank, const std::string& where,
                 MergeTable& merges) {
  const auto ia = vocab.find(a);
  const auto ib = vocab.find(b);
  std::string joined(a);
  joined.append(b);
  const auto im = vocab.find(joined);
  if (ia == vocab.end() || ib == vocab.end() || im == vocab.end()) {
    return corrupt(where + ": merge " + std::to_string(rank) + " (\"" + std::string(a) + "\" \"" + std::string(b) +
                   "\") uses a token missing from the vocabulary");
  }
  merges.insert(ia->second, ib->second, rank, im->second);
  return Status::ok();
}

// Parses a merge written as "a b" (exactly one space).
bool split_merge_line(std::string_view line, std::string_view& a, std::string_view& b) {
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) return false;
  a = line.substr(0, sp);
  b = line.substr(sp + 1);
  return true;
}

// Checks that normalizer/pre_tokenizer/model options are the Qwen2 ones zest implements.
Status check_pipeline(const json& j, const std::string& where, bool& nfc) {
  nfc = false;
  const json* norm = j.contains("normalizer") ? &j["normalizer"] : nullptr;
  if (norm != nullptr && !norm->is_null()) {
    if (!norm->is_object() || norm->value("type", "") != "NFC") {
      return unsupported(where + ": normalizer " + norm->dump() + " is not supported (zest implements NFC only)");
    }
    nfc = true;
  }
  const json* pre = j.contains("pre_tokenizer") ? &j["pre_tokenizer"] : nullptr;
  bool split_ok = false, bytelevel_ok = false;
  if (pre != nullptr && pre->is_object() && pre->value("type", "") == "Sequence" && pre->contains("pretokenizers") &&
      (*pre)["pretokenizers"].is_array() && (*pre)["pretokenizers"].size() == 2) {
    const json& s = (*pre)["pretokenizers"][0];
    const json& bl = (*pre)["pretokenizers"][1];
    split_ok = s.is_object() && s.value("type", "") == "Split" && s.contains("pattern") && s["pattern"].is_object() &&
               s["pattern"].value("Regex", "") == kQwen2SplitPattern && s.value("behavior", "") == "Isolated" &&
               !s.value("invert", false);
    bytelevel_ok = bl.is_object() && bl.value("type", "") == "ByteLevel" && !bl.value("add_prefix_space", false) &&
                   !bl.value("use_regex", true);
  }
  if (!split_ok || !bytelevel_ok) {
    return unsupported(where + ": pre_tokenizer " + (pre ? pre->dump().substr(0, 300) : std::string("(none)")) +
                       " is not the Qwen2 Split+ByteLevel pre-tokenizer that zest implements");
  }
  const json& m = j["model"];
  if (m.value("type", "BPE") != "BPE") return unsupported(where + ": model type " + m.value("type", "") + " is not BPE");
  const auto nonempty = [&](const char* key) { return m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty(); };
  if (nonempty("continuing_subword_prefix") || nonempty("end_of_word_suffix") ||
      (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>()) ||
      (m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>())) {
    return unsupported(where + ": BPE options (subword prefix/suffix, byte_fallback, ignore_merges) are not supported");
  }
  return Status::ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::from_tokenizer_json(const std::string& file) {
  ZEST_ASSIGN_OR_RETURN(json j, read_json(file));
  const std::string& where = file;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    return corrupt(where + ": missing the \"model\" object; this is not a HF tokenizer.json");
  }
  Tokenizer tok;
  Impl& im = *tok.impl_;
  ZEST_RETURN_IF_ERROR(check_pipeline(j, where, im.nfc));
  const json& m = j["model"];
  if (!m.contains("vocab")) return corrupt(where + ": model.vocab is missing");
  ZEST_RETURN_IF_ERROR(parse_vocab(m["vocab"], where + ": model.vocab", im.vocab));
  if (!m.contains("merges") || !m["merges"].is_array()) return corrupt(where + ": model.merges must be an array");
  const json& merges = m["merges"];
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    std::string_view a, b;
    if (e.is_string()) {
      if (!split_merge_line(e.get_ref<const std::string&>(), a, b)) {
        return corrupt(where + ": model.merges[" + std::to_string(r) + "] is not of the form \"a b\"");
      }
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get_ref<const std::string&>();
      b = e[1].get_ref<const std::string&>();
    } else {
      return corrupt(where + ": model.merges[" + std::to_string(r) + "] must be \"a b\" or [\"a\", \"b\"]");
    }
    ZEST_RETURN_IF_ERROR(add_merge(im.vocab, a, b, static_cast<int32_t>(r), where, im.merges));
  }
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) return corrupt(where + ": added_tokens must be an array");
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()) {
        return corrupt(where + ": every added_tokens entry needs an integer \"id\"");
      }
      AddedToken t;
      ZEST_RETURN_IF_ERROR(parse_added(a, a["id"].get<int64_t>(), where + ": added_tokens", t));
      im.added.push_back(std::move(t));
    }
  }
  ZEST_RETURN_IF_ERROR(im.finish(where));
  return tok;
}

namespace {

// Reads DIR/vocab.json + DIR/merges.txt (+ DIR/tokenizer_config.json added tokens) into `im`-style parts.
Status load_vocab_merges(const fs::path& dir, StringMap& vocab, MergeTable& merges, std::vector<AddedToken>& added) {
  const fs::path vocab_path = dir / "vocab.json", merges_path = dir / "merges.txt";
  ZEST_ASSIGN_OR_RETURN(json v, read_json(vocab_path));
  ZEST_RETURN_IF_ERROR(parse_vocab(v, vocab_path.string(), vocab));
  ZEST_ASSIGN_OR_RETURN(std::string text, read_file(merges_path));
  std::string_view rest(text);
  int32_t rank = 0;
  size_t line_no = 0;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with("#version")) continue;
    std::string_view a, b;
    if (!split_merge_line(line, a, b)) {
      return corrupt(merges_path.string() + ": line " + std::to_string(line_no) + " is not of the form \"a b\"");
    }
    ZEST_RETURN_IF_ERROR(add_merge(vocab, a, b, rank++, merges_path.string(), merges));
  }
  const fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    ZEST_ASSIGN_OR_RETURN(json c, read_json(config_path));
    if (c.is_object() && c.contains("added_tokens_decoder")) {
      const json& d = c["added_tokens_decoder"];
      if (!d.is_object()) return corrupt(config_path.string() + ": added_tokens_decoder must be an object");
      for (auto it = d.begin(); it != d.end(); ++it) {
        int64_t id = -1;
        try {
          size_t used = 0;
          id = std::stoll(it.key(), &used);
          if (used != it.key().size()) id = -1;
        } catch (const std::exception&) {
          id = -1;
        }
        if (id < 0) return corrupt(config_path.string() + ": added_tokens_decoder key \"" + it.key() + "\" is not an id");
        AddedToken t;
        ZEST_RETURN_IF_ERROR(parse_added(it.value(), id, config_path.string() + ": added_tokens_decoder", t));
        added.push_back(std::move(t));
      }
    }
  }
  return Status::ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  const fs::path dir(model_dir);
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return from_tokenizer_json(model_dir);
  if (fs::exists(dir / "tokenizer.json", ec)) return from_tokenizer_json((dir / "tokenizer.json").string());
  if (fs::exists(dir / "vocab.json", ec) && fs::exists(dir / "merges.txt", ec)) {
    Tokenizer tok;
    Impl& im = *tok.impl_;
    im.nfc = true;  // Qwen2 tokenizers normalise with NFC
    ZEST_RETURN_IF_ERROR(load_vocab_merges(dir, im.vocab, im.merges, im.added));
    ZEST_RETURN_IF_ERROR(im.finish(model_dir));
    return tok;
  }
  return not_found("no tokenizer in " + model_dir + ": expected tokenizer.json, or vocab.json and merges.txt");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  const Impl& im = *impl_;
  if (!im.has_raw_added) {
    im.encode_normalized(text, parse_special, out);
    return out;
  }
  im.split_added(
      text, /*normalized=*/false, parse_special,
      [&](std::string_view t) { im.encode_normalized(t, parse_special, out); }, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(impl_->id_to_bytes.size())) continue;
    if (skip_special && impl_->special[id]) continue;
    bytes += impl_->id_to_bytes[id];
  }
  return is_valid_utf8(bytes) ? bytes : repair_utf8(bytes);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(impl_->id_to_bytes.size())) return {};
  return impl_->id_to_bytes[id];
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_map.find(token); it != impl_->added_map.end()) return it->second;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return -1;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(impl_->special.size()) && impl_->special[id] != 0;
}

int64_t Tokenizer::size() const { return static_cast<int64_t>(impl_->id_to_bytes.size()); }

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Step st = utf8_step(pending_, i);
    if (st.kind == Utf8Step::kTruncated) break;
    if (st.kind == Utf8Step::kValid) {
      out.append(pending_, i, static_cast<size_t>(st.len));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += static_cast<size_t>(st.len);
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = repair_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace zest::text
