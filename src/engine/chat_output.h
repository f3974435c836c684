// Splitting a generated assistant text into what the OpenAI API returns: reasoning (Qwen3's <think>...</think>),
// content, and tool calls (Qwen3's hermes-style <tool_call>{"name": ..., "arguments": {...}}</tool_call>).
//
// One incremental parser serves both the whole response and the stream: the server feeds it the text as the engine
// produces it (any chunking, down to single bytes) and the pieces it returns add up, field by field, to what it
// returns for the whole text at once. A tag split over two chunks is held back until it is whole, so a delta never
// carries part of a tag.
//
// Reasoning (as vLLM's qwen3 reasoning parser): a `<think>` at the start of the output (after whitespace) opens
// the reasoning, `</think>` closes it, the text in between is reasoning (not stripped) and the text after it
// content. When the prompt itself left a think block open (a template that ends the generation prompt with
// `<think>`), the output starts in reasoning: everything before `</think>` is reasoning. An output that ends inside
// the reasoning is all reasoning (no content). Text after `</think>` is never reasoning again.
//
// Tool calls (as vLLM's hermes parser, on the content): the body of each <tool_call>...</tool_call> must be a JSON
// object with a string "name" and an object "arguments"; it becomes a call whose arguments are that object as
// Python's json.dumps writes it. A block whose body is not such an object (malformed JSON, too deep, wrong shape)
// stays in the content, tags included. A call is returned only once it is whole (its closing tag, or the end of
// the output), so a stream never announces a call that later turns out malformed; it then comes as the name and
// the arguments in two pieces. Text outside calls is content, except whitespace between or after calls. With
// parallel_tool_calls false, calls after the first are dropped.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zest::engine {

struct ParsedToolCall {
  std::string id;         // "call_" + 24 hex digits
  std::string name;
  std::string arguments;  // a JSON object as text
};

// One piece of an assistant message, in output order.
struct ChatDelta {
  enum Kind { kReasoning, kContent, kToolCall } kind = kContent;
  std::string text;   // kReasoning, kContent
  int tool_index = -1;  // kToolCall: the call's index among the message's calls
  ParsedToolCall call;  // kToolCall
};

struct ChatOutputOptions {
  bool reasoning = false;             // split <think>...</think> out of the text
  bool reasoning_open = false;        // the prompt left a think block open: start in reasoning
  bool tools = false;                 // parse <tool_call> blocks
  bool parallel_tool_calls = true;    // false: keep only the first call
};

// The whole assistant message.
struct ParsedMessage {
  bool has_reasoning = false;  // a reasoning section was seen (its text may be empty)
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputOptions opts = {});
  // Appends the pieces that `text` completes to `out` (kReasoning/kContent pieces of one kind in a row may come as
  // several pieces).
  void feed(std::string_view text, std::vector<ChatDelta>& out);
  // The end of the output: whatever was held back.
  void finish(std::vector<ChatDelta>& out);
  // Everything returned so far, assembled.
  const ParsedMessage& message() const { return msg_; }

 private:
  enum class Think { kStart, kReasoning, kContent };
  enum class Tool { kText, kCall };
  void content(std::string_view text, std::vector<ChatDelta>& out);
  void emit(ChatDelta::Kind kind, std::string_view text, std::vector<ChatDelta>& out);
  void end_call(bool closed, std::vector<ChatDelta>& out);

  ChatOutputOptions opts_;
  ParsedMessage msg_;
  Think think_;
  std::string think_buf_;  // held: leading text (kStart) or a partial "</think>" (kReasoning)
  Tool tool_ = Tool::kText;
  std::string tool_buf_;   // kText: a partial "<tool_call>" or whitespace after a call; kCall: the body so far
  int calls_seen_ = 0;     // complete, valid calls (including dropped ones)
};

// Parses one <tool_call> body: {"name": string, "arguments": object}; false when it is not one.
bool parse_tool_call_body(std::string_view body, std::string& name, std::string& arguments);

// The whole text at once.
ParsedMessage parse_chat_output(std::string_view text, const ChatOutputOptions& opts);

}  // namespace zest::engine
