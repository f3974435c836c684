// The OpenAI chat-completions wire format as zest speaks it: error bodies, responses, stream chunks,
// and a client-side reader for server-sent events (used by `zest bench serve` and the tests).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_depth.h"  // json_deeper_than, checked on request bodies
#include "core/status.h"
#include "engine/chat_output.h"
#include "engine/request.h"
#include "text/tokenizer.h"

namespace zest::server {

// Token counts reported in `usage` (zest adds the visual-token counts before and after pruning).
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t visual_tokens_before = 0;
  int64_t visual_tokens_after = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache (prompt_tokens_details.cached_tokens)
};

// Identity of one completion, shared by its response or all its chunks.
struct CompletionId {
  std::string id;       // "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// {"error": {"message", "type", "param", "code"}}; type follows the status (4xx invalid_request_error,
// 5xx server_error), code is the HTTP status, param null when empty.
nlohmann::json error_body(int http_status, const std::string& message, const std::string& param = {});
// The HTTP status for an error Status coming from request parsing, prompt building or the engine.
int http_status_for(const Status& st);
// The request field an error message names ("'top_p' must ..." -> top_p, "messages[2]..." -> messages).
std::string error_param(const std::string& message);

// OpenAI finish_reason for an engine finish (stop, length, abort; error -> "error").
const char* openai_finish_reason(engine::FinishReason r);
nlohmann::json usage_json(const Usage& u);
// One choice of a non-streaming "chat.completion": message, logprobs (null, or {"content": [...]}), finish_reason.
nlohmann::json chat_choice_json(int index, const std::string& text, engine::FinishReason finish,
                                const nlohmann::json& logprobs = nullptr);
// The assistant message of a parsed reply: content (null when empty beside reasoning or tool calls),
// reasoning_content (with a reasoning parser: the reasoning, or null), tool_calls ([{id, type, function: {name,
// arguments}}], only when there are calls).
nlohmann::json chat_message_json(const engine::ParsedMessage& m, bool reasoning_field);
// A choice with a ready message object and finish_reason.
nlohmann::json chat_choice_json(int index, nlohmann::json message, const std::string& finish_reason,
                                const nlohmann::json& logprobs);
// The stream delta(s) of one parsed piece: {"reasoning_content": ...} or {"content": ...}; a tool call gives two,
// as OpenAI streams one: {"tool_calls": [{index, id, type, function: {name, arguments: ""}}]}, then
// {"tool_calls": [{index, function: {arguments}}]}.
std::vector<nlohmann::json> chat_delta_json(const engine::ChatDelta& d);
// The non-streaming response object ("chat.completion") with the given choices.
nlohmann::json completion_json(const CompletionId& id, const nlohmann::json& choices, const Usage& u);
// One "chat.completion.chunk" of choice `index`: `delta` is the choice's delta object, finish_reason null when empty,
// logprobs null or {"content": [...]}. With include_usage every chunk carries "usage": null.
nlohmann::json chunk_json(const CompletionId& id, int index, const nlohmann::json& delta,
                          const std::string& finish_reason, bool include_usage,
                          const nlohmann::json& logprobs = nullptr);
// Chat logprobs in the OpenAI shape, {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}:
// token is the token's text (its raw bytes; invalid UTF-8 is replaced when serialized), or "token_id:N" with as_ids
// (vLLM's return_tokens_as_token_ids), bytes the raw bytes.
nlohmann::json chat_logprobs_json(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok,
                                  bool as_ids = false);
// Prompt log-probabilities in vLLM's shape: one entry per prompt token, null for the first, else
// {"<id>": {"logprob", "rank", "decoded_token"}} for the prompt token and the top alternatives (ranks 1..k).
nlohmann::json prompt_logprobs_json(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok);
// Text completions (POST /v1/completions): one choice {index, text, logprobs, finish_reason (null when empty)}.
nlohmann::json text_choice_json(int index, const std::string& text, const std::string& finish_reason,
                                nlohmann::json logprobs = nullptr);
// A "text_completion" object (the response, or one stream chunk) with the given choices; usage when not null, else
// "usage": null when usage_null (stream chunks with include_usage), else no usage key.
nlohmann::json text_completion_json(const CompletionId& id, const nlohmann::json& choices, const Usage* u,
                                    bool usage_null);
// Text-completion logprobs in the legacy OpenAI shape: {tokens, token_logprobs, top_logprobs: [{token: logprob}],
// text_offset}; top_logprobs holds the top entries and the sampled token. text_offset counts bytes of the
// completion's text from `offset`, which advances past these tokens (streams carry it from chunk to chunk).
nlohmann::json text_logprobs_json(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok,
                                  bool as_ids, int64_t& offset);

// The last chunk of a stream with include_usage: no choices, the usage.
nlohmann::json usage_chunk_json(const CompletionId& id, const Usage& u);
// "data: <json>\n\n" (invalid UTF-8 in strings is replaced by U+FFFD rather than thrown on).
std::string sse_event(const nlohmann::json& j);
// Serializes for an HTTP body with the same UTF-8 replacement.
std::string dump_json(const nlohmann::json& j);

// Incremental parser of a text/event-stream body: feed bytes as they arrive, collect the data field of
// each complete event. Comment lines (":...", used as keep-alives) and other fields are skipped.
class SseReader {
 public:
  // Appends bytes; every event completed by them is appended to `events` (its data lines joined by \n).
  void feed(const char* data, size_t n, std::vector<std::string>& events);

 private:
  std::string buf_;
};

}  // namespace zest::server
