// Shared pieces of the zest subcommands: model loading, request assembly, errors.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "engine/sere.h"

namespace zest::cli {

// Options every model-running subcommand takes.
struct ModelArgs {
  std::string model;
  int threads = 0;
  std::string device = "auto";
  // A random-weight model instead of --model (subcommands that allow it): a named shape or a config.json.
  std::string config;
  int64_t layers = 0;
  std::string tokenizer;
  uint64_t seed = 1;
  float skew = 0.f;
  std::string dtype = "bf16";  // with --config: bf16, or fp8 (block-wise, as the official -FP8 checkpoints)
  model::DeviceDecodeOptions decode;  // --cuda-graphs, --no-cuda-graph-padding, --cuda-graph-cap, --cuda-graph-log
  model::ParallelOptions parallel;    // --tensor-parallel, --expert-parallel
};
// With `random_model`, --config/--layers/--tokenizer/--seed are added and --model becomes optional
// (one of --model and --config is required).
void add_model_args(CLI::App* app, ModelArgs& a, bool random_model = false);
// Applies threads/device and loads the model (or makes the random one); prints nothing.
Result<std::shared_ptr<engine::ModelBundle>> load_model(const ModelArgs& a);
// One line describing a random-weight model (empty for a checkpoint).
std::string random_model_note(const engine::ModelBundle& m);

// Where a request comes from: a JSON body file, or --prompt with --image parts.
struct RequestArgs {
  std::string request_file;
  std::string prompt;
  std::string system;
  std::vector<std::string> images;
};
void add_request_args(CLI::App* app, RequestArgs& a);
// The chat-completions body these arguments describe.
Result<nlohmann::json> request_body(const RequestArgs& a);

// Acceleration flags shared by generate, serve and bench: SERE and VisionZip defaults.
struct AccelArgs {
  engine::SereOptions sere;
  float vision_prune_rate = 0.0f;
  std::string vision_budget_mode = "global";
  int64_t vision_budget = -1;
  std::optional<int64_t> vision_score_layer;  // unset: the model's (MODEL/visionzip.json, else -2)
  int64_t vision_min_tokens = 16;
  float vision_contextual = 0.0f;
};
void add_accel_args(CLI::App* app, AccelArgs& a);
// Applies the VisionZip defaults to the model and builds the SERE runtime (null when SERE is off);
// installs its hooks into `opts`.
Result<std::unique_ptr<engine::SereRuntime>> apply_accel(const AccelArgs& a, engine::ModelBundle& model,
                                                         engine::EngineOptions& opts);

// Engine flags shared by serve and eval: --max-batched-tokens, --max-context, --kv-blocks.
void add_engine_args(CLI::App* app, engine::EngineOptions& o);

// Prints "error: <message>" to stderr and returns exit code 1.
int fail(const Status& st);

}  // namespace zest::cli
