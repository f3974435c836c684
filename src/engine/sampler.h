// Token sampling: greedy, temperature, top-k, top-p, seeded. A Sampler plans each row (mode and one uniform
// number from the request's own seeded generator) and finishes the pick from the row's summary
// (model/sampling.h), which the decoder computes on its device or, for the CPU path, on the host.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/sampling.h"

namespace zest::engine {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  std::optional<uint64_t> seed;
  int64_t max_tokens = 256;
  std::vector<int32_t> stop_token_ids;  // end the sequence (not included in the text)
  std::vector<std::string> stop;        // stop strings (the text is cut before the match)
  bool ignore_eos = false;              // benchmarks: run to max_tokens
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // The next row's plan over a vocabulary of `vocab`: draws one uniform number unless the row is greedy.
  model::SampleRow plan(int64_t vocab);
  // The token from the summary of the row planned last (-1 when the summary cannot decide).
  static int32_t finish(const model::SampleRow& row, const model::SampleResult& r, int64_t vocab) {
    return model::pick_from_summary(row, r, vocab);
  }
  // Picks the next token from host logits[vocab] (plan, host summary, finish). Greedy and top-k / top-p
  // give the tokens of a full sort of the logits (descending, ties to the lower id); pure temperature
  // (top_k = 0, top_p = 1) walks the distribution in token-id order.
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// Index of the largest logit (ties to the lowest index).
int32_t argmax(const float* logits, int64_t n);

}  // namespace zest::engine
