// The reasoning / tool-call parser of assistant output (engine/chat_output.h): whole texts, and the same texts
// streamed in every split, byte by byte included.
#include <gtest/gtest.h>

#include <regex>

#include "engine/chat_output.h"

namespace zest::engine {
namespace {

ChatOutputOptions think_opts() {
  ChatOutputOptions o;
  o.reasoning = true;
  return o;
}

ChatOutputOptions tool_opts(bool reasoning = false) {
  ChatOutputOptions o;
  o.tools = true;
  o.reasoning = reasoning;
  return o;
}

// The message a stream of `chunks` adds up to, checked piece by piece: no piece is empty, and the calls come with
// increasing indexes.
ParsedMessage streamed(const std::vector<std::string>& chunks, const ChatOutputOptions& o,
                       std::vector<ChatDelta>* all = nullptr) {
  ChatOutputParser p(o);
  ParsedMessage m;
  std::vector<ChatDelta> out;
  for (const std::string& c : chunks) p.feed(c, out);
  p.finish(out);
  for (const ChatDelta& d : out) {
    if (d.kind == ChatDelta::kToolCall) {
      EXPECT_EQ(d.tool_index, static_cast<int>(m.tool_calls.size()));
      m.tool_calls.push_back(d.call);
    } else {
      EXPECT_FALSE(d.text.empty());
      (d.kind == ChatDelta::kReasoning ? m.reasoning : m.content) += d.text;
    }
  }
  m.has_reasoning = p.message().has_reasoning;
  EXPECT_EQ(m.reasoning, p.message().reasoning);
  EXPECT_EQ(m.content, p.message().content);
  if (all) *all = out;
  return m;
}

void expect_same(const ParsedMessage& a, const ParsedMessage& b, const std::string& what) {
  EXPECT_EQ(a.has_reasoning, b.has_reasoning) << what;
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t k = 0; k < a.tool_calls.size(); ++k) {
    EXPECT_EQ(a.tool_calls[k].name, b.tool_calls[k].name) << what;
    EXPECT_EQ(a.tool_calls[k].arguments, b.tool_calls[k].arguments) << what;
  }
}

TEST(ChatOutput, ThinkBlockSplitsReasoningFromContent) {
  const ParsedMessage m = parse_chat_output("<think>\nLet me add.\n</think>\n\n4", think_opts());
  EXPECT_TRUE(m.has_reasoning);
  EXPECT_EQ(m.reasoning, "\nLet me add.\n");
  EXPECT_EQ(m.content, "\n\n4");
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(ChatOutput, LeadingWhitespaceBeforeThinkIsDropped) {
  const ParsedMessage m = parse_chat_output("\n <think>r</think>c", think_opts());
  EXPECT_EQ(m.reasoning, "r");
  EXPECT_EQ(m.content, "c");
}

TEST(ChatOutput, NoTagsIsContent) {
  const ParsedMessage m = parse_chat_output("  plain answer <think> later", think_opts());
  EXPECT_FALSE(m.has_reasoning);
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "  plain answer <think> later");
}

TEST(ChatOutput, EndWithoutStartWhenThePromptOpenedTheBlock) {
  ChatOutputOptions o = think_opts();
  o.reasoning_open = true;
  ParsedMessage m = parse_chat_output("step 1, step 2</think>\n\nanswer", o);
  EXPECT_TRUE(m.has_reasoning);
  EXPECT_EQ(m.reasoning, "step 1, step 2");
  EXPECT_EQ(m.content, "\n\nanswer");
  // An explicit start tag is dropped there too.
  m = parse_chat_output("<think>x</think>y", o);
  EXPECT_EQ(m.reasoning, "x");
  EXPECT_EQ(m.content, "y");
  // Cut off while thinking: all reasoning.
  m = parse_chat_output("still thinking", o);
  EXPECT_EQ(m.reasoning, "still thinking");
  EXPECT_EQ(m.content, "");
}

TEST(ChatOutput, TruncatedReasoningStaysReasoning) {
  const ParsedMessage m = parse_chat_output("<think>\nhmm, the answer is </th", think_opts());
  EXPECT_TRUE(m.has_reasoning);
  EXPECT_EQ(m.reasoning, "\nhmm, the answer is </th");
  EXPECT_EQ(m.content, "");
}

TEST(ChatOutput, ParserOffKeepsTheText) {
  const std::string t = "<think>a</think><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  const ParsedMessage m = parse_chat_output(t, ChatOutputOptions{});
  EXPECT_FALSE(m.has_reasoning);
  EXPECT_EQ(m.content, t);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(ChatOutput, ToolCallIsParsed) {
  const ParsedMessage m = parse_chat_output(
      "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\", \"days\": 3, "
      "\"x\":1.50}}\n</tool_call>",
      tool_opts());
  EXPECT_EQ(m.content, "I'll check.\n");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  // json.dumps(arguments, ensure_ascii=False): insertion order, ", " / ": ", Python floats.
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"city\": \"東京\", \"days\": 3, \"x\": 1.5}");
  EXPECT_TRUE(std::regex_match(m.tool_calls[0].id, std::regex("call_[0-9a-f]{24}")));
}

TEST(ChatOutput, ParallelCallsAndTheWhitespaceBetween) {
  const std::string t =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
      "\"arguments\": {\"k\": [1, 2]}}\n</tool_call>\n";
  ParsedMessage m = parse_chat_output(t, tool_opts());
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].name, "a");
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
  EXPECT_EQ(m.tool_calls[1].name, "b");
  EXPECT_EQ(m.tool_calls[1].arguments, "{\"k\": [1, 2]}");
  EXPECT_NE(m.tool_calls[0].id, m.tool_calls[1].id);
  ChatOutputOptions one = tool_opts();
  one.parallel_tool_calls = false;
  m = parse_chat_output(t, one);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "a");
  // Text after a call is content.
  m = parse_chat_output("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\nDone.", tool_opts());
  EXPECT_EQ(m.content, "\n\nDone.");
  EXPECT_EQ(m.tool_calls.size(), 1u);
}

TEST(ChatOutput, MalformedCallsStayContent) {
  for (const std::string& t : {
           std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>"),
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>"),   // arguments not an object
           std::string("<tool_call>{\"arguments\": {}}</tool_call>"),                         // no name
           std::string("<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>"),         // empty name
           std::string("<tool_call>[1, 2]</tool_call>"),
           std::string("<tool_call></tool_call>"),
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": {") + std::string(5000, '[') + "</tool_call>",
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}") ,  // unclosed and incomplete
       }) {
    const ParsedMessage m = parse_chat_output(t, tool_opts());
    EXPECT_TRUE(m.tool_calls.empty()) << t.substr(0, 80);
    EXPECT_EQ(m.content, t) << t.substr(0, 80);
  }
  // A valid call followed by a broken one: the first is a call, the second content.
  const ParsedMessage m = parse_chat_output(
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{oops}</tool_call>", tool_opts());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content, "<tool_call>{oops}</tool_call>");
}

TEST(ChatOutput, UnclosedCallAtTheEndIsACallWhenItsBodyIsWhole) {
  const ParsedMessage m = parse_chat_output("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}\n", tool_opts());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"q\": \"x\"}");
  EXPECT_EQ(m.content, "");
}

TEST(ChatOutput, ThinkingThenToolCall) {
  const ParsedMessage m = parse_chat_output(
      "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n"
      "</tool_call>",
      tool_opts(/*reasoning=*/true));
  EXPECT_EQ(m.reasoning, "\nI need the weather.\n");
  EXPECT_EQ(m.content, "\n\n");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "w");
  // A tool-call tag inside the reasoning is reasoning.
  const ParsedMessage r = parse_chat_output("<think><tool_call>{\"name\": \"w\", \"arguments\": {}}</tool_call></think>ok",
                                            tool_opts(true));
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "ok");
}

const std::vector<std::string>& stream_texts() {
  static const std::vector<std::string> t = {
      "<think>\nLet me think: 2+2.\n</think>\n\nIt is 4.",
      " \n<think>a<b</think>c</thin</think>",
      "plain ü 東京 text",
      "<thi",
      "<think>\nneed a tool\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"</tool\"}}\n"
      "</tool_call>\n",
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }</tool_call> tail <tool_call>{\"name\": \"g\", "
      "\"arguments\": {}}</tool_call>",
      "x <tool_ca",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n",
  };
  return t;
}

TEST(ChatOutput, StreamingAtEveryByteBoundaryAddsUpToTheWhole) {
  for (bool open : {false, true})
    for (const std::string& t : stream_texts()) {
      ChatOutputOptions o = tool_opts(/*reasoning=*/true);
      o.reasoning_open = open;
      const ParsedMessage whole = parse_chat_output(t, o);
      for (size_t cut = 0; cut <= t.size(); ++cut)
        expect_same(streamed({t.substr(0, cut), t.substr(cut)}, o), whole, t + " cut at " + std::to_string(cut));
      std::vector<std::string> bytes;
      for (char c : t) bytes.emplace_back(1, c);
      std::vector<ChatDelta> pieces;
      expect_same(streamed(bytes, o, &pieces), whole, t + " byte by byte");
      // No piece carries a part of a tag that was recognised.
      for (const ChatDelta& d : pieces) {
        if (d.kind == ChatDelta::kReasoning) {
          EXPECT_EQ(d.text.find("</think"), std::string::npos) << t;
        }
      }
    }
}

TEST(ChatOutput, StreamedPiecesComeInOrder) {
  std::vector<ChatDelta> pieces;
  const std::string t = stream_texts()[4];
  std::vector<std::string> bytes;
  for (char c : t) bytes.emplace_back(1, c);
  streamed(bytes, tool_opts(true), &pieces);
  // reasoning, then content ("\n\nSure.\n"), then the two calls: kinds never go back.
  ASSERT_GE(pieces.size(), 4u);
  EXPECT_EQ(pieces.front().kind, ChatDelta::kReasoning);
  EXPECT_EQ(pieces[pieces.size() - 2].kind, ChatDelta::kToolCall);
  EXPECT_EQ(pieces.back().kind, ChatDelta::kToolCall);
  EXPECT_EQ(pieces.back().call.name, "search");
  EXPECT_EQ(pieces.back().call.arguments, "{\"q\": \"</tool\"}");
  for (size_t k = 1; k < pieces.size(); ++k) EXPECT_LE(pieces[k - 1].kind, pieces[k].kind);
}

}  // namespace
}  // namespace zest::engine
