// Chat templates of the Qwen3 and Qwen3-VL families, rendered byte-identically to their Jinja files.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace zest::text {

enum class TemplateKind {
  kQwen3,          // chat_template.qwen3.jinja (hybrid thinking, tools)
  kQwen3VL,        // chat_template.qwen3-vl-instruct.jinja (images/videos, tools)
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;  // Qwen3 only: false appends the empty think block
  bool add_vision_id = false;   // Qwen3-VL only: "Picture N: " before each image
};

// Renders an OpenAI-style `messages` array (role + content string or array of parts:
// {"type":"text","text":...}, {"type":"image_url",...}/{"type":"image"}, {"type":"video"}).
// Unknown roles, missing content or wrong types -> kInvalidArgument with the message index.
Result<std::string> render_chat(TemplateKind kind, const nlohmann::json& messages, const ChatOptions& opts);

}  // namespace zest::text
