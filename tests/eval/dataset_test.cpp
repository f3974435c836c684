// Parsing the eval JSONL: items, defaults, and a clear FILE:LINE error for every kind of bad line.
#include <gtest/gtest.h>

#include "eval/dataset.h"

namespace zest::eval {
namespace {

const std::string kMsg = R"("messages": [{"role": "user", "content": "hi"}])";

TEST(EvalData, ParsesItemsSkippingBlankLines) {
  const std::string text = "{" + kMsg + R"(, "answer": "a", "max_tokens": 5})" + "\n\n  \n{" + kMsg +
                           R"(, "answer": ["b", "c"], "task": "doc"})" + "\n";
  auto d = parse_eval_data(text, "f.jsonl");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_EQ(d->items.size(), 2u);
  EXPECT_EQ(d->items[0].line, 1);
  EXPECT_EQ(d->items[0].task, "default");
  EXPECT_EQ(d->items[0].answers, std::vector<std::string>{"a"});
  EXPECT_FALSE(d->items[0].body.contains("answer"));
  EXPECT_EQ(d->items[0].body["max_tokens"], 5);
  EXPECT_EQ(d->items[1].line, 4);
  EXPECT_EQ(d->items[1].task, "doc");
  EXPECT_EQ(d->items[1].answers, (std::vector<std::string>{"b", "c"}));
  EXPECT_FALSE(d->items[1].body.contains("task"));
  EXPECT_EQ(d->where(d->items[1]), "f.jsonl:4");
}

TEST(EvalData, Limit) {
  const std::string line = "{" + kMsg + R"(, "answer": "a"})" + "\n";
  auto d = parse_eval_data(line + line + line, "f.jsonl", 2);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->items.size(), 2u);
}

TEST(EvalData, BadLinesNameFileAndLine) {
  const std::string good = "{" + kMsg + R"(, "answer": "a"})" + "\n";
  const std::pair<std::string, std::string> cases[] = {
      {"{\"messages\": [", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {"{" + kMsg + "}", "'answer' is missing"},
      {"{" + kMsg + R"(, "answer": 3})", "'answer' must be a string"},
      {"{" + kMsg + R"(, "answer": []})", "'answer' must be a string"},
      {"{" + kMsg + R"(, "answer": ["a", 1]})", "'answer' must be a string"},
      {"{" + kMsg + R"(, "answer": "a", "task": 7})", "'task' must be a non-empty string"},
      {R"({"answer": "a"})", "'messages' must be an array"},
  };
  for (const auto& [line, what] : cases) {
    auto d = parse_eval_data(good + line + "\n" + good, "data/f.jsonl");
    ASSERT_FALSE(d.ok()) << line;
    EXPECT_EQ(d.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("data/f.jsonl:2: "), std::string::npos) << d.status().message();
    EXPECT_NE(d.status().message().find(what), std::string::npos) << d.status().message();
  }
}

TEST(EvalData, EmptyAndMissingFiles) {
  auto empty = parse_eval_data("\n\n", "e.jsonl");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no items"), std::string::npos);
  auto missing = load_eval_data("/nonexistent/zest-eval.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
}

TEST(EvalData, LoadsTheFixtureNextToItsImages) {
  auto d = load_eval_data(std::string(ZEST_FIXTURES_DIR) + "/eval/items.jsonl");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->items.size(), 7u);
  EXPECT_TRUE(d->base_dir.ends_with("tests/fixtures/eval")) << d->base_dir;
}

}  // namespace
}  // namespace zest::eval
