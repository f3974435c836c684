#include "model/kv_cache.h"

#include <algorithm>

namespace zest::model {

PagedKVCache::PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                           int64_t head_dim)
    : num_blocks_(num_blocks), block_size_(block_size), kv_heads_(kv_heads), head_dim_(head_dim) {
  for (int64_t l = 0; l < num_layers; ++l) {
    k_.push_back(Tensor::empty({num_blocks, block_size, kv_heads, head_dim}));
    v_.push_back(Tensor::empty({num_blocks, block_size, kv_heads, head_dim}));
  }
  // Hand out low block ids first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

Status PagedKVCache::reserve(std::vector<int32_t>& table, int64_t n_tokens) {
  const int64_t need = blocks_for(n_tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return Status::ok();
  if (need > free_blocks())
    return resource_exhausted("KV cache full: need " + std::to_string(need) + " more blocks, " +
                              std::to_string(free_blocks()) + " free");
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return Status::ok();
}

void PagedKVCache::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
  table.clear();
}

float* PagedKVCache::slot(std::vector<Tensor>& store, int64_t layer, const std::vector<int32_t>& table,
                          int64_t pos) {
  const int64_t block = table[pos / block_size_];
  const int64_t row = block * block_size_ + pos % block_size_;
  return store[layer].data<float>() + row * kv_heads_ * head_dim_;
}

float* PagedKVCache::k_at(int64_t layer, const std::vector<int32_t>& table, int64_t pos) {
  return slot(k_, layer, table, pos);
}
float* PagedKVCache::v_at(int64_t layer, const std::vector<int32_t>& table, int64_t pos) {
  return slot(v_, layer, table, pos);
}

}  // namespace zest::model
