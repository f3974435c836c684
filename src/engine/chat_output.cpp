#include "engine/chat_output.h"

#include <random>

#include <nlohmann/json.hpp>

#include "core/json_depth.h"
#include "text/py_json.h"

namespace zest::engine {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
// Deeper bodies stay content: the JSON value would be copied and printed recursively.
constexpr int kMaxCallDepth = 64;

bool all_space(std::string_view s) {
  return s.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

// The length of the longest proper prefix of `tag` that `s` ends with: bytes that may be the start of the tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::string new_call_id() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  static const char* kDigits = "0123456789abcdef";
  std::string id = "call_";
  for (int k = 0; k < 2; ++k) {
    uint64_t v = gen();
    for (int d = 0; d < 12; ++d, v >>= 4) id += kDigits[v & 15];
  }
  return id;
}

}  // namespace

bool parse_tool_call_body(std::string_view body, std::string& name, std::string& arguments) {
  if (json_deeper_than(body, kMaxCallDepth)) return false;
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto n = j.find("name");
  auto a = j.find("arguments");
  if (n == j.end() || !n->is_string() || n->get_ref<const std::string&>().empty()) return false;
  if (a == j.end() || !a->is_object()) return false;
  name = n->get<std::string>();
  arguments = text::py_json_dumps(*a);
  return true;
}

ChatOutputParser::ChatOutputParser(ChatOutputOptions opts) : opts_(opts), think_(Think::kStart) {}

void ChatOutputParser::emit(ChatDelta::Kind kind, std::string_view text, std::vector<ChatDelta>& out) {
  if (text.empty()) return;
  (kind == ChatDelta::kReasoning ? msg_.reasoning : msg_.content).append(text);
  if (!out.empty() && out.back().kind == kind) {
    out.back().text.append(text);
    return;
  }
  ChatDelta d;
  d.kind = kind;
  d.text = std::string(text);
  out.push_back(std::move(d));
}

void ChatOutputParser::feed(std::string_view text, std::vector<ChatDelta>& out) {
  if (!opts_.reasoning || think_ == Think::kContent) return content(text, out);
  think_buf_.append(text);
  for (;;) {
    if (think_ == Think::kStart) {
      const size_t i = think_buf_.find_first_not_of(" \t\r\n");
      if (i == std::string::npos) return;  // only whitespace so far
      const std::string_view rest = std::string_view(think_buf_).substr(i);
      if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
        think_buf_.erase(0, i + kThinkOpen.size());
        think_ = Think::kReasoning;
        msg_.has_reasoning = true;
        continue;
      }
      if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return;  // maybe "<think>"
      if (opts_.reasoning_open) {
        think_ = Think::kReasoning;
        msg_.has_reasoning = true;
        continue;
      }
      think_ = Think::kContent;
      const std::string held = std::move(think_buf_);
      think_buf_.clear();
      return content(held, out);
    }
    // kReasoning
    const size_t close = think_buf_.find(kThinkClose);
    if (close != std::string::npos) {
      emit(ChatDelta::kReasoning, std::string_view(think_buf_).substr(0, close), out);
      const std::string rest = think_buf_.substr(close + kThinkClose.size());
      think_buf_.clear();
      think_ = Think::kContent;
      return content(rest, out);
    }
    const size_t hold = partial_tag(think_buf_, kThinkClose);
    emit(ChatDelta::kReasoning, std::string_view(think_buf_).substr(0, think_buf_.size() - hold), out);
    think_buf_.erase(0, think_buf_.size() - hold);
    return;
  }
}

void ChatOutputParser::content(std::string_view text, std::vector<ChatDelta>& out) {
  if (!opts_.tools) return emit(ChatDelta::kContent, text, out);
  tool_buf_.append(text);
  for (;;) {
    if (tool_ == Tool::kText) {
      const size_t open = tool_buf_.find(kCallOpen);
      if (open != std::string::npos) {
        const std::string_view before = std::string_view(tool_buf_).substr(0, open);
        if (!(calls_seen_ > 0 && all_space(before))) emit(ChatDelta::kContent, before, out);
        tool_buf_.erase(0, open + kCallOpen.size());
        tool_ = Tool::kCall;
        continue;
      }
      const size_t hold = partial_tag(tool_buf_, kCallOpen);
      const std::string_view head = std::string_view(tool_buf_).substr(0, tool_buf_.size() - hold);
      if (calls_seen_ > 0 && all_space(head)) return;  // whitespace after a call: dropped unless text follows
      emit(ChatDelta::kContent, head, out);
      tool_buf_.erase(0, head.size());
      return;
    }
    // kCall: the body until the closing tag.
    const size_t close = tool_buf_.find(kCallClose);
    if (close == std::string::npos) return;
    std::string rest = tool_buf_.substr(close + kCallClose.size());
    tool_buf_.resize(close);
    end_call(/*closed=*/true, out);
    tool_buf_ = std::move(rest);
    tool_ = Tool::kText;
  }
}

void ChatOutputParser::end_call(bool closed, std::vector<ChatDelta>& out) {
  ParsedToolCall call;
  if (!parse_tool_call_body(tool_buf_, call.name, call.arguments)) {
    std::string raw = std::string(kCallOpen) + tool_buf_;
    if (closed) raw += kCallClose;
    emit(ChatDelta::kContent, raw, out);
    return;
  }
  ++calls_seen_;
  if (!opts_.parallel_tool_calls && calls_seen_ > 1) return;
  call.id = new_call_id();
  ChatDelta d;
  d.kind = ChatDelta::kToolCall;
  d.tool_index = static_cast<int>(msg_.tool_calls.size());
  d.call = call;
  msg_.tool_calls.push_back(std::move(call));
  out.push_back(std::move(d));
}

void ChatOutputParser::finish(std::vector<ChatDelta>& out) {
  if (opts_.reasoning && think_ != Think::kContent) {
    std::string held = std::move(think_buf_);
    think_buf_.clear();
    if (think_ == Think::kReasoning || opts_.reasoning_open) {
      msg_.has_reasoning = true;
      emit(ChatDelta::kReasoning, held, out);
    } else {
      think_ = Think::kContent;
      content(held, out);
    }
    think_ = Think::kContent;
  }
  if (!opts_.tools) return;
  if (tool_ == Tool::kCall) {
    end_call(/*closed=*/false, out);
  } else if (!(calls_seen_ > 0 && all_space(tool_buf_))) {
    emit(ChatDelta::kContent, tool_buf_, out);
  }
  tool_buf_.clear();
  tool_ = Tool::kText;
}

ParsedMessage parse_chat_output(std::string_view text, const ChatOutputOptions& opts) {
  ChatOutputParser p(opts);
  std::vector<ChatDelta> ignored;
  p.feed(text, ignored);
  p.finish(ignored);
  return p.message();
}

}  // namespace zest::engine
