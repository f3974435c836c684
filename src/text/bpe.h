// Byte-level BPE core: the GPT-2 byte<->unicode mapping and the rank-ordered merge of one word.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zest::text {

// The GPT-2 bytes_to_unicode table: the code point that stands for each byte in token strings.
const char32_t* byte_to_unicode();

// The byte a code point stands for in token strings, or -1 when it stands for none.
int unicode_to_byte(char32_t cp);

// Token string (byte-level characters) -> raw bytes; tokens holding a character outside the
// mapping decode to their own UTF-8 bytes, as HF's ByteLevel decoder does.
std::string byte_level_decode(std::string_view token);

// Raw bytes -> token string (each byte as its byte-level character, UTF-8 encoded).
std::string byte_level_encode(std::string_view bytes);

// Merge ranks keyed by the ids of the two parts: an open-addressing hash table.
class MergeTable {
 public:
  struct Entry {
    int32_t rank;
    int32_t merged_id;
  };
  // Sets the merge (a, b) -> merged_id with `rank`; a later insert of the same pair overwrites.
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged_id);
  // The merge of (a, b), or nullptr.
  const Entry* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].entry;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  void grow();

  struct Slot {
    uint64_t key;
    Entry entry;
  };
  std::vector<Slot> slots_;  // key and value side by side: one cache miss per probe
  size_t mask_ = 0;
  size_t count_ = 0;
};

// Words of up to this many symbols use the quadratic merge loop (no heap, no allocation).
inline constexpr int kSmallWord = 48;

// Applies the merges to the symbol ids of one word exactly as HF tokenizers' BPE does (lowest
// rank first, leftmost among equal ranks); `ids` holds the initial symbols and receives the result.
void bpe_merge(const MergeTable& merges, std::vector<int32_t>& ids);

// The two algorithms bpe_merge picks from, exposed so tests can check they agree.
// Quadratic: rescans the adjacent pairs for the lowest rank after each merge. It equals the heap
// variant because a merged id fixes the merged span, so no stale heap entry ever looks current.
void bpe_merge_small(const MergeTable& merges, std::vector<int32_t>& ids);
// HF's algorithm: a priority queue of (rank, position) over a linked list of symbols.
void bpe_merge_heap(const MergeTable& merges, std::vector<int32_t>& ids);

}  // namespace zest::text
