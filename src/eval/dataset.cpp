#include "eval/dataset.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace zest::eval {
namespace {

using nlohmann::json;

Result<EvalItem> parse_item(const std::string& line_text, int64_t line) {
  json j = json::parse(line_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("not valid JSON");
  if (!j.is_object()) return invalid_argument("an item must be a JSON object");
  EvalItem item;
  item.line = line;
  if (!j.contains("answer")) return invalid_argument("'answer' is missing");
  const json& a = j["answer"];
  if (a.is_string()) {
    item.answers.push_back(a.get<std::string>());
  } else if (a.is_array() && !a.empty()) {
    for (const json& e : a) {
      if (!e.is_string()) return invalid_argument("'answer' must be a string or a non-empty list of strings");
      item.answers.push_back(e.get<std::string>());
    }
  } else {
    return invalid_argument("'answer' must be a string or a non-empty list of strings");
  }
  if (j.contains("task")) {
    if (!j["task"].is_string() || j["task"].get<std::string>().empty())
      return invalid_argument("'task' must be a non-empty string");
    item.task = j["task"].get<std::string>();
  }
  if (!j.contains("messages") || !j["messages"].is_array())
    return invalid_argument("'messages' must be an array (an OpenAI chat-completions body)");
  j.erase("answer");
  j.erase("task");
  item.body = std::move(j);
  return item;
}

}  // namespace

Result<EvalData> parse_eval_data(const std::string& text, const std::string& file, int64_t limit) {
  EvalData data;
  data.file = file;
  std::istringstream in(text);
  std::string line_text;
  for (int64_t line = 1; std::getline(in, line_text); ++line) {
    if (line_text.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto item = parse_item(line_text, line);
    if (!item.ok()) return item.status().with_context(file + ":" + std::to_string(line));
    data.items.push_back(std::move(item).value());
    if (limit > 0 && static_cast<int64_t>(data.items.size()) >= limit) break;
  }
  if (data.items.empty()) return invalid_argument(file + ": no items");
  return data;
}

Result<EvalData> load_eval_data(const std::string& file, int64_t limit) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return not_found("cannot open eval data '" + file + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  ZEST_ASSIGN_OR_RETURN(EvalData data, parse_eval_data(ss.str(), file, limit));
  data.base_dir = std::filesystem::absolute(file).parent_path().string();
  return data;
}

}  // namespace zest::eval
