#include "text/bpe.h"

#include <algorithm>
#include <cstdint>
#include <queue>

#include "text/unicode.h"

namespace zest::text {
namespace {

struct ByteTables {
  char32_t to_unicode[256];
  int16_t from_unicode[324];  // the mapping's code points are all below 324
  ByteTables() {
    std::fill(std::begin(from_unicode), std::end(from_unicode), int16_t{-1});
    bool printable[256] = {};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      to_unicode[b] = printable[b] ? char32_t(b) : char32_t(256 + extra++);
      from_unicode[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

const char32_t* byte_to_unicode() { return tables().to_unicode; }

int unicode_to_byte(char32_t cp) { return cp < 324 ? tables().from_unicode[cp] : -1; }

std::string byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const Utf8Step st = utf8_step(token, i);
    if (st.kind != Utf8Step::kValid) return std::string(token);
    int len;
    const int b = unicode_to_byte(decode_utf8(token, i, len));
    if (b < 0) return std::string(token);
    out.push_back(static_cast<char>(b));
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char ch : bytes) append_utf8(byte_to_unicode()[static_cast<unsigned char>(ch)], out);
  return out;
}

void MergeTable::grow() {
  const size_t cap = slots_.empty() ? 1024 : slots_.size() * 2;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{kEmpty, Entry{0, 0}});
  mask_ = cap - 1;
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t j = slot(s.key);
    while (slots_[j].key != kEmpty) j = (j + 1) & mask_;
    slots_[j] = s;
  }
}

void MergeTable::insert(int32_t a, int32_t b, int32_t rank, int32_t merged_id) {
  // Keep the load factor at or below 0.7.
  if ((count_ + 1) * 10 > slots_.size() * 7) grow();
  const uint64_t key = pack(a, b);
  size_t i = slot(key);
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].key == kEmpty) {
    slots_[i].key = key;
    ++count_;
  }
  slots_[i].entry = Entry{rank, merged_id};
}

void bpe_merge_small(const MergeTable& merges, std::vector<int32_t>& ids) {
  constexpr int32_t kNone = INT32_MAX;
  int n = static_cast<int>(ids.size());
  if (n < 2) return;
  std::vector<int32_t> rank_buf, merged_buf;
  int32_t rank_small[kSmallWord], merged_small[kSmallWord];
  int32_t* rank = rank_small;
  int32_t* merged = merged_small;
  if (n > kSmallWord) {
    rank_buf.resize(static_cast<size_t>(n));
    merged_buf.resize(static_cast<size_t>(n));
    rank = rank_buf.data();
    merged = merged_buf.data();
  }
  const auto pair_at = [&](int i) {
    const MergeTable::Entry* e = merges.find(ids[i], ids[i + 1]);
    rank[i] = e ? e->rank : kNone;
    merged[i] = e ? e->merged_id : -1;
  };
  for (int i = 0; i + 1 < n; ++i) pair_at(i);
  while (n > 1) {
    int best = 0;
    for (int i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == kNone) break;
    ids[best] = merged[best];
    // Drop symbol best+1 and the pair that started at it.
    for (int i = best + 1; i + 1 < n; ++i) ids[i] = ids[i + 1];
    for (int i = best + 1; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) pair_at(best - 1);
    if (best + 1 < n) pair_at(best);
  }
  ids.resize(static_cast<size_t>(n));
}

void bpe_merge(const MergeTable& merges, std::vector<int32_t>& ids) {
  if (ids.size() <= static_cast<size_t>(kSmallWord)) {
    bpe_merge_small(merges, ids);
  } else {
    bpe_merge_heap(merges, ids);
  }
}

void bpe_merge_heap(const MergeTable& merges, std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  struct Cand {
    int32_t rank;
    int32_t pos;
    int32_t merged_id;
    // priority_queue pops the largest: lowest rank first, then leftmost position.
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Sym> sym(static_cast<size_t>(n));
  std::priority_queue<Cand> heap;
  for (int i = 0; i < n; ++i) sym[i] = Sym{ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  for (int i = 0; i + 1 < n; ++i) {
    if (const MergeTable::Entry* e = merges.find(ids[i], ids[i + 1])) heap.push({e->rank, i, e->merged_id});
  }
  while (!heap.empty()) {
    const Cand top = heap.top();
    heap.pop();
    Sym& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    const Sym right = sym[left.next];
    // Skip stale entries: the pair at this position changed since the entry was pushed.
    const MergeTable::Entry* cur = merges.find(left.id, right.id);
    if (cur == nullptr || cur->merged_id != top.merged_id) continue;
    sym[left.next].alive = false;
    left.id = top.merged_id;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeTable::Entry* e = merges.find(sym[left.prev].id, left.id)) {
        heap.push({e->rank, left.prev, e->merged_id});
      }
    }
    if (left.next >= 0) {
      if (const MergeTable::Entry* e = merges.find(left.id, sym[left.next].id)) {
        heap.push({e->rank, top.pos, e->merged_id});
      }
    }
  }
  ids.clear();
  for (int i = 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
}

}  // namespace zest::text
