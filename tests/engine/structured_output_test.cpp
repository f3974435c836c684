// Structured output through the engine on the tiny qwen3_moe fixture (CPU, random weights, so the model itself knows
// nothing about JSON: every structure in its replies comes from the grammar masks).
// - 50 requests sampled at temperature 1 (half pure temperature, half top-k / top-p) with a json_schema all end by
//   EOS (finish "stop") and parse and validate against the schema. The validator below is written for this test,
//   independent of src/grammar (standard JSON-Schema semantics of the keywords the schema uses; string lengths in
//   code points). The schema bounds every string, array and number, so a reply cannot run past max_tokens.
// - json_object: every reply that ends by EOS parses as a JSON object (a logit_bias on the closing tokens lets the
//   random model finish: at least 4 of 7 replies end by EOS).
// - tool_choice "required" / a named function: the reply parses (engine::parse_chat_output, as the server does) into
//   tool calls of the named tools whose arguments validate against the tool's parameters.
// - guided_choice: one of the choices, exactly; with min_tokens beyond the choice, EOS still ends it.
// - Refusals: unsupported schema keywords by name, guided_regex, response_format on text completions.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/chat_output.h"
#include "engine/chat_request.h"
#include "engine/engine.h"
#include "engine/structured_output.h"
#include "engine_test_util.h"

namespace zest::engine {
namespace {

using nlohmann::json;

int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The keywords of the schemas below, with JSON Schema's meaning (additionalProperties absent = allowed).
bool validate(const json& v, const json& s, const json& root, std::string& why) {
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validate(v, root.at(json::json_pointer(ref.substr(1))), root, why);
  }
  if (s.contains("anyOf")) {
    for (const json& sub : s["anyOf"]) {
      std::string ignored;
      if (validate(v, sub, root, ignored)) return true;
    }
    why = "no anyOf branch matches " + v.dump();
    return false;
  }
  if (s.contains("const") && v != s["const"]) return why = "const " + v.dump(), false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
    return why = "enum " + v.dump(), false;
  if (s.contains("type")) {
    const std::string t = s["type"];
    const bool ok = (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
                    (t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
                    (t == "integer" && v.is_number_integer()) || (t == "boolean" && v.is_boolean()) ||
                    (t == "null" && v.is_null());
    if (!ok) return why = "type " + t + ": " + v.dump(), false;
  }
  if (v.is_object()) {
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return why = "missing " + r.get<std::string>(), false;
    const json props = s.value("properties", json::object());
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!validate(x, props[k], root, why)) return why = k + ": " + why, false;
      } else if (s.contains("additionalProperties")) {
        const json& ap = s["additionalProperties"];
        if (ap.is_boolean() ? !ap.get<bool>() : !validate(x, ap, root, why)) return why = "extra " + k, false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("maxItems") && static_cast<int64_t>(v.size()) > s["maxItems"].get<int64_t>()) return why = "maxItems", false;
    if (s.contains("minItems") && static_cast<int64_t>(v.size()) < s["minItems"].get<int64_t>()) return why = "minItems", false;
    if (s.contains("items"))
      for (const json& x : v)
        if (!validate(x, s["items"], root, why)) return false;
  }
  if (v.is_string()) {
    const int64_t n = code_points(v.get<std::string>());
    if (s.contains("maxLength") && n > s["maxLength"].get<int64_t>()) return why = "maxLength " + v.dump(), false;
    if (s.contains("minLength") && n < s["minLength"].get<int64_t>()) return why = "minLength " + v.dump(), false;
  }
  return true;
}

const json kSchema = json::parse(R"({
  "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                    "required": ["kind"], "additionalProperties": false}},
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer"},
    "score": {"type": "number"},
    "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]}
  },
  "required": ["name", "age", "ok", "color"],
  "additionalProperties": false})");

json chat(const json& extra) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Describe a person as JSON."}}}},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  body.update(extra);
  return body;
}

// Runs the requests on one engine; returns their outputs in order.
std::vector<RequestOutput> run_all(const std::shared_ptr<ModelBundle>& m, const std::vector<json>& bodies) {
  Engine engine(m, {});
  std::vector<RequestOutput> outs(bodies.size());
  for (size_t i = 0; i < bodies.size(); ++i) {
    auto cr = parse_chat_request(bodies[i], *m);
    EXPECT_TRUE(cr.ok()) << cr.status().to_string();
    if (!cr.ok()) return {};
    auto p = build_prompt(*m, *cr, {});
    EXPECT_TRUE(p.ok());
    EXPECT_TRUE(cr->sampling.grammar) << "parse_chat_request compiles the constraint";
    Request req;
    req.id = static_cast<int64_t>(i);
    req.prompt = *p;
    req.sampling = cr->sampling;
    req.on_update = [&outs, i](const std::string&, const RequestOutput& out, bool finished) {
      if (finished) outs[i] = out;
    };
    EXPECT_TRUE(engine.add(std::move(req)).is_ok());
  }
  while (engine.has_work()) {
    Status st = engine.step();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
  }
  return outs;
}

TEST(StructuredOutput, SampledRepliesFollowTheJsonSchema) {
  auto m = zest::testing::tiny();
  ASSERT_TRUE(m);
  std::vector<json> bodies;
  for (int i = 0; i < 50; ++i) {
    json extra = {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", kSchema}}}}},
                  {"temperature", 1.0}, {"seed", 1000 + i}, {"max_tokens", 600}};
    if (i % 2) extra.update({{"top_k", 0}, {"top_p", 1.0}});
    else extra.update({{"top_k", 40}, {"top_p", 0.95}});
    bodies.push_back(chat(extra));
  }
  const auto outs = run_all(m, bodies);
  ASSERT_EQ(outs.size(), bodies.size());
  std::set<std::string> distinct;
  for (size_t i = 0; i < outs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + ": " + outs[i].text);
    ASSERT_EQ(outs[i].finish, FinishReason::kStop) << outs[i].error;
    const json v = json::parse(outs[i].text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << "does not parse";
    std::string why;
    EXPECT_TRUE(validate(v, kSchema, kSchema, why)) << why;
    distinct.insert(outs[i].text);
  }
  // Sampling, not one forced reply: the replies differ.
  EXPECT_GT(distinct.size(), 40u);
}

TEST(StructuredOutput, JsonObjectRepliesParse) {
  auto m = zest::testing::tiny();
  // The random model writes strings that never end; a bias on the closing tokens lets most replies finish.
  json bias = json::object();
  for (const char* t : {"\"", "}", "]", "\"}", "\",", "\":"}) {
    const int32_t id = m->tokenizer.token_to_id(t);
    ASSERT_GE(id, 0) << t;
    bias[std::to_string(id)] = 5.0;
  }
  std::vector<json> bodies;
  for (int i = 0; i < 6; ++i)
    bodies.push_back(chat({{"response_format", {{"type", "json_object"}}}, {"temperature", 1.0}, {"seed", 7 + i},
                           {"max_tokens", 300}, {"logit_bias", bias}}));
  bodies.push_back(chat({{"response_format", {{"type", "json_object"}}}, {"temperature", 0}, {"max_tokens", 300}}));
  const auto outs = run_all(m, bodies);
  ASSERT_EQ(outs.size(), bodies.size());
  int stopped = 0;
  for (const RequestOutput& o : outs) {
    ASSERT_NE(o.finish, FinishReason::kError) << o.error;
    ASSERT_FALSE(o.text.empty());
    EXPECT_EQ(o.text.find_first_not_of(" \n\t"), o.text.find('{')) << o.text;
    if (o.finish != FinishReason::kStop) continue;
    ++stopped;
    const json v = json::parse(o.text, nullptr, false);
    EXPECT_TRUE(v.is_object()) << o.text;
  }
  EXPECT_GE(stopped, 4);
}

TEST(StructuredOutput, ForcedToolCallsParseIntoCallsOfTheTools) {
  auto m = zest::testing::tiny();
  const json weather = json::parse(R"({"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                        "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}})");
  const json ping = json::parse(R"({"type": "function", "function": {"name": "ping"}})");
  std::vector<json> bodies;
  for (int i = 0; i < 8; ++i)
    bodies.push_back(chat({{"tools", {weather, ping}}, {"tool_choice", "required"}, {"temperature", 1.0},
                           {"seed", 50 + i}, {"max_tokens", 400}, {"parallel_tool_calls", i % 2 == 0}}));
  for (int i = 0; i < 4; ++i)
    bodies.push_back(chat({{"tools", {weather, ping}},
                           {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                           {"temperature", 1.0}, {"seed", 90 + i}, {"max_tokens", 400}}));
  const auto outs = run_all(m, bodies);
  ASSERT_EQ(outs.size(), bodies.size());
  std::set<std::string> names;
  for (size_t i = 0; i < outs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + ": " + outs[i].text);
    // A parallel reply may go on with more calls until max_tokens; every closed call must parse.
    ASSERT_NE(outs[i].finish, FinishReason::kError) << outs[i].error;
    ChatOutputOptions o;
    o.tools = true;
    const ParsedMessage msg = parse_chat_output(outs[i].text, o);
    ASSERT_FALSE(msg.tool_calls.empty());
    if (outs[i].finish == FinishReason::kStop) {
      EXPECT_EQ(msg.content, "");
    }
    if (i >= 8 || i % 2 == 1) {
      EXPECT_EQ(outs[i].finish, FinishReason::kStop);
      EXPECT_EQ(msg.tool_calls.size(), 1u);
    }
    for (const ParsedToolCall& c : msg.tool_calls) {
      names.insert(c.name);
      if (i >= 8) {
        EXPECT_EQ(c.name, "get_weather");
      }
      const json args = json::parse(c.arguments);
      const json schema = c.name == "get_weather" ? weather["function"]["parameters"] : json::parse(R"({"type": "object", "additionalProperties": false})");
      ASSERT_TRUE(c.name == "get_weather" || c.name == "ping") << c.name;
      std::string why;
      EXPECT_TRUE(validate(args, schema, schema, why)) << why << " " << c.arguments;
    }
  }
  EXPECT_EQ(names.size(), 2u);
}

TEST(StructuredOutput, UnsupportedConstraintsAreRefusedByName) {
  const ModelBundle& m = *zest::testing::tiny();
  for (const char* kw : {"pattern", "format", "minimum", "not"}) {
    json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {kw, "x"}}}}}};
    auto r = parse_chat_request(
        chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}}), m);
    ASSERT_FALSE(r.ok()) << kw;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("'") + kw + "'"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("response_format.json_schema.schema/properties/a"), std::string::npos)
        << r.status().message();
  }
  auto bad_type = parse_chat_request(chat({{"response_format", {{"type", "xml"}}}}), m);
  EXPECT_FALSE(bad_type.ok());
  auto regex = parse_chat_request(chat({{"guided_regex", "a+"}}), m);
  ASSERT_FALSE(regex.ok());
  EXPECT_NE(regex.status().message().find("'guided_regex'"), std::string::npos);
  auto both = parse_chat_request(chat({{"response_format", {{"type", "json_object"}}}, {"guided_choice", {"a"}}}), m);
  EXPECT_FALSE(both.ok());
  auto text = parse_chat_request(chat({{"response_format", {{"type", "text"}}}}), m);
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text->constraint.active());
  auto completion = parse_completion_request(json{{"prompt", "hi"}, {"response_format", {{"type", "json_object"}}}}, m);
  ASSERT_FALSE(completion.ok());
  EXPECT_NE(completion.status().message().find("'response_format'"), std::string::npos);
}

TEST(StructuredOutput, GuidedChoiceAndPropertyOrder) {
  auto m = zest::testing::tiny();
  std::vector<json> bodies;
  for (int i = 0; i < 6; ++i)
    bodies.push_back(chat({{"guided_choice", {"yes", "no", "perhaps not"}}, {"temperature", 1.0}, {"seed", i}}));
  const auto outs = run_all(m, bodies);
  ASSERT_EQ(outs.size(), bodies.size());
  for (const RequestOutput& o : outs) {
    EXPECT_EQ(o.finish, FinishReason::kStop);
    EXPECT_TRUE(o.text == "yes" || o.text == "no" || o.text == "perhaps not") << o.text;
  }
  // Where the grammar allows only EOS, min_tokens does not mask it (the grammar wins).
  const auto short_outs = run_all(m, {chat({{"guided_choice", {"yes"}}, {"min_tokens", 20}, {"max_tokens", 30}})});
  ASSERT_EQ(short_outs.size(), 1u);
  EXPECT_EQ(short_outs[0].finish, FinishReason::kStop);
  EXPECT_EQ(short_outs[0].text, "yes");
  // The schema's own key order decides the order of the properties (use_client_key_order).
  const std::string raw = R"({"messages": [{"role": "user", "content": "x"}], "temperature": 0, "max_tokens": 200,
      "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object",
      "properties": {"zeta": {"type": "boolean"}, "alpha": {"type": "boolean"}}, "required": ["zeta", "alpha"]}}}})";
  auto cr = parse_chat_request(json::parse(raw), *m);
  ASSERT_TRUE(cr.ok());
  use_client_key_order(*cr, nlohmann::ordered_json::parse(raw));
  auto g = output_grammar(*m, cr->constraint);
  ASSERT_TRUE(g.ok());
  grammar::Matcher mt(*g);
  EXPECT_TRUE(mt.accept_bytes(R"({"zeta": true, "alpha": false})"));
  EXPECT_TRUE(mt.complete());
  grammar::Matcher other(*g);
  EXPECT_FALSE(other.accept_bytes(R"({"alpha")"));
}

}  // namespace
}  // namespace zest::engine
