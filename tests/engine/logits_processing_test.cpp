// Logits processing (engine/sampler.h) against plain reference formulas on random logits and token histories:
// logit_bias, the min_tokens mask of EOS / stop ids (and ignore_eos), repetition_penalty (prompt and generated
// tokens; positive logits divided, negative multiplied), frequency and presence penalties (generated tokens). The
// processed row must equal the reference within 1e-5 (f32 arithmetic in another order), tokens that nothing touches
// must be bit-identical, and the token picked for a given uniform number must be the reference distribution's pick
// (greedy: its argmax; temperature: its id-order inverse CDF), so the distribution is exactly the formula's.
// Log-probabilities: the raw row's log-softmax, whatever the edits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine_test_util.h"

using namespace zest;
using namespace zest::engine;

namespace {

constexpr int64_t kVocab = 400;

std::vector<float> random_logits(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> v(kVocab);
  for (auto& x : v) x = d(rng);
  return v;
}

// The reference: the formulas written out over the whole row.
std::vector<float> reference(const std::vector<float>& logits, const SamplingParams& p, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& generated, const std::vector<int32_t>& eos) {
  std::vector<float> l = logits;
  std::map<int32_t, int> count;
  for (int32_t t : generated) ++count[t];
  const std::set<int32_t> in_prompt(prompt.begin(), prompt.end());
  for (const auto& [t, b] : p.logit_bias) l[t] += b;
  if (static_cast<int64_t>(generated.size()) < p.min_tokens) {
    for (int32_t t : p.stop_token_ids) l[t] = -INFINITY;
    if (!p.ignore_eos)
      for (int32_t t : eos) l[t] = -INFINITY;
  }
  for (int32_t t = 0; t < kVocab; ++t) {
    const int c = count.count(t) ? count[t] : 0;
    if (p.repetition_penalty != 1.0 && (c > 0 || in_prompt.count(t)))
      l[t] = l[t] > 0 ? static_cast<float>(l[t] / p.repetition_penalty) : static_cast<float>(l[t] * p.repetition_penalty);
    l[t] -= static_cast<float>(p.frequency_penalty * c + p.presence_penalty * (c > 0 ? 1 : 0));
  }
  return l;
}

std::vector<float> edited(const std::vector<float>& logits, const model::SampleRow& row) {
  std::vector<float> l = logits;
  for (const model::LogitEdit& e : row.edits) l[e.id] = model::apply_logit_edit(logits[e.id], e);
  return l;
}

// Random parameters: every processing field on or off at random.
SamplingParams random_params(std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  SamplingParams p;
  if (rng() % 2) p.presence_penalty = -2.0 + 4.0 * u(rng);
  if (rng() % 2) p.frequency_penalty = -2.0 + 4.0 * u(rng);
  if (rng() % 2) p.repetition_penalty = 0.3 + 2.0 * u(rng);
  if (rng() % 2) {
    std::set<int32_t> ids;
    for (int i = 0; i < 12; ++i) ids.insert(static_cast<int32_t>(rng() % kVocab));
    for (int32_t id : ids) p.logit_bias.emplace_back(id, static_cast<float>(-100.0 + 200.0 * u(rng)));
  }
  if (rng() % 2) p.min_tokens = rng() % 30;
  if (rng() % 3 == 0) p.stop_token_ids = {static_cast<int32_t>(rng() % kVocab), static_cast<int32_t>(rng() % kVocab)};
  p.ignore_eos = rng() % 4 == 0;
  return p;
}

TEST(LogitsProcessing, EditsEqualTheReferenceFormula) {
  std::mt19937 rng(41);
  const std::vector<int32_t> eos = {7, 399};
  int processed_rows = 0;
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const std::vector<float> logits = random_logits(1000 + trial);
    SamplingParams p = random_params(rng);
    std::vector<int32_t> prompt(5 + rng() % 60), generated(rng() % 40);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 50);  // a small range: repeats
    for (auto& t : generated) t = static_cast<int32_t>(20 + rng() % 60);
    Sampler s(p);
    s.set_context(prompt, eos);
    for (int32_t t : generated) s.accept(t);
    const model::SampleRow row = s.plan(kVocab);
    if (!has_logits_processing(p)) {
      EXPECT_TRUE(row.edits.empty());
    }
    for (size_t k = 1; k < row.edits.size(); ++k) ASSERT_LT(row.edits[k - 1].id, row.edits[k].id);
    const std::vector<float> got = edited(logits, row), want = reference(logits, p, prompt, generated, eos);
    for (int64_t t = 0; t < kVocab; ++t) {
      if (std::isinf(want[t])) {
        EXPECT_TRUE(std::isinf(got[t]) && got[t] < 0) << "token " << t << " must be masked";
      } else if (want[t] == logits[t]) {
        EXPECT_EQ(got[t], logits[t]) << "token " << t;
      } else {
        EXPECT_NEAR(got[t], want[t], 1e-5 * std::max(1.f, std::abs(want[t]))) << "token " << t;
      }
    }
    processed_rows += !row.edits.empty();
  }
  EXPECT_GT(processed_rows, 250);
}

// The pick for a given uniform number is the reference distribution's: greedy its argmax, temperature its id-order
// inverse CDF, top-k / top-p its sorted pick (the host summary of the reference row with the same plan).
TEST(LogitsProcessing, PickFollowsTheReferenceDistribution) {
  std::mt19937 rng(42);
  const std::vector<int32_t> eos = {3};
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const std::vector<float> logits = random_logits(5000 + trial);
    SamplingParams p = random_params(rng);
    p.presence_penalty = 1.5;  // always something to do
    const double temps[] = {0.0, 0.7, 1.3};
    p.temperature = temps[trial % 3];
    if (trial % 5 == 1) p.top_k = 20;
    if (trial % 5 == 2) p.top_p = 0.8;
    p.seed = trial;
    std::vector<int32_t> prompt(30), generated(rng() % 30);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
    for (auto& t : generated) t = static_cast<int32_t>(rng() % kVocab);
    Sampler s(p);
    s.set_context(prompt, eos);
    for (int32_t t : generated) s.accept(t);
    model::SampleRow row = s.plan(kVocab);
    const int32_t got = model::pick_from_summary(row, model::summarize_edited_row(logits.data(), kVocab, row), kVocab);
    const std::vector<float> want = reference(logits, p, prompt, generated, eos);
    model::SampleRow plain = row;
    plain.edits.clear();
    const int32_t ref = model::pick_from_summary(plain, model::summarize_row(want.data(), kVocab, plain), kVocab);
    EXPECT_EQ(got, ref);
    if (p.temperature == 0.0) {
      EXPECT_EQ(got, std::max_element(want.begin(), want.end()) - want.begin());
    }
  }
}

TEST(LogitsProcessing, MinTokensMasksEosAndStopIdsUntilReached) {
  std::vector<float> logits(kVocab, 0.f);
  logits[5] = 50.f;   // EOS, by far the most likely
  logits[9] = 40.f;   // a stop token id
  logits[11] = 1.f;
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 3;
  p.stop_token_ids = {9};
  Sampler s(p);
  s.set_context({1, 2}, {5});
  std::vector<int32_t> picks;
  for (int i = 0; i < 4; ++i) picks.push_back(s.sample(logits.data(), kVocab));
  EXPECT_EQ(picks, (std::vector<int32_t>{11, 11, 11, 5}));
  // ignore_eos: EOS is not a stop token, so min_tokens leaves it alone; stop_token_ids stay masked.
  p.ignore_eos = true;
  Sampler t(p);
  t.set_context({1, 2}, {5});
  EXPECT_EQ(t.sample(logits.data(), kVocab), 5);
  logits[5] = 0.f;
  EXPECT_EQ(t.sample(logits.data(), kVocab), 11);
}

TEST(LogitsProcessing, LogitBiasBoundsDecideGreedy) {
  const std::vector<float> logits = random_logits(7);
  SamplingParams p;
  p.temperature = 0;
  const int32_t top = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const int32_t other = (top + 17) % kVocab;
  p.logit_bias = {{top, -100.f}, {other, 100.f}};
  Sampler s(p);
  s.set_context({}, {});
  EXPECT_EQ(s.sample(logits.data(), kVocab), other);
}

// Log-probabilities are those of the raw row (log-softmax at temperature 1), whatever the edits and the temperature;
// the sampled token's raw logit is found whether the row edited it or not, in every summary kind.
TEST(LogitsProcessing, LogprobsAreTheRawLogSoftmax) {
  std::mt19937 rng(43);
  for (int trial = 0; trial < 60; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const std::vector<float> logits = random_logits(9000 + trial);
    SamplingParams p = random_params(rng);
    const double temps[] = {0.0, 0.8, 2.0};
    p.temperature = temps[trial % 3];
    if (trial % 4 == 1) p.top_k = 40;
    if (trial % 4 == 2) p.top_k = 2000;  // the whole row
    p.logprobs = true;
    p.top_logprobs = static_cast<int32_t>(trial % 21);
    p.seed = trial;
    Sampler s(p);
    std::vector<int32_t> prompt(20);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
    s.set_context(prompt, {1});
    s.accept(static_cast<int32_t>(rng() % kVocab));
    const model::SampleRow row = s.plan(kVocab);
    ASSERT_EQ(row.logprobs, p.top_logprobs);
    const model::SampleResult r = model::summarize_edited_row(logits.data(), kVocab, row);
    const int32_t tok = model::pick_from_summary(row, r, kVocab);
    ASSERT_GE(tok, 0);
    double z = 0;
    for (float l : logits) z += std::exp(static_cast<double>(l));
    const double lse = std::log(z);
    EXPECT_NEAR(r.lse, lse, 1e-9 * std::abs(lse) + 1e-12);
    EXPECT_EQ(model::raw_logit_of(row, r, tok, kVocab), logits[tok]);
    // The top list: the largest raw logits, descending.
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    ASSERT_EQ(r.top_ids.size(), static_cast<size_t>(p.top_logprobs));
    for (int k = 0; k < p.top_logprobs; ++k) {
      EXPECT_EQ(r.top_logits[k], sorted[k]);
      EXPECT_EQ(logits[r.top_ids[k]], sorted[k]);
    }
  }
}

// The engine on the tiny fixture (CPU) with every processing field on, greedy: each generated token is the argmax of
// the reference formula applied to the model's logits of the sequence so far (a fresh prefill per step), and its
// logprob is the log-softmax of those raw logits (within 1e-4: the decode step and the prefill sum in other orders).
TEST(LogitsProcessing, EngineFollowsTheFormulaOnTheModelsLogits) {
  auto m = zest::testing::tiny();
  ASSERT_TRUE(m);
  const engine::Prompt prompt = zest::testing::text_prompt(*m, "Count: one two one two one two");
  const int64_t V = m->config.text.vocab_size;
  engine::Request r;
  r.prompt = prompt;
  SamplingParams& p = r.sampling;
  p.temperature = 0;
  p.max_tokens = 10;
  p.repetition_penalty = 1.4;
  p.frequency_penalty = 0.6;
  p.presence_penalty = 0.3;
  p.min_tokens = 6;
  p.logprobs = true;
  p.top_logprobs = 4;
  p.logit_bias = {{prompt.ids[3], 2.5f}, {prompt.ids[5], -1.f}};
  auto out = engine::generate_one(m, r);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_GE(out->token_ids.size(), 6u);
  ASSERT_EQ(out->logprobs.size(), out->token_ids.size());
  const std::vector<int32_t> eos = m->eos_ids();
  std::vector<int32_t> seq = prompt.ids, generated;
  for (size_t i = 0; i < out->token_ids.size(); ++i) {
    SCOPED_TRACE("token " + std::to_string(i));
    const int64_t n = static_cast<int64_t>(seq.size());
    auto cache = *m->decoder().allocate_cache(64, 16);
    std::vector<int32_t> table;
    ASSERT_TRUE(cache.reserve(table, n).is_ok());
    model::ForwardBatch b;
    b.tokens = seq;
    for (int a = 0; a < 3; ++a)
      for (int64_t k = 0; k < n; ++k) b.positions.push_back(static_cast<int32_t>(k));
    b.seqs.push_back({&table, 0, n, false, true});
    auto l = m->decoder().forward(b, cache);
    ASSERT_TRUE(l.ok());
    const std::vector<float> raw(l->data<float>(), l->data<float>() + V);
    std::vector<float> want(V);
    {
      // reference() is written for kVocab; the same formula over the model's vocabulary.
      std::map<int32_t, int> count;
      for (int32_t t : generated) ++count[t];
      const std::set<int32_t> in_prompt(prompt.ids.begin(), prompt.ids.end());
      want = raw;
      for (const auto& [t, bias] : p.logit_bias) want[t] += bias;
      if (static_cast<int64_t>(generated.size()) < p.min_tokens)
        for (int32_t t : eos) want[t] = -INFINITY;
      for (int32_t t = 0; t < V; ++t) {
        const int c = count.count(t) ? count[t] : 0;
        if (c > 0 || in_prompt.count(t))
          want[t] = want[t] > 0 ? static_cast<float>(want[t] / p.repetition_penalty)
                                : static_cast<float>(want[t] * p.repetition_penalty);
        want[t] -= static_cast<float>(p.frequency_penalty * c + p.presence_penalty * (c > 0 ? 1 : 0));
      }
    }
    const int32_t tok = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
    ASSERT_EQ(out->token_ids[i], tok);
    double z = 0;
    const float mx = *std::max_element(raw.begin(), raw.end());
    for (float x : raw) z += std::exp(static_cast<double>(x) - mx);
    const double lse = mx + std::log(z);
    const engine::TokenLogprob& lp = out->logprobs[i];
    EXPECT_EQ(lp.token, tok);
    EXPECT_NEAR(lp.logprob, raw[tok] - lse, 1e-4);
    ASSERT_EQ(lp.top.size(), 4u);
    EXPECT_EQ(lp.top[0].first, std::max_element(raw.begin(), raw.end()) - raw.begin());
    for (const auto& [id, v] : lp.top) EXPECT_NEAR(v, raw[id] - lse, 1e-4);
    for (size_t k = 1; k < lp.top.size(); ++k) EXPECT_GE(lp.top[k - 1].second, lp.top[k].second);
    seq.push_back(tok);
    generated.push_back(tok);
  }  // The processing changed what greedy decoding gives (else the test would show nothing).
  engine::Request plain;
  plain.prompt = prompt;
  plain.sampling.temperature = 0;
  plain.sampling.max_tokens = 10;
  auto base = engine::generate_one(m, plain);
  ASSERT_TRUE(base.ok());
  EXPECT_NE(base->token_ids, out->token_ids);
  EXPECT_TRUE(base->logprobs.empty());
}

}  // namespace
