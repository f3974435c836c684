// SERE inside the engine on the tiny qwen3_moe fixture with its calibrated similarity: at batch 1 with
// S = 1, rho = 0 every MoE layer runs exactly one expert per decode step; on a batch of 8 different
// prompts, the distinct experts after re-routing equal |P| plus the critical experts at every layer
// and step; with S >= K the outputs are identical to SERE off.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "engine/chat_request.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "engine/sere.h"

using namespace zest;
using namespace zest::testing;

namespace {

std::vector<engine::Prompt> prompts(int n) {
  static const char* kTexts[] = {"Hello!", "Write a haiku about rain.", "1 2 3 4 5", "你好，世界",
                                 "What is the capital of France?", "def f(x): return x * 2",
                                 "The quick brown fox", "Explain MoE routing."};
  std::vector<engine::Prompt> out;
  for (int i = 0; i < n; ++i) out.push_back(text_prompt(*tiny(), kTexts[i % 8]));
  return out;
}

// Greedy outputs of the prompts run together, with the given hooks on decode steps.
std::vector<std::vector<int32_t>> run(const std::vector<engine::Prompt>& ps, const model::MoeHooks* hooks) {
  engine::EngineOptions o;
  o.moe_hooks = [hooks](bool decode_only) { return decode_only ? hooks : nullptr; };
  engine::Engine eng(tiny(), o);
  std::vector<std::vector<int32_t>> out(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    engine::Request r;
    r.id = static_cast<int64_t>(i);
    r.prompt = ps[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = true;
    r.on_update = [&out, i](const std::string&, const engine::RequestOutput& o, bool done) {
      if (done) out[i] = o.token_ids;
    };
    EXPECT_TRUE(eng.add(std::move(r)).is_ok());
  }
  while (eng.has_work()) EXPECT_TRUE(eng.step().is_ok());
  return out;
}

TEST(SereEngine, BatchOneWithOnePrimaryRunsOneExpertPerLayer) {
  ASSERT_TRUE(tiny());
  engine::SereOptions so;
  so.params.primary = 1;
  so.similarity_file = tiny_similarity_file();
  auto rt = engine::SereRuntime::create(*tiny(), so);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  run(prompts(1), (*rt)->hooks(true));
  const auto stats = (*rt)->stats_json();
  ASSERT_GT(stats["steps"].get<int64_t>(), 0);
  for (double v : stats["experts_per_layer_after"]) EXPECT_EQ(v, 1.0);
  for (double v : stats["experts_per_layer_before"]) EXPECT_EQ(v, 4.0);  // top-4 of one token
}

TEST(SereEngine, DistinctAfterIsPrimaryPlusCritical) {
  ASSERT_TRUE(tiny());
  engine::SereOptions so;
  so.params.primary = 2;
  so.params.threshold = 0.5f;
  so.similarity_file = tiny_similarity_file();
  auto rt = engine::SereRuntime::create(*tiny(), so);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  const model::MoeHooks* inner = (*rt)->hooks(true);
  ASSERT_NE(inner, nullptr);
  int64_t checked = 0;
  model::MoeHooks wrap;
  wrap.route = [&](int64_t layer, int32_t* ids, float* w, int64_t n, int64_t k, const std::vector<uint8_t>& active) {
    std::set<int32_t> primary, before;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t s = 0; s < k; ++s) {
        before.insert(ids[t * k + s]);
        if (s < 2) primary.insert(ids[t * k + s]);
      }
    EXPECT_EQ(n, 8);  // decode steps of the 8 requests: only real tokens reach the hook
    inner->route(layer, ids, w, n, k, active);
    std::set<int32_t> after, critical;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t s = 0; s < k; ++s)
        if (ids[t * k + s] >= 0) {
          after.insert(ids[t * k + s]);
          if (!primary.count(ids[t * k + s])) critical.insert(ids[t * k + s]);
        }
    // Every expert outside P that survives was in the batch before (a kept critical expert).
    for (int32_t c : critical) EXPECT_TRUE(before.count(c));
    EXPECT_EQ(after.size(), primary.size() + critical.size());
    EXPECT_LE(after.size(), before.size());
    ++checked;
  };
  run(prompts(8), &wrap);
  EXPECT_GT(checked, 0);
}

TEST(SereEngine, PrimaryAtLeastTopKChangesNothing) {
  ASSERT_TRUE(tiny());
  const auto ps = prompts(4);
  const auto ref = run(ps, nullptr);
  engine::SereOptions so;
  so.params.primary = 4;  // = top-k of the fixture
  so.similarity_file = tiny_similarity_file();
  auto rt = engine::SereRuntime::create(*tiny(), so);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  EXPECT_EQ(run(ps, (*rt)->hooks(true)), ref);
}

}  // namespace
