// Tools and thinking through the request path: parse_chat_request validates `tools` / `tool_choice`, and
// plan_prompt renders them with the history's tool calls and tool results exactly as transformers does
// (tests/text/data/chat_cases.json, tools/render_chat_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "engine/chat_request.h"
#include "engine_test_util.h"

namespace zest::engine {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::shared_ptr<ModelBundle> tiny_vl() {
  static std::shared_ptr<ModelBundle> m = [] {
    auto r = ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_vl_moe_tiny");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  return m;
}

ojson chat_case(const std::string& name) {
  std::ifstream in(ZEST_SOURCE_DIR "/tests/text/data/chat_cases.json", std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const ojson doc = ojson::parse(ss.str());
  for (const ojson& c : doc["cases"])
    if (c["name"] == name) return c;
  ADD_FAILURE() << "no chat case " << name;
  return {};
}

// The prompt text plan_prompt builds for an OpenAI body made of a fixture case (messages, tools, thinking switch).
std::string planned_text(const ModelBundle& m, const ojson& c) {
  ojson body = {{"messages", c["messages"]}, {"tools", c["tools"]},
                {"chat_template_kwargs", {{"enable_thinking", c["options"]["enable_thinking"]}}}};
  auto r = parse_chat_request(json(body), m);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  use_client_key_order(*r, body);
  auto plan = plan_prompt(m, *r, PromptOptions{});
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  return plan.ok() ? m.tokenizer.decode(plan->ids) : std::string();
}

TEST(ChatTools, RequestWithToolsRendersAsTransformers) {
  for (const char* name : {"qwen3/openai_tool_round_trip", "qwen3/openai_tool_round_trip_thinking_off",
                           "qwen3/tools_with_system", "qwen3/thinking_off"}) {
    const ojson c = chat_case(name);
    EXPECT_EQ(planned_text(*zest::testing::tiny(), c), c["expected"].get<std::string>()) << name;
  }
  const ojson c = chat_case("qwen3vl/vl_openai_tool_round_trip");
  EXPECT_EQ(planned_text(*tiny_vl(), c), c["expected"].get<std::string>());
}

TEST(ChatTools, KeyOrderOfToolsFollowsTheClient) {
  // The parsed body sorts keys; use_client_key_order brings back the client's order, which the template prints.
  const ojson c = chat_case("qwen3/openai_tool_round_trip");
  ojson body = {{"messages", c["messages"]}, {"tools", c["tools"]}};
  auto r = parse_chat_request(json(body), *zest::testing::tiny());
  ASSERT_TRUE(r.ok());
  auto sorted = plan_prompt(*zest::testing::tiny(), *r, PromptOptions{});
  ASSERT_TRUE(sorted.ok());
  EXPECT_NE(zest::testing::tiny()->tokenizer.decode(sorted->ids), c["expected"].get<std::string>());
  use_client_key_order(*r, body);
  auto kept = plan_prompt(*zest::testing::tiny(), *r, PromptOptions{});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(zest::testing::tiny()->tokenizer.decode(kept->ids), c["expected"].get<std::string>());
}

const json kTool = {{"type", "function"},
                    {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}};

json with(json extra) {
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

TEST(ChatTools, ToolChoiceAndParallelCalls) {
  const ModelBundle& m = *zest::testing::tiny();
  auto r = parse_chat_request(with({{"tools", {kTool}}}), m);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->parse_tool_calls());
  EXPECT_TRUE(r->parallel_tool_calls);
  r = parse_chat_request(with({{"tools", {kTool}}, {"tool_choice", "none"}, {"parallel_tool_calls", false}}), m);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->parse_tool_calls());  // rendered, not parsed
  EXPECT_FALSE(r->parallel_tool_calls);
  EXPECT_FALSE(r->tools.is_null());
  r = parse_chat_request(with({{"tools", json::array()}, {"tool_choice", "auto"}}), m);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->parse_tool_calls());
}

TEST(ChatTools, BadToolsAndToolChoiceNameTheField) {
  const ModelBundle& m = *zest::testing::tiny();
  json bad_name = kTool;
  bad_name["function"]["name"] = "has space";
  json no_fn = {{"type", "function"}};
  json retrieval = {{"type", "retrieval"}, {"function", kTool["function"]}};
  json params = kTool;
  params["function"]["parameters"] = "object";
  json desc = kTool;
  desc["function"]["description"] = 3;
  const std::vector<std::pair<json, std::string>> cases = {
      {with({{"tools", "get_weather"}}), "'tools'"},
      {with({{"tools", {1}}}), "'tools[0]'"},
      {with({{"tools", {retrieval}}}), "'tools[0].type'"},
      {with({{"tools", {no_fn}}}), "'tools[0].function'"},
      {with({{"tools", {kTool, bad_name}}}), "'tools[1].function.name'"},
      {with({{"tools", {kTool, kTool}}}), "'tools[1].function.name'"},
      {with({{"tools", {params}}}), "'tools[0].function.parameters'"},
      {with({{"tools", {desc}}}), "'tools[0].function.description'"},
      {with({{"tools", json::array({kTool})}, {"tool_choice", "always"}}), "'tool_choice'"},
      {with({{"tools", json::array({kTool})}, {"tool_choice", 1}}), "'tool_choice'"},
      {with({{"tool_choice", "required"}}), "'tool_choice'"},
      {with({{"tools", json::array({kTool})},
             {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}}),
       "'tool_choice'"},
      {with({{"tools", json::array({kTool})}, {"parallel_tool_calls", "yes"}}), "'parallel_tool_calls'"},
      {with({{"functions", {kTool["function"]}}}), "'functions'"},
  };
  for (const auto& [body, field] : cases) {
    auto r = parse_chat_request(body, m);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.status().message().rfind(field, 0), 0u) << r.status().message();
  }
  // Forcing a call is structured output: the reply is constrained to the tool-call grammar.
  auto r = parse_chat_request(with({{"tools", json::array({kTool})}, {"tool_choice", "required"}}), m);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->constraint.kind, OutputConstraint::kToolCall);
  EXPECT_TRUE(r->parse_tool_calls());
  r = parse_chat_request(with({{"tools", json::array({kTool})},
                               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}),
                         m);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->constraint.tools.size(), 1u);
  EXPECT_EQ(r->constraint.tools[0].name, "get_weather");
  EXPECT_FALSE(r->constraint.parallel);
}

TEST(ChatTools, EnableThinkingReachesTheTemplate) {
  const ModelBundle& m = *zest::testing::tiny();
  auto on = parse_chat_request(with({}), m);
  auto off = parse_chat_request(with({{"chat_template_kwargs", {{"enable_thinking", false}}}}), m);
  ASSERT_TRUE(on.ok() && off.ok());
  auto p_on = plan_prompt(m, *on, PromptOptions{});
  auto p_off = plan_prompt(m, *off, PromptOptions{});
  ASSERT_TRUE(p_on.ok() && p_off.ok());
  const std::string t_on = m.tokenizer.decode(p_on->ids), t_off = m.tokenizer.decode(p_off->ids);
  EXPECT_TRUE(t_on.ends_with("<|im_start|>assistant\n")) << t_on;
  EXPECT_TRUE(t_off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << t_off;
}

}  // namespace
}  // namespace zest::engine
