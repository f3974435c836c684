#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace zest::model {

CpuKvStorage::CpuKvStorage(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                           int64_t head_dim)
    : kv_heads_(kv_heads), head_dim_(head_dim), row_elems_(kv_heads * head_dim) {
  for (int64_t l = 0; l < num_layers; ++l) {
    k_.push_back(Tensor::empty({num_blocks, block_size, kv_heads, head_dim}));
    v_.push_back(Tensor::empty({num_blocks, block_size, kv_heads, head_dim}));
  }
}

Result<KvSnapshot> CpuKvStorage::read(const std::vector<int32_t>& table, int64_t block_size, int64_t tokens,
                                      bool /*on_device: the CPU has none*/) const {
  if (tokens < 0 || static_cast<int64_t>(table.size()) * block_size < tokens)
    return invalid_argument("KV snapshot of " + std::to_string(tokens) + " tokens from a table of " +
                            std::to_string(table.size()) + " blocks");
  KvSnapshot s;
  s.tokens = tokens;
  s.layers = static_cast<int64_t>(k_.size());
  s.kv_heads = kv_heads_;
  s.head_dim = head_dim_;
  s.dtype = DType::F32;
  s.bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(s.expected_bytes()));
  const int64_t rb = s.row_bytes();
  for (int64_t l = 0; l < s.layers; ++l)
    for (int v = 0; v < 2; ++v) {
      const float* base = (v ? v_ : k_)[l].data<float>();
      // A block's rows are contiguous: one copy per block.
      for (int64_t t = 0; t < tokens; t += block_size) {
        const int64_t n = std::min(block_size, tokens - t);
        std::memcpy(s.bytes->data() + s.offset(l, v, t), base + table[t / block_size] * block_size * row_elems_,
                    static_cast<size_t>(n * rb));
      }
    }
  return s;
}

Status CpuKvStorage::write(const KvSnapshot& snap, const std::vector<int32_t>& table, int64_t block_size) {
  if (snap.layers != static_cast<int64_t>(k_.size()) || snap.kv_heads != kv_heads_ || snap.head_dim != head_dim_ ||
      snap.dtype != DType::F32)
    return invalid_argument("the KV snapshot (" + std::to_string(snap.layers) + " layers, " +
                            std::to_string(snap.kv_heads) + " kv heads of " + std::to_string(snap.head_dim) + ", " +
                            dtype_name(snap.dtype) + ") does not fit this cache (" + std::to_string(k_.size()) +
                            " layers, " + std::to_string(kv_heads_) + " kv heads of " + std::to_string(head_dim_) +
                            ", f32)");
  if (snap.device_data != nullptr) return invalid_argument("a KV snapshot in device memory cannot enter a CPU cache");
  if (!snap.bytes || static_cast<int64_t>(snap.bytes->size()) != snap.expected_bytes())
    return invalid_argument("the KV snapshot holds " + std::to_string(snap.bytes ? snap.bytes->size() : 0) +
                            " bytes, not " + std::to_string(snap.expected_bytes()));
  if (static_cast<int64_t>(table.size()) * block_size < snap.tokens)
    return invalid_argument("the block table cannot hold the KV snapshot's " + std::to_string(snap.tokens) + " tokens");
  const int64_t rb = snap.row_bytes();
  for (int64_t l = 0; l < snap.layers; ++l)
    for (int v = 0; v < 2; ++v) {
      float* base = (v ? v_ : k_)[l].data<float>();
      for (int64_t t = 0; t < snap.tokens; t += block_size) {
        const int64_t n = std::min(block_size, snap.tokens - t);
        std::memcpy(base + table[t / block_size] * block_size * row_elems_, snap.bytes->data() + snap.offset(l, v, t),
                    static_cast<size_t>(n * rb));
      }
    }
  return Status::ok();
}

Result<KvSnapshot> PagedKVCache::snapshot(const std::vector<int32_t>& table, int64_t tokens, bool on_device) const {
  if (!storage_) return internal_error("the KV cache has no storage");
  return storage_->read(table, block_size_, tokens, on_device);
}

Status PagedKVCache::restore(const KvSnapshot& snap, const std::vector<int32_t>& table) {
  if (!storage_) return internal_error("the KV cache has no storage");
  return storage_->write(snap, table, block_size_);
}

PagedKVCache::PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                           int64_t head_dim)
    : PagedKVCache(num_blocks, block_size,
                   std::make_shared<CpuKvStorage>(num_layers, num_blocks, block_size, kv_heads, head_dim)) {}

int32_t PagedKVCache::take_block() {
  if (!free_.empty()) {
    const int32_t b = free_.back();
    free_.pop_back();
    return b;
  }
  if (lru_.empty()) return -1;
  const int32_t b = lru_.front();
  lru_.pop_front();
  in_lru_[b] = 0;
  by_hash_.erase(hash_[b]);
  registered_[b] = 0;
  return b;
}

Status PagedKVCache::reserve(std::vector<int32_t>& table, int64_t n_tokens) {
  const int64_t need = blocks_for(n_tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return Status::ok();
  if (need > free_blocks())
    return resource_exhausted("KV cache full: need " + std::to_string(need) + " more blocks, " +
                              std::to_string(free_blocks()) + " free");
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = take_block();
    ref_[b] = 1;
    table.push_back(b);
  }
  return Status::ok();
}

void PagedKVCache::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int32_t b = *it;
    if (--ref_[b] > 0) continue;
    if (registered_[b]) {
      lru_at_[b] = lru_.insert(lru_.end(), b);
      in_lru_[b] = 1;
    } else {
      free_.push_back(b);
    }
  }
  table.clear();
}

int64_t PagedKVCache::match_prefix(const uint64_t* hashes, int64_t count, std::vector<int32_t>& table) {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) {
    auto f = by_hash_.find(hashes[i]);
    if (f == by_hash_.end()) break;
    const int32_t b = f->second;
    if (in_lru_[b]) {
      lru_.erase(lru_at_[b]);
      in_lru_[b] = 0;
    }
    ++ref_[b];
    table.push_back(b);
    ++n;
  }
  return n;
}

void PagedKVCache::register_block(int32_t block, uint64_t hash) {
  if (registered_[block] || by_hash_.count(hash)) return;
  registered_[block] = 1;
  hash_[block] = hash;
  by_hash_.emplace(hash, block);
}

void PagedKVCache::share(const std::vector<int32_t>& from, std::vector<int32_t>& to) {
  for (int32_t b : from) {
    if (in_lru_[b]) {
      lru_.erase(lru_at_[b]);
      in_lru_[b] = 0;
    }
    ++ref_[b];
    to.push_back(b);
  }
}

void PagedKVCache::clear_prefix_cache() {
  for (int32_t b : lru_) {
    in_lru_[b] = 0;
    free_.push_back(b);
  }
  lru_.clear();
  for (auto& [h, b] : by_hash_) registered_[b] = 0;
  by_hash_.clear();
}

Status PagedKVCache::check(const std::vector<const std::vector<int32_t>*>& tables) const {
  std::vector<int64_t> held(num_blocks_, 0), on_free(num_blocks_, 0);
  for (const auto* t : tables)
    for (int32_t b : *t) {
      if (b < 0 || b >= num_blocks_) return internal_error("block id out of range in a table");
      ++held[b];
    }
  for (int32_t b : free_) ++on_free[b];
  int64_t in_lru = 0;
  for (int32_t b : lru_) {
    if (!in_lru_[b] || !registered_[b]) return internal_error("block " + std::to_string(b) + " in the LRU list unflagged");
    ++in_lru;
  }
  if (in_lru != static_cast<int64_t>(lru_.size())) return internal_error("LRU size mismatch");
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const std::string id = "block " + std::to_string(b);
    if (ref_[b] != held[b])
      return internal_error(id + ": refcount " + std::to_string(ref_[b]) + " but held by " + std::to_string(held[b]));
    const int states = (on_free[b] > 0) + (in_lru_[b] ? 1 : 0) + (ref_[b] > 0);
    if (on_free[b] > 1 || states != 1) return internal_error(id + " is in " + std::to_string(states) + " states");
    if (on_free[b] && registered_[b]) return internal_error(id + " is free but registered");
    if (registered_[b]) {
      auto f = by_hash_.find(hash_[b]);
      if (f == by_hash_.end() || f->second != b) return internal_error(id + " registered but not indexed");
    }
  }
  for (const auto& [h, b] : by_hash_)
    if (!registered_[b] || hash_[b] != h) return internal_error("hash index points at a block without that hash");
  return Status::ok();
}

}  // namespace zest::model
