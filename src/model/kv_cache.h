// Paged KV cache: fixed-size blocks of `block_size` token slots shared by all sequences; each sequence
// owns an ordered list of block ids (its block table). Storage is per layer [num_blocks, block_size,
// kv_heads, head_dim] f32 for K and for V.
#pragma once
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zest::model {

class PagedKVCache {
 public:
  PagedKVCache() = default;
  PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Blocks needed to hold n tokens.
  int64_t blocks_for(int64_t n) const { return (n + block_size_ - 1) / block_size_; }

  // Grows `table` so it can hold n_tokens; kResourceExhausted (table unchanged) if blocks run out.
  Status reserve(std::vector<int32_t>& table, int64_t n_tokens);
  // Returns every block of `table` to the free list and clears it.
  void release(std::vector<int32_t>& table);

  // Pointer to the K (or V) vector of token `pos` in a sequence with block table `table`, layer `layer`:
  // kv_heads * head_dim floats.
  float* k_at(int64_t layer, const std::vector<int32_t>& table, int64_t pos);
  float* v_at(int64_t layer, const std::vector<int32_t>& table, int64_t pos);

 private:
  float* slot(std::vector<Tensor>& store, int64_t layer, const std::vector<int32_t>& table, int64_t pos);
  int64_t num_blocks_ = 0, block_size_ = 16, kv_heads_ = 0, head_dim_ = 0;
  std::vector<Tensor> k_, v_;
  std::vector<int32_t> free_;
};

}  // namespace zest::model
