// Paged KV cache: fixed-size blocks of `block_size` token slots shared by all sequences; each sequence
// holds an ordered list of block ids (its block table). The block allocator is the same for every backend:
// blocks are reference-counted (a full block can be in several tables at once: prefix caching), and a block
// is in exactly one of three states:
//   free       on the free list, refcount 0, no content worth keeping;
//   in use     refcount >= 1 (in that many block tables);
//   cached     refcount 0 but registered under a prefix hash: its K/V stay valid and a later sequence
//              with the same prefix can take it back (match_prefix); these blocks sit in an LRU list and
//              are handed out (their hash dropped) only when the free list is empty.
// free_blocks() counts free + cached blocks (what an allocation can get), used_blocks() the blocks in use;
// the storage behind the blocks belongs to the backend that made the cache (CPU: per layer
// [num_blocks, block_size, kv_heads, head_dim] f32 for K and for V; CUDA: bf16 on the device).
#pragma once
#include <cstdint>
#include <list>
#include <string>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zest::model {

// The K/V of a sequence's first `tokens` tokens outside any cache (prefill/decode disaggregation moves it from one
// instance to another): per layer its K rows then its V rows, each row kv_heads * head_dim elements of `dtype`, in
// token order (so the two caches' block sizes need not match).
struct KvSnapshot {
  int64_t tokens = 0, layers = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::F32;
  std::shared_ptr<std::vector<uint8_t>> bytes;  // expected_bytes() of them (host snapshots)
  // A snapshot in device memory (CUDA backend): `device` owns it (freed with its last holder), `device_data` points at
  // expected_bytes() in the same layout; `bytes` is then null.
  std::shared_ptr<void> device;
  const void* device_data = nullptr;
  int64_t row_bytes() const { return kv_heads * head_dim * static_cast<int64_t>(dtype_size(dtype)); }
  int64_t expected_bytes() const { return 2 * layers * tokens * row_bytes(); }
  // Offset of token t's K (v = false) or V row of `layer`.
  int64_t offset(int64_t layer, bool v, int64_t t) const { return ((2 * layer + (v ? 1 : 0)) * tokens + t) * row_bytes(); }
};

// Backend-specific block storage of a PagedKVCache.
class KvStorage {
 public:
  virtual ~KvStorage() = default;
  // Copies tokens [0, tokens) of the sequence whose block table is `table` out (kUnsupported where the backend
  // cannot). `table` must hold them.
  // on_device: leave the copy in device memory (KvSnapshot::device) where the backend has one (CUDA), for a transfer
  // that stays on the GPU; backends without device memory copy to the host anyway.
  virtual Result<KvSnapshot> read(const std::vector<int32_t>& table, int64_t block_size, int64_t tokens,
                                  bool on_device = false) const {
    (void)table, (void)block_size, (void)tokens, (void)on_device;
    return unsupported("this backend's KV cache cannot be copied out");
  }
  // Writes a snapshot into tokens [0, snap.tokens) of `table` (reserved for them). kInvalidArgument when its layers,
  // heads, head size or dtype differ from this storage's.
  virtual Status write(const KvSnapshot& snap, const std::vector<int32_t>& table, int64_t block_size) {
    (void)snap, (void)table, (void)block_size;
    return unsupported("this backend's KV cache cannot be written from a snapshot");
  }
};

// CPU storage: per layer K and V tensors [num_blocks, block_size, kv_heads, head_dim] f32.
class CpuKvStorage : public KvStorage {
 public:
  CpuKvStorage(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim);
  // K (or V) vector of cache row `row` (= block * block_size + slot) of `layer`: kv_heads * head_dim floats.
  float* k_row(int64_t layer, int64_t row) { return k_[layer].data<float>() + row * row_elems_; }
  float* v_row(int64_t layer, int64_t row) { return v_[layer].data<float>() + row * row_elems_; }
  Result<KvSnapshot> read(const std::vector<int32_t>& table, int64_t block_size, int64_t tokens,
                          bool on_device = false) const override;
  Status write(const KvSnapshot& snap, const std::vector<int32_t>& table, int64_t block_size) override;

 private:
  int64_t kv_heads_ = 0, head_dim_ = 0;
  int64_t row_elems_ = 0;
  std::vector<Tensor> k_, v_;
};

class PagedKVCache {
 public:
  PagedKVCache() = default;
  // A cache over `storage` (made by a backend for num_blocks blocks of block_size slots).
  PagedKVCache(int64_t num_blocks, int64_t block_size, std::shared_ptr<KvStorage> storage)
      : num_blocks_(num_blocks), block_size_(block_size), storage_(std::move(storage)) {
    cpu_ = dynamic_cast<CpuKvStorage*>(storage_.get());
    init_blocks();
  }
  // A cache with CPU f32 storage.
  PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  // Blocks an allocation can get: free ones plus cached ones nobody holds.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Blocks registered under a prefix hash (held or not).
  int64_t cached_blocks() const { return static_cast<int64_t>(by_hash_.size()); }
  // Cached blocks that nobody holds (evicted first-in first-out when the free list is empty).
  int64_t evictable_blocks() const { return static_cast<int64_t>(lru_.size()); }
  int64_t ref_count(int32_t block) const { return ref_[block]; }
  // Blocks needed to hold n tokens.
  int64_t blocks_for(int64_t n) const { return (n + block_size_ - 1) / block_size_; }

  // Grows `table` so it can hold n_tokens; kResourceExhausted (table unchanged) if blocks run out. New
  // blocks come from the free list, then from the least recently released cached blocks (whose hash is
  // dropped); a block held by any table is never handed out.
  Status reserve(std::vector<int32_t>& table, int64_t n_tokens);
  // Drops the table's hold on each of its blocks and clears it. A block nobody holds any more goes back to
  // the free list, or, when it is registered under a prefix hash, to the cached LRU list (the table's last
  // block first, so a sequence's tail is evicted before its head).
  void release(std::vector<int32_t>& table);

  // Prefix caching. Appends to `table` (which must be empty) the blocks registered under hashes[0],
  // hashes[1], ..., hashes[n - 1] up to the first hash not registered, taking a hold on each; returns how many.
  int64_t match_prefix(const uint64_t* hashes, int64_t n, std::vector<int32_t>& table);
  // Registers a full, computed block held by a table under `hash`. No-op when the hash is already
  // registered (another block holds the same content) or the block already has a hash.
  void register_block(int32_t block, uint64_t hash);
  // Appends a hold on each block of `from` to `to` (a sequence that shares another's full blocks).
  void share(const std::vector<int32_t>& from, std::vector<int32_t>& to);
  // Drops every registration (cached blocks nobody holds return to the free list).
  void clear_prefix_cache();
  // Checks the allocator's invariants against every live block table: each block's refcount equals the tables
  // holding it, a free or evictable block is held by none, every block is in exactly one state, the hash index
  // and the per-block hashes agree. kInternal naming the first broken one (tests, debugging).
  Status check(const std::vector<const std::vector<int32_t>*>& tables) const;

  // The backend storage (null for a default-constructed cache).
  KvStorage* storage() const { return storage_.get(); }
  // Tokens [0, tokens) of the sequence with block table `table`, copied out (KvStorage::read).
  Result<KvSnapshot> snapshot(const std::vector<int32_t>& table, int64_t tokens, bool on_device = false) const;
  // Writes `snap` into tokens [0, snap.tokens) of `table`, which must have blocks for them (KvStorage::write).
  Status restore(const KvSnapshot& snap, const std::vector<int32_t>& table);

  // Pointer to the K (or V) vector of token `pos` in a sequence with block table `table`, layer `layer`:
  // kv_heads * head_dim floats. CPU storage only.
  float* k_at(int64_t layer, const std::vector<int32_t>& table, int64_t pos) {
    return cpu_->k_row(layer, table[pos / block_size_] * block_size_ + pos % block_size_);
  }
  float* v_at(int64_t layer, const std::vector<int32_t>& table, int64_t pos) {
    return cpu_->v_row(layer, table[pos / block_size_] * block_size_ + pos % block_size_);
  }

 private:
  int64_t num_blocks_ = 0, block_size_ = 16;
  std::shared_ptr<KvStorage> storage_;
  CpuKvStorage* cpu_ = nullptr;
  // Inline: backends construct caches (the CUDA decoder's library does not link the model library).
  void init_blocks() {
    free_.clear();
    // Hand out low block ids first.
    for (int64_t b = num_blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
    ref_.assign(num_blocks_, 0);
    hash_.assign(num_blocks_, 0);
    registered_.assign(num_blocks_, 0);
    in_lru_.assign(num_blocks_, 0);
    lru_at_.assign(num_blocks_, lru_.end());
    lru_.clear();
    by_hash_.clear();
  }
  int32_t take_block();  // from the free list, else evicts the oldest cached block; -1 when none

  std::vector<int32_t> free_;
  std::vector<int32_t> ref_;             // per block: tables holding it
  std::vector<uint64_t> hash_;           // per block: its prefix hash when registered
  std::vector<uint8_t> registered_;      // per block: 1 when registered
  std::list<int32_t> lru_;               // cached blocks nobody holds, least recently released first
  std::vector<std::list<int32_t>::iterator> lru_at_;  // per block: its place in lru_ (valid when in it)
  std::vector<uint8_t> in_lru_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace zest::model
