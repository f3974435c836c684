// Tokenizer encoding throughput (MB/s of UTF-8 input) on a few MB of generated mixed text.
// Usage: bench_tokenizer_bench [TOKENIZER_DIR [CORPUS]]   (default dir: assets/tokenizer, run from the
// repo root; CORPUS limits the run to corpora whose name starts with it)
// Prints one line per corpus: size, tokens, and MB/s for a cold word cache (fresh tokenizer) and a
// warm one (second pass over the same text).
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/timer.h"
#include "text/tokenizer.h"

namespace {

constexpr size_t kCorpusBytes = 4 << 20;

// A random pronounceable word of 1-4 syllables.
std::string random_word(std::mt19937& rng) {
  static const char* syl[] = {"ta", "ke", "ri", "mon", "sel", "ar", "tion", "in", "der", "ous", "pre", "com",
                              "the", "and", "ing", "ex", "ly", "al", "er", "st", "qu", "ble", "ment", "o"};
  std::uniform_int_distribution<int> nsyl(1, 4), pick(0, 23);
  std::string w;
  const int n = nsyl(rng);
  for (int k = 0; k < n; ++k) w += syl[pick(rng)];
  return w;
}

// English-like prose with punctuation, numbers and line breaks. With `zipf`, words are drawn from a
// 30k-word lexicon with Zipf(1) frequencies like natural text; otherwise every word is fresh
// (nearly no repeats: the worst case for the word cache).
std::string prose(std::mt19937& rng, bool zipf) {
  std::vector<std::string> lexicon;
  std::vector<double> cdf;
  if (zipf) {
    double acc = 0;
    for (int r = 1; r <= 30000; ++r) {
      lexicon.push_back(random_word(rng));
      acc += 1.0 / r;
      cdf.push_back(acc);
    }
  }
  std::uniform_real_distribution<double> u(0.0, zipf ? cdf.back() : 1.0);
  std::uniform_int_distribution<int> p(0, 99);
  std::string out;
  while (out.size() < kCorpusBytes) {
    std::string w = zipf ? lexicon[std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()] : random_word(rng);
    if (p(rng) < 8) w[0] = static_cast<char>(w[0] - 'a' + 'A');
    out += w;
    const int r = p(rng);
    if (r < 6) out += ", ";
    else if (r < 10) out += ". ";
    else if (r < 12) out += " " + std::to_string(rng() % 100000) + " ";
    else if (r < 13) out += "\n\n";
    else out += ' ';
  }
  return out;
}

// Random CJK (common ideographs and kana) with CJK punctuation.
std::string cjk(std::mt19937& rng) {
  std::uniform_int_distribution<int> han(0x4E00, 0x9FA5), kana(0x3041, 0x30F6), p(0, 99);
  std::string out;
  const auto put = [&](char32_t c) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  };
  while (out.size() < kCorpusBytes) {
    const int r = p(rng);
    // Frequent characters dominate real text: draw most from a small range.
    put(r < 60 ? static_cast<char32_t>(0x4E00 + rng() % 600) : r < 85 ? han(rng) : kana(rng));
    if (p(rng) < 5) put(0x3002);  // 。
    if (p(rng) < 5) put(0xFF0C);  // ，
  }
  return out;
}

// Source-code-like text: identifiers, operators, indentation and newlines.
std::string code(std::mt19937& rng) {
  static const char* ids[] = {"x", "idx", "count", "buffer", "self", "value", "result", "tmp", "node", "data"};
  static const char* ops[] = {" = ", " + ", " * ", " == ", "(", ")", ", ", "[", "]", ".", " -> ", ": "};
  std::uniform_int_distribution<int> id(0, 9), op(0, 11), len(2, 9), indent(0, 3);
  std::string out;
  while (out.size() < kCorpusBytes) {
    out += std::string(static_cast<size_t>(4 * indent(rng)), ' ');
    const int n = len(rng);
    for (int k = 0; k < n; ++k) {
      out += ids[id(rng)];
      if (rng() % 5 == 0) out += std::to_string(rng() % 64);
      out += ops[op(rng)];
    }
    out += rng() % 7 == 0 ? "  # note\n" : "\n";
  }
  return out;
}

// A mix of the above plus Cyrillic, Arabic and emoji, in alternating paragraphs.
std::string mixed(std::mt19937& rng) {
  const std::string a = prose(rng, true), b = cjk(rng), c = code(rng);
  const char* extra[] = {"Съешь же ещё этих мягких французских булок. ", "مرحبا بالعالم، كيف حالك؟ ",
                         "😀🚀 👩‍👩‍👧 ✅ ", "한국어 문장입니다. "};
  std::string out;
  size_t i = 0;
  while (out.size() < kCorpusBytes) {
    const size_t chunk = 2000;
    out += a.substr(i, chunk);
    out += extra[(i / chunk) % 4];
    // Cut the CJK text on a character boundary (3-byte characters).
    out += b.substr(i / 3 * 3, chunk / 3 * 3);
    out += c.substr(i, chunk);
    i += chunk;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "assets/tokenizer";
  std::mt19937 rng(1234);
  struct Corpus {
    const char* name;
    std::string text;
  };
  std::vector<Corpus> corpora;
  corpora.push_back({"prose (zipf words)", prose(rng, true)});
  corpora.push_back({"prose (fresh words)", prose(rng, false)});
  corpora.push_back({"cjk", cjk(rng)});
  corpora.push_back({"code", code(rng)});
  corpora.push_back({"mixed", mixed(rng)});
  const std::string only = argc > 2 ? argv[2] : "";
  for (const Corpus& c : corpora) {
    if (std::string_view(c.name).substr(0, only.size()) != only) continue;
    auto tok = zest::text::Tokenizer::load(dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "bench_tokenizer_bench: %s\n", tok.status().to_string().c_str());
      return 1;
    }
    const double mb = static_cast<double>(c.text.size()) / (1024.0 * 1024.0);
    double t0 = zest::now_ms();
    const size_t n_tokens = tok->encode(c.text, false).size();
    const double cold_ms = zest::now_ms() - t0;
    t0 = zest::now_ms();
    const size_t n_again = tok->encode(c.text, false).size();
    const double warm_ms = zest::now_ms() - t0;
    if (n_again != n_tokens) {
      std::fprintf(stderr, "bench_tokenizer_bench: encoding is not deterministic\n");
      return 1;
    }
    std::printf("%-20s %6.2f MB  %9zu tokens  cold %7.2f MB/s  warm %7.2f MB/s  (%.2f Mtok/s warm)\n", c.name, mb,
                n_tokens, mb / (cold_ms / 1000.0), mb / (warm_ms / 1000.0), n_tokens / (warm_ms / 1000.0) / 1e6);
  }
  return 0;
}
