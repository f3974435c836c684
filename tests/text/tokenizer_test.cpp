// Tokenizer tests: llama.cpp's Qwen2 vectors, public/derived vectors, HF tokenizers recordings,
// both loaders, round trips, the character classes of the pre-tokenizer, and streaming decode.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "text/bpe.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace zest::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kAssets = ZEST_SOURCE_DIR "/assets/tokenizer";
const std::string kData = ZEST_SOURCE_DIR "/tests/text/data";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t next = s.find(sep, pos);
    if (next == std::string::npos) {
      out.push_back(s.substr(pos));
      return out;
    }
    out.push_back(s.substr(pos, next - pos));
    pos = next + sep.size();
  }
}

// The tokenizer loaded once from assets/tokenizer/tokenizer.json.
const Tokenizer& tok() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::from_tokenizer_json(kAssets + "/tokenizer.json");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return new Tokenizer(std::move(r).value());
  }();
  return *t;
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / ("zest_text_test_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& file, const std::string& text) const {
    std::ofstream(path / file, std::ios::binary) << text;
  }
};

// tokenizer.json's BPE model, written as the vocab.json + merges.txt pair that older checkpoints ship
// (the same data in the other format: the two loaders must agree on it).
const json& bpe_model() {
  static const json* m = new json(json::parse(slurp(kAssets + "/tokenizer.json"))["model"]);
  return *m;
}

void write_vocab_merges(const TempDir& dir, bool merges = true) {
  dir.write("vocab.json", bpe_model()["vocab"].dump());
  if (!merges) return;
  std::string text = "#version: 0.2\n";
  for (const json& m : bpe_model()["merges"]) {
    text += m.is_array() ? m[0].get<std::string>() + " " + m[1].get<std::string>() : m.get<std::string>();
    text += "\n";
  }
  dir.write("merges.txt", text);
}

std::vector<std::string> corpus() {
  std::vector<std::string> lines = split(slurp(kData + "/multilingual_corpus.txt"), "\n__zest_corpus_line__\n");
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

std::string nfc_reference(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  std::string r(reinterpret_cast<const char*>(out));
  free(out);
  return r;
}

TEST(Tokenizer, LoadsQwenVocabulary) {
  // Added tokens and their special flags as listed in special_tokens.qwen3.json.
  const json specials = json::parse(slurp(kAssets + "/special_tokens.qwen3.json"));
  size_t added = 0;
  for (const char* group : {"special", "non_special", "added"}) {
    if (!specials.contains(group)) continue;
    for (auto it = specials[group].begin(); it != specials[group].end(); ++it) {
      EXPECT_EQ(tok().token_to_id(it.key()), it.value()["id"].get<int32_t>()) << it.key();
      EXPECT_EQ(tok().is_special(it.value()["id"]), it.value()["special"].get<bool>()) << it.key();
      EXPECT_EQ(tok().token_bytes(it.value()["id"]), it.key());
      ++added;
    }
  }
  EXPECT_EQ(added, 26u);
  // Regular tokens as listed in the BPE model's vocabulary.
  const json& vocab = bpe_model()["vocab"];
  EXPECT_EQ(tok().size(), static_cast<int64_t>(vocab.size() + added));
  for (const char* t : {"Ġhello", "ĠĠ", "ä¸ŃåĽ½", "!"}) EXPECT_EQ(tok().token_to_id(t), vocab[t].get<int32_t>()) << t;
  EXPECT_EQ(tok().token_bytes(vocab["Ġhello"]), " hello");
  EXPECT_EQ(tok().token_bytes(vocab["ä¸ŃåĽ½"]), "中国");
  EXPECT_FALSE(tok().is_special(0));
  EXPECT_EQ(tok().token_to_id("no such token"), -1);
  EXPECT_EQ(tok().token_bytes(-3), "");
  EXPECT_EQ(tok().token_bytes(9999999), "");
}

TEST(Tokenizer, LlamaCppQwen2Vectors) {
  std::vector<std::string> inputs = split(slurp(kData + "/ggml-vocab-qwen2.gguf.inp"), "\n__ggml_vocab_test__\n");
  std::vector<std::string> outputs = split(slurp(kData + "/ggml-vocab-qwen2.gguf.out"), "\n");
  ASSERT_EQ(inputs.back(), "");
  ASSERT_EQ(outputs.back(), "");
  inputs.pop_back();
  outputs.pop_back();
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(outputs.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int32_t> expected;
    std::istringstream ss(outputs[i]);
    for (int32_t id; ss >> id;) expected.push_back(id);
    EXPECT_EQ(tok().encode(inputs[i], /*parse_special=*/false), expected) << "input #" << i << ": " << inputs[i];
  }
}

TEST(Tokenizer, ExtraVectors) {
  const json j = json::parse(slurp(kData + "/qwen_tokenizer_vectors_extra.json"));
  ASSERT_GE(j["cases"].size(), 7u);
  for (const json& c : j["cases"]) {
    const auto ids = tok().encode(c["input"].get<std::string>(), c["parse_special"].get<bool>());
    EXPECT_EQ(ids, c["expected_ids"].get<std::vector<int32_t>>()) << c["name"];
  }
}

TEST(Tokenizer, MatchesHfTokenizersRecordings) {
  const json j = json::parse(slurp(kData + "/hf_tokenizer_cases.json"));
  ASSERT_GE(j["cases"].size(), 400u);
  int failures = 0;
  for (const json& c : j["cases"]) {
    const std::string input = c["input"];
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    const auto ids = tok().encode(input, c["parse_special"].get<bool>());
    EXPECT_EQ(ids, expected) << "input: " << json(input).dump();
    EXPECT_EQ(tok().decode(expected), c["decoded"].get<std::string>()) << "input: " << json(input).dump();
    if (ids != expected && ++failures > 10) break;
  }
}

TEST(Tokenizer, CharClassesMatchHfRegexEngine) {
  const json j = json::parse(slurp(kData + "/hf_char_classes.json"));
  int mismatches = 0;
  for (const json& run : j["runs"]) {
    const char32_t first = run[0].get<uint32_t>(), last = run[1].get<uint32_t>();
    const char expect = run[2].get<std::string>()[0];
    if (expect == 'S') continue;  // surrogates cannot occur in UTF-8 text
    for (char32_t c = first; c <= last; ++c) {
      char got = 'O';
      switch (char_class(c)) {
        case CharClass::kLetter: got = 'L'; break;
        case CharClass::kNumber: got = 'N'; break;
        case CharClass::kNewline: got = 'R'; break;
        case CharClass::kSpace:
        case CharClass::kWhite: got = 'W'; break;
        case CharClass::kOther: got = 'O'; break;
      }
      if (got != expect && ++mismatches <= 20) ADD_FAILURE() << "U+" << std::hex << uint32_t(c) << " hf=" << expect << " zest=" << got;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Tokenizer, NfcMatchesHfNormalizer) {
  // HF's NFC tables predate some combining marks that utf8proc knows; see hf_nfc_cases.json.
  const json j = json::parse(slurp(kData + "/hf_nfc_cases.json"));
  ASSERT_GE(j["cases"].size(), 1000u);
  int mismatches = 0;
  for (const json& c : j["cases"]) {
    const std::string in = c["input"];
    const std::string got = nfc(in);
    if (got != c["expected"].get<std::string>() && ++mismatches <= 20) {
      ADD_FAILURE() << "input " << json(in).dump() << " zest " << json(got).dump() << " hf " << c["expected"].dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Tokenizer, VocabMergesLoaderGivesIdenticalIds) {
  TempDir dir("vm");
  write_vocab_merges(dir);
  fs::create_symlink(kAssets + "/tokenizer_config.qwen3-4b.json", dir.path / "tokenizer_config.json");
  auto r = Tokenizer::load(dir.path.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Tokenizer& vm = *r;
  EXPECT_EQ(vm.size(), tok().size());
  const json j = json::parse(slurp(kData + "/hf_tokenizer_cases.json"));
  for (const json& c : j["cases"]) {
    const std::string input = c["input"];
    EXPECT_EQ(vm.encode(input, c["parse_special"]), tok().encode(input, c["parse_special"])) << json(input).dump();
  }
  for (int32_t id = 151643; id < 151669; ++id) EXPECT_EQ(vm.is_special(id), tok().is_special(id)) << id;
}

TEST(Tokenizer, LoadFindsTokenizerJsonThroughSymlink) {
  TempDir dir("sym");
  fs::create_symlink(kAssets + "/tokenizer.json", dir.path / "tokenizer.json");
  auto r = Tokenizer::load(dir.path.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::string text = corpus()[0];
  EXPECT_EQ(r->encode(text), tok().encode(text));
}

TEST(Tokenizer, LoadErrors) {
  {
    TempDir dir("empty");
    auto r = Tokenizer::load(dir.path.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  }
  {
    TempDir dir("badjson");
    dir.write("tokenizer.json", "{\"model\": {\"vocab\": {\"a\": 0}, ");
    auto r = Tokenizer::load(dir.path.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
    EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos) << r.status().message();
  }
  {
    TempDir dir("nomodel");
    dir.write("tokenizer.json", "{\"version\": \"1.0\"}");
    auto r = Tokenizer::load(dir.path.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  }
  {
    TempDir dir("badmerge");
    write_vocab_merges(dir, false);
    dir.write("merges.txt", "#version: 0.2\nĠ Ġ\nthis line has three\n");
    auto r = Tokenizer::load(dir.path.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
    EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().message();
  }
  {
    TempDir dir("unknownmerge");
    write_vocab_merges(dir, false);
    dir.write("merges.txt", "#version: 0.2\nĠ Ġ\nqqqqzz xxxyy\n");
    auto r = Tokenizer::load(dir.path.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  }
  {
    TempDir dir("badvocab");
    dir.write("vocab.json", "{\"a\": \"zero\"}");
    dir.write("merges.txt", "");
    auto r = Tokenizer::load(dir.path.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  }
  {
    // A vocabulary without the 256 byte-level tokens cannot encode arbitrary bytes.
    TempDir dir("nobytes");
    dir.write("vocab.json", "{\"a\": 0, \"b\": 1, \"ab\": 2}");
    dir.write("merges.txt", "a b\n");
    auto r = Tokenizer::load(dir.path.string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  }
}

TEST(Tokenizer, UnsupportedPipelineIsReported) {
  json j = json::parse(slurp(kAssets + "/tokenizer.json"));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
  TempDir dir("pipeline");
  dir.write("tokenizer.json", j.dump());
  auto r = Tokenizer::load(dir.path.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
}

TEST(Tokenizer, MergesAsPairsEqualMergesAsStrings) {
  json j = json::parse(slurp(kAssets + "/tokenizer.json"));
  for (json& m : j["model"]["merges"]) {
    if (m.is_string()) {
      const std::string s = m;
      const size_t sp = s.find(' ');
      m = json::array({s.substr(0, sp), s.substr(sp + 1)});
    } else {
      m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    }
  }
  TempDir dir("pairs");
  dir.write("tokenizer.json", j.dump());
  auto r = Tokenizer::load(dir.path.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const std::string& line : corpus()) EXPECT_EQ(r->encode(line), tok().encode(line)) << line;
}

TEST(Tokenizer, RoundTripIsNfc) {
  for (const std::string& line : corpus()) {
    EXPECT_EQ(tok().decode(tok().encode(line)), nfc_reference(line)) << line;
    EXPECT_EQ(tok().decode(tok().encode(line, false)), nfc_reference(line)) << line;
  }
}

TEST(Tokenizer, RandomBytesRoundTrip) {
  // Random valid UTF-8 strings (random code points, no special-token text) survive encode/decode.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> cp_dist(1, 0x10FFFF), len_dist(1, 40), kind(0, 3);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s;
    const uint32_t len = len_dist(rng);
    for (uint32_t k = 0; k < len; ++k) {
      uint32_t cp = kind(rng) == 0 ? cp_dist(rng) : 0x20 + cp_dist(rng) % 0x5F;
      if (cp >= 0xD800 && cp < 0xE000) cp = 'x';
      append_utf8(cp, s);
    }
    EXPECT_EQ(tok().decode(tok().encode(s, false)), nfc(s));
  }
}

TEST(Tokenizer, SpecialTokensParsing) {
  const std::string text = "<|im_start|>user\nhi<think>x</think><|im_end|>";
  const auto with = tok().encode(text, true);
  const auto without = tok().encode(text, false);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with.front(), 151644);
  EXPECT_EQ(with.back(), 151645);
  EXPECT_NE(std::find(without.begin(), without.end(), 151667), without.end());  // <think> still matches
  EXPECT_EQ(std::find(without.begin(), without.end(), 151644), without.end());
  EXPECT_EQ(tok().decode(with), text);
  EXPECT_EQ(tok().decode(without), text);
  EXPECT_EQ(tok().decode(with, /*skip_special=*/true), "user\nhi<think>x</think>");
}

TEST(Tokenizer, InvalidUtf8IsRepaired) {
  const std::string bad = "ab\xff\xc3(cd\xe2\x82";
  const auto ids = tok().encode(bad);
  EXPECT_EQ(tok().decode(ids), "ab\xEF\xBF\xBD\xEF\xBF\xBD(cd\xEF\xBF\xBD");
}

TEST(Tokenizer, DecodeRepairsPartialCharacters) {
  // A rare 4-byte character is split over several byte tokens; decoding a prefix gives U+FFFD.
  std::string ch;
  std::vector<int32_t> ids;
  for (const char* c : {"🫠", "𓀀", "𠀀", "🦙"}) {
    ids = tok().encode(c);
    ch = c;
    if (ids.size() >= 2) break;
  }
  ASSERT_GE(ids.size(), 2u);
  std::string bytes;
  for (int32_t id : ids) bytes += tok().token_bytes(id);
  EXPECT_EQ(bytes, ch);
  const std::vector<int32_t> prefix(ids.begin(), ids.end() - 1);
  EXPECT_EQ(tok().decode(prefix), "\xEF\xBF\xBD");
}

TEST(Bpe, QuadraticAndHeapMergesAgree) {
  // Words of every length up to several times kSmallWord, cut from the corpus at random places,
  // merged with the Qwen merge table by both algorithms.
  auto r = Tokenizer::from_tokenizer_json(kAssets + "/tokenizer.json");
  ASSERT_TRUE(r.ok());
  const json j = json::parse(slurp(kAssets + "/tokenizer.json"));
  MergeTable merges;
  const json& vocab = j["model"]["vocab"];
  int32_t rank = 0;
  for (const json& m : j["model"]["merges"]) {
    const std::string a = m[0], b = m[1];
    merges.insert(vocab[a].get<int32_t>(), vocab[b].get<int32_t>(), rank++, vocab[a + b].get<int32_t>());
  }
  std::string all;
  for (const std::string& line : corpus()) all += line;
  std::mt19937 rng(3);
  int differing_from_input = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t len = 2 + rng() % (3 * kSmallWord);
    const size_t start = rng() % (all.size() - len);
    std::vector<int32_t> a;
    for (char ch : all.substr(start, len)) a.push_back(tok().token_to_id(byte_level_encode(std::string(1, ch))));
    std::vector<int32_t> b = a;
    const size_t before = a.size();
    bpe_merge_small(merges, a);
    bpe_merge_heap(merges, b);
    ASSERT_EQ(a, b) << "at " << start << " len " << len;
    if (a.size() < before) ++differing_from_input;
  }
  EXPECT_GT(differing_from_input, 1000);
}

TEST(IncrementalDecoder, NeverEmitsPartialCharacters) {
  std::vector<std::string> texts = corpus();
  texts.push_back("🦙🦙 😶‍🌫️ 中文字符测试 𠀀𠀁 한국어 ✅");
  int multi_byte_splits = 0;
  for (const std::string& text : texts) {
    const auto ids = tok().encode(text);
    IncrementalDecoder dec(tok(), /*skip_special=*/false);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      EXPECT_TRUE(is_valid_utf8(piece)) << text;
      if (!is_valid_utf8(tok().token_bytes(id))) ++multi_byte_splits;
      streamed += piece;
    }
    streamed += dec.flush();
    EXPECT_EQ(streamed, tok().decode(ids)) << text;
  }
  EXPECT_GT(multi_byte_splits, 10);  // the corpus does exercise characters split across tokens
}

TEST(IncrementalDecoder, MatchesLossyDecodeOnRandomIds) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> id_dist(0, 151668);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<int32_t> ids(1 + iter % 30);
    for (auto& id : ids) id = id_dist(rng) % (iter % 2 ? 300 : 151669);  // many single-byte tokens
    IncrementalDecoder dec(tok(), /*skip_special=*/true);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      EXPECT_TRUE(is_valid_utf8(piece));
      streamed += piece;
    }
    streamed += dec.flush();
    EXPECT_EQ(streamed, tok().decode(ids, /*skip_special=*/true));
  }
}

TEST(IncrementalDecoder, HoldsBackUntilCharacterCompletes) {
  const std::string emoji = "🦙";  // F0 9F A6 99
  // Byte-level token ids of each raw byte, looked up through their token strings.
  const std::string f0 = "ð", b9f = "Ł", ba6 = "¦", b99 = "Ļ";
  const std::vector<int32_t> ids = {tok().token_to_id(f0), tok().token_to_id(b9f), tok().token_to_id(ba6),
                                    tok().token_to_id(b99)};
  for (size_t k = 0; k < ids.size(); ++k) ASSERT_EQ(tok().token_bytes(ids[k]), emoji.substr(k, 1));
  IncrementalDecoder dec(tok());
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.push(ids[2]), "");
  EXPECT_EQ(dec.push(ids[3]), emoji);
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace zest::text
