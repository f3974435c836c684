// The recognizer of a grammar (grammar.h) and the per-step token masks of guided decoding.
//
// State: a set of parse stacks (a pushdown recognizer run breadth-first over the grammar's ambiguity). A stack is a
// chain of positions in the rules' alternatives, top first; every top is a byte set (rules are expanded top-down as
// soon as they are reached), and a position whose alternative ends right after it is not pushed (tail calls: right
// recursion runs in constant stack depth). Stacks are interned nodes (position, parent), so equal stacks are equal
// ids, and a set of stacks is interned too: a state is one integer, and the transition (state, byte) -> state is
// computed once and then read from a 256-entry table.
//
// Masks: the vocabulary's byte strings sit in a trie laid out in preorder (each node's subtree is a contiguous range),
// and a mask is one walk over it that follows the transitions byte by byte from the current state, skipping the
// whole subtree below a byte that kills every stack (prefix sharing: a byte common to many tokens is looked at
// once). A token is allowed when its last byte leaves a live state; the end tokens (EOS) are allowed where the
// grammar may end, and only they where it must. The masks of the states asked for are kept, least recently used
// first out, up to kMaskCacheBytes (8 MiB) a grammar: a state recurs (inside a JSON string, every character leads back to the
// same one; every request with the same schema meets the same states), and a walk over a 151k-token vocabulary costs
// up to ~2 ms where most tokens are allowed. A mask with few allowed tokens is kept as their ids.
//
// A CompiledGrammar may serve several requests at once (GrammarCache shares it between requests with the same
// grammar): its tables sit behind a mutex, and each request walks it with a Matcher of its own.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"

namespace zest::grammar {

// A model's vocabulary as byte strings.
class TokenVocab {
 public:
  // tokens[i]: the bytes of token i (empty: a grammar never allows it: special tokens, ids without text);
  // end_ids: the tokens that end the output (EOS), allowed where the grammar is complete. The masks cover
  // tokens.size() ids.
  TokenVocab(std::vector<std::string> tokens, std::vector<int32_t> end_ids);
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t mask_words() const { return (size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
  bool is_end(int32_t id) const;
  const std::vector<int32_t>& end_ids() const { return end_ids_; }

  // The trie in preorder: node 0 is the root (the empty string); node i > 0 is reached by byte_[i] from the node at
  // depth_[i] - 1 above it, its subtree is [i, end_[i]), and the tokens spelled by exactly its path are
  // ids_[tok_begin_[i] .. tok_begin_[i + 1]).
  std::vector<uint8_t> byte_;
  std::vector<int32_t> depth_, end_, tok_begin_, ids_;
  int32_t max_depth_ = 0;

 private:
  std::vector<std::string> tokens_;
  std::vector<int32_t> end_ids_;  // sorted
};

using TokenMask = std::vector<uint32_t>;  // bit t % 32 of word t / 32: token t is allowed

class CompiledGrammar {
 public:
  // The recognizer of `g` over `vocab` (null: byte strings only, no masks). kInvalidArgument when the grammar is
  // malformed, left-recursive at its start, or matches nothing.
  static Result<std::shared_ptr<CompiledGrammar>> compile(const Grammar& g, std::shared_ptr<const TokenVocab> vocab);
  const TokenVocab* vocab() const { return vocab_.get(); }
  // States interned so far (a grammar shared by many requests is replaced when it has grown past kSaturated).
  int64_t states() const;
  bool saturated() const { return states() > kSaturated; }

  static constexpr int32_t kDead = 0;
  static constexpr int64_t kMaxStacks = 4096;    // stacks in one state
  static constexpr int64_t kMaxStates = 1 << 16;
  static constexpr int64_t kSaturated = 1 << 15;
  static constexpr int kMaxExpansion = 2000;     // nested rule expansions from one position (left recursion)
  static constexpr size_t kMaskCacheBytes = size_t{8} << 20;

 private:
  friend class Matcher;
  struct Elem {
    enum Kind : uint8_t { kBytes, kRule, kEnd } kind;
    int32_t id;
  };
  struct Node {
    int32_t pos, parent;
  };
  struct Settled {
    bool done = false, accept = false;
    std::vector<int32_t> tops;
  };
  struct State {
    bool accept = false;
    std::vector<int32_t> tops;
    std::unique_ptr<int32_t[]> next;  // [256] lazily; -1 = not computed yet
  };

  CompiledGrammar() = default;
  // All under mu_.
  int32_t node(int32_t pos, int32_t parent);
  Status settle(int32_t n, int depth);
  int32_t state_of(bool accept, std::vector<int32_t> tops);
  int32_t next(int32_t s, uint8_t b) {
    const int32_t* t = states_[s].next.get();
    if (t && t[b] >= 0) return t[b];
    return next_slow(s, b);
  }
  int32_t next_slow(int32_t s, uint8_t b);
  std::shared_ptr<const TokenMask> mask(int32_t s);

  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<Elem> elems_;
  std::vector<std::vector<int32_t>> alts_;  // per rule: the positions its alternatives start at
  std::vector<ByteSet> sets_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<Settled> settled_;
  std::vector<State> states_;
  std::map<std::pair<bool, std::vector<int32_t>>, int32_t> state_ids_;
  int32_t start_ = kDead;
  Status error_;  // the first limit hit (sticky: every later transition is dead)
  struct CachedMask {
    int32_t state;
    std::shared_ptr<const TokenMask> dense;  // or, when it is smaller,
    std::vector<int32_t> ids;                // the allowed ids
    size_t bytes() const { return dense ? dense->size() * 4 : ids.size() * 4; }
  };
  std::list<CachedMask> masks_;  // most recent first
  std::unordered_map<int32_t, std::list<CachedMask>::iterator> mask_of_;
  size_t mask_bytes_ = 0;
  mutable std::mutex mu_;
};

// One request's walk through a grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> g);
  // Why the last accept failed, or a limit of the grammar's tables; ok otherwise.
  const Status& status() const { return status_; }
  // The tokens allowed next (size: the vocabulary's mask_words()).
  std::shared_ptr<const TokenMask> mask();
  // Advances by one token (an end token: only where the grammar may end; the match is then over). False, with
  // status() saying why, when the grammar does not allow it; the state is then unchanged.
  bool accept(int32_t token);
  // Advances by raw bytes (tests, prefixes); false when they leave the grammar.
  bool accept_bytes(std::string_view bytes);
  bool complete() const;   // the grammar may end here
  bool must_end() const;   // only an end token may follow
  bool ended() const { return ended_; }
  const CompiledGrammar& grammar() const { return *g_; }

 private:
  std::shared_ptr<CompiledGrammar> g_;
  int32_t state_;
  bool ended_ = false;
  Status status_;
};

// Whether the grammar matches `text` as a whole (tests).
Result<bool> matches(const Grammar& g, std::string_view text);

// Compiled grammars by key (the request's constraint), shared while requests use them, and the vocabulary they are
// compiled over, made once. Thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 32) : capacity_(capacity) {}
  std::shared_ptr<const TokenVocab> vocab(const std::function<std::shared_ptr<const TokenVocab>()>& make);
  // The grammar compiled under `key`, else `make()`'s, compiled and kept (a saturated one is replaced).
  Result<std::shared_ptr<CompiledGrammar>> get(const std::string& key, const std::function<Result<Grammar>()>& make);

 private:
  size_t capacity_;
  std::mutex mu_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::list<std::pair<std::string, std::shared_ptr<CompiledGrammar>>> items_;  // most recent first
};

}  // namespace zest::grammar
