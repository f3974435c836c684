// Reasoning and tool-call parsing of chat replies through the server (--reasoning-parser, tools). The fixture models
// write noise, so a reply is forced with logit_bias: every token the same tag. The parser itself (splits at every byte,
// well-formed and malformed calls) is tested in tests/engine/chat_output_test.cpp.
#include "server_test_util.h"

namespace zest::server::testing {
namespace {

constexpr const char* kThinkId = "151667";     // <think>
constexpr const char* kToolCallId = "151657";  // <tool_call>

json forced(const char* token_id, int64_t max_tokens) {
  json body = chat_body("Say something.", max_tokens);
  body["logit_bias"] = {{token_id, 100}};
  body["ignore_eos"] = true;
  return body;
}

const json kTools = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"description", "Weather of a city"},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties", {{"city", {{"type", "string"}}}}},
                                      {"required", {"city"}}}}}}}});

std::unique_ptr<Server> serve(const std::string& model, const std::string& parser = "auto") {
  ServerOptions o;
  o.engine.max_context = 1024;
  o.stream_keepalive_ms = 50;
  o.reasoning_parser = parser;
  return start_server(model, o);
}

TEST(ServerReasoning, ThinkBlockGoesToReasoningContent) {
  auto srv = serve("qwen3_moe_tiny");  // auto: the Qwen3 template has the thinking switch
  ASSERT_TRUE(srv);
  auto c = client(*srv);
  json body = forced(kThinkId, 4);
  HttpReply r = post_json(*c, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json& msg = r.j["choices"][0]["message"];
  // "<think>" opens the reasoning; the three after it are its text, and the reply ends inside it: no content.
  EXPECT_EQ(msg["reasoning_content"], "<think><think><think>");
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_FALSE(msg.contains("tool_calls"));
  EXPECT_EQ(r.j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 4);

  body["stream"] = true;
  StreamParts p = split_stream(post_stream(*c, body.dump()));
  EXPECT_TRUE(p.done_last);
  EXPECT_EQ(p.reasoning, "<think><think><think>");
  EXPECT_EQ(p.content, "");  // only the role chunk's ""
  EXPECT_EQ(p.chunks.back()["choices"][0]["finish_reason"], "length");
  for (const json& ch : p.chunks) {
    const json& d = ch["choices"][0]["delta"];
    EXPECT_FALSE(d.contains("reasoning_content") && d.contains("content")) << "one kind per delta: " << d.dump();
  }

  // Plain replies keep their text as content, with "reasoning_content": null.
  HttpReply plain = post_json(*c, chat_body("hi", 5).dump());
  ASSERT_EQ(plain.status, 200);
  EXPECT_TRUE(plain.j["choices"][0]["message"]["content"].is_string());
  EXPECT_TRUE(plain.j["choices"][0]["message"].contains("reasoning_content"));
}

TEST(ServerReasoning, ParserOffLeavesTheTextWhole) {
  for (const auto& [model, parser] : {std::pair{"qwen3_moe_tiny", "none"}, std::pair{"qwen3_vl_moe_tiny", "auto"}}) {
    auto srv = serve(model, parser);
    ASSERT_TRUE(srv);
    auto c = client(*srv);
    HttpReply r = post_json(*c, forced(kThinkId, 3).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json& msg = r.j["choices"][0]["message"];
    EXPECT_EQ(msg["content"], "<think><think><think>") << model;
    EXPECT_FALSE(msg.contains("reasoning_content")) << model;
  }
  // qwen3 asked for explicitly on the VL model works too.
  auto srv = serve("qwen3_vl_moe_tiny", "qwen3");
  ASSERT_TRUE(srv);
  auto c = client(*srv);
  HttpReply r = post_json(*c, forced(kThinkId, 3).dump());
  EXPECT_EQ(r.j["choices"][0]["message"]["reasoning_content"], "<think><think>");
  // A bad --reasoning-parser is refused at start.
  ServerOptions o;
  o.reasoning_parser = "deepseek";
  o.port = 0;
  EXPECT_FALSE(Server::start(fixture_model("qwen3_moe_tiny"), o).ok());
}

TEST(ServerTools, MalformedCallIsContentAndFinishIsNotToolCalls) {
  auto srv = serve("qwen3_vl_moe_tiny");
  ASSERT_TRUE(srv);
  auto c = client(*srv);
  json body = forced(kToolCallId, 3);
  body["tools"] = kTools;
  HttpReply r = post_json(*c, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json& msg = r.j["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "<tool_call><tool_call><tool_call>");
  EXPECT_FALSE(msg.contains("tool_calls"));
  EXPECT_EQ(r.j["choices"][0]["finish_reason"], "length");
  body["stream"] = true;
  StreamParts p = split_stream(post_stream(*c, body.dump()));
  EXPECT_EQ(p.content, "<tool_call><tool_call><tool_call>");
  for (const json& ch : p.chunks) EXPECT_FALSE(ch["choices"][0]["delta"].contains("tool_calls"));
}

TEST(ServerTools, ToolRoundTripIsRenderedAndBadToolsAreRefusedByName) {
  auto srv = serve("qwen3_moe_tiny");
  ASSERT_TRUE(srv);
  auto c = client(*srv);
  json body = chat_body("Weather in Paris?", 3);
  body["tools"] = kTools;
  body["messages"].push_back({{"role", "assistant"},
                              {"content", nullptr},
                              {"tool_calls",
                               {{{"id", "call_1"},
                                 {"type", "function"},
                                 {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temp\": 18}"}});
  HttpReply r = post_json(*c, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  // The prompt holds the tool preamble, the call and the result: longer than without the tools.
  json no_tools = body;
  no_tools.erase("tools");
  HttpReply r2 = post_json(*c, no_tools.dump());
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_GT(r.j["usage"]["prompt_tokens"].get<int64_t>(), r2.j["usage"]["prompt_tokens"].get<int64_t>() + 50);

  // /tokenize renders the same prompt.
  HttpReply tok = post_json(*c, json({{"messages", body["messages"]}, {"tools", body["tools"]}}).dump(), "/tokenize");
  ASSERT_EQ(tok.status, 200) << tok.body;
  EXPECT_EQ(tok.j["count"], r.j["usage"]["prompt_tokens"]);

  json bad = body;
  bad["tools"][0]["function"]["name"] = "bad name";
  HttpReply e = post_json(*c, bad.dump());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.j["error"]["param"], "tools[0].function.name");
  bad = body;
  bad["tool_choice"] = {{"type", "function"}, {"function", {{"name", "not_a_tool"}}}};
  e = post_json(*c, bad.dump());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.j["error"]["param"], "tool_choice");
}

}  // namespace
}  // namespace zest::server::testing
