// Automatic prefix caching: the refcounted block allocator (sharing, LRU eviction of cached blocks, never a held
// block), and the engine on the tiny qwen3_moe fixture: the same requests with and without the cache give the
// same greedy tokens and the same log-probabilities bit for bit, a request sharing a prefix reports cached tokens
// and runs fewer tokens, requests with one prompt added together compute it once, and nothing leaks under eviction
// pressure or cancellation.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "engine/chat_request.h"
#include "engine/engine.h"
#include "engine_test_util.h"

using namespace zest;
using namespace zest::testing;

namespace {

model::PagedKVCache small_cache(int64_t blocks) { return model::PagedKVCache(1, blocks, 4, 1, 2); }

TEST(BlockManager, SharedBlocksAreFreedByTheirLastOwner) {
  auto c = small_cache(6);
  std::vector<int32_t> a;
  ASSERT_TRUE(c.reserve(a, 10).is_ok());  // 3 blocks
  ASSERT_EQ(a.size(), 3u);
  c.register_block(a[0], 100);
  c.register_block(a[1], 101);
  std::vector<int32_t> b;
  const uint64_t hs[] = {100, 101, 102};
  EXPECT_EQ(c.match_prefix(hs, 3, b), 2);  // 102 is not registered
  EXPECT_EQ(b, (std::vector<int32_t>{a[0], a[1]}));
  EXPECT_EQ(c.ref_count(a[0]), 2);
  EXPECT_EQ(c.used_blocks(), 3);
  ASSERT_TRUE(c.check({&a, &b}).is_ok());
  const std::vector<int32_t> a_copy = a;
  c.release(a);
  // b still holds the two shared blocks; a's private third block is free again.
  EXPECT_EQ(c.used_blocks(), 2);
  EXPECT_EQ(c.ref_count(a_copy[0]), 1);
  EXPECT_EQ(c.evictable_blocks(), 0);
  ASSERT_TRUE(c.check({&b}).is_ok());
  c.release(b);
  EXPECT_EQ(c.used_blocks(), 0);
  EXPECT_EQ(c.evictable_blocks(), 2);  // cached, nobody holds them
  EXPECT_EQ(c.cached_blocks(), 2);
  ASSERT_TRUE(c.check({}).is_ok());
  // A later sequence takes them back.
  std::vector<int32_t> d;
  EXPECT_EQ(c.match_prefix(hs, 3, d), 2);
  EXPECT_EQ(d[0], a_copy[0]);
  EXPECT_EQ(c.evictable_blocks(), 0);
  ASSERT_TRUE(c.check({&d}).is_ok());
  // The allocator needs every other block: the 4 free ones come first, then nothing (d holds the cached pair).
  std::vector<int32_t> e;
  ASSERT_TRUE(c.reserve(e, 16).is_ok());
  EXPECT_FALSE(c.reserve(e, 20).is_ok());
  for (int32_t x : e) EXPECT_TRUE(x != d[0] && x != d[1]);
  ASSERT_TRUE(c.check({&d, &e}).is_ok());
  c.release(e);
  c.release(d);
  EXPECT_EQ(c.used_blocks(), 0);
}

TEST(BlockManager, CachedBlocksAreEvictedOnlyWhenTheFreeListIsEmptyOldestFirst) {
  auto c = small_cache(4);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(c.reserve(a, 4).is_ok());
  ASSERT_TRUE(c.reserve(b, 4).is_ok());
  c.register_block(a[0], 1);
  c.register_block(b[0], 2);
  const int32_t blk_a = a[0], blk_b = b[0];
  c.release(a);  // released first: evicted first
  c.release(b);
  EXPECT_EQ(c.free_blocks(), 4);
  std::vector<int32_t> x;
  ASSERT_TRUE(c.reserve(x, 8).is_ok());  // the two free blocks: nothing evicted
  EXPECT_EQ(c.cached_blocks(), 2);
  ASSERT_TRUE(c.reserve(x, 12).is_ok());  // one more: the oldest cached block goes
  EXPECT_EQ(x.back(), blk_a);
  EXPECT_EQ(c.cached_blocks(), 1);
  std::vector<int32_t> y;
  const uint64_t h1 = 1, h2 = 2;
  EXPECT_EQ(c.match_prefix(&h1, 1, y), 0);  // its hash is gone with it
  EXPECT_EQ(c.match_prefix(&h2, 1, y), 1);
  EXPECT_EQ(y[0], blk_b);
  // Registering a hash twice keeps the first block; registering a registered block again is a no-op.
  c.register_block(x[0], 2);
  std::vector<int32_t> z;
  EXPECT_EQ(c.match_prefix(&h2, 1, z), 1);
  EXPECT_EQ(z[0], blk_b);
  ASSERT_TRUE(c.check({&x, &y, &z}).is_ok());
  c.release(x);
  c.release(y);
  c.release(z);
  EXPECT_EQ(c.used_blocks(), 0);
  ASSERT_TRUE(c.check({}).is_ok());
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<engine::TokenLogprob> logprobs;
  int64_t cached = 0;
};

engine::Request greedy_request(int64_t id, engine::Prompt p, int64_t max_tokens, std::map<int64_t, Outcome>& out) {
  engine::Request r;
  r.id = id;
  r.prompt = std::move(p);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 5;
  r.on_update = [&out, id](const std::string&, const engine::RequestOutput& o, bool done) {
    if (done) out[id] = {o.token_ids, o.logprobs, o.cached_tokens};
  };
  return r;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    // Bit for bit: the cached K/V are the very values the request would have computed.
    EXPECT_EQ(std::memcmp(&a.logprobs[i].logprob, &b.logprobs[i].logprob, sizeof(float)), 0) << what << " pos " << i;
    ASSERT_EQ(a.logprobs[i].top.size(), b.logprobs[i].top.size());
    for (size_t k = 0; k < a.logprobs[i].top.size(); ++k) {
      EXPECT_EQ(a.logprobs[i].top[k].first, b.logprobs[i].top[k].first) << what;
      EXPECT_EQ(std::memcmp(&a.logprobs[i].top[k].second, &b.logprobs[i].top[k].second, sizeof(float)), 0) << what;
    }
  }
}

std::vector<int32_t> random_ids(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> tok(0, 151000);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = tok(rng);
  return v;
}

// Runs the prompts one after another (each to its end before the next is added) on one engine.
std::map<int64_t, Outcome> run_in_turn(const std::vector<std::vector<int32_t>>& prompts, engine::EngineOptions o,
                                       int64_t max_tokens, engine::EngineStats* st = nullptr) {
  engine::Engine eng(tiny(), o);
  std::map<int64_t, Outcome> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(eng.add(greedy_request(static_cast<int64_t>(i), engine::token_prompt(prompts[i]), max_tokens, out)).is_ok());
    while (eng.has_work()) {
      EXPECT_TRUE(eng.step().is_ok());
      EXPECT_TRUE(eng.check_blocks().is_ok()) << eng.check_blocks().to_string();
    }
  }
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
  if (st) *st = eng.stats();
  return out;
}

TEST(PrefixCache, SharedPrefixIsCachedAndOutputsAreBitIdentical) {
  ASSERT_TRUE(tiny());
  std::mt19937 rng(11);
  const auto prefix = random_ids(rng, 70);  // 4 full blocks of 16 and 6 tokens
  std::vector<std::vector<int32_t>> prompts;
  for (int tail : {5, 9}) {
    auto p = prefix;
    auto t = random_ids(rng, tail);
    p.insert(p.end(), t.begin(), t.end());
    prompts.push_back(p);
  }
  prompts.push_back(prefix);  // the first request's prompt is a prefix of this one's context
  prompts.push_back(std::vector<int32_t>(prefix.begin(), prefix.begin() + 64));  // exactly 4 cached blocks
  engine::EngineOptions off;
  off.prefix_caching = false;
  engine::EngineOptions on;
  engine::EngineStats st_off, st_on;
  const auto ref = run_in_turn(prompts, off, 6, &st_off);
  const auto got = run_in_turn(prompts, on, 6, &st_on);
  for (size_t i = 0; i < prompts.size(); ++i) expect_same(got.at(i), ref.at(i), "prompt " + std::to_string(i));
  for (const auto& [i, o] : ref) EXPECT_EQ(o.cached, 0);
  EXPECT_EQ(got.at(0).cached, 0);
  EXPECT_EQ(got.at(1).cached, 64);  // the 4 full blocks of the shared prefix
  EXPECT_EQ(got.at(2).cached, 64);
  // A prompt made only of cached blocks recomputes its last block (its last token's logits are sampled).
  EXPECT_EQ(got.at(3).cached, 48);
  EXPECT_EQ(st_off.tokens_computed - st_on.tokens_computed, 64 + 64 + 48);
  EXPECT_EQ(st_on.prefix_cache_hits, 64 + 64 + 48);
  int64_t queried = 0;
  for (const auto& p : prompts) queried += static_cast<int64_t>(p.size());
  EXPECT_EQ(st_on.prefix_cache_queries, queried);
  EXPECT_EQ(st_off.prefix_cache_queries, 0);
  EXPECT_GT(st_on.prefix_cache_blocks, 0);
}

// Requests with one prompt added together (the n choices of a request): the first computes the prompt's blocks,
// the others wait a step for them and take them from the cache, with the same tokens and log-probabilities as
// requests run alone; a request behind them with another prompt is admitted meanwhile.
TEST(PrefixCache, RequestsAddedTogetherComputeTheSharedPromptOnce) {
  ASSERT_TRUE(tiny());
  std::mt19937 rng(12);
  const auto prompt = random_ids(rng, 70);  // 4 full blocks of 16 and 6 tokens
  engine::EngineOptions off;
  off.prefix_caching = false;
  engine::EngineStats st_off;
  const auto ref = run_in_turn({prompt}, off, 6, &st_off);
  engine::Engine eng(tiny(), engine::EngineOptions{});
  std::map<int64_t, Outcome> got;
  for (int64_t i = 0; i < 3; ++i)
    ASSERT_TRUE(eng.add(greedy_request(i, engine::token_prompt(prompt), 6, got)).is_ok());
  // A request with another prompt, added after them, is not held up by their wait.
  const auto other = random_ids(rng, 20);
  ASSERT_TRUE(eng.add(greedy_request(3, engine::token_prompt(other), 6, got)).is_ok());
  ASSERT_TRUE(eng.step().is_ok());
  EXPECT_EQ(eng.stats().running, 2);  // requests 0 and 3
  EXPECT_EQ(eng.stats().waiting, 2);  // 1 and 2 wait for request 0's blocks
  while (eng.has_work()) {
    ASSERT_TRUE(eng.step().is_ok());
    ASSERT_TRUE(eng.check_blocks().is_ok()) << eng.check_blocks().to_string();
  }
  ASSERT_EQ(got.size(), 4u);
  for (int64_t i = 0; i < 3; ++i) expect_same(got.at(i), ref.at(0), "request " + std::to_string(i));
  EXPECT_EQ(got.at(0).cached, 0);
  EXPECT_EQ(got.at(1).cached, 64);
  EXPECT_EQ(got.at(2).cached, 64);
  const engine::EngineStats st = eng.stats();
  EXPECT_EQ(st.tokens_computed, 3 * st_off.tokens_computed - 2 * 64 + 20 + 5);  // + request 3's prompt and 5 steps
  EXPECT_GE(st.prefix_waits, 1);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

// prompt_logprobs: every prompt token from the second on gets the log-softmax of the logits at the position before it
// (against one whole-prompt forward with every row's logits: the engine runs the prompt in chunks of 256), its rank
// and the top alternatives; the request takes no blocks from the prefix cache (each position needs its logits), and
// later requests still take its blocks.
TEST(PrefixCache, PromptLogprobsAreTheLogSoftmaxOfEveryPosition) {
  ASSERT_TRUE(tiny());
  std::mt19937 rng(14);
  const auto prompt = random_ids(rng, 300);
  const int64_t n = static_cast<int64_t>(prompt.size());
  const model::TextDecoder& dec = tiny()->decoder();
  const int64_t V = dec.config().vocab_size;
  auto cache = dec.allocate_cache(32, 16);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> table;
  ASSERT_TRUE(cache->reserve(table, n).is_ok());
  model::ForwardBatch b;
  b.tokens = prompt;
  b.positions.resize(3 * n);
  for (int a = 0; a < 3; ++a)
    for (int64_t i = 0; i < n; ++i) b.positions[a * n + i] = static_cast<int32_t>(i);
  b.seqs.push_back({&table, 0, n, true, true});
  auto ref = dec.forward(b, *cache);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_EQ(ref->dim(0), n);

  engine::Engine eng(tiny(), engine::EngineOptions{});
  std::map<int64_t, Outcome> plain;
  engine::RequestOutput got;
  ASSERT_TRUE(eng.add(greedy_request(0, engine::token_prompt(prompt), 2, plain)).is_ok());
  engine::Request r = greedy_request(1, engine::token_prompt(prompt), 2, plain);
  r.sampling.prompt_logprobs = 3;
  r.on_update = [&got](const std::string&, const engine::RequestOutput& o, bool done) {
    if (done) got = o;
  };
  while (eng.has_work()) ASSERT_TRUE(eng.step().is_ok());
  ASSERT_TRUE(eng.add(std::move(r)).is_ok());
  while (eng.has_work()) ASSERT_TRUE(eng.step().is_ok());
  std::map<int64_t, Outcome> later;
  ASSERT_TRUE(eng.add(greedy_request(2, engine::token_prompt(prompt), 2, later)).is_ok());
  while (eng.has_work()) ASSERT_TRUE(eng.step().is_ok());
  EXPECT_EQ(got.cached_tokens, 0);
  EXPECT_EQ(later.at(2).cached, 288);
  EXPECT_EQ(got.token_ids, plain.at(0).tokens);
  ASSERT_EQ(static_cast<int64_t>(got.prompt_logprobs.size()), n - 1);
  for (int64_t p = 0; p + 1 < n; ++p) {
    SCOPED_TRACE("position " + std::to_string(p));
    const float* row = ref->data<float>() + p * V;
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]));
    const double lse = std::log(z);
    const engine::TokenLogprob& lp = got.prompt_logprobs[p];
    const int32_t tok = prompt[p + 1];
    ASSERT_EQ(lp.token, tok);
    EXPECT_NEAR(lp.logprob, row[tok] - lse, 1e-4);
    // Rank and top ids where no other logit is within 1e-3 (the chunked prefill sums in another order).
    int32_t rank = 1, near = 0;
    float mx = row[0];
    for (int64_t v = 0; v < V; ++v) {
      mx = std::max(mx, row[v]);
      rank += row[v] > row[tok];
      near += v != tok && std::abs(row[v] - row[tok]) < 1e-3f;
    }
    if (near == 0) {
      EXPECT_EQ(lp.rank, rank);
    }
    ASSERT_EQ(lp.top.size(), 3u);
    for (const auto& [id, v] : lp.top) EXPECT_NEAR(v, row[id] - lse, 1e-4);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
    EXPECT_GE(lp.top[0].second + 1e-4, lp.logprob);
    EXPECT_NEAR(lp.top[0].second, mx - lse, 1e-4);
  }
}

TEST(PrefixCache, ChatTurnsReuseTheEarlierTurn) {
  auto m = tiny();
  ASSERT_TRUE(m);
  // The second turn re-sends the first turn's messages: its prompt starts with the first turn's prompt.
  nlohmann::json msgs = {{{"role", "system"}, {"content", std::string(300, 'x') + " be brief."}},
                         {{"role", "user"}, {"content", "What does a prefix cache keep between turns?"}}};
  auto first = engine::parse_chat_request({{"messages", msgs}}, *m);
  ASSERT_TRUE(first.ok());
  auto p1 = engine::build_prompt(*m, *first, {});
  ASSERT_TRUE(p1.ok());
  msgs.push_back({{"role", "assistant"}, {"content", "Full blocks."}});
  msgs.push_back({{"role", "user"}, {"content", "And what does it evict?"}});
  auto second = engine::parse_chat_request({{"messages", msgs}}, *m);
  ASSERT_TRUE(second.ok());
  auto p2 = engine::build_prompt(*m, *second, {});
  ASSERT_TRUE(p2.ok());
  const auto ref = run_in_turn({p1->ids, p2->ids}, [] { engine::EngineOptions o; o.prefix_caching = false; return o; }(), 4);
  const auto got = run_in_turn({p1->ids, p2->ids}, {}, 4);
  expect_same(got.at(0), ref.at(0), "turn 1");
  expect_same(got.at(1), ref.at(1), "turn 2");
  // Every full block the second prompt shares with the first turn's context (prompt + generated tokens): all of
  // the first prompt's full blocks at least.
  std::vector<int32_t> ctx = p1->ids;
  ctx.insert(ctx.end(), got.at(0).tokens.begin(), got.at(0).tokens.end());
  size_t common = 0;
  while (common < ctx.size() && common < p2->ids.size() && ctx[common] == p2->ids[common]) ++common;
  ASSERT_GE(common, p1->ids.size());
  EXPECT_EQ(got.at(1).cached, static_cast<int64_t>(common / 16 * 16));
  EXPECT_GE(got.at(1).cached, static_cast<int64_t>(p1->ids.size() / 16 * 16));
}

TEST(PrefixCache, EvictionUnderPressureNeverFreesAHeldBlock) {
  ASSERT_TRUE(tiny());
  std::mt19937 rng(5);
  // Many prompts from a few shared stems, all in flight at once, in a cache far too small for them: admission
  // takes cached blocks, preemption and eviction run all the time.
  std::vector<std::vector<int32_t>> stems = {random_ids(rng, 40), random_ids(rng, 33), random_ids(rng, 20)};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 18; ++i) {
    auto p = stems[i % 3];
    p.resize(p.size() - (i % 4) * 3);
    auto t = random_ids(rng, 1 + i % 5);
    p.insert(p.end(), t.begin(), t.end());
    prompts.push_back(p);
  }
  auto run = [&](bool caching, engine::EngineStats* st) {
    engine::EngineOptions o;
    o.prefix_caching = caching;
    o.kv_blocks = 12;
    o.max_batched_tokens = 24;
    engine::Engine eng(tiny(), o);
    std::map<int64_t, Outcome> out;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_TRUE(eng.add(greedy_request(static_cast<int64_t>(i), engine::token_prompt(prompts[i]), 12, out)).is_ok());
    int steps = 0;
    while (eng.has_work() && steps++ < 5000) {
      EXPECT_TRUE(eng.step().is_ok());
      const Status c = eng.check_blocks();
      EXPECT_TRUE(c.is_ok()) << c.to_string();
      if (!c.is_ok()) break;
    }
    EXPECT_FALSE(eng.has_work());
    *st = eng.stats();
    return out;
  };
  engine::EngineStats st_off, st_on;
  const auto ref = run(false, &st_off);
  const auto got = run(true, &st_on);
  ASSERT_EQ(got.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) expect_same(got.at(i), ref.at(i), "prompt " + std::to_string(i));
  EXPECT_EQ(st_on.kv_blocks_used, 0);
  EXPECT_GT(st_on.prefix_cache_hits, 0);
  EXPECT_GT(st_on.preemptions, 0);
  EXPECT_LT(st_on.tokens_computed, st_off.tokens_computed);
}

TEST(PrefixCache, CancelledMidPrefillLeaksNothingAndItsBlocksStayValid) {
  ASSERT_TRUE(tiny());
  std::mt19937 rng(3);
  const auto ids = random_ids(rng, 80);
  engine::EngineOptions o;
  o.max_batched_tokens = 32;  // the prefill takes three steps
  engine::Engine eng(tiny(), o);
  std::map<int64_t, Outcome> out;
  ASSERT_TRUE(eng.add(greedy_request(1, engine::token_prompt(ids), 5, out)).is_ok());
  ASSERT_TRUE(eng.step().is_ok());
  ASSERT_TRUE(eng.step().is_ok());  // 64 tokens computed: 4 full blocks registered
  EXPECT_GT(eng.stats().kv_blocks_used, 0);
  eng.abort(1);
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
  EXPECT_EQ(eng.stats().prefix_cache_blocks, 4);
  EXPECT_TRUE(eng.check_blocks().is_ok());
  // The same prompt again starts from the cancelled request's blocks and ends as a fresh engine would.
  ASSERT_TRUE(eng.add(greedy_request(2, engine::token_prompt(ids), 5, out)).is_ok());
  while (eng.has_work()) ASSERT_TRUE(eng.step().is_ok());
  EXPECT_EQ(out.at(2).cached, 64);
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);
  engine::EngineOptions off;
  off.prefix_caching = false;
  const auto ref = run_in_turn({ids}, off, 5);
  expect_same(out.at(2), ref.at(0), "after cancel");
}

}  // namespace
