// The architecture table (model/architecture.h): one entry per io::Arch, and each entry's text prefix and CPU decoder
// fit the fixture checkpoints of that architecture (the decoder's config is the checkpoint's, its logits finite).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/architecture.h"

using namespace zest;

namespace {

TEST(Architecture, EveryArchHasOneEntry) {
  std::set<int> seen;
  for (const model::Architecture& a : model::architectures()) {
    EXPECT_TRUE(seen.insert(static_cast<int>(a.arch)).second) << io::arch_name(a.arch) << " twice";
    EXPECT_EQ(model::architecture(a.arch).arch, a.arch);
    EXPECT_NE(a.cpu_decoder, nullptr);
  }
  for (io::Arch a : {io::Arch::kQwen3Moe, io::Arch::kQwen3VLMoe, io::Arch::kQwen3VL, io::Arch::kQwen3}) {
    EXPECT_TRUE(seen.count(static_cast<int>(a))) << io::arch_name(a) << " has no entry";
    EXPECT_EQ(model::architecture(a).arch, a);
  }
}

TEST(Architecture, EntriesFitTheFixtureCheckpoints) {
  for (const char* name : {"qwen3_moe_tiny", "qwen3_vl_moe_tiny", "qwen3_vl_tiny", "qwen3_tiny"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(ZEST_FIXTURES_DIR) + "/models/" + name;
    auto cfg = io::load_model_config(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    auto st = io::SafeTensors::open(dir);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    const model::Architecture& a = model::architecture(cfg->arch);
    EXPECT_TRUE(st->get(std::string(a.text_prefix) + "embed_tokens.weight").ok()) << a.text_prefix;
    auto dec = a.cpu_decoder(*st, *cfg);
    ASSERT_TRUE(dec.ok()) << dec.status().to_string();
    EXPECT_EQ((*dec)->config().num_layers, cfg->text.num_layers);
    EXPECT_EQ((*dec)->backend(), model::Backend::kCpu);
    auto cache = (*dec)->allocate_cache(4, 16);
    ASSERT_TRUE(cache.ok());
    std::vector<int32_t> table;
    ASSERT_TRUE(cache->reserve(table, 3).is_ok());
    model::ForwardBatch b;
    b.tokens = {1, 2, 3};
    b.positions = {0, 1, 2, 0, 1, 2, 0, 1, 2};
    b.seqs.push_back({&table, 0, 3, false, true});
    auto logits = (*dec)->forward(b, *cache);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    ASSERT_EQ(logits->dim(1), cfg->text.vocab_size);
    for (int64_t v = 0; v < logits->dim(1); ++v) ASSERT_TRUE(std::isfinite(logits->data<float>()[v]));
  }
}

}  // namespace
