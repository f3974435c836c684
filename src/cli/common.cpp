#include "cli/common.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/thread_pool.h"
#include "engine/vision_encode.h"
#include "kernels/backend.h"
#include "model/random_weights.h"

namespace zest::cli {

void add_model_args(CLI::App* app, ModelArgs& a, bool random_model) {
  CLI::Option* model =
      app->add_option("--model", a.model, "Hugging Face model directory (config.json, *.safetensors, tokenizer)");
  app->add_option("--threads", a.threads, "CPU threads (0 = all cores)");
  app->add_option("--device", a.device, "cpu | cuda | auto")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  using Graphs = model::DeviceDecodeOptions::Graphs;
  const std::map<std::string, Graphs> graphs = {{"on", Graphs::kOn}, {"off", Graphs::kOff}, {"eager", Graphs::kEager}};
  app->add_option("--cuda-graphs", a.decode.graphs,
                  "CUDA decode steps: on = replay CUDA graphs; off = eager launches with exact context bounds; eager = "
                  "eager launches of what a graph would replay (padding and context buckets included)")
      ->transform(CLI::CheckedTransformer(graphs, CLI::ignore_case).description("on | off | eager"))
      ->type_name("MODE")
      ->default_str("on");
  app->add_flag("!--no-cuda-graph-padding", a.decode.graph_padding,
                "CUDA decode graphs keyed by the exact sequence count (default: padded up to a ladder of row counts)");
  app->add_option("--cuda-graph-cap", a.decode.graph_cap, "CUDA decode graphs kept at most (least recently used out)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--cuda-graph-log", a.decode.graph_log, "one stderr line per captured CUDA decode graph");
  app->add_option("--tensor-parallel", a.parallel.tensor_parallel,
                  "split the decoder over N ranks: attention heads and MLP columns (and each expert's columns, or "
                  "whole experts with --expert-parallel), partial results summed by all-reduces; the CPU backend runs "
                  "the ranks as threads, the CUDA backend one a GPU joined by NCCL")
      ->check(CLI::PositiveNumber)
      ->type_name("N")
      ->capture_default_str();
  app->add_flag("--expert-parallel", a.parallel.expert_parallel,
                "with --tensor-parallel: place whole experts on ranks (expert parallel MoE) instead of splitting each "
                "expert's columns");
  if (!random_model) {
    model->required();
    return;
  }
  std::string names;
  for (const std::string& n : model::named_model_configs()) names += (names.empty() ? "" : ", ") + n;
  CLI::Option* config = app->add_option(
      "--config", a.config,
      "run a model with RANDOM weights of this shape instead of --model: " + names + ", or a config.json path");
  model->excludes(config);
  config->excludes(model);
  app->add_option("--layers", a.layers, "with --config: decoder layers (0 = the config's)")
      ->check(CLI::NonNegativeNumber);
  a.tokenizer = std::string(ZEST_ASSETS_DIR) + "/tokenizer";
  app->add_option("--tokenizer", a.tokenizer, "with --config: tokenizer.json or a directory with one")
      ->capture_default_str();
  app->add_option("--seed", a.seed, "with --config: seed of the random weights")->capture_default_str();
  app->add_option("--skew", a.skew,
                  "with --config: Zipf-like expert popularity, router logits biased by -SKEW*ln(rank+1) (0 = uniform)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--dtype", a.dtype,
                  "with --config: weight format, bf16 or fp8 (block-wise 128x128 FP8 as the official -FP8 checkpoints; "
                  "--device cuda)")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
}

Result<std::shared_ptr<engine::ModelBundle>> load_model(const ModelArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  const bool gpu = kernels::cuda_available();
  if (a.device == "cuda" && !gpu)
    return unsupported("--device cuda: " + kernels::cuda_describe() + "; use --device cpu (or auto)");
  const bool cuda = a.device == "cuda" || (a.device == "auto" && gpu);
  const model::Backend backend = cuda ? model::Backend::kCuda : model::Backend::kCpu;
  if (a.model.empty() && a.config.empty())
    return invalid_argument("give --model DIR (a checkpoint) or --config NAME (random weights of a named shape)");
  if (!a.config.empty()) {
    engine::RandomModelOptions o;
    o.config = a.config;
    o.layers = a.layers;
    o.tokenizer = a.tokenizer;
    o.seed = a.seed;
    o.router_skew = a.skew;
    o.fp8 = a.dtype == "fp8";
    return engine::ModelBundle::random(o, backend, a.decode, a.parallel);
  }
  return engine::ModelBundle::load(a.model, backend, a.decode, a.parallel);
}

std::string random_model_note(const engine::ModelBundle& m) {
  if (!m.random_seed) return "";
  const io::TextConfig& t = m.config.text;
  return "RANDOM WEIGHTS (seed " + std::to_string(*m.random_seed) + ", no checkpoint; outputs are meaningless): '" +
         m.dir + "' shape, " + std::to_string(t.num_layers) + " decoder layers, hidden " +
         std::to_string(t.hidden_size) + ", " +
         (t.num_experts > 0 ? std::to_string(t.num_experts) + " experts top-" + std::to_string(t.num_experts_per_tok)
                            : std::string("dense")) +
         (t.num_experts > 0 && m.random_router_skew > 0.f ? ", router skew " + std::to_string(m.random_router_skew)
                                                            : std::string()) +
         (m.config.vision ? ", vision tower " + std::to_string(m.config.vision->depth) + " blocks" : "") +
         (m.config.fp8 ? ", block-wise FP8 weights" : "") + ", " +
         std::to_string(model::text_parameters(t) +
                        (m.config.vision ? model::vision_parameters(*m.config.vision) : 0)) +
         " parameters on " + model::backend_name(m.backend);
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
  app->add_option("--sere-primary", a.sere.params.primary, "SERE: experts per token kept as primary (0 = off)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--sere-threshold", a.sere.params.threshold,
                  "SERE: keep an expert whose best substitute's similarity is below this");
  app->add_option("--sere-layer-thresholds", a.sere.params.layer_thresholds, "SERE: one threshold per layer");
  app->add_option("--sere-similarity", a.sere.similarity_file, "SERE similarity file (default: MODEL/sere_similarity.safetensors)");
  app->add_flag("--sere-prefill", a.sere.prefill, "SERE: also re-route prefill steps");
  app->add_option("--sere-protected", a.sere.protected_file,
                  "SERE: per-layer experts never re-routed away (JSON from zest sere-protect)");
  app->add_option("--vision-prune-rate", a.vision_prune_rate, "VisionZip: share of visual tokens dropped (0 = off)")
      ->check(CLI::Range(0.0f, 1.0f));
  app->add_option("--vision-budget-mode", a.vision_budget_mode, "VisionZip: uniform | global")
      ->check(CLI::IsMember({"uniform", "global"}));
  app->add_option("--vision-budget", a.vision_budget, "VisionZip: absolute visual-token budget per request (global mode)");
  app->add_option("--vision-score-layer", a.vision_score_layer,
                  "VisionZip: vision block that scores tokens (negative counts from the end; default: the model's "
                  "visionzip.json from zest calibrate-visionzip, else -2)");
  app->add_option("--vision-min-tokens", a.vision_min_tokens, "VisionZip: tokens every image keeps at least")
      ->check(CLI::PositiveNumber);
  app->add_option("--vision-contextual", a.vision_contextual, "VisionZip: share of kept tokens that are merged tokens")
      ->check(CLI::Range(0.0f, 0.99f));
}

void add_engine_args(CLI::App* app, engine::EngineOptions& o) {
  app->add_option("--max-batched-tokens", o.max_batched_tokens, "tokens per engine step at most")
      ->capture_default_str();
  app->add_option("--max-context", o.max_context, "context limit in tokens (0 = model's, at most 32768)")
      ->capture_default_str();
  app->add_option("--kv-blocks", o.kv_blocks, "KV-cache blocks of 16 tokens (0 = 4 full contexts)")
      ->capture_default_str();
  app->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.prefix_caching,
                "automatic prefix caching: full KV blocks shared by requests with the same prefix (default on)");
  app->add_flag("!--host-sampling", o.device_sampling,
                "host logits and host sampling whatever the device (A/B against the device's sampling summaries)");
}

namespace {

// Writes model::random_sere_similarity of a random model to a temporary file; returns its path.
Result<std::string> write_random_similarity(const engine::ModelBundle& model) {
  const auto sim = model::random_sere_similarity(model.config.text, *model.random_seed);
  const int64_t E = model.config.text.num_experts;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t l = 0; l < sim.size(); ++l)
    if (!sim[l].empty())
      tensors.emplace_back("layers." + std::to_string(l) + ".similarity", Tensor::from_vector({E, E}, sim[l]));
  static int counter = 0;
  std::error_code ec;
  const std::string file = (std::filesystem::temp_directory_path(ec) /
                            ("zest-sere-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".safetensors"))
                               .string();
  ZEST_RETURN_IF_ERROR(io::write_safetensors(file, tensors, {{"metric", "random"}}).with_context("SERE similarity"));
  return file;
}

}  // namespace

Result<std::unique_ptr<engine::SereRuntime>> apply_accel(const AccelArgs& a, engine::ModelBundle& model,
                                                         engine::EngineOptions& opts) {
  auto& vp = model.vision_prune;
  vp.rate = a.vision_prune_rate;
  vp.mode = a.vision_budget_mode == "uniform" ? accel::VisionPruneOptions::Mode::kUniform
                                              : accel::VisionPruneOptions::Mode::kGlobal;
  vp.budget = a.vision_budget;
  vp.min_tokens = a.vision_min_tokens;
  vp.contextual = a.vision_contextual;
  if (a.vision_score_layer) vp.score_layer = *a.vision_score_layer;
  ZEST_RETURN_IF_ERROR(engine::check_vision_prune(model, vp).with_context("--vision-* options"));
  std::unique_ptr<engine::SereRuntime> sere;
  if (a.sere.params.primary > 0) {
    engine::SereOptions so = a.sere;
    std::string temp;
    if (model.random_seed && so.similarity_file.empty() && model.config.is_moe()) {
      // A random model has no calibration: a random symmetric similarity with unit diagonal per layer.
      ZEST_ASSIGN_OR_RETURN(temp, write_random_similarity(model));
      so.similarity_file = temp;
    }
    auto r = engine::SereRuntime::create(model, so);
    if (!temp.empty()) std::filesystem::remove(temp);
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
