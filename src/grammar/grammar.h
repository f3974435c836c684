// Structured output (guided decoding): byte-level context-free grammars (this file), JSON schemas compiled to them
// (json_schema.h), and the recognizer that turns a grammar state into the mask of tokens the sampler may pick
// (matcher.h).
//
// Why zest has its own: the grammar engines other servers use cannot be installed and linked from C++ where zest is
// built (Debian 12 packages and PyPI only). xgrammar is on PyPI as Python bindings with no C++ headers or stable
// C ABI; llguidance and outlines-core are Rust crates shipped as Python wheels; Debian 12 packages none of them, nor
// llama.cpp (whose grammar code is tied to its own vocabulary type). The subset zest needs (JSON values, a JSON-schema
// subset, fixed tool-call wrappers, choices) is small enough to keep here, on zest_core and zest_text only.
//
// A grammar is a set of rules; a rule is a list of alternatives; an alternative is a sequence of symbols, each either a
// byte set (matches one byte in the set) or a reference to a rule. Terminals are bytes, not characters: the model's
// tokens are byte strings (a token may hold part of a UTF-8 character), and the grammars spell UTF-8 out byte by byte.
// Left recursion is not allowed (the recognizer expands rules top-down); repetition is right recursion, which the
// recognizer runs without growing its stacks.
#pragma once
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace zest::grammar {

using ByteSet = std::bitset<256>;

// The bytes lo..hi (inclusive).
ByteSet byte_range(uint8_t lo, uint8_t hi);
// The bytes of `chars`.
ByteSet byte_set(std::string_view chars);

struct Sym {
  enum Kind : uint8_t { kBytes, kRule } kind = kBytes;
  int32_t id = 0;  // kBytes: index into Grammar::byte_sets(); kRule: the rule
};
using Seq = std::vector<Sym>;

// Concatenation of sequences.
Seq cat(std::initializer_list<Seq> parts);

class Grammar {
 public:
  // A new rule without alternatives (a rule that keeps none matches nothing).
  int32_t add_rule(std::string name);
  void add_alt(int32_t rule, Seq alt);
  // A rule with the given alternatives.
  int32_t rule_of(std::string name, std::vector<Seq> alts);

  Sym bytes(const ByteSet& set);  // interned
  Sym byte(uint8_t b) { return bytes(ByteSet().set(b)); }
  static Sym ref(int32_t rule) { return Sym{Sym::kRule, rule}; }
  // The bytes of `text`, one symbol each.
  Seq text(std::string_view text);

  // `item` repeated min..max times (max < 0: unbounded) with `sep` between two items, as a rule. min and max above
  // kMaxRepeat are refused by the callers (the rule count grows with the bound).
  int32_t repeat(std::string name, const Seq& item, int64_t min, int64_t max, const Seq& sep = {});
  static constexpr int64_t kMaxRepeat = 4096;

  void set_root(int32_t rule) { root_ = rule; }
  int32_t root() const { return root_; }

  int32_t num_rules() const { return static_cast<int32_t>(alts_.size()); }
  const std::vector<Seq>& alternatives(int32_t rule) const { return alts_[rule]; }
  const std::string& rule_name(int32_t rule) const { return names_[rule]; }
  const std::vector<ByteSet>& byte_sets() const { return sets_; }
  // The root is set and every referenced rule and byte set exists.
  Status check() const;
  // The grammar as text, one rule a line (tests and errors).
  std::string to_string() const;

 private:
  std::vector<std::vector<Seq>> alts_;
  std::vector<std::string> names_;
  std::vector<ByteSet> sets_;
  int32_t root_ = -1;
};

}  // namespace zest::grammar
