// OpenAI chat-completions request bodies: validation, sampling parameters, and the prompt the decoder
// runs (chat template, tokens, images through the vision tower, M-RoPE positions).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/model_bundle.h"
#include "engine/request.h"
#include "engine/sampler.h"

namespace zest::engine {

struct PromptOptions {
  bool allow_local_files = true;  // file:// URLs and plain paths (CLI yes; server only when enabled)
  int64_t max_images = 64;
  std::string base_dir;           // relative image paths resolve against this (empty = cwd)
};

// A parsed chat request.
struct ChatRequest {
  nlohmann::json messages;
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;
  bool sere = true;
  nlohmann::json vision_prune;  // per-request VisionZip overrides (object) or null
  nlohmann::json mm_processor_kwargs;  // min_pixels / max_pixels overrides or null
  bool enable_thinking = true;
  bool add_vision_id = false;
};

// Parses and validates a request body (types, ranges, roles, n == 1). Errors are kInvalidArgument with
// the offending field named. Sampling defaults come from the model's generation_config.
Result<ChatRequest> parse_chat_request(const nlohmann::json& body, const ModelBundle& model);

// Renders, tokenizes and (for images) encodes the request's messages into a decoder prompt.
Result<Prompt> build_prompt(const ModelBundle& model, const ChatRequest& req, const PromptOptions& opts);

// M-RoPE position ids [3, n] for `ids` given each image's merged grid (rows, cols) in order of its
// image-pad run, and the rope delta for decode (Qwen3-VL get_rope_index).
void rope_positions(const std::vector<int32_t>& ids, int32_t image_token_id,
                    const std::vector<std::pair<int64_t, int64_t>>& merged_grids, std::vector<int32_t>& positions,
                    int64_t& rope_delta);

}  // namespace zest::engine
