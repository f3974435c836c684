// Token sampling: greedy, temperature, top-k, top-p, seeded. A Sampler plans each row (mode and one uniform
// number from the request's own seeded generator) and finishes the pick from the row's summary
// (model/sampling.h), which the decoder computes on its device or, for the CPU path, on the host.
//
// Logits processing, as vLLM does it (each step, before temperature / top-k / top-p, on the row's logits l):
//   l[t] += logit_bias[t];
//   l[t] = -inf for t in (EOS ids unless ignore_eos) + stop_token_ids while fewer than min_tokens are generated;
//   repetition_penalty r (t in the prompt or the generated tokens): l[t] = l[t] > 0 ? l[t] / r : l[t] * r;
//   l[t] -= frequency_penalty * c[t] + presence_penalty * (c[t] > 0), c[t] = count of t in the generated tokens.
// The plan carries these as sparse per-token edits (model::LogitEdit); the decoder applies them.
//
// Guided decoding (SamplingParams::grammar): each row also carries the mask of the tokens the grammar allows next
// (grammar::Matcher over the request's own state), applied after the edits; accept() advances the grammar. While the
// grammar allows only the end of the output, min_tokens does not mask the EOS ids (the grammar wins).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "grammar/matcher.h"
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
  bool ignore_eos = false;              // EOS does not end the sequence (nor is it masked by min_tokens)
  double presence_penalty = 0.0;        // [-2, 2]
  double frequency_penalty = 0.0;       // [-2, 2]
  double repetition_penalty = 1.0;      // > 0; 1 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> bias in [-100, 100], ids distinct
  int64_t min_tokens = 0;               // stop / EOS ids masked until this many tokens are generated
  bool logprobs = false;                // log-probabilities of the sampled tokens (raw logits, log-softmax)
  int32_t top_logprobs = 0;             // 0..20 most likely tokens per position with logprobs
  // Log-probabilities of the prompt's tokens (vLLM's extension): -1 off, else the most likely 0..20 tokens per prompt
  // position too. The prompt is then computed in full (no prefix-cache blocks), its logits on the host.
  int32_t prompt_logprobs = -1;
  // Structured output: the grammar the output follows (null: none), compiled over the model's vocabulary (its masks
  // have the decoder's vocab_size bits). Shared by the requests that use it; each Sampler walks it on its own.
  std::shared_ptr<grammar::CompiledGrammar> grammar;
};

// True when the parameters ask for any logits processing (bias, penalties, min_tokens).
bool has_logits_processing(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // The token history the edits depend on: the prompt, and the ids that min_tokens masks besides
  // stop_token_ids (the model's EOS ids; ignored with ignore_eos). Call before the first plan.
  void set_context(const std::vector<int32_t>& prompt, const std::vector<int32_t>& eos_ids);
  // A generated token (counts for the penalties and min_tokens; advances the grammar).
  void accept(int32_t token);
  // Ok, or why the grammar cannot go on (the sampled token does not continue it, or a limit of its tables); sticky.
  const Status& status() const { return status_; }
  // The next row's plan over a vocabulary of `vocab`: draws one uniform number unless the row is greedy; carries
  // the row's logit edits and log-probability request.
  model::SampleRow plan(int64_t vocab);
  // The edits of the next row (sorted by id), as plan() attaches them.
  std::vector<model::LogitEdit> edits(int64_t vocab) const;
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
  bool processing_ = false;
  std::vector<int32_t> prompt_ids_;  // distinct, ascending (repetition_penalty only)
  std::vector<int32_t> stop_ids_;    // masked while generated_ < min_tokens
  std::vector<std::pair<int32_t, int32_t>> counts_;  // generated token -> count, ascending by id
  int64_t generated_ = 0;
  std::optional<grammar::Matcher> matcher_;
  Status status_;
};

// Index of the largest logit (ties to the lowest index).
int32_t argmax(const float* logits, int64_t n);

}  // namespace zest::engine
