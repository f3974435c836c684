// Aggregates and the markdown report of `zest eval`: one row per setting, overall and per task; and the
// per-item predictions as JSON Lines.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/runner.h"

namespace zest::eval {

// Means over a set of items (TPOT over the items that produced at least two tokens).
struct Scores {
  int64_t items = 0;
  double exact = 0, relaxed = 0, anls = 0;
  double visual_tokens_before = 0, visual_tokens_after = 0;
  double ttft_ms = 0, tpot_ms = 0;
};

// The items of `task` (empty = all of them).
Scores summarize(const std::vector<ItemResult>& items, const std::string& task = {});

// One run of the data set under one setting ("vision-prune-rate=0.3 sere-primary=2"; "default" without a sweep).
struct SettingRun {
  std::string label;
  RunResult run;
};

// "# zest eval" with a header line (`title`), then an "Overall" table and one table per task, each with
// one row per setting: items, exact match, relaxed accuracy, ANLS (in %), visual tokens before and after
// pruning (mean per item), TTFT and TPOT (mean, ms), decode step (ms) and wall time (s).
std::string markdown_report(const std::string& title, const std::vector<SettingRun>& runs);

// One JSON object per item and setting: setting, line, task, prediction, answers, exact, relaxed, anls,
// token counts, visual tokens, ttft_ms, tpot_ms, finish_reason.
std::string predictions_jsonl(const std::vector<SettingRun>& runs);

}  // namespace zest::eval
