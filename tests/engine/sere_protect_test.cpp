// Protected experts in the engine on the tiny qwen3_moe fixture: a --sere-protected file reaches the one
// re-routing hook (a protected expert stays in every token that chose it, while the same experts are
// re-routed without the file); bad files are refused with a clear message; zest sere-protect's ranking
// is well formed and round-trips through its JSON file.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>

#include "engine/sere.h"
#include "engine_test_util.h"

using namespace zest;
using namespace zest::testing;

namespace {

std::string write_text(const std::string& name, const std::string& text) {
  const std::string file = ::testing::TempDir() + "/" + name;
  std::ofstream(file) << text;
  return file;
}

// {"protected": [[ids] x layers]} with the same ids in every layer.
std::string protected_file(const std::vector<int32_t>& ids) {
  nlohmann::json layers = nlohmann::json::array();
  for (int64_t l = 0; l < tiny()->config.text.num_layers; ++l) layers.push_back(ids);
  return write_text("protected.json", nlohmann::json{{"protected", layers}}.dump());
}

// Runs `rt`'s re-routing hook over random routings of 8 tokens at every layer; counts how often a slot
// holding one of `watch` no longer holds it and the token lost it altogether.
int64_t lost_experts(const engine::SereRuntime& rt, const std::vector<int32_t>& watch) {
  const model::MoeHooks* h = rt.hooks(/*decode_only=*/true);
  EXPECT_NE(h, nullptr);
  const auto& tc = tiny()->config.text;
  const int64_t n = 8, k = tc.num_experts_per_tok, E = tc.num_experts;
  std::mt19937 rng(3);
  int64_t lost = 0;
  for (int trial = 0; trial < 50; ++trial)
    for (int64_t l = 0; l < tc.num_layers; ++l) {
      std::vector<int32_t> ids;
      std::vector<float> w;
      std::vector<int32_t> all(E);
      for (int64_t t = 0; t < n; ++t) {
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t j = 0; j < k; ++j) {
          ids.push_back(all[j]);
          w.push_back(1.0f / static_cast<float>(k));
        }
      }
      const std::vector<int32_t> before = ids;
      h->route(l, ids.data(), w.data(), n, k, std::vector<uint8_t>(n, 1));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = before[t * k + j];
          if (std::find(watch.begin(), watch.end(), e) == watch.end()) continue;
          if (std::find(ids.begin() + t * k, ids.begin() + (t + 1) * k, e) == ids.begin() + (t + 1) * k) ++lost;
        }
    }
  return lost;
}

TEST(SereProtected, ProtectedExpertsAreNeverReroutedAway) {
  const std::vector<int32_t> prot = {0, 3, 5, 6, 10};
  engine::SereOptions so;
  so.params.primary = 1;
  so.similarity_file = tiny_similarity_file();
  auto plain = engine::SereRuntime::create(*tiny(), so);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_GT(lost_experts(**plain, prot), 50);  // without the file these experts are re-routed
  so.protected_file = protected_file(prot);
  auto guarded = engine::SereRuntime::create(*tiny(), so);
  ASSERT_TRUE(guarded.ok()) << guarded.status().to_string();
  EXPECT_EQ(lost_experts(**guarded, prot), 0);
  so.params.threshold = 0.5f;  // with a threshold too
  auto guarded_rho = engine::SereRuntime::create(*tiny(), so);
  ASSERT_TRUE(guarded_rho.ok());
  EXPECT_EQ(lost_experts(**guarded_rho, prot), 0);
}

TEST(SereProtected, BadFilesAreRefused) {
  const int64_t L = tiny()->config.text.num_layers;
  nlohmann::json short_list = {{"protected", nlohmann::json::array({nlohmann::json::array()})}};
  nlohmann::json out_of_range = {{"protected", nlohmann::json::array()}};
  for (int64_t l = 0; l < L; ++l) out_of_range["protected"].push_back({l == 1 ? 99 : 0});
  nlohmann::json other_model = {{"config_hash", "0123"}, {"protected", nlohmann::json::array()}};
  const std::pair<std::string, std::string> cases[] = {
      {"{not json", "is not a JSON object"},
      {short_list.dump(), "one per layer"},
      {out_of_range.dump(), "layer 1 holds 99"},
      {other_model.dump(), "made for another model"},
  };
  engine::SereOptions so;
  so.params.primary = 1;
  so.similarity_file = tiny_similarity_file();
  for (const auto& [text, what] : cases) {
    so.protected_file = write_text("bad_protected.json", text);
    auto rt = engine::SereRuntime::create(*tiny(), so);
    ASSERT_FALSE(rt.ok()) << text;
    EXPECT_NE(rt.status().message().find(what), std::string::npos) << rt.status().message();
  }
  so.protected_file = "/nonexistent/protected.json";
  auto missing = engine::SereRuntime::create(*tiny(), so);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
}

TEST(SereProtected, RankingIsWellFormedAndRoundTrips) {
  std::vector<engine::Prompt> prompts = {text_prompt(*tiny(), "The quick brown fox jumps over the lazy dog."),
                                         text_prompt(*tiny(), "1 2 3 4 5 6 7 8")};
  engine::ProtectOptions po;
  po.similarity_file = tiny_similarity_file();
  po.per_layer = 3;
  po.progress = false;
  auto r = engine::rank_protected_experts(*tiny(), prompts, po);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& tc = tiny()->config.text;
  EXPECT_EQ(r->tokens, static_cast<int64_t>(prompts[0].ids.size() + prompts[1].ids.size()));
  ASSERT_EQ(static_cast<int64_t>(r->kl.size()), tc.num_layers);
  for (int64_t l = 0; l < tc.num_layers; ++l) {
    ASSERT_EQ(static_cast<int64_t>(r->kl[l].size()), tc.num_experts);
    int64_t positive = 0;
    for (double kl : r->kl[l]) {
      EXPECT_GE(kl, -1e-6);  // a KL divergence (up to rounding)
      positive += kl > 0;
    }
    EXPECT_GT(positive, 0);  // re-routing some expert away changes the outputs
    const auto& ids = r->experts[l];
    EXPECT_EQ(static_cast<int64_t>(ids.size()), std::min<int64_t>(3, positive));
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) {
        EXPECT_GE(r->kl[l][ids[i - 1]], r->kl[l][ids[i]]);
      }
    }
    for (int32_t e = 0; e < tc.num_experts && !ids.empty(); ++e) {  // nothing outside the list beats its last entry
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) {
        EXPECT_LE(r->kl[l][e], r->kl[l][ids.back()]);
      }
    }
  }
  const std::string file = ::testing::TempDir() + "/ranked_protected.json";
  ASSERT_TRUE(engine::write_protected_experts(file, *tiny(), *r).is_ok());
  auto back = engine::load_protected_experts(file, *tiny());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, r->experts);
}

}  // namespace
