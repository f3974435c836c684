#include "engine/sampler.h"

namespace zest::engine {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed ? *p.seed : std::random_device{}()) {}

model::SampleRow Sampler::plan(int64_t vocab) {
  model::SampleRow row = model::plan_sample_row(p_.temperature, p_.top_k, p_.top_p, vocab);
  // One draw per sampled token, as uniform_real_distribution(0, total) drew it: u * total is the same number.
  if (row.mode != model::SampleMode::kGreedy) row.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return row;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  const model::SampleRow row = plan(vocab);
  return finish(row, model::summarize_row(logits, vocab, row), vocab);
}

}  // namespace zest::engine
