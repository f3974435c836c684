#include "grammar/matcher.h"

#include <algorithm>
#include <numeric>

namespace zest::grammar {

TokenVocab::TokenVocab(std::vector<std::string> tokens, std::vector<int32_t> end_ids)
    : tokens_(std::move(tokens)), end_ids_(std::move(end_ids)) {
  std::sort(end_ids_.begin(), end_ids_.end());
  end_ids_.erase(std::unique(end_ids_.begin(), end_ids_.end()), end_ids_.end());
  end_ids_.erase(std::remove_if(end_ids_.begin(), end_ids_.end(), [&](int32_t id) { return id < 0 || id >= size(); }),
                 end_ids_.end());
  // Tokens with bytes, sorted by their bytes; the trie is built in that order (preorder falls out of it).
  std::vector<int32_t> order;
  for (int32_t i = 0; i < static_cast<int32_t>(tokens_.size()); ++i)
    if (!tokens_[i].empty() && !is_end(i)) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return tokens_[a] != tokens_[b] ? tokens_[a] < tokens_[b] : a < b;
  });
  byte_.push_back(0);
  depth_.push_back(0);
  end_.push_back(0);
  std::vector<int32_t> tok_of_node = {-1};  // per node: the first index in `order` spelled by it, or -1
  std::vector<int32_t> path = {0};            // nodes on the current path, by depth
  const std::string* prev = nullptr;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& s = tokens_[order[k]];
    size_t common = 0;
    if (prev) {
      const size_t n = std::min(prev->size(), s.size());
      while (common < n && (*prev)[common] == s[common]) ++common;
    }
    // Close the nodes below the common prefix.
    while (path.size() > common + 1) {
      end_[path.back()] = static_cast<int32_t>(byte_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      byte_.push_back(static_cast<uint8_t>(s[d]));
      depth_.push_back(static_cast<int32_t>(d + 1));
      end_.push_back(0);
      tok_of_node.push_back(-1);
      path.push_back(static_cast<int32_t>(byte_.size()) - 1);
    }
    if (tok_of_node[path.back()] < 0) tok_of_node[path.back()] = static_cast<int32_t>(k);
    max_depth_ = std::max<int32_t>(max_depth_, static_cast<int32_t>(s.size()));
    prev = &s;
  }
  while (!path.empty()) {
    end_[path.back()] = static_cast<int32_t>(byte_.size());
    path.pop_back();
  }
  // Token ranges per node: the tokens of node i are those of `order` from tok_of_node[i] while their bytes equal
  // the node's (equal strings are adjacent in `order`).
  const int32_t n = static_cast<int32_t>(byte_.size());
  tok_begin_.assign(static_cast<size_t>(n) + 1, 0);
  ids_.reserve(order.size());
  for (int32_t i = 0; i < n; ++i) {
    tok_begin_[i] = static_cast<int32_t>(ids_.size());
    if (tok_of_node[i] < 0) continue;
    const std::string& s = tokens_[order[tok_of_node[i]]];
    for (size_t k = static_cast<size_t>(tok_of_node[i]); k < order.size() && tokens_[order[k]] == s; ++k)
      ids_.push_back(order[k]);
  }
  tok_begin_[n] = static_cast<int32_t>(ids_.size());
}

bool TokenVocab::is_end(int32_t id) const { return std::binary_search(end_ids_.begin(), end_ids_.end(), id); }

Result<std::shared_ptr<CompiledGrammar>> CompiledGrammar::compile(const Grammar& g,
                                                                  std::shared_ptr<const TokenVocab> vocab) {
  ZEST_RETURN_IF_ERROR(g.check());
  std::shared_ptr<CompiledGrammar> c(new CompiledGrammar());
  c->vocab_ = std::move(vocab);
  c->sets_ = g.byte_sets();
  // Position 0: the root, then the end of everything.
  c->elems_.push_back({Elem::kRule, g.root()});
  c->elems_.push_back({Elem::kEnd, 0});
  c->alts_.resize(static_cast<size_t>(g.num_rules()));
  for (int32_t r = 0; r < g.num_rules(); ++r)
    for (const Seq& alt : g.alternatives(r)) {
      c->alts_[r].push_back(static_cast<int32_t>(c->elems_.size()));
      for (const Sym& s : alt)
        c->elems_.push_back({s.kind == Sym::kRule ? Elem::kRule : Elem::kBytes, s.id});
      c->elems_.push_back({Elem::kEnd, 0});
    }
  c->states_.emplace_back();  // kDead
  c->state_ids_[{false, {}}] = kDead;
  std::lock_guard<std::mutex> lock(c->mu_);
  const int32_t n0 = c->node(0, -1);
  ZEST_RETURN_IF_ERROR(c->settle(n0, 0).with_context("grammar"));
  const Settled& s = c->settled_[n0];
  c->start_ = c->state_of(s.accept, s.tops);
  ZEST_RETURN_IF_ERROR(c->error_);
  if (c->start_ == kDead) return invalid_argument("the grammar matches nothing");
  return c;
}

int64_t CompiledGrammar::states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(states_.size());
}

int32_t CompiledGrammar::node(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent + 1);
  auto [it, fresh] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) {
    nodes_.push_back({pos, parent});
    settled_.emplace_back();
  }
  return it->second;
}

namespace {

void merge_into(std::vector<int32_t>& dst, const std::vector<int32_t>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

void sort_unique(std::vector<int32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

// The stacks whose tops are byte sets that node n stands for (rules expanded, finished alternatives popped), and
// whether one of its expansions finishes the whole grammar.
Status CompiledGrammar::settle(int32_t n, int depth) {
  if (settled_[n].done) return Status::ok();
  if (depth > kMaxExpansion)
    return invalid_argument("a rule expands into itself without consuming a byte (left recursion) or nests too deep");
  const Node nd = nodes_[n];
  const Elem e = elems_[nd.pos];
  bool accept = false;
  std::vector<int32_t> tops;
  if (e.kind == Elem::kBytes) {
    tops.push_back(n);
  } else if (e.kind == Elem::kEnd) {
    if (nd.parent < 0) {
      accept = true;
    } else {
      ZEST_RETURN_IF_ERROR(settle(nd.parent, depth + 1));
      accept = settled_[nd.parent].accept;
      tops = settled_[nd.parent].tops;
    }
  } else {
    const int32_t cont = elems_[nd.pos + 1].kind == Elem::kEnd ? nd.parent : node(nd.pos + 1, nd.parent);
    for (int32_t start : alts_[e.id]) {
      const int32_t c = node(start, cont);
      ZEST_RETURN_IF_ERROR(settle(c, depth + 1));
      accept = accept || settled_[c].accept;
      merge_into(tops, settled_[c].tops);
    }
    sort_unique(tops);
  }
  if (static_cast<int64_t>(tops.size()) > kMaxStacks)
    return resource_exhausted("the grammar is too ambiguous here (more than " + std::to_string(kMaxStacks) +
                              " parses at once)");
  Settled& s = settled_[n];
  s.done = true;
  s.accept = accept;
  s.tops = std::move(tops);
  return Status::ok();
}

int32_t CompiledGrammar::state_of(bool accept, std::vector<int32_t> tops) {
  auto it = state_ids_.find({accept, tops});
  if (it != state_ids_.end()) return it->second;
  if (static_cast<int64_t>(states_.size()) >= kMaxStates) {
    if (error_.is_ok())
      error_ = resource_exhausted("the grammar's state space grew past " + std::to_string(kMaxStates) + " states");
    return kDead;
  }
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.emplace_back();
  states_.back().accept = accept;
  states_.back().tops = tops;
  state_ids_.emplace(std::make_pair(accept, std::move(tops)), id);
  return id;
}

int32_t CompiledGrammar::next_slow(int32_t s, uint8_t b) {
  if (s == kDead) return kDead;
  if (!states_[s].next) {
    states_[s].next.reset(new int32_t[256]);
    std::fill(states_[s].next.get(), states_[s].next.get() + 256, -1);
  }
  bool accept = false;
  std::vector<int32_t> tops;
  const std::vector<int32_t>& from = states_[s].tops;  // states_ does not grow before state_of below
  for (int32_t n : from) {
    const Node nd = nodes_[n];
    if (!sets_[elems_[nd.pos].id].test(b)) continue;
    const int32_t m = node(nd.pos + 1, nd.parent);
    if (Status st = settle(m, 0); !st.is_ok()) {
      if (error_.is_ok()) error_ = st;
      return kDead;
    }
    accept = accept || settled_[m].accept;
    merge_into(tops, settled_[m].tops);
  }
  sort_unique(tops);
  if (static_cast<int64_t>(tops.size()) > kMaxStacks) {
    if (error_.is_ok())
      error_ = resource_exhausted("the grammar is too ambiguous here (more than " + std::to_string(kMaxStacks) +
                                  " parses at once)");
    tops.clear();
    accept = false;
  }
  const int32_t to = (accept || !tops.empty()) ? state_of(accept, std::move(tops)) : kDead;
  // A state that hit a limit is not remembered: the error stays visible.
  if (error_.is_ok()) states_[s].next[b] = to;
  return to;
}

std::shared_ptr<const TokenMask> CompiledGrammar::mask(int32_t s) {
  const TokenVocab& v = *vocab_;
  if (auto hit = mask_of_.find(s); hit != mask_of_.end()) {
    masks_.splice(masks_.begin(), masks_, hit->second);
    const CachedMask& c = masks_.front();
    if (c.dense) return c.dense;
    auto m = std::make_shared<TokenMask>(static_cast<size_t>(v.mask_words()), 0u);
    for (int32_t id : c.ids) (*m)[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    return m;
  }
  auto m = std::make_shared<TokenMask>(static_cast<size_t>(v.mask_words()), 0u);
  uint32_t* bits = m->data();
  auto allow = [&](int32_t id) { bits[id >> 5] |= 1u << (id & 31); };
  if (states_[s].accept)
    for (int32_t id : v.end_ids()) allow(id);
  if (!states_[s].tops.empty()) {
    std::vector<int32_t> at(static_cast<size_t>(v.max_depth_) + 1, kDead);
    at[0] = s;
    const int32_t n = static_cast<int32_t>(v.byte_.size());
    const uint8_t* byte = v.byte_.data();
    const int32_t* depth = v.depth_.data();
    const int32_t* end = v.end_.data();
    const int32_t* tb = v.tok_begin_.data();
    const int32_t* ids = v.ids_.data();
    for (int32_t i = 1; i < n;) {
      const int32_t d = depth[i];
      const int32_t to = next(at[d - 1], byte[i]);
      if (to == kDead) {
        i = end[i];
        continue;
      }
      at[d] = to;
      for (int32_t k = tb[i]; k < tb[i + 1]; ++k) allow(ids[k]);
      ++i;
    }
  }
  std::shared_ptr<const TokenMask> out = std::move(m);
  if (!error_.is_ok()) return out;  // not kept: the walk stopped at a limit
  CachedMask c{s, nullptr, {}};
  int64_t allowed = 0;
  for (uint32_t w : *out) allowed += __builtin_popcount(w);
  if (allowed < v.mask_words()) {
    c.ids.reserve(static_cast<size_t>(allowed));
    for (size_t w = 0; w < out->size(); ++w)
      for (uint32_t bitsw = (*out)[w]; bitsw; bitsw &= bitsw - 1)
        c.ids.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(bitsw))));
  } else {
    c.dense = out;
  }
  mask_bytes_ += c.bytes();
  masks_.push_front(std::move(c));
  mask_of_[s] = masks_.begin();
  while (mask_bytes_ > kMaskCacheBytes && masks_.size() > 1) {
    mask_bytes_ -= masks_.back().bytes();
    mask_of_.erase(masks_.back().state);
    masks_.pop_back();
  }
  return out;
}

Matcher::Matcher(std::shared_ptr<CompiledGrammar> g) : g_(std::move(g)), state_(g_->start_) {}

std::shared_ptr<const TokenMask> Matcher::mask() {
  if (!g_->vocab_) {
    status_ = internal_error("the grammar was compiled without a vocabulary");
    return std::make_shared<TokenMask>();
  }
  std::lock_guard<std::mutex> lock(g_->mu_);
  if (ended_) {
    auto m = std::make_shared<TokenMask>(static_cast<size_t>(g_->vocab_->mask_words()), 0u);
    for (int32_t id : g_->vocab_->end_ids()) (*m)[id >> 5] |= 1u << (id & 31);
    return m;
  }
  auto m = g_->mask(state_);
  if (!g_->error_.is_ok() && status_.is_ok()) status_ = g_->error_;
  return m;
}

bool Matcher::accept(int32_t token) {
  const TokenVocab* v = g_->vocab_.get();
  if (!v || token < 0 || token >= v->size()) {
    status_ = invalid_argument("structured output: token " + std::to_string(token) + " is outside the vocabulary");
    return false;
  }
  if (v->is_end(token)) {
    if (ended_ || complete()) {
      ended_ = true;
      return true;
    }
    status_ = invalid_argument("structured output: the output ended before the grammar was complete");
    return false;
  }
  if (!accept_bytes(v->bytes(token))) {
    if (status_.is_ok())
      status_ = invalid_argument("structured output: token " + std::to_string(token) +
                                 " does not continue the grammar (the sampling constraints left no allowed token)");
    return false;
  }
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (ended_) return bytes.empty();
  std::lock_guard<std::mutex> lock(g_->mu_);
  int32_t s = state_;
  for (char c : bytes) {
    s = g_->next(s, static_cast<uint8_t>(c));
    if (s == CompiledGrammar::kDead) break;
  }
  if (!g_->error_.is_ok() && status_.is_ok()) status_ = g_->error_;
  if (s == CompiledGrammar::kDead) return false;
  state_ = s;
  return true;
}

bool Matcher::complete() const {
  std::lock_guard<std::mutex> lock(g_->mu_);
  return ended_ || g_->states_[state_].accept;
}

bool Matcher::must_end() const {
  std::lock_guard<std::mutex> lock(g_->mu_);
  return ended_ || (g_->states_[state_].accept && g_->states_[state_].tops.empty());
}

Result<bool> matches(const Grammar& g, std::string_view text) {
  ZEST_ASSIGN_OR_RETURN(std::shared_ptr<CompiledGrammar> c, CompiledGrammar::compile(g, nullptr));
  Matcher m(c);
  if (!m.accept_bytes(text)) {
    if (!m.status().is_ok()) return m.status();
    return false;
  }
  return m.complete();
}

std::shared_ptr<const TokenVocab> GrammarCache::vocab(const std::function<std::shared_ptr<const TokenVocab>()>& make) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!vocab_) vocab_ = make();
  return vocab_;
}

Result<std::shared_ptr<CompiledGrammar>> GrammarCache::get(const std::string& key,
                                                           const std::function<Result<Grammar>()>& make) {
  std::shared_ptr<const TokenVocab> v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!vocab_) return internal_error("the grammar cache has no vocabulary yet");
    v = vocab_;
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->first == key) {
        if (it->second->saturated()) {
          items_.erase(it);
          break;
        }
        items_.splice(items_.begin(), items_, it);
        return items_.front().second;
      }
  }
  ZEST_ASSIGN_OR_RETURN(Grammar g, make());
  ZEST_ASSIGN_OR_RETURN(std::shared_ptr<CompiledGrammar> c, CompiledGrammar::compile(g, v));
  std::lock_guard<std::mutex> lock(mu_);
  items_.emplace_front(key, c);
  while (items_.size() > capacity_) items_.pop_back();
  return c;
}

}  // namespace zest::grammar
