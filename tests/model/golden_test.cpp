// Golden tests: the CPU decoder against transformers on the tiny fixture checkpoints
// (tests/fixtures, made by tools/make_fixtures.py). Tolerances: prompt ids equal; last-position logits
// max|zest - ref| <= 1e-3 * max|ref|; 16 greedy tokens equal up to the first step whose reference
// top-2 margin is below 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/chat_request.h"
#include "engine/engine.h"
#include "io/npy.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zest;

namespace {

struct Case {
  std::string model, name;
  json ref;
};

std::vector<Case> cases_of(const std::string& model) {
  std::vector<Case> out;
  const fs::path dir = fs::path(ZEST_FIXTURES_DIR) / "ref" / model;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    out.push_back({model, e.path().stem().string(), json::parse(f)});
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  return out;
}

std::shared_ptr<engine::ModelBundle> load(const std::string& model) {
  static std::map<std::string, std::shared_ptr<engine::ModelBundle>> cache;
  auto& m = cache[model];
  if (!m) {
    auto r = engine::ModelBundle::load((fs::path(ZEST_FIXTURES_DIR) / "models" / model).string());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) m = *r;
  }
  return m;
}

engine::PromptOptions prompt_options() {
  engine::PromptOptions po;
  po.base_dir = ZEST_SOURCE_DIR;
  return po;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesTransformers) {
  const std::string model_name = GetParam();
  auto model = load(model_name);
  ASSERT_TRUE(model);
  const auto cases = cases_of(model_name);
  ASSERT_FALSE(cases.empty());
  for (const Case& c : cases) {
    SCOPED_TRACE(model_name + "/" + c.name);
    auto req = engine::parse_chat_request(c.ref["request"], *model);
    ASSERT_TRUE(req.ok()) << req.status().to_string();
    auto prompt = engine::build_prompt(*model, *req, prompt_options());
    ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
    const std::vector<int32_t> ref_ids = c.ref["prompt_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(prompt->ids, ref_ids);
    if (c.ref.contains("position_ids")) {
      const auto pos = c.ref["position_ids"].get<std::vector<std::vector<int32_t>>>();
      const size_t n = ref_ids.size();
      for (int a = 0; a < 3; ++a)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(prompt->positions[a * n + i], pos[a][i]) << "axis " << a << " token " << i;
      ASSERT_EQ(prompt->rope_delta, c.ref["rope_delta"].get<int64_t>());
    }

    // Last-position logits.
    const int64_t n = static_cast<int64_t>(prompt->ids.size());
    model::PagedKVCache cache = model->text.make_cache((n + 15) / 16 + 1, 16);
    std::vector<int32_t> table;
    ASSERT_TRUE(cache.reserve(table, n).is_ok());
    model::ForwardBatch b;
    b.tokens = prompt->ids;
    b.positions = prompt->positions;
    b.seqs.push_back({&table, 0, n, false, true});
    b.mm_embeds = prompt->mm_embeds;
    b.mm_index = prompt->mm_index;
    b.deepstack = prompt->deepstack;
    auto logits = model->text.forward(b, cache);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    auto ref = io::read_npy((fs::path(ZEST_FIXTURES_DIR) / "ref" / model_name / c.ref["logits_file"].get<std::string>()).string());
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    ASSERT_EQ(ref->numel(), logits->numel());
    float max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < ref->numel(); ++i) {
      max_ref = std::max(max_ref, std::fabs(ref->data<float>()[i]));
      max_diff = std::max(max_diff, std::fabs(ref->data<float>()[i] - logits->data<float>()[i]));
    }
    EXPECT_LE(max_diff, 1e-3f * max_ref) << "max diff " << max_diff << " max ref " << max_ref;

    // 16 greedy tokens through the engine.
    engine::Request r;
    r.prompt = *prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 16;
    r.sampling.ignore_eos = true;
    auto out = engine::generate_one(model, r);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const auto ref_tokens = c.ref["greedy_tokens"].get<std::vector<int32_t>>();
    const auto margins = c.ref["greedy_margins"].get<std::vector<double>>();
    size_t checked = 0;
    for (size_t i = 0; i < ref_tokens.size(); ++i) {
      ASSERT_LT(i, out->token_ids.size());
      EXPECT_EQ(out->token_ids[i], ref_tokens[i]) << "greedy step " << i;
      ++checked;
      if (margins[i] < 1e-3) break;
    }
    EXPECT_GT(checked, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden,
                         ::testing::Values("qwen3_moe_tiny", "qwen3_vl_moe_tiny", "qwen3_vl_tiny"));

}  // namespace
