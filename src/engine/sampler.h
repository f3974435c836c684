// Token sampling on the host from f32 logits: greedy, temperature, top-k, top-p, seeded.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

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
  // Picks the next token from logits[vocab].
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// Index of the largest logit (ties to the lowest index).
int32_t argmax(const float* logits, int64_t n);

}  // namespace zest::engine
