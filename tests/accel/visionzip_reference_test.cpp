// VisionZip uniform selection against the transformers-side reference
// (tests/fixtures/ref/visionzip, made by tools/make_accel_fixtures.py): given the recorded per-image
// LLM-token scores, select_vision_tokens must keep exactly the recorded indices, the counts must follow
// k_i = max(min(M_i, min_tokens), floor(M_i * (1 - rate))), and build_gather_index must give the
// recorded rows of the vision-tower output. Exact comparisons (the scores are the recorded f32 values).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "accel/visionzip.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace zest::accel {
namespace {

struct RefCase {
  std::string name;
  json ref;
};

std::vector<RefCase> reference_cases() {
  std::vector<RefCase> out;
  const fs::path dir = fs::path(ZEST_FIXTURES_DIR) / "ref" / "visionzip";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    out.push_back({e.path().stem().string(), json::parse(f)});
  }
  std::sort(out.begin(), out.end(), [](const RefCase& a, const RefCase& b) { return a.name < b.name; });
  return out;
}

TEST(VisionZipReference, UniformSelectionMatchesTransformersReference) {
  const auto cases = reference_cases();
  ASSERT_GE(cases.size(), 4u);
  bool saw_two_images = false, saw_other_rate = false;
  for (const RefCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(c.ref.at("mode").get<std::string>(), "uniform");
    const auto token_scores = c.ref.at("token_scores").get<std::vector<std::vector<float>>>();
    const auto kept_ref = c.ref.at("kept").get<std::vector<std::vector<int64_t>>>();
    const auto counts_ref = c.ref.at("tokens_per_image").get<std::vector<int64_t>>();
    ASSERT_EQ(token_scores.size(), kept_ref.size());
    std::vector<float> scores;
    std::vector<int64_t> counts;
    for (const auto& s : token_scores) {
      scores.insert(scores.end(), s.begin(), s.end());
      counts.push_back(static_cast<int64_t>(s.size()));
    }
    ASSERT_EQ(counts, counts_ref);
    saw_two_images = saw_two_images || counts.size() > 1;

    VisionPruneOptions o;
    o.mode = VisionPruneOptions::Mode::kUniform;
    o.rate = c.ref.at("rate").get<float>();
    o.min_tokens = c.ref.at("min_tokens").get<int64_t>();
    saw_other_rate = saw_other_rate || o.rate != 0.5f;

    auto kc = vision_keep_counts(scores, counts, o);
    ASSERT_TRUE(kc.ok()) << kc.status().to_string();
    EXPECT_EQ(*kc, c.ref.at("keep_counts").get<std::vector<int64_t>>());

    auto kept = select_vision_tokens(scores, counts, o);
    ASSERT_TRUE(kept.ok()) << kept.status().to_string();
    ASSERT_EQ(kept->size(), kept_ref.size());
    for (size_t i = 0; i < kept_ref.size(); ++i) EXPECT_EQ((*kept)[i], kept_ref[i]) << "image " << i;

    // Every image's kept tokens are strictly better than its dropped ones (the recorded gap is > 0),
    // so the reference is not decided by a tie.
    for (const auto& g : c.ref.at("selection_gaps")) {
      if (!g.is_null()) {
        EXPECT_GT(g.get<double>(), 0.0);
      }
    }

    std::vector<int64_t> offsets;
    int64_t row = 0;
    for (int64_t m : counts) {
      offsets.push_back(row);
      row += m;
    }
    auto rows = build_gather_index(*kept, offsets, counts);
    ASSERT_TRUE(rows.ok()) << rows.status().to_string();
    EXPECT_EQ(*rows, c.ref.at("kept_rows").get<std::vector<int64_t>>());
  }
  EXPECT_TRUE(saw_two_images);
  EXPECT_TRUE(saw_other_rate);
}

// The recorded patch scores sum to the patch count per image and merge into the recorded token scores
// (merge_group_scores over groups of 4); tolerance 1e-4 relative for the f32 sums.
TEST(VisionZipReference, PatchScoresMergeIntoTokenScores) {
  for (const RefCase& c : reference_cases()) {
    SCOPED_TRACE(c.name);
    const auto patch = c.ref.at("patch_scores").get<std::vector<std::vector<float>>>();
    const auto tokens = c.ref.at("token_scores").get<std::vector<std::vector<float>>>();
    ASSERT_EQ(patch.size(), tokens.size());
    for (size_t i = 0; i < patch.size(); ++i) {
      double total = 0;
      for (float a : patch[i]) total += a;
      EXPECT_NEAR(total, static_cast<double>(patch[i].size()), 1e-4 * patch[i].size());
      auto merged = merge_group_scores(patch[i], 4);
      ASSERT_TRUE(merged.ok()) << merged.status().to_string();
      ASSERT_EQ(merged->size(), tokens[i].size());
      for (size_t m = 0; m < tokens[i].size(); ++m)
        EXPECT_NEAR((*merged)[m], tokens[i][m], 1e-4f * std::max(1.0f, tokens[i][m])) << "image " << i << " token " << m;
    }
  }
}

}  // namespace
}  // namespace zest::accel
