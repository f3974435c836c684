// Chat template tests: byte-for-byte against transformers' Jinja rendering (chat_cases.json, made by
// tools/render_chat_fixtures.py), Python json.dumps float layout, and input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/py_json.h"

namespace zest::text {
namespace {

using ojson = nlohmann::ordered_json;

ojson load_cases() {
  std::ifstream in(ZEST_SOURCE_DIR "/tests/text/data/chat_cases.json", std::ios::binary);
  EXPECT_TRUE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ojson::parse(ss.str());
}

ChatOptions options_of(const ojson& c) {
  ChatOptions o;
  o.add_generation_prompt = c["options"]["add_generation_prompt"];
  o.enable_thinking = c["options"]["enable_thinking"];
  o.add_vision_id = c["options"]["add_vision_id"];
  o.tools = c["tools"];
  return o;
}

TemplateKind kind_of(const ojson& c) { return c["kind"] == "qwen3" ? TemplateKind::kQwen3 : TemplateKind::kQwen3VL; }

TEST(ChatTemplate, MatchesJinjaRendering) {
  const ojson cases = load_cases();
  ASSERT_GE(cases["cases"].size(), 30u);
  for (const ojson& c : cases["cases"]) {
    auto r = render_chat_ordered(kind_of(c), c["messages"], options_of(c));
    ASSERT_TRUE(r.ok()) << c["name"] << ": " << r.status().to_string();
    EXPECT_EQ(*r, c["expected"].get<std::string>()) << c["name"];
  }
}

TEST(ChatTemplate, UnorderedJsonOverloadAgreesWhenKeyOrderIsIrrelevant) {
  // Messages without object-valued tool arguments render the same through nlohmann::json.
  const ojson cases = load_cases();
  int compared = 0;
  for (const ojson& c : cases["cases"]) {
    if (c["messages"].dump().find("\"arguments\":{") != std::string::npos) continue;
    auto r = render_chat(kind_of(c), nlohmann::json(c["messages"]), options_of(c));
    ASSERT_TRUE(r.ok()) << c["name"] << ": " << r.status().to_string();
    EXPECT_EQ(*r, c["expected"].get<std::string>()) << c["name"];
    ++compared;
  }
  EXPECT_GE(compared, 20);
}

TEST(ChatTemplate, PythonFloatRepr) {
  // Expected strings are Python 3 repr() of the same doubles.
  EXPECT_EQ(py_float_repr(0.0), "0.0");
  EXPECT_EQ(py_float_repr(-0.0), "-0.0");
  EXPECT_EQ(py_float_repr(1.0), "1.0");
  EXPECT_EQ(py_float_repr(-2.5), "-2.5");
  EXPECT_EQ(py_float_repr(0.1), "0.1");
  EXPECT_EQ(py_float_repr(1e-4), "0.0001");
  EXPECT_EQ(py_float_repr(1e-5), "1e-05");
  EXPECT_EQ(py_float_repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(py_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(123456.789), "123456.789");
  EXPECT_EQ(py_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(py_float_repr(5e-324), "5e-324");
  EXPECT_EQ(py_float_repr(INFINITY), "Infinity");
  EXPECT_EQ(py_json_dumps(ojson::parse(R"({"b": [1, 2.0, "x\u0001\"\\\n"], "a": {}, "c": [], "d": "ü"})")),
            "{\"b\": [1, 2.0, \"x\\u0001\\\"\\\\\\n\"], \"a\": {}, \"c\": [], \"d\": \"ü\"}");
}

TEST(ChatTemplate, RejectsBadInput) {
  const ChatOptions opts;
  const auto code = [&](TemplateKind k, const char* messages) {
    auto r = render_chat(k, nlohmann::json::parse(messages), opts);
    return r.ok() ? ErrorCode::kOk : r.status().code();
  };
  const auto K3 = TemplateKind::kQwen3, KVL = TemplateKind::kQwen3VL;
  EXPECT_EQ(code(K3, "[]"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, "{\"role\": \"user\"}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "wizard", "content": "x"}])"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"content": "x"}])"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "user"}])"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "user", "content": 5}])"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "user", "content": [{"type": "image", "image": "a.jpg"}]}])"),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(KVL, R"([{"role": "user", "content": ["just a string part"]}])"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(KVL, R"([{"role": "user", "content": [{"type": "text", "text": 3}]}])"),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning_content": 1}])"),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": {}}}]}])"),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f"}}]}])"),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "assistant", "content": null}])"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(K3, R"([{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}])"),
            ErrorCode::kOk);
  // The message index is named in the error.
  auto r = render_chat(K3, nlohmann::json::parse(R"([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}])"),
                       opts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("messages[1]"), std::string::npos) << r.status().message();
  ChatOptions bad_tools;
  bad_tools.tools = "not an array";
  EXPECT_FALSE(render_chat(K3, nlohmann::json::parse(R"([{"role": "user", "content": "a"}])"), bad_tools).ok());
}

}  // namespace
}  // namespace zest::text
