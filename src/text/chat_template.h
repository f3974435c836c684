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
  // OpenAI `tools` array (function schemas), rendered with the template's tool preamble; null or
  // empty for none. Key order is kept as given (ordered_json), as transformers' tojson does.
  nlohmann::ordered_json tools;
};

// Renders an OpenAI-style `messages` array (role + content string or array of parts:
// {"type":"text","text":...}, {"type":"image_url",...}/{"type":"image"}, {"type":"video"}).
// Unknown roles, missing content or wrong types -> kInvalidArgument with the message index.
// Assistant messages may carry `reasoning_content` and `tool_calls` ({"function": {"name",
// "arguments"}}, arguments as a JSON string or object); their content may then be null or absent
// (rendered as ""). For the text-only Qwen3 template a list of text parts is joined with "\n".
// Output is byte-identical to transformers' apply_chat_template with the same inputs.
Result<std::string> render_chat(TemplateKind kind, const nlohmann::json& messages, const ChatOptions& opts);
// Same, keeping the key order of objects inside tool-call arguments (std::map-backed
// nlohmann::json sorts keys; transformers keeps insertion order).
Result<std::string> render_chat_ordered(TemplateKind kind, const nlohmann::ordered_json& messages,
                                        const ChatOptions& opts);

}  // namespace zest::text
