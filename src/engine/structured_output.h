// Structured output (guided decoding) of chat requests: response_format {"type": "json_object"} or {"type":
// "json_schema", "json_schema": {"name", "schema", "strict"}}, vLLM's guided_json (a schema) and guided_choice (a list
// of strings), and tool_choice "required" or a named function (the reply is then one or more of Qwen3's tool calls,
// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, whose arguments follow the tool's parameters schema).
// The constraint becomes a grammar (src/grammar) compiled over the model's vocabulary; the sampler masks every token
// the grammar does not allow next (engine/sampler.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/model_bundle.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace zest::engine {

struct OutputConstraint {
  enum Kind { kNone, kJsonObject, kJsonSchema, kChoice, kToolCall } kind = kNone;
  grammar::Json schema;                   // kJsonSchema
  std::string where;                      // the schema's place in the request ("response_format.json_schema.schema")
  std::vector<std::string> choices;       // kChoice
  std::vector<grammar::ToolSpec> tools;   // kToolCall: the tools the reply may call
  bool parallel = true;                   // kToolCall: more than one call allowed
  bool active() const { return kind != kNone; }
  // The grammar of the reply (without a think block before it).
  Result<grammar::Grammar> grammar() const;
  // What identifies the grammar (the compiled-grammar cache's key, with the think mode).
  std::string key() const;
};

// The constraint a chat body asks for: response_format, guided_json, guided_choice (at most one of them), or the tool
// call that tool_choice ("required" / "function", naming `tool_name`) forces over `tools` (the validated tools array);
// `parallel` is parallel_tool_calls. The schema is compiled once here, so an unsupported keyword is refused
// (kInvalidArgument, naming it and where it is) before any work is done. Key order of `body` is kept (properties are
// written in it).
Status parse_output_constraint(const grammar::Json& body, const nlohmann::ordered_json& tools,
                               const std::string& tool_choice, const std::string& tool_name, bool parallel,
                               OutputConstraint& out);

// The grammar of `c` compiled over `model`'s vocabulary, with the think block a reasoning model may write first;
// shared with other requests asking for the same (model.grammars).
Result<std::shared_ptr<grammar::CompiledGrammar>> output_grammar(const ModelBundle& model, const OutputConstraint& c,
                                                                 grammar::ThinkPrefix think = grammar::ThinkPrefix::kNone);

// The model's vocabulary for grammars: every id below the decoder's vocab_size with its bytes (special tokens none),
// the EOS ids as end tokens.
std::shared_ptr<const grammar::TokenVocab> grammar_vocab(const ModelBundle& model);
// The same from a tokenizer alone: `vocab_size` ids (the decoder's, which may exceed the tokenizer's), special tokens
// and ids without text never allowed, `end_ids` the tokens that end the output.
std::shared_ptr<const grammar::TokenVocab> tokenizer_vocab(const text::Tokenizer& tok, int64_t vocab_size,
                                                           std::vector<int32_t> end_ids);

}  // namespace zest::engine
