// Request state shared by the scheduler and the runner.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/sampler.h"
#include "model/kv_cache.h"

namespace zest::engine {

// A prompt ready for the decoder: token ids after image-token expansion, M-RoPE positions, and the
// visual embeddings that replace the image-pad tokens.
struct Prompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> positions;  // [3, ids.size()]: rows t, h, w
  int64_t rope_delta = 0;          // decode position = tokens in cache + rope_delta
  Tensor mm_embeds;                // [n_mm, hidden]
  std::vector<int64_t> mm_index;   // prompt index of each mm_embeds row (ascending)
  // Prefix caching: per mm_embeds row, a key of what made the row (the image's content and pixel budget, the
  // request's VisionZip settings). Empty with rows present: blocks holding visual rows are never cached.
  std::vector<uint64_t> mm_keys;
  std::vector<Tensor> deepstack;   // each [n_mm, hidden]
  std::vector<int64_t> visual_tokens_before, visual_tokens_after;  // per image
  int64_t images_encoded = 0;  // images this prompt ran through the vision tower (the others came from its cache)
  double vision_preprocess_ms = 0, vision_tower_ms = 0, vision_select_ms = 0;  // time spent on the images
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);

// The log-probability of one generated token (log-softmax of the raw logits) and the most likely alternatives.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.f;
  int32_t rank = 0;  // prompt log-probabilities: 1 + the tokens with a higher logit (0: not computed)
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};

// What a caller sees of a request while and after it runs.
struct RequestOutput {
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  // one per generated token when the request asked for logprobs
  // SamplingParams::prompt_logprobs >= 0: one per prompt token from the second on (the first has no context), set
  // once the prompt is computed.
  std::vector<TokenLogprob> prompt_logprobs;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  int64_t cached_tokens = 0;  // prompt tokens whose K/V came from the prefix cache (first admission)
  // Request::export_kv: the prompt's K/V, copied out of the cache when the request ended (null when it ended by
  // abort or error, or before its prompt was computed).
  std::shared_ptr<const model::KvSnapshot> kv;
  double arrival_ms = 0, first_scheduled_ms = 0, first_token_ms = 0, finish_ms = 0;
};

struct Request {
  int64_t id = 0;
  Prompt prompt;
  SamplingParams sampling;
  bool sere = true;  // takes part in expert re-routing
  // Prefill/decode disaggregation. A prefill instance sets export_kv: the prompt's K/V come back in
  // RequestOutput::kv. A decode instance sets kv (the prompt's K/V computed elsewhere, for every prompt token) and
  // first_token (the token sampled after it there): the prompt is not run here, generation goes on from that token
  // (prompt.positions may be empty; decode positions follow prompt.rope_delta). Such a request takes no prefix-cache
  // blocks; preempted, it gets the snapshot back and recomputes only its generated tokens.
  bool export_kv = false;
  std::shared_ptr<const model::KvSnapshot> kv;
  int32_t first_token = -1;
  std::optional<TokenLogprob> first_logprob;  // its log-probabilities, when the request asks for them
  // Called from the engine thread with each newly decoded piece of text (may be empty) and, at the
  // end, with finished = true.
  std::function<void(const std::string& delta, const RequestOutput& out, bool finished)> on_update;
};

}  // namespace zest::engine
