// zest calibrate-sere: expert-similarity calibration for SERE.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/sere.h"

namespace zest::cli {
namespace {

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
    // The bundled corpus: every .txt file of assets/calibration, in name order.
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(std::string(ZEST_ASSETS_DIR) + "/calibration", ec))
      if (e.path().extension() == ".txt") co.text_files.push_back(e.path().string());
    std::sort(co.text_files.begin(), co.text_files.end());
    if (co.text_files.empty()) return fail(not_found("no bundled calibration corpus found; pass --text FILE"));
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

}  // namespace zest::cli
