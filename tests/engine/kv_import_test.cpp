// Prefill/decode disaggregation in the engine: a request run with export_kv hands back its prompt's K/V
// (RequestOutput::kv) and first token; another engine given them (Request::kv, first_token) must generate exactly
// what one engine generates alone: the same tokens under greedy and under seeded sampling, also when the imported
// request is preempted (its snapshot is written back and only its generated tokens are recomputed). Bad imports are
// refused.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine_test_util.h"

using namespace zest;
using namespace zest::testing;

namespace {

engine::Request make_request(const engine::Prompt& p, int64_t max_tokens, double temperature, uint64_t seed) {
  engine::Request r;
  r.prompt = p;
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.ignore_eos = true;
  return r;
}

// The prefill instance's half: the prompt run with export_kv and one token.
engine::RequestOutput prefill_half(std::shared_ptr<engine::ModelBundle> m, engine::Request r) {
  r.sampling.max_tokens = 1;
  r.export_kv = true;
  auto out = engine::generate_one(std::move(m), std::move(r));
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : engine::RequestOutput{};
}

// The decode instance's half: the prompt's ids and rope delta only, with the K/V and the first token.
engine::Request decode_half(const engine::Request& full, const engine::RequestOutput& pre) {
  engine::Request r = full;
  r.prompt.positions.clear();
  r.kv = pre.kv;
  r.first_token = pre.token_ids.at(0);
  return r;
}

std::shared_ptr<engine::ModelBundle> load(const std::string& name) {
  auto r = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/" + name);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : nullptr;
}

TEST(KvImport, ImportedPromptGeneratesWhatOneEngineDoes) {
  for (const char* name : {"qwen3_moe_tiny", "qwen3_tiny"}) {
    auto m = load(name);
    ASSERT_TRUE(m);
    const engine::Prompt p = text_prompt(*m, "Tell me about the sea and the ships on it.");
    for (double temperature : {0.0, 0.9}) {
      SCOPED_TRACE(std::string(name) + " temperature " + std::to_string(temperature));
      const engine::Request full = make_request(p, 24, temperature, 7);
      auto ref = engine::generate_one(m, full);
      ASSERT_TRUE(ref.ok()) << ref.status().to_string();
      const engine::RequestOutput pre = prefill_half(m, full);
      ASSERT_TRUE(pre.kv);
      EXPECT_EQ(pre.kv->tokens, static_cast<int64_t>(p.ids.size()));
      EXPECT_EQ(static_cast<int64_t>(pre.kv->bytes->size()), pre.kv->expected_bytes());
      ASSERT_EQ(pre.token_ids.size(), 1u);
      EXPECT_EQ(pre.token_ids[0], ref->token_ids[0]);
      auto got = engine::generate_one(m, decode_half(full, pre));
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_EQ(got->token_ids, ref->token_ids);
      EXPECT_EQ(got->text, ref->text);
      EXPECT_EQ(got->cached_tokens, 0);
    }
  }
}

TEST(KvImport, PreemptedImportsGetTheirSnapshotBack) {
  auto m = tiny();
  // Two requests of 15-20 prompt + 40 generated tokens need 4 blocks of 16 each; 5 blocks force preemptions.
  engine::EngineOptions small;
  small.kv_blocks = 5;
  small.block_size = 16;
  small.prefix_caching = false;
  std::vector<engine::Request> fulls;
  std::vector<std::vector<int32_t>> refs;
  for (const char* text : {"Write about the mountains in winter, please.", "Describe a busy market at noon."}) {
    fulls.push_back(make_request(text_prompt(*m, text), 40, 0.0, 1));
    auto ref = engine::generate_one(m, fulls.back());
    ASSERT_TRUE(ref.ok());
    refs.push_back(ref->token_ids);
  }
  engine::Engine eng(m, small);
  std::vector<engine::RequestOutput> outs(fulls.size());
  for (size_t i = 0; i < fulls.size(); ++i) {
    engine::Request r = decode_half(fulls[i], prefill_half(m, fulls[i]));
    r.id = static_cast<int64_t>(i);
    r.on_update = [&outs, i](const std::string&, const engine::RequestOutput& out, bool finished) {
      if (finished) outs[i] = out;
    };
    ASSERT_TRUE(eng.add(std::move(r)).is_ok());
  }
  while (eng.has_work()) {
    ASSERT_TRUE(eng.step().is_ok());
    ASSERT_TRUE(eng.check_blocks().is_ok());
  }
  EXPECT_GT(eng.stats().preemptions, 0) << "the test must preempt an imported request";
  EXPECT_GT(eng.stats().kv_imports, 2) << "a preempted import writes its snapshot again";
  for (size_t i = 0; i < fulls.size(); ++i) EXPECT_EQ(outs[i].token_ids, refs[i]) << i;
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
}

TEST(KvImport, FirstTokenEndingTheRequestNeedsNoBlocks) {
  auto m = tiny();
  engine::Request full = make_request(text_prompt(*m, "Hi"), 1, 0.0, 1);
  const engine::RequestOutput pre = prefill_half(m, full);
  ASSERT_TRUE(pre.kv);
  engine::Engine eng(m, {});
  engine::RequestOutput out;
  engine::Request r = decode_half(full, pre);
  r.on_update = [&](const std::string&, const engine::RequestOutput& o, bool finished) {
    if (finished) out = o;
  };
  ASSERT_TRUE(eng.add(std::move(r)).is_ok());
  EXPECT_FALSE(eng.has_work()) << "max_tokens 1: the first token ends the request at once";
  EXPECT_EQ(out.finish, engine::FinishReason::kLength);
  EXPECT_EQ(out.token_ids, pre.token_ids);
  EXPECT_EQ(eng.stats().kv_imports, 0);
}

TEST(KvImport, BadImportsAreRefused) {
  auto m = tiny();
  engine::Request full = make_request(text_prompt(*m, "Hello there"), 4, 0.0, 1);
  const engine::RequestOutput pre = prefill_half(m, full);
  ASSERT_TRUE(pre.kv);
  engine::Engine eng(m, {});
  engine::Request shorter = decode_half(full, pre);
  shorter.prompt.ids.pop_back();
  EXPECT_EQ(eng.add(shorter).code(), ErrorCode::kInvalidArgument);
  engine::Request bad_token = decode_half(full, pre);
  bad_token.first_token = static_cast<int32_t>(m->config.text.vocab_size);
  EXPECT_EQ(eng.add(bad_token).code(), ErrorCode::kInvalidArgument);
  engine::Request no_logprob = decode_half(full, pre);  // asks for logprobs, has none for its first token
  no_logprob.sampling.logprobs = true;
  EXPECT_EQ(eng.add(no_logprob).code(), ErrorCode::kInvalidArgument);
  // Another model's geometry (one layer fewer) fails at admission with an error, not a crash, and frees its blocks.
  auto other = std::make_shared<model::KvSnapshot>(*pre.kv);
  other->layers -= 1;
  other->bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(other->expected_bytes()));
  engine::Request wrong = decode_half(full, pre);
  wrong.kv = other;
  engine::RequestOutput out;
  wrong.on_update = [&](const std::string&, const engine::RequestOutput& o, bool finished) {
    if (finished) out = o;
  };
  ASSERT_TRUE(eng.add(std::move(wrong)).is_ok());
  while (eng.has_work()) ASSERT_TRUE(eng.step().is_ok());
  EXPECT_EQ(out.finish, engine::FinishReason::kError);
  EXPECT_NE(out.error.find("does not fit this cache"), std::string::npos) << out.error;
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
}

}  // namespace
