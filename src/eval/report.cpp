#include "eval/report.h"

#include <cstdio>
#include <set>

namespace zest::eval {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string table(const std::vector<SettingRun>& runs, const std::string& task) {
  std::string s =
      "| setting | items | exact match % | relaxed % | ANLS % | visual tokens before | visual tokens after | "
      "TTFT ms | TPOT ms | decode step ms | wall s |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const SettingRun& r : runs) {
    const Scores sc = summarize(r.run.items, task);
    s += "| " + r.label + " | " + std::to_string(sc.items) + " | " + fmt("%.1f", 100 * sc.exact) + " | " +
         fmt("%.1f", 100 * sc.relaxed) + " | " + fmt("%.1f", 100 * sc.anls) + " | " +
         fmt("%.1f", sc.visual_tokens_before) + " | " + fmt("%.1f", sc.visual_tokens_after) + " | " +
         fmt("%.2f", sc.ttft_ms) + " | " + fmt("%.2f", sc.tpot_ms) + " | " + fmt("%.2f", r.run.decode_step_ms) +
         " | " + fmt("%.2f", r.run.wall_s) + " |\n";
  }
  return s;
}

}  // namespace

Scores summarize(const std::vector<ItemResult>& items, const std::string& task) {
  Scores s;
  int64_t timed = 0;
  for (const ItemResult& it : items) {
    if (!task.empty() && it.task != task) continue;
    ++s.items;
    s.exact += it.exact;
    s.relaxed += it.relaxed;
    s.anls += it.anls;
    s.visual_tokens_before += static_cast<double>(it.visual_tokens_before);
    s.visual_tokens_after += static_cast<double>(it.visual_tokens_after);
    s.ttft_ms += it.ttft_ms;
    if (it.token_ids.size() > 1) {
      s.tpot_ms += it.tpot_ms;
      ++timed;
    }
  }
  if (s.items > 0) {
    const double n = static_cast<double>(s.items);
    s.exact /= n;
    s.relaxed /= n;
    s.anls /= n;
    s.visual_tokens_before /= n;
    s.visual_tokens_after /= n;
    s.ttft_ms /= n;
  }
  if (timed > 0) s.tpot_ms /= static_cast<double>(timed);
  return s;
}

std::string markdown_report(const std::string& title, const std::vector<SettingRun>& runs) {
  std::string s = "# zest eval\n\n" + title + "\n\n## Overall\n\n" + table(runs, {});
  std::set<std::string> tasks;
  for (const SettingRun& r : runs)
    for (const ItemResult& it : r.run.items) tasks.insert(it.task);
  for (const std::string& t : tasks) s += "\n## Task " + t + "\n\n" + table(runs, t);
  return s;
}

std::string predictions_jsonl(const std::vector<SettingRun>& runs) {
  std::string s;
  for (const SettingRun& r : runs)
    for (const ItemResult& it : r.run.items) {
      nlohmann::json j = {{"setting", r.label},
                          {"line", it.line},
                          {"task", it.task},
                          {"prediction", it.prediction},
                          {"answers", it.answers},
                          {"exact", it.exact},
                          {"relaxed", it.relaxed},
                          {"anls", it.anls},
                          {"prompt_tokens", it.prompt_tokens},
                          {"completion_tokens", it.token_ids.size()},
                          {"visual_tokens_before", it.visual_tokens_before},
                          {"visual_tokens_after", it.visual_tokens_after},
                          {"ttft_ms", it.ttft_ms},
                          {"tpot_ms", it.tpot_ms},
                          {"finish_reason", it.finish_reason}};
      s += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
  return s;
}

}  // namespace zest::eval
