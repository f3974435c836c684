// JSON grammars (grammar.h) for structured output: any JSON value or object, a subset of JSON Schema, Qwen3's
// hermes-style tool calls, fixed choices, and the think block a reasoning model writes before them.
//
// The JSON text: `ws VALUE ws`, where ws, the only whitespace allowed between JSON tokens, is nothing, one space, or
// one newline followed by up to JsonOptions::max_indent spaces or tabs: bounded, so sampling at a high temperature
// cannot wander in whitespace forever. Numbers have at most 18 integer digits, 18 fraction digits and a two-digit
// exponent (every such number parses to a finite double; an "integer" fits int64). Strings are UTF-8 (every byte
// sequence the grammar allows is well-formed) with JSON's escapes; \u escapes of surrogates come in valid pairs only.
//
// The JSON Schema subset (anything else is refused by keyword, with its place in the schema):
//   type (a name or a list of names: object, array, string, number, integer, boolean, null), enum, const,
//   properties, required, additionalProperties (false, true or a schema; when absent: false if "properties" is
//   given, else any members), items, minItems, maxItems, minLength, maxLength, anyOf, oneOf (as anyOf: the grammar
//   does not check that exactly one matches), allOf with a single schema, $ref to "#", "#/$defs/..." or
//   "#/definitions/..." (recursion allowed), uniqueItems: false, and the annotations (title, description, default,
//   examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, $defs, definitions).
// Properties are written in the order of "properties" (required ones always, optional ones may be left out); extra
// members allowed by additionalProperties come after them, under any name.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/grammar.h"

namespace zest::grammar {

// Schemas keep the key order of their text: properties are written in that order.
using Json = nlohmann::ordered_json;

struct JsonOptions {
  int64_t max_indent = 32;  // spaces or tabs after a newline between JSON tokens
};

// Rules for JSON values inside one grammar; the shared pieces (whitespace, strings, numbers, any value) are made once.
class JsonRules {
 public:
  explicit JsonRules(Grammar& g, JsonOptions opts = {});
  // The values `schema` accepts. `where` names the schema in errors ("response_format.json_schema.schema"); the
  // root of "$ref": "#..." is the schema given here.
  Result<int32_t> schema(const Json& schema, const std::string& where);
  int32_t ws();
  int32_t any_value();
  int32_t any_object();
  int32_t string(int64_t min_len = 0, int64_t max_len = -1);
  int32_t number();
  int32_t integer();
  // The bytes of one JSON value as text (no whitespace inside).
  Seq literal(const Json& value);

 private:
  Result<int32_t> compile(const Json& s, const std::string& path, int depth);
  Result<int32_t> compile_ref(const std::string& ref, const std::string& path, int depth);
  Result<int32_t> compile_object(const Json& s, const std::string& path, int depth);
  Result<int32_t> compile_array(const Json& s, const std::string& path, int depth);
  int32_t json_char();

  Grammar& g_;
  JsonOptions opts_;
  const Json* root_ = nullptr;
  std::string where_;
  std::map<std::string, int32_t> refs_;
  int32_t ws_ = -1, char_ = -1, value_ = -1, object_ = -1, array_ = -1, number_ = -1, integer_ = -1;
  std::map<std::pair<int64_t, int64_t>, int32_t> strings_;
};

// A JSON text whose value `schema` accepts.
Result<Grammar> json_schema_grammar(const Json& schema, const std::string& where, JsonOptions opts = {});
// A JSON text holding any object.
Grammar json_object_grammar(JsonOptions opts = {});

// Tool calls as Qwen3's template writes them: <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>, ARGS
// a JSON object that the tool's "parameters" schema accepts (no parameters: {}); with `parallel`, one or more calls
// separated by a newline, else exactly one.
struct ToolSpec {
  std::string name;           // letters, digits, '_' and '-'
  Json parameters;  // a JSON schema, or null
};
Result<Grammar> tool_call_grammar(const std::vector<ToolSpec>& tools, bool parallel, const std::string& where,
                                  JsonOptions opts = {});

// Exactly one of the strings.
Grammar choice_grammar(const std::vector<std::string>& choices);

// What comes before the grammar's output in a reasoning model's reply: nothing, an optional "<think>...</think>"
// block (the reasoning, any bytes), or the rest of a think block the prompt opened ("...</think>"). Up to 8 spaces,
// tabs or newlines may follow the block.
enum class ThinkPrefix { kNone, kOptional, kOpen };
void add_think_prefix(Grammar& g, ThinkPrefix mode);

// A rule matching any bytes that do not contain `terminator`, followed by `terminator` (a right-linear rule per
// prefix of the terminator, from its KMP automaton).
int32_t until_rule(Grammar& g, const std::string& name, const std::string& terminator);

}  // namespace zest::grammar
