// Paged KV cache: fixed-size blocks of `block_size` token slots shared by all sequences; each sequence
// owns an ordered list of block ids (its block table). The block allocator (free list) is the same for
// every backend; the storage behind the blocks belongs to the backend that made the cache (CPU: per layer
// [num_blocks, block_size, kv_heads, head_dim] f32 for K and for V; CUDA: bf16 on the device).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zest::model {

// Backend-specific block storage of a PagedKVCache.
class KvStorage {
 public:
  virtual ~KvStorage() = default;
};

// CPU storage: per layer K and V tensors [num_blocks, block_size, kv_heads, head_dim] f32.
class CpuKvStorage : public KvStorage {
 public:
  CpuKvStorage(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_heads, int64_t head_dim);
  // K (or V) vector of cache row `row` (= block * block_size + slot) of `layer`: kv_heads * head_dim floats.
  float* k_row(int64_t layer, int64_t row) { return k_[layer].data<float>() + row * row_elems_; }
  float* v_row(int64_t layer, int64_t row) { return v_[layer].data<float>() + row * row_elems_; }

 private:
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
    // Hand out low block ids first.
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  }
  // A cache with CPU f32 storage.
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

  // The backend storage (null for a default-constructed cache).
  KvStorage* storage() const { return storage_.get(); }

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
  std::vector<int32_t> free_;
};

}  // namespace zest::model
