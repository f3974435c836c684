#include "engine/encoder_cache.h"

#include <cstring>

namespace zest::engine {

size_t CachedImage::bytes() const {
  size_t b = embeds.nbytes() + scores.size() * sizeof(float) + (device_scores.defined() ? device_scores.nbytes() : 0);
  for (const Tensor& t : deepstack) b += t.nbytes();
  return b;
}

std::shared_ptr<const CachedImage> EncoderCache::get(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void EncoderCache::put(uint64_t key, std::shared_ptr<const CachedImage> entry) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t b = entry->bytes();
  if (b > max_bytes_) return;
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ -= it->second->second->bytes();
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(key, std::move(entry));
  index_[key] = lru_.begin();
  bytes_ += b;
  while (bytes_ > max_bytes_ && !lru_.empty()) {
    bytes_ -= lru_.back().second->bytes();
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

int64_t EncoderCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

void EncoderCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

int64_t EncoderCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

uint64_t image_cache_key(const io::Image& img, int64_t min_pixels, int64_t max_pixels) {
  // Multiply-xorshift over 8-byte words (fast enough for tens of MB; not cryptographic).
  auto mix = [](uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
  };
  uint64_t h = 0x84222325cbf29ce4ull;
  h = mix(h, static_cast<uint64_t>(img.width));
  h = mix(h, static_cast<uint64_t>(img.height));
  h = mix(h, static_cast<uint64_t>(min_pixels));
  h = mix(h, static_cast<uint64_t>(max_pixels));
  const uint8_t* p = img.rgb.data();
  const size_t n = img.rgb.size();
  size_t i = 0;
  uint64_t acc[4] = {h, ~h, h * 3, h * 5};
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      acc[l] = (acc[l] ^ w) * 0x9fb21c651e98df25ull;
      acc[l] ^= acc[l] >> 29;
    }
  for (int l = 0; l < 4; ++l) h = mix(h, acc[l]);
  for (; i < n; ++i) h = mix(h, p[i]);
  return h;
}

}  // namespace zest::engine
