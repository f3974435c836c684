#include "engine/structured_output.h"

#include <algorithm>

namespace zest::engine {
namespace {

using grammar::Json;

const Json* field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// Schemas may be given as JSON text (vLLM's guided_json accepts both).
Status schema_of(const Json& v, const std::string& where, Json& out) {
  if (v.is_string()) {
    out = Json::parse(v.get_ref<const std::string&>(), nullptr, false);
    if (out.is_discarded()) return invalid_argument("'" + where + "' is not valid JSON");
  } else {
    out = v;
  }
  if (!out.is_object() && !out.is_boolean()) return invalid_argument("'" + where + "' must be a JSON schema object");
  return Status::ok();
}

}  // namespace

Result<grammar::Grammar> OutputConstraint::grammar() const {
  switch (kind) {
    case kJsonObject: return grammar::json_object_grammar();
    case kJsonSchema: return grammar::json_schema_grammar(schema, where);
    case kChoice: return grammar::choice_grammar(choices);
    case kToolCall: return grammar::tool_call_grammar(tools, parallel, "tools");
    case kNone: break;
  }
  return invalid_argument("no output constraint");
}

std::string OutputConstraint::key() const {
  switch (kind) {
    case kJsonObject: return "json_object";
    case kJsonSchema: return "json_schema:" + schema.dump();
    case kChoice: return "choice:" + Json(choices).dump();
    case kToolCall: {
      Json t = Json::array();
      for (const grammar::ToolSpec& s : tools) t.push_back(Json{{"name", s.name}, {"parameters", s.parameters}});
      return std::string("tools:") + (parallel ? "parallel:" : "one:") + t.dump();
    }
    case kNone: break;
  }
  return "none";
}

Status parse_output_constraint(const Json& body, const nlohmann::ordered_json& tools, const std::string& tool_choice,
                               const std::string& tool_name, bool parallel, OutputConstraint& out) {
  out = OutputConstraint{};
  int given = 0;
  if (const Json* rf = field(body, "response_format")) {
    const Json* type = rf->is_object() ? field(*rf, "type") : nullptr;
    if (!type || !type->is_string())
      return invalid_argument("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                              "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}");
    const std::string t = *type;
    if (t == "json_object") {
      out.kind = OutputConstraint::kJsonObject;
      ++given;
    } else if (t == "json_schema") {
      const Json* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        return invalid_argument("'response_format.json_schema' must be an object {\"name\": ..., \"schema\": {...}}");
      if (const Json* name = field(*js, "name"); name && !name->is_string())
        return invalid_argument("'response_format.json_schema.name' must be a string");
      if (const Json* strict = field(*js, "strict"); strict && !strict->is_boolean())
        return invalid_argument("'response_format.json_schema.strict' must be a boolean");
      const Json* schema = field(*js, "schema");
      out.kind = OutputConstraint::kJsonSchema;
      out.where = "response_format.json_schema.schema";
      if (!schema) return invalid_argument("'response_format.json_schema.schema' is missing");
      ZEST_RETURN_IF_ERROR(schema_of(*schema, out.where, out.schema));
      ++given;
    } else if (t != "text") {
      return invalid_argument("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  if (const Json* gj = field(body, "guided_json")) {
    out.kind = OutputConstraint::kJsonSchema;
    out.where = "guided_json";
    ZEST_RETURN_IF_ERROR(schema_of(*gj, out.where, out.schema));
    ++given;
  }
  if (const Json* gc = field(body, "guided_choice")) {
    if (!gc->is_array() || gc->empty() || gc->size() > 1024 ||
        !std::all_of(gc->begin(), gc->end(), [](const Json& c) { return c.is_string() && !c.get_ref<const std::string&>().empty(); }))
      return invalid_argument("'guided_choice' must be an array of 1 to 1024 non-empty strings");
    out.kind = OutputConstraint::kChoice;
    for (const Json& c : *gc) out.choices.push_back(c);
    ++given;
  }
  const bool forced = tool_choice == "required" || tool_choice == "function";
  if (given > 1 || (given && forced))
    return invalid_argument("ask for one output constraint: 'response_format' (json), 'guided_json', 'guided_choice' "
                            "and a forced 'tool_choice' cannot be combined");
  if (forced) {
    out.kind = OutputConstraint::kToolCall;
    out.parallel = parallel && tool_choice == "required";
    for (const auto& t : tools) {
      const auto& fn = t["function"];
      const std::string name = fn["name"];
      if (tool_choice == "function" && name != tool_name) continue;
      grammar::ToolSpec spec;
      spec.name = name;
      if (auto p = fn.find("parameters"); p != fn.end() && !p->is_null()) spec.parameters = *p;
      out.tools.push_back(std::move(spec));
    }
  }
  if (out.active()) {
    auto g = out.grammar();
    if (!g.ok()) return g.status();
  }
  return Status::ok();
}

std::shared_ptr<const grammar::TokenVocab> grammar_vocab(const ModelBundle& model) {
  return model.grammars->vocab(
      [&] { return tokenizer_vocab(model.tokenizer, model.decoder().config().vocab_size, model.eos_ids()); });
}

std::shared_ptr<const grammar::TokenVocab> tokenizer_vocab(const text::Tokenizer& tok, int64_t vocab_size,
                                                           std::vector<int32_t> end_ids) {
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  const int32_t n = static_cast<int32_t>(std::min<int64_t>(vocab_size, tok.size()));
  for (int32_t i = 0; i < n; ++i)
    if (!tok.is_special(i)) tokens[i] = tok.token_bytes(i);
  return std::make_shared<const grammar::TokenVocab>(std::move(tokens), std::move(end_ids));
}

Result<std::shared_ptr<grammar::CompiledGrammar>> output_grammar(const ModelBundle& model, const OutputConstraint& c,
                                                                 grammar::ThinkPrefix think) {
  if (!c.active()) return invalid_argument("no output constraint");
  grammar_vocab(model);
  const std::string key = c.key() + "|think:" + std::to_string(static_cast<int>(think));
  return model.grammars->get(key, [&]() -> Result<grammar::Grammar> {
    ZEST_ASSIGN_OR_RETURN(grammar::Grammar g, c.grammar());
    grammar::add_think_prefix(g, think);
    return g;
  });
}

}  // namespace zest::engine
