// Cache of vision-tower outputs keyed by image content: an image sent again (a later turn, another
// request) is not re-encoded. Holds the unpruned merged embeddings, the deepstack features and, when a
// request asked for them, the VisionZip token scores; each request applies its own budget.
// Thread-safe (prompts are built on several threads).
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "io/image.h"

namespace zest::engine {

struct CachedImage {
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;  // patch grid
  Tensor embeds;                      // [M, hidden] merged tokens
  std::vector<Tensor> deepstack;      // each [M, hidden]
  std::vector<float> scores;          // [M] VisionZip token scores at score_layer; empty if not computed
  Tensor device_scores;               // device-resident encoders: the scores as an f32 device tensor [M]
  int64_t score_layer = -1;
  size_t bytes() const;
};

class EncoderCache {
 public:
  explicit EncoderCache(size_t max_bytes = size_t{1} << 30) : max_bytes_(max_bytes) {}
  // The entry for `key`, or null; a hit moves it to the front.
  std::shared_ptr<const CachedImage> get(uint64_t key);
  // Inserts (or replaces) an entry and evicts the least recently used ones beyond the byte limit.
  void put(uint64_t key, std::shared_ptr<const CachedImage> entry);
  int64_t hits() const;
  int64_t misses() const;
  // Drops every entry (the counters stay).
  void clear();

 private:
  using List = std::list<std::pair<uint64_t, std::shared_ptr<const CachedImage>>>;
  mutable std::mutex mu_;
  size_t max_bytes_, bytes_ = 0;
  List lru_;
  std::unordered_map<uint64_t, List::iterator> index_;
  int64_t hits_ = 0, misses_ = 0;
};

// A 64-bit content hash of the decoded pixels and the preprocessing budget that shapes the tower's input.
uint64_t image_cache_key(const io::Image& img, int64_t min_pixels, int64_t max_pixels);

}  // namespace zest::engine
