#include "cli/common.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "core/thread_pool.h"
#include "kernels/backend.h"

namespace zest::cli {

void add_model_args(CLI::App* app, ModelArgs& a) {
  app->add_option("--model", a.model, "Hugging Face model directory (config.json, *.safetensors, tokenizer)")
      ->required();
  app->add_option("--threads", a.threads, "CPU threads (0 = all cores)");
  app->add_option("--device", a.device, "cpu | cuda | auto")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

Result<std::shared_ptr<engine::ModelBundle>> load_model(const ModelArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  const bool gpu = kernels::cuda_available();
  if (a.device == "cuda" && !gpu)
    return unsupported("--device cuda: " + kernels::cuda_describe() + "; use --device cpu (or auto)");
  const bool cuda = a.device == "cuda" || (a.device == "auto" && gpu);
  return engine::ModelBundle::load(a.model, cuda ? model::Backend::kCuda : model::Backend::kCpu);
}

void add_request_args(CLI::App* app, RequestArgs& a) {
  app->add_option("--request", a.request_file, "OpenAI chat-completions request body (JSON file)");
  app->add_option("--prompt", a.prompt, "user message text");
  app->add_option("--system", a.system, "system message text (with --prompt)");
  app->add_option("--image", a.images, "image path or URL for --prompt (repeatable)");
}

Result<nlohmann::json> request_body(const RequestArgs& a) {
  using nlohmann::json;
  if (!a.request_file.empty()) {
    if (!a.prompt.empty() || !a.images.empty()) return invalid_argument("use either --request or --prompt/--image");
    std::ifstream f(a.request_file);
    if (!f) return not_found("cannot open request file '" + a.request_file + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    json body = json::parse(ss.str(), nullptr, false);
    if (body.is_discarded()) return invalid_argument("request file '" + a.request_file + "' is not valid JSON");
    return body;
  }
  if (a.prompt.empty() && a.images.empty()) return invalid_argument("give --request FILE or --prompt TEXT");
  json content = json::array();
  for (const std::string& img : a.images) content.push_back({{"type", "image_url"}, {"image_url", {{"url", img}}}});
  if (!a.prompt.empty()) content.push_back({{"type", "text"}, {"text", a.prompt}});
  json messages = json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  messages.push_back({{"role", "user"}, {"content", content}});
  return json{{"messages", messages}};
}

void add_accel_args(CLI::App* app, AccelArgs& a) {
  app->add_option("--sere-primary", a.sere.primary, "SERE: experts per token kept as primary (0 = off)");
  app->add_option("--sere-threshold", a.sere.threshold, "SERE: keep an expert whose best substitute's similarity is below this");
  app->add_option("--sere-layer-thresholds", a.sere.layer_thresholds, "SERE: one threshold per layer");
  app->add_option("--sere-similarity", a.sere.similarity_file, "SERE similarity file (default: MODEL/sere_similarity.safetensors)");
  app->add_flag("--sere-prefill", a.sere.prefill, "SERE: also re-route prefill steps");
  app->add_option("--vision-prune-rate", a.vision_prune_rate, "VisionZip: share of visual tokens dropped (0 = off)")
      ->check(CLI::Range(0.0f, 1.0f));
  app->add_option("--vision-budget-mode", a.vision_budget_mode, "VisionZip: uniform | global")
      ->check(CLI::IsMember({"uniform", "global"}));
  app->add_option("--vision-budget", a.vision_budget, "VisionZip: absolute visual-token budget per request (global mode)");
  app->add_option("--vision-score-layer", a.vision_score_layer, "VisionZip: vision block that scores tokens (negative counts from the end)");
  app->add_option("--vision-min-tokens", a.vision_min_tokens, "VisionZip: tokens every image keeps at least")
      ->check(CLI::PositiveNumber);
  app->add_option("--vision-contextual", a.vision_contextual, "VisionZip: share of kept tokens that are merged tokens")
      ->check(CLI::Range(0.0f, 0.99f));
}

Result<std::unique_ptr<engine::SereRuntime>> apply_accel(const AccelArgs& a, engine::ModelBundle& model,
                                                         engine::EngineOptions& opts) {
  auto& vp = model.vision_prune;
  vp.rate = a.vision_prune_rate;
  vp.mode = a.vision_budget_mode == "uniform" ? accel::VisionPruneOptions::Mode::kUniform
                                              : accel::VisionPruneOptions::Mode::kGlobal;
  vp.budget = a.vision_budget;
  vp.min_tokens = a.vision_min_tokens;
  vp.contextual = a.vision_contextual;
  model.vision_score_layer = a.vision_score_layer;
  std::unique_ptr<engine::SereRuntime> sere;
  if (a.sere.enabled()) {
    auto r = engine::SereRuntime::create(model, a.sere);
    if (!r.ok()) return r.status();
    sere = std::move(r).value();
    engine::SereRuntime* raw = sere.get();
    opts.moe_hooks = [raw](bool decode_only) { return raw->hooks(decode_only); };
  }
  return sere;
}

int fail(const Status& st) {
  std::cerr << "error: " << st.message() << "\n";
  return 1;
}

}  // namespace zest::cli
