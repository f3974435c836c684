// Everything loaded from one model directory: config, tokenizer, chat template, weights, decoder and
// (for the VL models) the vision encoder on the same backend as the decoder.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "accel/visionzip.h"
#include "core/status.h"
#include "grammar/matcher.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/parallel.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace zest::vision {
class VisionEncoder;
}

namespace zest::engine {
class EncoderCache;

// A model with random weights (benchmarks and load tests without a checkpoint).
struct RandomModelOptions {
  std::string config;     // a model::named_model_configs() name, or a config.json file or a directory with one
  int64_t layers = 0;     // > 0: the decoder gets this many layers instead of the config's
  std::string tokenizer;  // tokenizer.json, or a directory with one (the Qwen tokenizer)
  uint64_t seed = 1;
  // Device backends: layers synthesised on the host with tensors of their own; the others reuse them
  // (every layer is still uploaded). 0 = all.
  int64_t distinct_layers = 1;
  // > 0: Zipf-like expert popularity (model::random_decoder_weights' router_skew).
  float router_skew = 0.f;
  // Block-wise FP8 weights as the official -FP8 checkpoints hold them (model::quantize_fp8_blockwise; device backends).
  bool fp8 = false;
};

struct ModelBundle {
  std::string dir;
  io::ModelConfig config;
  io::GenerationDefaults generation;
  io::PreprocessorConfig preprocessor;
  text::Tokenizer tokenizer;
  text::TemplateKind chat_template = text::TemplateKind::kQwen3;
  io::SafeTensors weights;
  model::Backend backend = model::Backend::kCpu;
  // The text decoder on `backend`: the architecture's CPU decoder (model/architecture.h) or the device decoder.
  std::shared_ptr<model::TextDecoder> text_decoder;
  std::shared_ptr<vision::VisionEncoder> vision;   // the vision tower on `backend`; null for text-only models
  // VisionZip defaults for requests that do not override them (rate 0 = off); the score layer is
  // MODEL/visionzip.json's choice (zest calibrate-visionzip) if the folder has one, else the options' default.
  accel::VisionPruneOptions vision_prune;
  std::optional<int64_t> calibrated_score_layer;  // from MODEL/visionzip.json
  // Vision-tower outputs by image content (null = no caching).
  std::shared_ptr<EncoderCache> encoder_cache;
  // Structured output: the vocabulary as grammars see it and the compiled grammars of recent requests
  // (engine/structured_output.h).
  std::shared_ptr<grammar::GrammarCache> grammars = std::make_shared<grammar::GrammarCache>();

  // Loads DIR with the text decoder on `backend` (a device decoder runs its decode steps as `decode` says); every
  // problem is returned as a Status naming the file and what is wrong.
  static Result<std::shared_ptr<ModelBundle>> load(const std::string& dir,
                                                   model::Backend backend = model::Backend::kCpu,
                                                   const model::DeviceDecodeOptions& decode = {},
                                                   const model::ParallelOptions& parallel = {});
  // A model of the shape `opts.config` with random weights on `backend` (dir = the config's name). The
  // CPU backend loads them through a temporary checkpoint file (small shapes only: its f32 weights must
  // fit in 16 GiB); device backends upload host tensors directly.
  static Result<std::shared_ptr<ModelBundle>> random(const RandomModelOptions& opts,
                                                     model::Backend backend = model::Backend::kCpu,
                                                     const model::DeviceDecodeOptions& decode = {},
                                                     const model::ParallelOptions& parallel = {});
  // Set by random(): the seed the weights came from, and the router skew.
  std::optional<uint64_t> random_seed;
  float random_router_skew = 0.f;
  // The text decoder the engine runs.
  const model::TextDecoder& decoder() const { return *text_decoder; }
  // Token ids that end generation: generation_config eos ids, else <|im_end|> and <|endoftext|>.
  std::vector<int32_t> eos_ids() const;
};

// The score block of a visionzip.json (zest calibrate-visionzip) checked against a tower of `depth` blocks;
// nullopt when the file does not exist.
Result<std::optional<int64_t>> load_score_layer(const std::string& file, int64_t depth);

}  // namespace zest::engine
