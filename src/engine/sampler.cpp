#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace zest::engine {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed ? *p.seed : std::random_device{}()) {}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature <= 0.0 || p_.top_k == 1) return argmax(logits, vocab);
  // Candidates sorted by logit (descending, ties to lower id), cut by top-k, then softmax + top-p.
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = p_.top_k > 0 ? std::min<int64_t>(p_.top_k, vocab) : vocab;
  auto cmp = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  idx.resize(k);
  const double inv_t = 1.0 / p_.temperature;
  const double mx = logits[idx[0]];
  std::vector<double> prob(k);
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) * inv_t);
  int64_t keep = k;
  if (p_.top_p < 1.0) {
    double cum = 0;
    for (int64_t i = 0; i < k; ++i) {
      cum += prob[i] / sum;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += prob[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace zest::engine
