#include "model/kv_cache.h"

#include <algorithm>

namespace zest::model {

CpuKvStorage::CpuKvStorage(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                           int64_t head_dim)
    : row_elems_(kv_heads * head_dim) {
  for (int64_t l = 0; l < num_layers; ++l) {
    k_.push_back(Tensor::empty({num_blocks, block_size, kv_heads, head_dim}));
    v_.push_back(Tensor::empty({num_blocks, block_size, kv_heads, head_dim}));
  }
}

PagedKVCache::PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads,
                           int64_t head_dim)
    : PagedKVCache(num_blocks, block_size,
                   std::make_shared<CpuKvStorage>(num_layers, num_blocks, block_size, kv_heads, head_dim)) {}

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

}  // namespace zest::model
