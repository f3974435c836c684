// zest eval's engine loop on the tiny Qwen3-VL-MoE fixture (random weights: the text is noise, the
// mechanism is real): deterministic predictions, the defaults, VisionZip counts, the report's shape, and
// FILE:LINE errors for items that cannot run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/model_bundle.h"
#include "eval/report.h"
#include "eval/eval_test_util.h"
#include "eval/runner.h"

namespace zest::eval {
namespace {

RunOptions quiet(int64_t batch, int64_t max_tokens = 6) {
  RunOptions o;
  o.batch = batch;
  o.max_tokens = max_tokens;
  o.progress = false;
  return o;
}

TEST(EvalRun, TwoRunsGiveTheSamePredictions) {
  ASSERT_TRUE(vl_tiny());
  const EvalData data = fixture_data();
  auto a = run_eval(vl_tiny(), data, {}, quiet(4));
  auto b = run_eval(vl_tiny(), data, {}, quiet(4));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(a->items.size(), data.items.size());
  for (size_t i = 0; i < data.items.size(); ++i) {
    const ItemResult &x = a->items[i], &y = b->items[i];
    EXPECT_EQ(x.line, data.items[i].line);
    EXPECT_EQ(x.task, data.items[i].task);
    EXPECT_EQ(x.token_ids, y.token_ids) << "line " << x.line;
    EXPECT_EQ(x.prediction, y.prediction) << "line " << x.line;
    EXPECT_FALSE(x.token_ids.empty());
    EXPECT_GT(x.ttft_ms, 0.0);
    // Items without max_tokens get the eval default (6); line 4 asks for 8 itself.
    EXPECT_LE(static_cast<int64_t>(x.token_ids.size()), data.items[i].body.value("max_tokens", int64_t{6}));
  }
  const auto& text_item = a->items.back();  // the text-only item
  EXPECT_EQ(text_item.task, "text");
  EXPECT_EQ(text_item.visual_tokens_before, 0);
  for (size_t i = 0; i + 1 < a->items.size(); ++i) {
    EXPECT_GT(a->items[i].visual_tokens_before, 0);
    EXPECT_EQ(a->items[i].visual_tokens_after, a->items[i].visual_tokens_before);  // no pruning
  }
}

TEST(EvalRun, PruningKeepsFewerVisualTokens) {
  ASSERT_TRUE(vl_tiny());
  const EvalData data = fixture_data();
  vl_tiny()->vision_prune.rate = 0.5f;
  auto r = run_eval(vl_tiny(), data, {}, quiet(2, 2));
  vl_tiny()->vision_prune.rate = 0.0f;
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Scores s = summarize(r->items);
  EXPECT_GT(s.visual_tokens_before, 0.0);
  EXPECT_LT(s.visual_tokens_after, s.visual_tokens_before);
}

TEST(EvalRun, ReportHasOneRowPerSettingInEveryTable) {
  ASSERT_TRUE(vl_tiny());
  const EvalData data = fixture_data();
  std::vector<SettingRun> runs;
  for (int64_t batch : {1, 3}) {
    auto r = run_eval(vl_tiny(), data, {}, quiet(batch, 2));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    runs.push_back({"batch=" + std::to_string(batch), std::move(r).value()});
  }
  const std::string md = markdown_report("title line", runs);
  // Overall plus one table per task (chart, doc, photo, text), each with the two settings' rows.
  for (const char* section : {"## Overall", "## Task chart", "## Task doc", "## Task photo", "## Task text"})
    EXPECT_NE(md.find(section), std::string::npos) << section;
  size_t rows1 = 0, rows3 = 0, headers = 0;
  for (size_t p = md.find("\n| batch=1 |"); p != std::string::npos; p = md.find("\n| batch=1 |", p + 1)) ++rows1;
  for (size_t p = md.find("\n| batch=3 |"); p != std::string::npos; p = md.find("\n| batch=3 |", p + 1)) ++rows3;
  for (size_t p = md.find("| setting |"); p != std::string::npos; p = md.find("| setting |", p + 1)) ++headers;
  EXPECT_EQ(headers, 5u);
  EXPECT_EQ(rows1, 5u);
  EXPECT_EQ(rows3, 5u);
  EXPECT_NE(md.find("| batch=1 | 7 |"), std::string::npos);  // overall row counts all seven items
  // One predictions line per item and setting.
  const std::string jl = predictions_jsonl(runs);
  EXPECT_EQ(std::count(jl.begin(), jl.end(), '\n'), 14);
}

// Writes `lines` as a JSONL file in a fresh temporary directory; returns its path.
std::string temp_jsonl(const std::string& name, const std::string& lines) {
  const auto dir = std::filesystem::temp_directory_path() / ("zest_eval_test_" + name);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "data.jsonl").string();
  std::ofstream(file) << lines;
  return file;
}

TEST(EvalRun, ItemsThatCannotRunNameTheirLine) {
  ASSERT_TRUE(vl_tiny());
  const std::string good = R"({"messages": [{"role": "user", "content": "hi"}], "answer": "a"})";
  struct Case {
    std::string line, what;
  } cases[] = {
      {R"({"messages": [{"role": "robot", "content": "hi"}], "answer": "a"})", "role 'robot'"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "missing.png"}}]}], "answer": "a"})",
       "missing.png"},
      // The server's refusals apply to eval items too: a field zest does not implement, a mistyped one.
      {R"({"messages": [{"role": "user", "content": "hi"}], "answer": "a", "functions": [{"name": "f"}]})",
       "unsupported field 'functions'"},
      // One completion per item: n > 1 is refused rather than silently cut to one.
      {R"({"messages": [{"role": "user", "content": "hi"}], "answer": "a", "n": 2})", "'n'"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "answer": "a", "max_tokens": "8"})", "'max_tokens'"},
  };
  for (const Case& c : cases) {
    const std::string file = temp_jsonl("bad", good + "\n" + c.line + "\n");
    auto d = load_eval_data(file);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    auto r = run_eval(vl_tiny(), *d, {}, quiet(2, 2));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(file + ":2: "), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.what), std::string::npos) << r.status().message();
  }
}

TEST(EvalRun, AnswerTaskAndUnknownFieldsDoNotStopAnItem) {
  ASSERT_TRUE(vl_tiny());
  // answer and task are the data file's own; other fields zest has never heard of pass as with the server,
  // and an unsupported field with the value that asks for nothing is accepted.
  const std::string file = temp_jsonl(
      "extra", R"({"messages": [{"role": "user", "content": "hi"}], "answer": ["a", "b"], "task": "t", "id": 7, )"
               R"("source": {"set": "x"}, "logprobs": false, "tools": []})"
               "\n");
  auto d = load_eval_data(file);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  auto r = run_eval(vl_tiny(), *d, {}, quiet(1, 2));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->items.size(), 1u);
  EXPECT_EQ(r->items[0].task, "t");
  EXPECT_EQ(r->items[0].answers, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(r->items[0].token_ids.empty());
}

}  // namespace
}  // namespace zest::eval
