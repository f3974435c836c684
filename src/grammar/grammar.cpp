#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>

namespace zest::grammar {

ByteSet byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return s;
}

ByteSet byte_set(std::string_view chars) {
  ByteSet s;
  for (char c : chars) s.set(static_cast<uint8_t>(c));
  return s;
}

Seq cat(std::initializer_list<Seq> parts) {
  Seq out;
  for (const Seq& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

int32_t Grammar::add_rule(std::string name) {
  alts_.emplace_back();
  names_.push_back(std::move(name));
  return static_cast<int32_t>(alts_.size()) - 1;
}

void Grammar::add_alt(int32_t rule, Seq alt) { alts_[rule].push_back(std::move(alt)); }

int32_t Grammar::rule_of(std::string name, std::vector<Seq> alts) {
  const int32_t r = add_rule(std::move(name));
  for (Seq& a : alts) add_alt(r, std::move(a));
  return r;
}

Sym Grammar::bytes(const ByteSet& set) {
  for (size_t i = 0; i < sets_.size(); ++i)
    if (sets_[i] == set) return Sym{Sym::kBytes, static_cast<int32_t>(i)};
  sets_.push_back(set);
  return Sym{Sym::kBytes, static_cast<int32_t>(sets_.size()) - 1};
}

Seq Grammar::text(std::string_view text) {
  Seq s;
  s.reserve(text.size());
  for (char c : text) s.push_back(byte(static_cast<uint8_t>(c)));
  return s;
}

int32_t Grammar::repeat(std::string name, const Seq& item, int64_t min, int64_t max, const Seq& sep) {
  min = std::max<int64_t>(min, 0);
  const int32_t r = add_rule(name);
  if (max >= 0 && max < min) return r;  // nothing matches
  if (min == 0) add_alt(r, {});
  if (max == 0) return r;
  const int64_t first = std::max<int64_t>(min, 1);  // items written out in the first alternative
  // The tail: items after the first `first`, each after `sep`: unbounded, or up to max - first more.
  int32_t tail = -1;
  if (max < 0) {
    tail = add_rule(name + "_more");
    add_alt(tail, {});
    add_alt(tail, cat({sep, item, {ref(tail)}}));
  } else {
    for (int64_t k = 1; k <= max - first; ++k) {
      const int32_t t = add_rule(name + "_more" + std::to_string(k));
      add_alt(t, {});
      add_alt(t, tail < 0 ? cat({sep, item}) : cat({sep, item, {ref(tail)}}));
      tail = t;
    }
  }
  Seq alt = item;
  for (int64_t i = 1; i < first; ++i) alt = cat({alt, sep, item});
  if (tail >= 0) alt.push_back(ref(tail));
  add_alt(r, std::move(alt));
  return r;
}

Status Grammar::check() const {
  if (root_ < 0 || root_ >= num_rules()) return invalid_argument("grammar: no root rule");
  for (int32_t r = 0; r < num_rules(); ++r)
    for (const Seq& a : alts_[r])
      for (const Sym& s : a) {
        const int32_t n = s.kind == Sym::kRule ? num_rules() : static_cast<int32_t>(sets_.size());
        if (s.id < 0 || s.id >= n) return invalid_argument("grammar: rule '" + names_[r] + "' names a missing symbol");
      }
  return Status::ok();
}

namespace {

std::string set_text(const ByteSet& s) {
  if (s.count() == 1)
    for (int b = 0; b < 256; ++b)
      if (s.test(b)) {
        if (b >= 0x20 && b < 0x7f && b != '\'' && b != '\\') return "'" + std::string(1, static_cast<char>(b)) + "'";
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02X", b);
        return buf;
      }
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s.test(b)) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.test(e + 1)) ++e;
    char buf[16];
    if (e == b) std::snprintf(buf, sizeof buf, "%02X ", b);
    else std::snprintf(buf, sizeof buf, "%02X-%02X ", b, e);
    out += buf;
    b = e + 1;
  }
  if (out.size() > 1) out.pop_back();
  return out + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (int32_t r = 0; r < num_rules(); ++r) {
    out += names_[r] + (r == root_ ? " (root)" : "") + " ::=";
    for (size_t a = 0; a < alts_[r].size(); ++a) {
      out += a ? " |" : "";
      if (alts_[r][a].empty()) out += " ''";
      for (const Sym& s : alts_[r][a]) out += " " + (s.kind == Sym::kRule ? names_[s.id] : set_text(sets_[s.id]));
    }
    out += "\n";
  }
  return out;
}

}  // namespace zest::grammar
