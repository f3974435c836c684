// Engine tests on the tiny qwen3_moe fixture: batched forward == one-by-one forward, continuous
// batching and preemption do not change greedy outputs, stop conditions, abort frees KV blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "engine/chat_request.h"
#include "engine/engine.h"
#include "engine_test_util.h"

using namespace zest;
using namespace zest::testing;

namespace {

// Logits of the last token of each prompt, computed one sequence at a time.
std::vector<std::vector<float>> solo_logits(const engine::ModelBundle& m, const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<std::vector<float>> out;
  for (const auto& ids : seqs) {
    const int64_t n = static_cast<int64_t>(ids.size());
    auto cache = *m.decoder().allocate_cache(64, 16);
    std::vector<int32_t> table;
    EXPECT_TRUE(cache.reserve(table, n).is_ok());
    model::ForwardBatch b;
    b.tokens = ids;
    for (int a = 0; a < 3; ++a)
      for (int64_t i = 0; i < n; ++i) b.positions.push_back(static_cast<int32_t>(i));
    b.seqs.push_back({&table, 0, n, false, true});
    auto l = m.decoder().forward(b, cache);
    EXPECT_TRUE(l.ok());
    out.emplace_back(l->data<float>(), l->data<float>() + l->numel());
  }
  return out;
}

TEST(Forward, MixedBatchEqualsOneByOne) {
  auto m = tiny();
  ASSERT_TRUE(m);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, 151000);
  std::vector<std::vector<int32_t>> seqs;
  for (int len : {5, 17, 1, 33}) {
    std::vector<int32_t> s(len);
    for (auto& t : s) t = tok(rng);
    seqs.push_back(s);
  }
  const auto ref = solo_logits(*m, seqs);
  // Sequences 0 and 1 first get their prefix (all but the last token) into the cache; then one batch
  // mixes decode (last token of 0 and 1) with full prefills (2 and 3).
  auto cache = *m->decoder().allocate_cache(64, 16);
  std::vector<std::vector<int32_t>> tables(4);
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(cache.reserve(tables[s], seqs[s].size()).is_ok());
  {
    model::ForwardBatch pre;
    for (int s = 0; s < 2; ++s) {
      const int64_t n = static_cast<int64_t>(seqs[s].size()) - 1;
      pre.tokens.insert(pre.tokens.end(), seqs[s].begin(), seqs[s].end() - 1);
      pre.seqs.push_back({&tables[s], 0, n, false, true});
    }
    const int64_t T = pre.num_tokens();
    pre.positions.resize(3 * T);
    int64_t t = 0;
    for (int s = 0; s < 2; ++s)
      for (size_t i = 0; i + 1 < seqs[s].size(); ++i, ++t)
        for (int a = 0; a < 3; ++a) pre.positions[a * T + t] = static_cast<int32_t>(i);
    ASSERT_TRUE(m->decoder().forward(pre, cache).ok());
  }
  model::ForwardBatch b;
  std::vector<std::pair<int64_t, int64_t>> spans;  // (start, length) per sequence
  spans = {{static_cast<int64_t>(seqs[0].size()) - 1, 1}, {static_cast<int64_t>(seqs[1].size()) - 1, 1}, {0, 1}, {0, 33}};
  for (int s = 0; s < 4; ++s) {
    const auto [start, len] = spans[s];
    b.tokens.insert(b.tokens.end(), seqs[s].begin() + start, seqs[s].begin() + start + len);
    b.seqs.push_back({&tables[s], start, len, false, true});
  }
  const int64_t T = b.num_tokens();
  b.positions.resize(3 * T);
  int64_t t = 0;
  for (int s = 0; s < 4; ++s)
    for (int64_t i = 0; i < spans[s].second; ++i, ++t)
      for (int a = 0; a < 3; ++a) b.positions[a * T + t] = static_cast<int32_t>(spans[s].first + i);
  auto l = m->decoder().forward(b, cache);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  const int64_t V = l->dim(1);
  for (int s = 0; s < 4; ++s) {
    float max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < V; ++i) {
      max_ref = std::max(max_ref, std::fabs(ref[s][i]));
      max_diff = std::max(max_diff, std::fabs(ref[s][i] - l->data<float>()[s * V + i]));
    }
    // Same math in a different batch layout: only summation-order differences (tolerance 1e-5 relative).
    EXPECT_LE(max_diff, 1e-5f * max_ref) << "sequence " << s;
  }
}

// Runs prompts through one engine and returns the generated ids per request.
std::vector<std::vector<int32_t>> run_all(const std::vector<engine::Prompt>& prompts, engine::EngineOptions opts,
                                          int64_t max_tokens, engine::EngineStats* stats = nullptr) {
  engine::Engine eng(tiny(), opts);
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::Request r;
    r.id = static_cast<int64_t>(i);
    r.prompt = prompts[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.on_update = [&out, i](const std::string&, const engine::RequestOutput& o, bool done) {
      if (done) out[i] = o.token_ids;
    };
    EXPECT_TRUE(eng.add(std::move(r)).is_ok());
  }
  while (eng.has_work()) EXPECT_TRUE(eng.step().is_ok());
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
  if (stats) *stats = eng.stats();
  return out;
}

TEST(Engine, BatchingAndPreemptionKeepGreedyOutputs) {
  auto m = tiny();
  ASSERT_TRUE(m);
  std::vector<engine::Prompt> prompts;
  for (const char* t : {"Hello!", "Write a poem about the sea, please, in four lines.", "1 2 3 4 5 6 7 8 9 10 11 12",
                        "你好，世界", "What is the capital of France?"})
    prompts.push_back(text_prompt(*m, t));
  engine::EngineOptions solo;
  solo.max_num_seqs = 1;
  const auto ref = run_all(prompts, solo, 20);
  engine::EngineOptions batched;
  batched.max_batched_tokens = 7;  // forces chunked prefill
  EXPECT_EQ(run_all(prompts, batched, 20), ref);
  engine::EngineOptions tight;
  tight.kv_blocks = 6;  // 96 token slots for 5 requests of ~40 tokens: forces preemption
  tight.block_size = 16;
  engine::EngineStats st;
  EXPECT_EQ(run_all(prompts, tight, 20, &st), ref);
  EXPECT_GT(st.preemptions, 0);
}

TEST(Engine, DecodeStepTimesCountEveryDecodeStep) {
  auto m = tiny();
  ASSERT_TRUE(m);
  engine::EngineStats st;
  const auto out = run_all({text_prompt(*m, "Hello!")}, {}, 12, &st);
  ASSERT_EQ(out[0].size(), 12u);
  // The prompt's step samples the first token; each of the other 11 comes from a decode-only step, and every one
  // but the first of those follows a decode step directly.
  EXPECT_EQ(st.decode_steps, 11);
  EXPECT_EQ(st.decode_intervals, 10);
  EXPECT_GT(st.decode_forward_s, 0);
  EXPECT_LE(st.decode_forward_s, st.decode_step_s);
  EXPECT_GT(st.decode_interval_s, 0);
  // A chunked prompt's steps are not decode-only: two prompts, the second admitted while the first decodes.
  engine::EngineOptions chunked;
  chunked.max_batched_tokens = 3;
  engine::EngineStats st2;
  run_all({text_prompt(*m, "Hello!"), text_prompt(*m, "What is the capital of France?")}, chunked, 4, &st2);
  EXPECT_LT(st2.decode_steps, st2.steps);
  EXPECT_LE(st2.decode_intervals, st2.decode_steps);
}

TEST(Engine, StopStringsAndTokens) {
  auto m = tiny();
  ASSERT_TRUE(m);
  const engine::Prompt p = text_prompt(*m, "Hello!");
  engine::Request r;
  r.prompt = p;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 12;
  r.sampling.ignore_eos = true;
  auto full = engine::generate_one(m, r);
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->finish, engine::FinishReason::kLength);
  ASSERT_GE(full->text.size(), 4u);
  // A stop string taken from the middle of the greedy text cuts the text before it.
  const std::string stop = full->text.substr(full->text.size() / 2, 3);
  const size_t at = full->text.find(stop);
  engine::Request r2 = r;
  r2.sampling.stop = {stop};
  std::string streamed;
  r2.on_update = [&](const std::string& d, const engine::RequestOutput& o, bool) {
    streamed += d;
    EXPECT_EQ(o.text, streamed);  // the text so far is what the deltas sent
  };
  auto cut = engine::generate_one(m, r2);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->finish, engine::FinishReason::kStop);
  EXPECT_EQ(cut->text, full->text.substr(0, at));
  EXPECT_EQ(streamed, cut->text);
  // A stop token id ends generation at that token.
  engine::Request r3 = r;
  r3.sampling.stop_token_ids = {full->token_ids[3]};
  auto st = engine::generate_one(m, r3);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->finish, engine::FinishReason::kStop);
  const auto first = std::find(full->token_ids.begin(), full->token_ids.end(), full->token_ids[3]) - full->token_ids.begin();
  EXPECT_EQ(static_cast<int64_t>(st->token_ids.size()), first + 1);
}

TEST(Engine, AbortFreesBlocksAndPromptPastContextIsRejected) {
  auto m = tiny();
  ASSERT_TRUE(m);
  engine::EngineOptions o;
  o.max_context = 64;
  engine::Engine eng(m, o);
  engine::Request r;
  r.id = 1;
  r.prompt = text_prompt(*m, "Hello!");
  r.sampling.max_tokens = 30;
  engine::RequestOutput last;
  r.on_update = [&](const std::string&, const engine::RequestOutput& out, bool) { last = out; };
  ASSERT_TRUE(eng.add(r).is_ok());
  ASSERT_TRUE(eng.step().is_ok());
  EXPECT_GT(eng.stats().kv_blocks_used, 0);
  eng.abort(1);
  EXPECT_EQ(last.finish, engine::FinishReason::kAbort);
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
  EXPECT_FALSE(eng.has_work());
  engine::Request big;
  big.prompt = text_prompt(*m, std::string(400, 'a') + " b c d e f g h i j k l m n o p q r s t u v w x y z");
  const Status st = eng.add(big);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange) << st.to_string();
}

}  // namespace

namespace {

// The text streamed through on_update adds up to the final text when a request ends by length.
TEST(Engine, StreamedTextEqualsFinalTextAtLength) {
  auto m = tiny();
  ASSERT_TRUE(m);
  engine::Request r;
  r.prompt = text_prompt(*m, "Hello!");
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 9;
  r.sampling.ignore_eos = true;
  std::string streamed;
  r.on_update = [&](const std::string& d, const engine::RequestOutput&, bool) { streamed += d; };
  auto out = engine::generate_one(m, r);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->finish, engine::FinishReason::kLength);
  EXPECT_EQ(streamed, out->text);
  EXPECT_EQ(out->text, m->tokenizer.decode(out->token_ids, true));
}

// A request that outgrows a KV cache holding nothing else ends by length instead of stalling.
TEST(Engine, RequestOutgrowingTheCacheEndsByLength) {
  auto m = tiny();
  ASSERT_TRUE(m);
  engine::EngineOptions o;
  o.kv_blocks = 2;  // 32 token slots
  o.block_size = 16;
  engine::Engine eng(m, o);
  engine::Request r;
  r.prompt = text_prompt(*m, "Hello!");
  r.sampling.max_tokens = 100;
  r.sampling.ignore_eos = true;
  engine::RequestOutput last;
  r.on_update = [&](const std::string&, const engine::RequestOutput& out, bool) { last = out; };
  ASSERT_TRUE(eng.add(r).is_ok());
  int steps = 0;
  while (eng.has_work() && steps < 200) {
    ASSERT_TRUE(eng.step().is_ok());
    ++steps;
  }
  EXPECT_FALSE(eng.has_work());
  EXPECT_EQ(last.finish, engine::FinishReason::kLength);
  // 32 cached tokens, plus the last sampled token, whose K/V would need a 33rd slot.
  EXPECT_EQ(static_cast<int64_t>(r.prompt.ids.size() + last.token_ids.size()), 2 * 16 + 1);
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
}

}  // namespace

namespace {

// The engine over a decoder split over ranks (ModelBundle with --tensor-parallel / --expert-parallel on the CPU
// backend): the last-token logits of a few prompts within 1e-5 of the whole model's (f32 summation order) and the
// same greedy tokens, two ranks, experts split by columns or whole.
TEST(Engine, SplitDecoderGivesTheWholeModelsOutputs) {
  auto whole = tiny();
  ASSERT_TRUE(whole);
  const std::vector<std::vector<int32_t>> seqs = {{1, 2, 3, 4, 5}, {900, 17, 33}};
  const auto want = solo_logits(*whole, seqs);
  engine::Request r;
  r.prompt = text_prompt(*whole, "What is the capital of France?");
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 10;
  r.sampling.ignore_eos = true;
  auto ref = engine::generate_one(whole, r);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (bool ep : {false, true}) {
    SCOPED_TRACE(ep ? "expert parallel" : "tensor parallel");
    model::ParallelOptions par;
    par.tensor_parallel = 2;
    par.expert_parallel = ep;
    auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny",
                                       model::Backend::kCpu, {}, par);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto got = solo_logits(**m, seqs);
    for (size_t s = 0; s < seqs.size(); ++s) {
      float scale = 0.f, err = 0.f;
      for (size_t i = 0; i < want[s].size(); ++i) {
        scale = std::max(scale, std::fabs(want[s][i]));
        err = std::max(err, std::fabs(got[s][i] - want[s][i]));
      }
      EXPECT_LE(err, 1e-5f * scale) << "prompt " << s;
    }
    auto out = engine::generate_one(*m, r);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->token_ids, ref->token_ids);
  }
  model::ParallelOptions three;
  three.tensor_parallel = 3;
  auto bad = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny",
                                       model::Backend::kCpu, {}, three);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("do not split"), std::string::npos) << bad.status().to_string();
}

}  // namespace
