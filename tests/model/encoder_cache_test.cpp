// Encoder cache: an image sent again is served from the cache with bit-identical embeddings and
// selections; a different pixel budget or a missing score layer is a miss; LRU eviction by bytes.
#include <cstring>

#include "engine/encoder_cache.h"
#include "engine/vision_encode.h"
#include "golden_util.h"
#include "io/image.h"

using namespace zest;
using namespace zest::testing;

namespace {

// encode_images with the pixel budget and VisionZip options parsed as a request's are.
Result<engine::EncodedImages> encode(const engine::ModelBundle& m, const std::vector<io::Image>& imgs,
                                     const nlohmann::json& kw, const nlohmann::json& prune) {
  auto budget = engine::request_pixel_budget(m, kw, int64_t{1} << 40);
  if (!budget.ok()) return budget.status();
  auto opts = engine::request_vision_prune(m, prune);
  if (!opts.ok()) return opts.status();
  return engine::encode_images(m, imgs, *budget, *opts);
}

io::Image bundled(const std::string& name) {
  auto img = io::load_image(std::string(ZEST_SOURCE_DIR) + "/assets/images/" + name);
  EXPECT_TRUE(img.ok()) << img.status().to_string();
  return *img;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(EncoderCache, RepeatedImagesAreServedFromTheCache) {
  auto model = fixture_model("qwen3_vl_moe_tiny");
  ASSERT_TRUE(model && model->encoder_cache);
  const std::vector<io::Image> imgs = {bundled("chart_line_pew_pena_nieto.png"), bundled("photo_lounge.jpg")};
  const nlohmann::json kw = {{"min_pixels", 16 * 32 * 32}, {"max_pixels", 64 * 32 * 32}};
  const nlohmann::json prune = {{"rate", 0.5}, {"mode", "global"}};
  auto first = encode(*model, imgs, kw, prune);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto again = encode(*model, imgs, kw, prune);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cache_hits, 2);
  EXPECT_EQ(again->kept, first->kept);
  EXPECT_TRUE(same(again->embeds, first->embeds));
  ASSERT_EQ(again->deepstack.size(), first->deepstack.size());
  for (size_t l = 0; l < first->deepstack.size(); ++l) EXPECT_TRUE(same(again->deepstack[l], first->deepstack[l]));

  // A new image next to a cached one: one hit, and the cached image's selection is unchanged by
  // the order (uniform mode selects per image).
  const nlohmann::json uni = {{"rate", 0.5}, {"mode", "uniform"}};
  auto a = encode(*model, {imgs[1]}, kw, uni);
  auto b = encode(*model, {bundled("ticket_bus_zh.jpg"), imgs[1]}, kw, uni);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->cache_hits, 1);
  EXPECT_EQ(b->kept[1], a->kept[0]);

  // Another pixel budget changes the tower input: a miss.
  auto other = encode(*model, imgs, {{"min_pixels", 16 * 32 * 32}, {"max_pixels", 32 * 32 * 32}}, prune);
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_EQ(other->cache_hits, 0);
}

TEST(EncoderCache, ScoresAreComputedWhenACachedEntryLacksThem) {
  auto model = fixture_model("qwen3_vl_moe_tiny");
  ASSERT_TRUE(model && model->encoder_cache);
  const std::vector<io::Image> imgs = {bundled("receipt_unihakka.jpg")};
  const nlohmann::json kw = {{"min_pixels", 16 * 32 * 32}, {"max_pixels", 48 * 32 * 32}};
  auto plain = encode(*model, imgs, kw, nullptr);  // caches without scores
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  const nlohmann::json prune = {{"rate", 0.5}, {"mode", "uniform"}, {"score_layer", -1}};
  auto pruned = encode(*model, imgs, kw, prune);
  ASSERT_TRUE(pruned.ok()) << pruned.status().to_string();
  EXPECT_EQ(pruned->cache_hits, 0);
  auto pruned_again = encode(*model, imgs, kw, prune);
  ASSERT_TRUE(pruned_again.ok());
  EXPECT_EQ(pruned_again->cache_hits, 1);
  EXPECT_EQ(pruned_again->kept, pruned->kept);
  // The unpruned request is also served by the scored entry, with the same embeddings.
  auto plain_again = encode(*model, imgs, kw, nullptr);
  ASSERT_TRUE(plain_again.ok());
  EXPECT_EQ(plain_again->cache_hits, 1);
  EXPECT_TRUE(same(plain_again->embeds, plain->embeds));
}

TEST(EncoderCache, EvictsLeastRecentlyUsedBeyondItsByteLimit) {
  auto entry = [](int64_t rows) {
    auto e = std::make_shared<engine::CachedImage>();
    e->embeds = Tensor::zeros({rows, 16});
    return e;
  };
  const size_t one = entry(10)->bytes();
  engine::EncoderCache cache(3 * one);
  cache.put(1, entry(10));
  cache.put(2, entry(10));
  cache.put(3, entry(10));
  ASSERT_TRUE(cache.get(1));  // 1 becomes the most recent
  cache.put(4, entry(10));    // evicts 2
  EXPECT_TRUE(cache.get(1));
  EXPECT_FALSE(cache.get(2));
  EXPECT_TRUE(cache.get(3));
  EXPECT_TRUE(cache.get(4));
  cache.put(5, entry(1000));  // larger than the whole cache: not stored
  EXPECT_FALSE(cache.get(5));
  EXPECT_TRUE(cache.get(4));
}

TEST(EncoderCache, KeyDependsOnPixelsAndBudget) {
  io::Image a;
  a.width = 4;
  a.height = 3;
  a.rgb.assign(36, 7);
  io::Image b = a;
  b.rgb[35] = 8;
  EXPECT_EQ(engine::image_cache_key(a, 1, 2), engine::image_cache_key(a, 1, 2));
  EXPECT_NE(engine::image_cache_key(a, 1, 2), engine::image_cache_key(b, 1, 2));
  EXPECT_NE(engine::image_cache_key(a, 1, 2), engine::image_cache_key(a, 1, 3));
}

}  // namespace
