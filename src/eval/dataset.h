// The `zest eval` data file: JSON Lines, one item a line. Each item is an OpenAI chat-completions body
// (`messages` with text and image_url parts; any other request field such as max_tokens) plus `answer`
// (a string or a list of accepted strings) and an optional `task` (a string). Blank lines are skipped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace zest::eval {

struct EvalItem {
  int64_t line = 0;                  // 1-based line in the file
  nlohmann::json body;               // the chat-completions body (the item without answer and task)
  std::vector<std::string> answers;  // accepted answers (at least one)
  std::string task = "default";
};

struct EvalData {
  std::string file;
  std::string base_dir;  // relative image paths resolve against this: the file's directory
  std::vector<EvalItem> items;
  // "FILE:LINE" of an item, for messages.
  std::string where(const EvalItem& item) const { return file + ":" + std::to_string(item.line); }
};

// Parses JSONL text; `file` names it in messages ("FILE:LINE: ..."). limit > 0 keeps the first `limit` items.
Result<EvalData> parse_eval_data(const std::string& text, const std::string& file, int64_t limit = 0);
// Reads and parses a file; base_dir is set to its directory.
Result<EvalData> load_eval_data(const std::string& file, int64_t limit = 0);

}  // namespace zest::eval
