#include "engine/sampler.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace zest::engine {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

bool has_logits_processing(const SamplingParams& p) {
  return p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0 ||
         !p.logit_bias.empty() || p.min_tokens > 0;
}

Sampler::Sampler(const SamplingParams& p)
    : p_(p), rng_(p.seed ? *p.seed : std::random_device{}()), processing_(has_logits_processing(p)) {
  std::sort(p_.logit_bias.begin(), p_.logit_bias.end());
  if (p_.grammar) matcher_.emplace(p_.grammar);
}

void Sampler::set_context(const std::vector<int32_t>& prompt, const std::vector<int32_t>& eos_ids) {
  prompt_ids_.clear();
  if (p_.repetition_penalty != 1.0) {
    prompt_ids_ = prompt;
    std::sort(prompt_ids_.begin(), prompt_ids_.end());
    prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
  }
  stop_ids_ = p_.stop_token_ids;
  if (!p_.ignore_eos) stop_ids_.insert(stop_ids_.end(), eos_ids.begin(), eos_ids.end());
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
}

void Sampler::accept(int32_t token) {
  ++generated_;
  if (matcher_ && status_.is_ok() && !matcher_->accept(token)) status_ = matcher_->status();
  if (!processing_) return;
  auto it = std::lower_bound(counts_.begin(), counts_.end(), std::make_pair(token, INT32_MIN));
  if (it != counts_.end() && it->first == token) ++it->second;
  else counts_.insert(it, {token, 1});
}

std::vector<model::LogitEdit> Sampler::edits(int64_t vocab) const {
  std::vector<model::LogitEdit> e;
  if (!processing_) return e;
  const bool rep = p_.repetition_penalty != 1.0;
  const bool counted = rep || p_.presence_penalty != 0.0 || p_.frequency_penalty != 0.0;
  const bool mask = generated_ < p_.min_tokens && !(matcher_ && matcher_->must_end());
  // The edited ids: biased, masked, in the prompt (repetition) or generated (any penalty); each set is sorted.
  std::vector<int32_t> ids;
  ids.reserve(prompt_ids_.size() + counts_.size() + p_.logit_bias.size() + (mask ? stop_ids_.size() : 0));
  ids.insert(ids.end(), prompt_ids_.begin(), prompt_ids_.end());
  if (counted)
    for (const auto& c : counts_) ids.push_back(c.first);
  for (const auto& b : p_.logit_bias) ids.push_back(b.first);
  if (mask) ids.insert(ids.end(), stop_ids_.begin(), stop_ids_.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  auto count_of = [&](int32_t id) {
    auto it = std::lower_bound(counts_.begin(), counts_.end(), std::make_pair(id, INT32_MIN));
    return it != counts_.end() && it->first == id ? it->second : 0;
  };
  e.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) continue;
    model::LogitEdit x;
    x.id = id;
    auto b = std::lower_bound(p_.logit_bias.begin(), p_.logit_bias.end(), std::make_pair(id, -INFINITY));
    if (b != p_.logit_bias.end() && b->first == id) x.bias = b->second;
    if (mask && std::binary_search(stop_ids_.begin(), stop_ids_.end(), id)) x.bias = -INFINITY;
    const int32_t c = counted ? count_of(id) : 0;
    if (rep && (c > 0 || std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)))
      x.rep = static_cast<float>(p_.repetition_penalty);
    if (c > 0) x.sub = static_cast<float>(p_.frequency_penalty * c + p_.presence_penalty);
    e.push_back(x);
  }
  return e;
}

model::SampleRow Sampler::plan(int64_t vocab) {
  model::SampleRow row = model::plan_sample_row(p_.temperature, p_.top_k, p_.top_p, vocab);
  row.edits = edits(vocab);
  if (p_.logprobs) row.logprobs = std::clamp<int32_t>(p_.top_logprobs, 0, model::kMaxTopLogprobs);
  if (matcher_) {
    row.allowed = matcher_->mask();
    if (status_.is_ok() && !matcher_->status().is_ok()) status_ = matcher_->status();
    if (status_.is_ok() && static_cast<int64_t>(row.allowed->size()) != (vocab + 31) / 32)
      status_ = internal_error("structured output: the grammar's vocabulary has " +
                               std::to_string(row.allowed->size() * 32) + " bits for " + std::to_string(vocab) +
                               " logits");
  }
  // One draw per sampled token, as uniform_real_distribution(0, total) drew it: u * total is the same number.
  if (row.mode != model::SampleMode::kGreedy) row.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return row;
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  const model::SampleRow row = plan(vocab);
  const int32_t tok = finish(row, model::summarize_edited_row(logits, vocab, row), vocab);
  if (tok >= 0) accept(tok);
  return tok;
}

}  // namespace zest::engine
