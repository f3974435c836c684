// The grammar module: byte-level grammars, the JSON-schema compiler and the token masks.
// - Hand-written grammars and schemas: strings accepted and rejected as a whole (exact: a recognizer has no tolerance).
// - Masks over a tiny hand-made vocabulary against brute force: at every step of random walks through several
//   grammars, the mask's bit of every token equals whether feeding that token's bytes to a copy of the matcher succeeds
//   (and, for the end token, whether the grammar may end there). Exact.
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace zest::grammar {
namespace {

using json = Json;

bool match(const Grammar& g, std::string_view s) {
  auto r = matches(g, s);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() && *r;
}

Grammar schema_grammar(const json& schema) {
  auto g = json_schema_grammar(schema, "schema");
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? *g : Grammar();
}

TEST(Grammar, HandWrittenRules) {
  // S ::= "a" S | "b" ; T ::= S "c"? ; root ::= T ("," T){0,2}
  Grammar g;
  const int32_t s = g.add_rule("S");
  g.add_alt(s, cat({g.text("a"), {Grammar::ref(s)}}));
  g.add_alt(s, g.text("b"));
  const int32_t c = g.rule_of("c?", {{}, g.text("c")});
  const int32_t t = g.rule_of("T", {{Grammar::ref(s), Grammar::ref(c)}});
  g.set_root(g.repeat("list", {Grammar::ref(t)}, 1, 3, g.text(",")));
  for (const char* ok : {"b", "ab", "aaab", "bc", "aabc", "b,b", "ab,bc,aaab"}) EXPECT_TRUE(match(g, ok)) << ok;
  for (const char* bad : {"", "a", "ba", "bcc", "b,", "b,b,b,b", ",b", "abd"}) EXPECT_FALSE(match(g, bad)) << bad;
}

TEST(Grammar, LeftRecursionAndEmptyLanguagesAreRefused) {
  Grammar g;
  const int32_t s = g.add_rule("S");
  g.add_alt(s, cat({{Grammar::ref(s)}, g.text("a")}));
  g.add_alt(s, g.text("b"));
  g.set_root(s);
  EXPECT_FALSE(CompiledGrammar::compile(g, nullptr).ok());
  Grammar none;
  none.set_root(none.add_rule("nothing"));
  EXPECT_FALSE(CompiledGrammar::compile(none, nullptr).ok());
}

TEST(Grammar, UntilRule) {
  Grammar g;
  g.set_root(until_rule(g, "u", "abac"));
  for (const char* ok : {"abac", "xabac", "ababac", "abaabac", "aaaabac", "abab abac"}) EXPECT_TRUE(match(g, ok)) << ok;
  for (const char* bad : {"", "aba", "abacabac", "abacx", "ababa"}) EXPECT_FALSE(match(g, bad)) << bad;
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const Grammar g = schema_grammar(json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
    "required": ["name"]})"));
  for (const char* ok : {R"({"name": "bob"})", R"({"name":"","age":-3})", R"({"name": "a", "tags": ["x", "y"]})",
                         R"({"name": "a", "age": 0, "tags": []})", "{\n  \"name\": \"\\u00e9\"\n}", R"( {"name":"a"} )",
                         R"({"name": "h\u00e9llo"})", "{\"name\": \"\xC3\xA9\"}"})
    EXPECT_TRUE(match(g, ok)) << ok;
  for (const char* bad : {R"({})", R"({"age": 1})", R"({"age": 1, "name": "a"})", R"({"name": "toolong"})",
                          R"({"name": "a", "tags": ["x", "y", "x"]})", R"({"name": "a", "tags": ["z"]})",
                          R"({"name": "a", "age": 1.5})", R"({"name": "a", "age": 01})", R"({"name": "a", "x": 1})",
                          R"({"name": "a",})", "{\"name\":  \"a\"}", "{\"name\": \"\xC3\"}", R"({"name": "\ud800"})",
                          "{\"name\": \"\xED\xA0\x80\"}", "{\"name\": \"a\x01\"}", R"({"name": "a"})"
                                                                                   "x"})
    EXPECT_FALSE(match(g, bad)) << bad;
}

TEST(JsonSchema, AnyOfRefsAndRecursion) {
  const Grammar g = schema_grammar(json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": ["number", "null"]},
                                                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v"]}},
    "anyOf": [{"$ref": "#/$defs/node"}, {"type": "boolean"}, {"const": "leaf"}]})"));
  for (const char* ok : {"true", R"("leaf")", R"({"v": null})", R"({"v": 1.5e-3, "kids": [{"v": 2}, {"v": -0.25, "kids": []}]})"})
    EXPECT_TRUE(match(g, ok)) << ok;
  for (const char* bad : {R"("other")", "null", R"({"kids": []})", R"({"v": 1, "kids": [{"w": 1}]})", "1e999", R"({"v": 1.})"})
    EXPECT_FALSE(match(g, bad)) << bad;
}

TEST(JsonSchema, AdditionalPropertiesAndAnyObject) {
  const Grammar open = schema_grammar(json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                                      "additionalProperties": {"type": "string"}})"));
  EXPECT_TRUE(match(open, R"({"a": 1, "b": "x", "c": "y"})"));
  EXPECT_TRUE(match(open, R"({"b": "x"})"));
  EXPECT_FALSE(match(open, R"({"a": 1, "b": 2})"));
  const Grammar any = json_object_grammar();
  EXPECT_TRUE(match(any, R"({"a": [1, {"b": null}], "c": {"d": "e"}})"));
  EXPECT_TRUE(match(any, "{}"));
  EXPECT_FALSE(match(any, "[]"));
  EXPECT_FALSE(match(any, R"({"a": 1} {})"));
  // Whitespace between tokens is bounded: one space, or a newline and at most 32 spaces or tabs.
  EXPECT_TRUE(match(any, "{\n" + std::string(32, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(match(any, "{\n" + std::string(33, ' ') + "\"a\": 1}"));
  EXPECT_FALSE(match(any, "{  \"a\": 1}"));
  EXPECT_FALSE(match(any, "{\n\n\"a\": 1}"));
}

TEST(JsonSchema, NumbersAreBounded) {
  const Grammar num = schema_grammar(json{{"type", "number"}});
  for (const char* ok : {"0", "-0", "12.5", "1e5", "1E+05", "-3.25e-7", "123456789012345678"}) EXPECT_TRUE(match(num, ok)) << ok;
  for (const char* bad : {"", "-", "01", "1.", ".5", "1e", "1e123", "+1", "1234567890123456789", "NaN"})
    EXPECT_FALSE(match(num, bad)) << bad;
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedByName) {
  for (const char* kw : {"pattern", "format", "minimum", "patternProperties", "not", "if", "prefixItems"}) {
    json s = {{"type", "object"}, {"properties", {{"x", {{"type", "string"}, {kw, "v"}}}}}};
    auto g = json_schema_grammar(s, "response_format.json_schema.schema");
    ASSERT_FALSE(g.ok()) << kw;
    EXPECT_NE(g.status().message().find(std::string("'") + kw + "'"), std::string::npos) << g.status().message();
    EXPECT_NE(g.status().message().find("properties/x"), std::string::npos) << g.status().message();
  }
  EXPECT_FALSE(json_schema_grammar(json{{"type", "strange"}}, "s").ok());
  EXPECT_FALSE(json_schema_grammar(json{{"$ref", "#/$defs/missing"}}, "s").ok());
  EXPECT_FALSE(json_schema_grammar(json{{"type", "object"}, {"required", {"a"}}}, "s").ok());
  EXPECT_FALSE(json_schema_grammar(json(false), "s").ok());
}

TEST(JsonSchema, ToolCallsAndThinkPrefix) {
  std::vector<ToolSpec> tools = {{"get_weather", json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}},
                                                                  "required": ["city"]})")},
                                 {"ping", json()}};
  auto g = tool_call_grammar(tools, /*parallel=*/true, "tools");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const std::string a = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string b = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(match(*g, a));
  EXPECT_TRUE(match(*g, a + "\n" + b));
  EXPECT_FALSE(match(*g, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(match(*g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
  EXPECT_FALSE(match(*g, "text " + a));
  auto one = tool_call_grammar(tools, /*parallel=*/false, "tools");
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(match(*one, a + "\n" + b));
  add_think_prefix(*one, ThinkPrefix::kOptional);
  EXPECT_TRUE(match(*one, b));
  EXPECT_TRUE(match(*one, "<think>\nhmm </think\n</think>\n\n" + b));
  EXPECT_FALSE(match(*one, "<think>\nhmm"));
  Grammar choice = choice_grammar({"yes", "no", "maybe"});
  add_think_prefix(choice, ThinkPrefix::kOpen);
  EXPECT_TRUE(match(choice, "ok</think>\nyes"));
  EXPECT_FALSE(match(choice, "yes"));
}

// The mask against feeding every token's bytes to a copy of the matcher, along random walks.
void check_masks(const Grammar& g, const std::vector<std::string>& tokens, int32_t end_id, uint32_t seed, int walks) {
  auto vocab = std::make_shared<TokenVocab>(tokens, std::vector<int32_t>{end_id});
  auto c = CompiledGrammar::compile(g, vocab);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::mt19937 rng(seed);
  int steps = 0, ended = 0;
  for (int w = 0; w < walks; ++w) {
    Matcher m(*c);
    std::string path;
    for (int step = 0; step < 40; ++step, ++steps) {
      const auto mask = m.mask();
      ASSERT_TRUE(m.status().is_ok()) << m.status().to_string();
      ASSERT_EQ(mask->size(), static_cast<size_t>((tokens.size() + 31) / 32));
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < static_cast<int32_t>(tokens.size()); ++t) {
        Matcher copy = m;
        const bool brute = t == end_id ? m.complete() : (!tokens[t].empty() && copy.accept_bytes(tokens[t]));
        const bool bit = ((*mask)[t >> 5] >> (t & 31)) & 1u;
        ASSERT_EQ(bit, brute) << "token " << t << " '" << tokens[t] << "' at step " << step;
        if (bit) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << "a live state allows no token after '" << path << "'";
      const int32_t pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept(pick));
      path += tokens[pick] + "|";
      if (pick == end_id) {
        ++ended;
        break;
      }
    }
  }
  EXPECT_GT(ended, 0) << "no walk reached the end";
  EXPECT_GT(steps, walks);
}

TEST(Masks, MatchBruteForceOnATinyVocabulary) {
  std::vector<std::string> tokens = {
      "{", "}", "\"", "\":", "\": ", ", \"", "a", "ab", "name", "\"name\"", " ", "\n", "\n  ", "  ", "1", "12", "-",
      "0", ".", "5e", "e", "true", "fal", "se", "null", "[", "]", "[]", "{}", ",", "\xC3", "\xA9", "\xC3\xA9", "\\",
      "\\u", "00e9", "\"}", "\"]", "x\"", "\xE2\x82", "\xAC", "<think>", "</think>", "<", "think", ">", "</", "\n\n",
      "<tool_call>", "\n{\"name\": \"", "get", "_weather", "\", \"arguments\": ", "}\n</tool_call>", "</tool_call>",
      "city", "yes", "no", "ye", "", "\x01", "\xFF"};
  const int32_t eos = static_cast<int32_t>(tokens.size()) - 3;  // the empty token: the end id
  // Every printable ASCII byte as a token of its own, as byte-level vocabularies have (else a state may need a byte
  // that no token starts with).
  for (int b = 0x20; b < 0x7f; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  const json schema = json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 4}, "n": {"type": "number"},
      "l": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}, "z": {"type": "null"}},
    "required": ["name"]})");
  check_masks(schema_grammar(schema), tokens, eos, 1, 40);
  check_masks(json_object_grammar(), tokens, eos, 2, 40);
  auto calls = tool_call_grammar({{"get_weather", json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 3}}})")}},
                                 true, "tools");
  ASSERT_TRUE(calls.ok());
  add_think_prefix(*calls, ThinkPrefix::kOptional);
  check_masks(*calls, tokens, eos, 3, 40);
  Grammar choice = choice_grammar({"yes", "no", "ab"});
  check_masks(choice, tokens, eos, 4, 20);
}

TEST(Masks, OnlyTheEndTokenOnceComplete) {
  const std::vector<std::string> tokens = {"yes", "y", "es", "", "no"};
  auto vocab = std::make_shared<TokenVocab>(tokens, std::vector<int32_t>{3});
  auto c = CompiledGrammar::compile(choice_grammar({"yes", "yesno"}), vocab);
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  EXPECT_EQ((*m.mask())[0], 0b00011u);
  ASSERT_TRUE(m.accept(0));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.must_end());
  EXPECT_EQ((*m.mask())[0], 0b11000u);
  EXPECT_FALSE(m.accept(1));
  EXPECT_FALSE(m.status().is_ok());
  ASSERT_TRUE(m.accept(4));
  EXPECT_TRUE(m.must_end());
  EXPECT_EQ((*m.mask())[0], 0b01000u);
  EXPECT_TRUE(m.accept(3));
  EXPECT_TRUE(m.ended());
}

}  // namespace
}  // namespace zest::grammar
