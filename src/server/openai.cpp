#include "server/openai.h"

#include <cmath>

namespace zest::server {

using nlohmann::json;

json error_body(int http_status, const std::string& message, const std::string& param) {
  const char* type = http_status >= 500 ? "server_error" : "invalid_request_error";
  return {{"error",
           {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", http_status}}}};
}

int http_status_for(const Status& st) {
  switch (st.code()) {
    case ErrorCode::kOk: return 200;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kCorrupt:
    case ErrorCode::kUnsupported:
    case ErrorCode::kOutOfRange: return 400;
    case ErrorCode::kResourceExhausted: return 503;
    case ErrorCode::kInternal: return 500;
  }
  return 500;
}

std::string error_param(const std::string& message) {
  if (message.rfind("messages", 0) == 0 || message.rfind("image ", 0) == 0 || message.rfind("too many images", 0) == 0)
    return "messages";
  if (message.size() > 2 && message[0] == '\'') {
    const size_t end = message.find('\'', 1);
    if (end != std::string::npos) return message.substr(1, end - 1);
  }
  return {};
}

const char* openai_finish_reason(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop: return "stop";
    case engine::FinishReason::kLength: return "length";
    case engine::FinishReason::kAbort: return "abort";
    case engine::FinishReason::kError: return "error";
    case engine::FinishReason::kNone: break;
  }
  return "stop";
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"visual_tokens_before", u.visual_tokens_before},
          {"visual_tokens_after", u.visual_tokens_after}};
}

json chat_choice_json(int index, const std::string& text, engine::FinishReason finish, const json& logprobs) {
  return {{"index", index},
          {"message", {{"role", "assistant"}, {"content", text}}},
          {"logprobs", logprobs},
          {"finish_reason", openai_finish_reason(finish)}};
}

json chat_message_json(const engine::ParsedMessage& m, bool reasoning_field) {
  json msg = {{"role", "assistant"}};
  msg["content"] = m.content.empty() && (m.has_reasoning || !m.tool_calls.empty()) ? json(nullptr) : json(m.content);
  if (reasoning_field) msg["reasoning_content"] = m.has_reasoning ? json(m.reasoning) : json(nullptr);
  if (!m.tool_calls.empty()) {
    json calls = json::array();
    for (const engine::ParsedToolCall& c : m.tool_calls)
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    msg["tool_calls"] = std::move(calls);
  }
  return msg;
}

json chat_choice_json(int index, json message, const std::string& finish_reason, const json& logprobs) {
  return {{"index", index}, {"message", std::move(message)}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
}

std::vector<json> chat_delta_json(const engine::ChatDelta& d) {
  switch (d.kind) {
    case engine::ChatDelta::kReasoning: return {json{{"reasoning_content", d.text}}};
    case engine::ChatDelta::kContent: return {json{{"content", d.text}}};
    case engine::ChatDelta::kToolCall: break;
  }
  json head = {{"index", d.tool_index},
               {"id", d.call.id},
               {"type", "function"},
               {"function", {{"name", d.call.name}, {"arguments", ""}}}};
  json args = {{"index", d.tool_index}, {"function", {{"arguments", d.call.arguments}}}};
  return {json{{"tool_calls", json::array({std::move(head)})}}, json{{"tool_calls", json::array({std::move(args)})}}};
}

json completion_json(const CompletionId& id, const json& choices, const Usage& u) {
  return {{"id", id.id},       {"object", "chat.completion"}, {"created", id.created},
          {"model", id.model}, {"choices", choices},         {"usage", usage_json(u)}};
}

json chunk_json(const CompletionId& id, int index, const json& delta, const std::string& finish_reason,
                bool include_usage, const json& logprobs) {
  json choice = {{"index", index},
                 {"delta", delta},
                 {"logprobs", logprobs},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  json j = {{"id", id.id},       {"object", "chat.completion.chunk"}, {"created", id.created},
            {"model", id.model}, {"choices", json::array({choice})}};
  if (include_usage) j["usage"] = nullptr;
  return j;
}

namespace {

// A logprob as JSON: finite (vLLM's floor for -inf).
double finite_logprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

json bytes_json(const std::string& b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(static_cast<int>(c));
  return a;
}

}  // namespace

json chat_logprobs_json(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok, bool as_ids) {
  json content = json::array();
  auto name = [&](int32_t id, const std::string& b) { return as_ids ? "token_id:" + std::to_string(id) : b; };
  for (const engine::TokenLogprob& lp : lps) {
    const std::string b = tok.token_bytes(lp.token);
    json top = json::array();
    for (const auto& [id, v] : lp.top) {
      const std::string tb = tok.token_bytes(id);
      top.push_back({{"token", name(id, tb)}, {"logprob", finite_logprob(v)}, {"bytes", bytes_json(tb)}});
    }
    content.push_back({{"token", name(lp.token, b)}, {"logprob", finite_logprob(lp.logprob)}, {"bytes", bytes_json(b)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json prompt_logprobs_json(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok) {
  json out = json::array();
  out.push_back(nullptr);
  for (const engine::TokenLogprob& lp : lps) {
    json d = json::object();
    for (size_t r = 0; r < lp.top.size(); ++r)
      d[std::to_string(lp.top[r].first)] = {{"logprob", finite_logprob(lp.top[r].second)},
                                            {"rank", static_cast<int64_t>(r) + 1},
                                            {"decoded_token", tok.token_bytes(lp.top[r].first)}};
    d[std::to_string(lp.token)] = {
        {"logprob", finite_logprob(lp.logprob)}, {"rank", lp.rank}, {"decoded_token", tok.token_bytes(lp.token)}};
    out.push_back(std::move(d));
  }
  return out;
}

json text_choice_json(int index, const std::string& text, const std::string& finish_reason, json logprobs) {
  return {{"index", index},
          {"text", text},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
}

json text_completion_json(const CompletionId& id, const json& choices, const Usage* u, bool usage_null) {
  json j = {{"id", id.id},       {"object", "text_completion"}, {"created", id.created},
            {"model", id.model}, {"choices", choices}};
  if (u) j["usage"] = usage_json(*u);
  else if (usage_null) j["usage"] = nullptr;
  return j;
}

json text_logprobs_json(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok, bool as_ids,
                        int64_t& offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  auto name = [&](int32_t id, const std::string& b) { return as_ids ? "token_id:" + std::to_string(id) : b; };
  for (const engine::TokenLogprob& lp : lps) {
    const std::string b = tok.token_bytes(lp.token);
    tokens.push_back(name(lp.token, b));
    values.push_back(finite_logprob(lp.logprob));
    json top = json::object();
    for (const auto& [id, v] : lp.top) top[name(id, tok.token_bytes(id))] = finite_logprob(v);
    top[name(lp.token, b)] = finite_logprob(lp.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(b.size());
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json usage_chunk_json(const CompletionId& id, const Usage& u) {
  return {{"id", id.id},       {"object", "chat.completion.chunk"}, {"created", id.created},
          {"model", id.model}, {"choices", json::array()},          {"usage", usage_json(u)}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

void SseReader::feed(const char* data, size_t n, std::vector<std::string>& events) {
  buf_.append(data, n);
  for (;;) {
    // An event ends at a blank line; accept \n\n and \r\n\r\n.
    size_t end = buf_.find("\n\n");
    size_t sep = 2;
    const size_t crlf = buf_.find("\r\n\r\n");
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) return;
    const std::string block = buf_.substr(0, end);
    buf_.erase(0, end + sep);
    std::string data_field;
    bool has_data = false;
    size_t pos = 0;
    while (pos <= block.size()) {
      size_t nl = block.find('\n', pos);
      if (nl == std::string::npos) nl = block.size();
      std::string line = block.substr(pos, nl - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string v = line.substr(5);
        if (!v.empty() && v[0] == ' ') v.erase(0, 1);
        if (has_data) data_field += "\n";
        data_field += v;
        has_data = true;
      }
      pos = nl + 1;
    }
    if (has_data) events.push_back(std::move(data_field));
  }
}

}  // namespace zest::server
