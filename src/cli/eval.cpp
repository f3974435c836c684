// zest eval: accuracy and speed of a model on a JSONL data set under one or several acceleration settings
// (src/eval, docs/quality.md).
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/dataset.h"
#include "eval/plot.h"
#include "eval/report.h"
#include "eval/runner.h"
#include "eval/score_layer.h"

namespace zest::cli {
namespace {

// What one eval setting consists of: the acceleration and engine flags and the requests in flight.
struct SettingArgs {
  AccelArgs accel;
  engine::EngineOptions engine;
  int64_t batch = 16;
};

void add_setting_args(CLI::App* app, SettingArgs& s) {
  add_accel_args(app, s.accel);
  add_engine_args(app, s.engine);
  app->add_option("--batch", s.batch, "requests in flight at once (continuous batching)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

struct Setting {
  std::string label;
  SettingArgs args;
};

struct EvalArgs {
  ModelArgs model;
  SettingArgs base;
  std::string data;
  int64_t limit = 0;
  int64_t max_tokens = 32;
  std::vector<std::string> sweeps;
  std::string out, predictions, plot, plot_metric = "exact";
  bool quiet = false;
};

// The settings of the sweep: the cartesian product of every --sweep NAME=V1,V2,... over the base flags
// (the first sweep varies slowest). Each value is parsed by the very option that parses --NAME.
Result<std::vector<Setting>> sweep_settings(const SettingArgs& base, const std::vector<std::string>& sweeps) {
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  for (const std::string& sw : sweeps) {
    const size_t eq = sw.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == sw.size())
      return invalid_argument("--sweep '" + sw + "': expected NAME=V1,V2,... (e.g. vision-prune-rate=0,0.3,0.5)");
    const std::string name = sw.substr(0, eq);
    for (const auto& axis : axes)
      if (axis.first == name) return invalid_argument("--sweep '" + name + "' is given twice");
    std::vector<std::string> values;
    for (size_t start = eq + 1;;) {
      const size_t comma = sw.find(',', start);
      values.push_back(sw.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (values.back().empty()) return invalid_argument("--sweep '" + sw + "': an empty value");
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    axes.emplace_back(name, std::move(values));
  }
  std::vector<Setting> settings;
  std::vector<size_t> idx(axes.size(), 0);
  while (true) {
    Setting s{"", base};
    CLI::App app;
    add_setting_args(&app, s.args);
    std::vector<std::string> argv;  // CLI11 takes the arguments in reverse order
    for (size_t a = 0; a < axes.size(); ++a) {
      const std::string& v = axes[a].second[idx[a]];
      argv.insert(argv.begin(), "--" + axes[a].first + "=" + v);
      s.label += (s.label.empty() ? "" : " ") + axes[a].first + "=" + v;
    }
    try {
      app.parse(argv);
    } catch (const CLI::ParseError& e) {
      return invalid_argument("--sweep " + s.label + ": " + e.what());
    }
    if (s.label.empty()) s.label = "default";
    settings.push_back(std::move(s));
    size_t a = axes.size();
    while (a > 0 && ++idx[a - 1] == axes[a - 1].second.size()) idx[--a] = 0;
    if (a == 0) break;
  }
  return settings;
}

Status write_file(const std::string& file, const std::string& text) {
  std::ofstream f(file, std::ios::binary);
  if (!f) return not_found("cannot write '" + file + "'");
  f << text;
  return f ? Status::ok() : internal_error("writing '" + file + "' failed");
}

int run_eval(const EvalArgs& a) {
  auto settings = sweep_settings(a.base, a.sweeps);
  if (!settings.ok()) return fail(settings.status());
  auto data = eval::load_eval_data(a.data, a.limit);
  if (!data.ok()) return fail(data.status());
  auto model_r = load_model(a.model);
  if (!model_r.ok()) return fail(model_r.status());
  std::shared_ptr<engine::ModelBundle> model = std::move(model_r).value();

  std::vector<eval::SettingRun> runs;
  for (const Setting& s : *settings) {
    engine::EngineOptions eopts = s.args.engine;
    auto sere = apply_accel(s.args.accel, *model, eopts);
    if (!sere.ok()) return fail(sere.status().with_context(s.label));
    eval::RunOptions ro;
    ro.batch = s.args.batch;
    ro.max_tokens = a.max_tokens;
    ro.progress = !a.quiet;
    ro.label = s.label;
    auto run = eval::run_eval(model, *data, eopts, ro);
    if (!run.ok()) return fail(run.status().with_context(s.label));
    runs.push_back({s.label, std::move(run).value()});
  }

  const std::string title = "model `" + model->dir + "` on " + model::backend_name(model->backend) + ", data `" +
                            a.data + "` (" + std::to_string(data->items.size()) + " items), max tokens " +
                            std::to_string(a.max_tokens) + " unless an item sets its own.";
  const std::string report = eval::markdown_report(title, runs);
  std::cout << report;
  if (!a.out.empty()) {
    Status st = write_file(a.out, report);
    if (!st.is_ok()) return fail(st);
  }
  if (!a.predictions.empty()) {
    Status st = write_file(a.predictions, eval::predictions_jsonl(runs));
    if (!st.is_ok()) return fail(st);
  }
  if (!a.plot.empty()) {
    std::vector<eval::PlotPoint> points;
    for (const eval::SettingRun& r : runs) {
      const eval::Scores sc = eval::summarize(r.run.items);
      const double acc = a.plot_metric == "relaxed" ? sc.relaxed : a.plot_metric == "anls" ? sc.anls : sc.exact;
      points.push_back({sc.visual_tokens_after, sc.tpot_ms, acc});
    }
    eval::PlotStyle style;
    style.accuracy_label = a.plot_metric == "exact" ? "exact match" : a.plot_metric;
    Status st = eval::write_plot(a.plot, points, style);
    if (!st.is_ok()) return fail(st);
  }
  return 0;
}

struct ScoreLayerArgs {
  ModelArgs model;
  std::string data;
  int64_t limit = 0;
  double rate = 0.4;
  int64_t batch = 16;
  int64_t max_tokens = 32;
  std::string out;
  bool quiet = false;
};

int run_calibrate_visionzip(const ScoreLayerArgs& a) {
  auto data = eval::load_eval_data(a.data, a.limit);
  if (!data.ok()) return fail(data.status());
  auto model = load_model(a.model);
  if (!model.ok()) return fail(model.status());
  eval::ScoreLayerOptions o;
  o.rate = a.rate;
  o.run.batch = a.batch;
  o.run.max_tokens = a.max_tokens;
  o.run.progress = !a.quiet;
  engine::EngineOptions eopts;
  auto c = eval::choose_score_layer(*model, *data, eopts, o);
  if (!c.ok()) return fail(c.status());
  const std::string out = a.out.empty() ? (*model)->dir + "/visionzip.json" : a.out;
  for (const eval::BlockScore& b : c->blocks)
    std::cout << "score block " << b.score_layer << ": exact match " << 100 * b.exact << "%, ANLS " << 100 * b.anls
              << "%\n";
  Status st = eval::write_score_layer(out, *c);
  if (!st.is_ok()) return fail(st);
  std::cout << "score block " << c->score_layer << " at rate " << c->rate << " over " << c->items << " items; wrote "
            << out << "\n";
  return 0;
}

}  // namespace

void register_calibrate_visionzip(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<ScoreLayerArgs>();
  CLI::App* sub = app.add_subcommand(
      "calibrate-visionzip",
      "Choose the vision block whose attention scores VisionZip's tokens: the one that keeps a calibration set's "
      "answers best when its images are pruned; writes MODEL/visionzip.json, the model's default from then on");
  add_model_args(sub, a->model);
  sub->add_option("--data", a->data, "calibration items with images and answers (zest eval JSONL)")->required();
  sub->add_option("--limit", a->limit, "only the first N items (0 = all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--rate", a->rate, "VisionZip rate the blocks are compared at (global budget)")
      ->check(CLI::Range(0.01, 0.99))
      ->capture_default_str();
  sub->add_option("--batch", a->batch, "requests in flight")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate for items that set no max_tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--out", a->out, "output JSON (default: MODEL/visionzip.json)");
  sub->add_flag("--quiet", a->quiet, "no progress line on stderr");
  sub->callback([a, &run] { run = [a] { return run_calibrate_visionzip(*a); }; });
}

void register_eval(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "Accuracy and speed on a JSONL data set, under one or a sweep of settings");
  add_model_args(sub, a->model);
  add_setting_args(sub, a->base);
  sub->add_option("--data", a->data, "JSONL: one chat-completions body per line plus \"answer\" and optional \"task\"")
      ->required();
  sub->add_option("--limit", a->limit, "only the first N items (0 = all)")->check(CLI::NonNegativeNumber);
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate for items that set no max_tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--sweep", a->sweeps,
                  "NAME=V1,V2,...: run once per value of the flag --NAME (repeatable: every combination)");
  sub->add_option("--out", a->out, "write the markdown report to this file too");
  sub->add_option("--predictions", a->predictions, "write every item's prediction and scores (JSONL)");
  sub->add_option("--plot", a->plot, "write a PNG: accuracy against visual tokens kept and against TPOT");
  sub->add_option("--plot-metric", a->plot_metric, "accuracy on the plot: exact | relaxed | anls")
      ->check(CLI::IsMember({"exact", "relaxed", "anls"}))
      ->capture_default_str();
  sub->add_flag("--quiet", a->quiet, "no progress line on stderr");
  sub->callback([a, &run] { run = [a] { return run_eval(*a); }; });
}

}  // namespace zest::cli
