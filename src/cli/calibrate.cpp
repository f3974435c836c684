// zest calibrate-sere: expert-similarity calibration for SERE; zest sere-protect: its protected experts.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/chat_request.h"
#include "engine/sere.h"
#include "eval/dataset.h"

namespace zest::cli {
namespace {

// The bundled calibration corpus: every .txt file of assets/calibration, in name order.
Result<std::vector<std::string>> bundled_corpus() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(std::string(ZEST_ASSETS_DIR) + "/calibration", ec))
    if (e.path().extension() == ".txt") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  if (files.empty()) return not_found("no bundled calibration corpus found; pass --text FILE");
  return files;
}

struct CalibrateArgs {
  ModelArgs model;
  std::vector<std::string> text;
  int64_t tokens = 4096;
  std::string metric = "frobenius";
  std::string out;
};

int run_calibrate(const CalibrateArgs& a) {
  if (a.out.empty() && !a.model.config.empty()) {
    return fail(invalid_argument("a random-weight model (--config) has no model directory: give --out FILE"));
  }
  auto model_r = load_model(a.model);
  if (!model_r.ok()) return fail(model_r.status());
  engine::CalibrationOptions co;
  co.text_files = a.text;
  if (co.text_files.empty()) {
    auto corpus = bundled_corpus();
    if (!corpus.ok()) return fail(corpus.status());
    co.text_files = std::move(corpus).value();
  }
  co.max_tokens = a.tokens;
  co.metric = a.metric == "cosine" ? accel::SimilarityMetric::kCosine
              : a.metric == "cka"  ? accel::SimilarityMetric::kLinearCka
                                   : accel::SimilarityMetric::kFrobenius;
  co.out_file = a.out;
  auto r = engine::calibrate_sere(**model_r, co);
  if (!r.ok()) return fail(r.status());
  std::cout << "wrote " << *r << "\n";
  return 0;
}

struct ProtectArgs {
  ModelArgs model;
  std::string data;
  std::vector<std::string> text;
  int64_t tokens = 512;
  int64_t seq_tokens = 128;
  std::string similarity;
  int64_t per_layer = 4;
  std::string out;
};

// Calibration prompts: the requests of an eval data file (images included), or the text files' tokens cut
// into sequences of seq_tokens; at most `tokens` positions in all.
Result<std::vector<engine::Prompt>> protect_prompts(const ProtectArgs& a, const engine::ModelBundle& model) {
  std::vector<engine::Prompt> prompts;
  int64_t total = 0;
  if (!a.data.empty()) {
    ZEST_ASSIGN_OR_RETURN(const eval::EvalData data, eval::load_eval_data(a.data));
    engine::PromptOptions po;
    po.base_dir = data.base_dir;
    for (const eval::EvalItem& item : data.items) {
      if (total >= a.tokens) break;
      auto req = engine::parse_chat_request(item.body, model);
      if (!req.ok()) return req.status().with_context(data.where(item));
      auto p = engine::build_prompt(model, *req, po);
      if (!p.ok()) return p.status().with_context(data.where(item));
      total += static_cast<int64_t>(p->ids.size());
      prompts.push_back(std::move(p).value());
    }
    return prompts;
  }
  std::vector<std::string> files = a.text;
  if (files.empty()) {
    ZEST_ASSIGN_OR_RETURN(files, bundled_corpus());
  }
  ZEST_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, engine::calibration_tokens(model, files, a.tokens));
  for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(a.seq_tokens)) {
    engine::Prompt p;
    p.ids.assign(tokens.begin() + start, tokens.begin() + std::min(tokens.size(), start + a.seq_tokens));
    const int64_t n = static_cast<int64_t>(p.ids.size());
    p.positions.resize(3 * n);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t i = 0; i < n; ++i) p.positions[r * n + i] = static_cast<int32_t>(i);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

int run_protect(const ProtectArgs& a) {
  auto model_r = load_model(a.model);
  if (!model_r.ok()) return fail(model_r.status());
  const engine::ModelBundle& model = **model_r;
  auto prompts = protect_prompts(a, model);
  if (!prompts.ok()) return fail(prompts.status());
  engine::ProtectOptions po;
  po.similarity_file = a.similarity;
  po.per_layer = a.per_layer;
  auto ranked = engine::rank_protected_experts(model, *prompts, po);
  if (!ranked.ok()) return fail(ranked.status());
  const std::string out = a.out.empty() ? model.dir + "/sere_protected.json" : a.out;
  Status st = engine::write_protected_experts(out, model, *ranked);
  if (!st.is_ok()) return fail(st);
  std::cout << "wrote " << out << " (" << ranked->tokens << " positions)\n";
  return 0;
}

}  // namespace

void register_calibrate_sere(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* sub = app.add_subcommand("calibrate-sere", "Measure expert similarity for SERE on calibration text");
  add_model_args(sub, a->model, /*random_model=*/true);
  sub->add_option("--text", a->text, "calibration text file (repeatable; default: the bundled corpus)");
  sub->add_option("--tokens", a->tokens, "calibration tokens")->check(CLI::PositiveNumber);
  sub->add_option("--metric", a->metric, "frobenius | cosine | cka")
      ->check(CLI::IsMember({"frobenius", "cosine", "cka"}));
  sub->add_option("--out", a->out, "output file (default: MODEL/sere_similarity.safetensors)");
  sub->callback([a, &run] { run = [a] { return run_calibrate(*a); }; });
}

void register_sere_protect(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<ProtectArgs>();
  CLI::App* sub = app.add_subcommand(
      "sere-protect", "Rank each layer's experts by the output KL of re-routing them away; write the protected list");
  add_model_args(sub, a->model);
  auto* data = sub->add_option("--data", a->data, "calibration prompts: a zest eval JSONL file (images included)");
  sub->add_option("--text", a->text, "calibration text file (repeatable; default: the bundled corpus)")->excludes(data);
  sub->add_option("--tokens", a->tokens, "calibration positions at most")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--seq-tokens", a->seq_tokens, "with text: tokens per calibration sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--sere-similarity", a->similarity, "SERE similarity file (default: MODEL/sere_similarity.safetensors)");
  sub->add_option("--per-layer", a->per_layer, "experts protected per layer")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--out", a->out, "output JSON (default: MODEL/sere_protected.json)");
  sub->callback([a, &run] { run = [a] { return run_protect(*a); }; });
}

}  // namespace zest::cli
