// Prefix caching with images on the tiny Qwen3-VL-MoE fixture: a 3-image chat and its second turn, which re-sends
// the history, give the same outputs bit for bit with and without the cache; the second turn takes the first
// turn's blocks (images included) from the cache and runs no image through the vision tower again; the same
// images with other VisionZip settings never hit.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "engine/chat_request.h"
#include "engine/encoder_cache.h"
#include "engine/engine.h"
#include "golden_util.h"

using namespace zest;
using namespace zest::testing;

namespace {

nlohmann::json image_part(const std::string& name) {
  return {{"type", "image_url"}, {"image_url", {{"url", std::string(ZEST_SOURCE_DIR) + "/assets/images/" + name}}}};
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<engine::TokenLogprob> logprobs;
  int64_t cached = 0;
};

// Runs the prompts one after another on one engine; greedy, with log-probabilities.
std::vector<Outcome> run_in_turn(std::shared_ptr<engine::ModelBundle> m, const std::vector<engine::Prompt>& prompts,
                                 bool caching) {
  engine::EngineOptions o;
  o.prefix_caching = caching;
  engine::Engine eng(m, o);
  std::vector<Outcome> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::Request r;
    r.id = static_cast<int64_t>(i);
    r.prompt = prompts[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 5;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = 3;
    r.on_update = [&out, i](const std::string&, const engine::RequestOutput& o, bool done) {
      if (done) out[i] = {o.token_ids, o.logprobs, o.cached_tokens};
    };
    EXPECT_TRUE(eng.add(std::move(r)).is_ok());
    while (eng.has_work()) EXPECT_TRUE(eng.step().is_ok());
  }
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
  return out;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.logprobs[i].logprob, &b.logprobs[i].logprob, sizeof(float)), 0) << what << " pos " << i;
    ASSERT_EQ(a.logprobs[i].top.size(), b.logprobs[i].top.size());
    for (size_t k = 0; k < a.logprobs[i].top.size(); ++k)
      EXPECT_EQ(std::memcmp(&a.logprobs[i].top[k].second, &b.logprobs[i].top[k].second, sizeof(float)), 0) << what;
  }
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

class PrefixCacheVl : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheVl, SecondTurnOfAThreeImageChatReusesTheFirst) {
  auto m = fixture_model("qwen3_vl_moe_tiny");
  ASSERT_TRUE(m && m->encoder_cache);
  m->encoder_cache->clear();
  const nlohmann::json prune = nlohmann::json::parse(GetParam());
  const nlohmann::json kw = {{"min_pixels", 16 * 32 * 32}, {"max_pixels", 48 * 32 * 32}};
  nlohmann::json msgs = nlohmann::json::array();
  msgs.push_back({{"role", "user"},
                  {"content", {image_part("chart_line_pew_pena_nieto.png"), image_part("photo_lounge.jpg"),
                               image_part("ticket_bus_zh.jpg"), {{"type", "text"}, {"text", "Compare the three."}}}}});
  auto build = [&](const nlohmann::json& messages, const nlohmann::json& pr) {
    nlohmann::json body = {{"messages", messages}, {"mm_processor_kwargs", kw}};
    if (!pr.is_null()) body["vision_prune"] = pr;
    auto req = engine::parse_chat_request(body, *m);
    EXPECT_TRUE(req.ok()) << req.status().to_string();
    auto p = engine::build_prompt(*m, *req, {});
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return *p;
  };
  const engine::Prompt p1 = build(msgs, prune);
  EXPECT_EQ(p1.images_encoded, 3);
  ASSERT_EQ(p1.mm_keys.size(), p1.mm_index.size());
  ASSERT_GT(p1.mm_index.size(), 16u);  // several blocks of visual rows
  msgs.push_back({{"role", "assistant"}, {"content", "The chart, the lounge and the ticket."}});
  msgs.push_back({{"role", "user"}, {"content", "Which one has text?"}});
  const engine::Prompt p2 = build(msgs, prune);
  EXPECT_EQ(p2.images_encoded, 0);  // the re-sent images never reach the vision tower
  // The same images with other pruning: rows keyed differently.
  const nlohmann::json other = prune.is_null() ? nlohmann::json{{"rate", 0.5}} : nlohmann::json{{"rate", 0.25}};
  const engine::Prompt p3 = build(msgs, other);

  const auto ref = run_in_turn(m, {p1, p2, p3}, false);
  const auto got = run_in_turn(m, {p1, p2, p3}, true);
  for (size_t i = 0; i < 3; ++i) expect_same(got[i], ref[i], "turn " + std::to_string(i + 1));
  EXPECT_EQ(got[0].cached, 0);
  // Turn 2 takes every full block its prompt shares with turn 1's context (prompt + generated tokens): at least
  // all of turn 1's full prompt blocks, images included.
  std::vector<int32_t> ctx1 = p1.ids;
  ctx1.insert(ctx1.end(), got[0].tokens.begin(), got[0].tokens.end());
  const size_t shared = common_prefix(ctx1, p2.ids);
  ASSERT_GE(shared, p1.ids.size());
  EXPECT_EQ(got[1].cached, static_cast<int64_t>(shared / 16 * 16));
  EXPECT_GE(got[1].cached, static_cast<int64_t>(p1.ids.size() / 16 * 16));
  // Other pruning: nothing from the first image's first row on is shared.
  EXPECT_LE(got[2].cached, p1.mm_index.front());
}

INSTANTIATE_TEST_SUITE_P(Pruning, PrefixCacheVl,
                         ::testing::Values("null", R"({"rate": 0.5, "mode": "global"})",
                                           R"({"rate": 0.5, "mode": "uniform"})"));

}  // namespace
