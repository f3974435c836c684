// Sampler: greedy is argmax; seeded sampling is reproducible; top-k / top-p never pick outside their
// sets; empirical frequencies follow softmax(logits / T) within a stated tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/sampler.h"

using namespace zest::engine;

namespace {

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Sampler, GreedyIsArgmax) {
  const auto l = random_logits(1000, 1);
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(l.data(), 1000), std::max_element(l.begin(), l.end()) - l.begin());
}

TEST(Sampler, SeededIsReproducible) {
  const auto l = random_logits(500, 2);
  SamplingParams p;
  p.temperature = 0.8;
  p.seed = 42;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(l.data(), 500), b.sample(l.data(), 500));
}

TEST(Sampler, TopKAndTopPStayInTheirSets) {
  const auto l = random_logits(300, 3);
  std::vector<int> order(300);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 5;
  p.seed = 1;
  Sampler s(p);
  std::set<int> top5(order.begin(), order.begin() + 5);
  for (int i = 0; i < 200; ++i) EXPECT_TRUE(top5.count(s.sample(l.data(), 300)));
  // top-p: the smallest prefix of the sorted distribution whose mass reaches p.
  SamplingParams q;
  q.temperature = 1.0;
  q.top_p = 0.5;
  q.seed = 2;
  double mx = l[order[0]], z = 0;
  for (float x : l) z += std::exp(x - mx);
  double cum = 0;
  std::set<int> nucleus;
  for (int id : order) {
    nucleus.insert(id);
    cum += std::exp(l[id] - mx) / z;
    if (cum >= 0.5) break;
  }
  Sampler t(q);
  for (int i = 0; i < 200; ++i) EXPECT_TRUE(nucleus.count(t.sample(l.data(), 300)));
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  const std::vector<float> l = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0.7;
  p.seed = 9;
  Sampler s(p);
  std::map<int, int> count;
  const int N = 40000;
  for (int i = 0; i < N; ++i) ++count[s.sample(l.data(), 5)];
  double z = 0;
  for (float x : l) z += std::exp(x / 0.7);
  for (int i = 0; i < 5; ++i) {
    const double expect = std::exp(l[i] / 0.7) / z;
    // 5 standard deviations of a binomial proportion.
    const double tol = 5 * std::sqrt(expect * (1 - expect) / N);
    EXPECT_NEAR(static_cast<double>(count[i]) / N, expect, tol) << "token " << i;
  }
}

}  // namespace

// ---- summaries (model/sampling.h) against the full-sort sampler ----------------------------------------

namespace summary {

using zest::model::SampleMode;
using zest::model::SampleResult;
using zest::model::SampleRow;

// The full-logit sampler as it was before summaries: every kept candidate sorted by logit (descending, ties to
// the lower id), cut by top-k, softmax over the kept set, top-p, then the inverse CDF in that order at u * total.
int32_t full_sort_pick(const std::vector<float>& l, double temperature, int64_t top_k, double top_p, double u) {
  const int64_t vocab = static_cast<int64_t>(l.size());
  if (temperature <= 0.0 || top_k == 1) return argmax(l.data(), vocab);
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  const int64_t k = top_k > 0 ? std::min<int64_t>(top_k, vocab) : vocab;
  const double mx = l[idx[0]];
  std::vector<double> prob(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += prob[i] = std::exp((l[idx[i]] - mx) * (1.0 / temperature));
  int64_t keep = k;
  if (top_p < 1.0) {
    double cum = 0;
    for (int64_t i = 0; i < k; ++i) {
      cum += prob[i] / sum;
      if (cum >= top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += prob[i];
  double r = u * total;
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<float> logits_with_ties(int n, uint32_t seed, bool ties) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = ties ? std::round(d(rng) * 2.f) / 2.f : d(rng);
  return v;
}

struct Params {
  double t;
  int64_t k;
  double p;
};

TEST(SamplerSummary, PickEqualsFullSortForGreedyTopKTopP) {
  const int sizes[] = {1, 2, 7, 50, 1000, 1024, 1025, 3001};
  const Params params[] = {{0.0, 0, 1.0},   {0.8, 1, 1.0},   {1.0, 2, 1.0},    {0.7, 5, 1.0},   {1.3, 50, 1.0},
                           {1.0, 1024, 1.0}, {1.0, 1500, 1.0}, {1.0, 0, 0.3},   {0.5, 0, 0.9},   {2.0, 0, 0.999},
                           {1.0, 40, 0.8},  {0.9, 2000, 0.95}, {1.0, 1024, 0.5}, {3.0, 0, 0.9999}};
  int fallbacks = 0, candidate_rows = 0;
  for (int seed = 0; seed < 24; ++seed) {
    std::mt19937_64 urng(1000 + seed);
    std::uniform_real_distribution<double> uni(0.0, 1.0);
    for (int n : sizes) {
      const auto l = logits_with_ties(n, static_cast<uint32_t>(seed * 131 + n), seed % 2 == 1);
      for (const Params& pp : params) {
        SampleRow row = zest::model::plan_sample_row(pp.t, pp.k, pp.p, n);
        if (row.mode == SampleMode::kTemperature) continue;
        row.u = uni(urng);
        const SampleResult s = zest::model::summarize_row(l.data(), n, row);
        if (row.mode == SampleMode::kCandidates) {
          ++candidate_rows;
          if (s.full) ++fallbacks;
          else EXPECT_LE(s.ids.size(), static_cast<size_t>(zest::model::kMaxSampleCandidates));
        }
        EXPECT_EQ(zest::model::pick_from_summary(row, s, n), full_sort_pick(l, pp.t, pp.k, pp.p, row.u))
            << "seed " << seed << " vocab " << n << " T " << pp.t << " top_k " << pp.k << " top_p " << pp.p;
      }
    }
  }
  // Both ways through the candidates were taken: decided by them, and the whole row.
  EXPECT_GT(candidate_rows - fallbacks, 100);
  EXPECT_GT(fallbacks, 0);
}

TEST(SamplerSummary, SeededSequenceEqualsFullSortSampler) {
  // The Sampler draws one uniform per sampled token from the request's generator, as the full-sort sampler
  // did with uniform_real_distribution(0, total): the same seeds give the same tokens.
  const auto l = logits_with_ties(700, 77, false);
  for (const Params& pp : {Params{0.9, 20, 1.0}, Params{1.1, 0, 0.8}, Params{1.0, 100, 0.9}, Params{0.0, 0, 1.0}}) {
    SamplingParams p;
    p.temperature = pp.t;
    p.top_k = pp.k;
    p.top_p = pp.p;
    p.seed = 5;
    Sampler s(p);
    std::mt19937_64 rng(5);
    for (int i = 0; i < 100; ++i) {
      double u = 0;
      if (pp.t > 0 && pp.k != 1) u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      ASSERT_EQ(s.sample(l.data(), 700), full_sort_pick(l, pp.t, pp.k, pp.p, u)) << "token " << i;
    }
  }
}

TEST(SamplerSummary, TemperatureWalkInvertsTheIdOrderCdf) {
  for (int seed = 0; seed < 40; ++seed) {
    const int n = 1 + seed * 37;
    const auto l = logits_with_ties(n, static_cast<uint32_t>(seed), seed % 3 == 0);
    const double t = 0.3 + 0.1 * (seed % 10);
    SampleRow row = zest::model::plan_sample_row(t, 0, 1.0, n);
    ASSERT_EQ(row.mode, SampleMode::kTemperature);
    std::mt19937_64 urng(seed);
    row.u = std::uniform_real_distribution<double>(0.0, 1.0)(urng);
    const SampleResult s = zest::model::summarize_row(l.data(), n, row);
    // Independent prefix sums: the token's interval of the CDF holds u * Z.
    const double mx = *std::max_element(l.begin(), l.end());
    std::vector<double> w(n);
    double z = 0;
    for (int i = 0; i < n; ++i) z += w[i] = std::exp((l[i] - mx) / t);
    EXPECT_NEAR(s.z, z, 1e-9 * z);
    EXPECT_EQ(s.max, static_cast<float>(mx));
    double before = 0;
    for (int i = 0; i < s.token; ++i) before += w[i];
    EXPECT_LE(before, row.u * z * (1 + 1e-12)) << "seed " << seed;
    EXPECT_GT(before + w[s.token], row.u * z * (1 - 1e-12)) << "seed " << seed;
    EXPECT_EQ(zest::model::pick_from_summary(row, s, n), s.token);
  }
}

}  // namespace summary
