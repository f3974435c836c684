// Sampler: greedy is argmax; seeded sampling is reproducible; top-k / top-p never pick outside their
// sets; empirical frequencies follow softmax(logits / T) within a stated tolerance.
#include <gtest/gtest.h>

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
