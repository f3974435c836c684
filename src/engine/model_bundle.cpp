#include "engine/model_bundle.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cuda.h"
#include "engine/encoder_cache.h"
#include "engine/vision_encode.h"
#include "kernels/backend.h"
#include "model/architecture.h"
#include "model/parallel_decoder.h"
#include "model/random_weights.h"
#include "vision/encoder.h"

namespace zest::engine {
namespace {

// The chat template family of an architecture (Qwen3's text template, or Qwen3-VL's with image parts).
text::TemplateKind template_kind(io::Arch arch) {
  return io::has_vision(arch) ? text::TemplateKind::kQwen3VL : text::TemplateKind::kQwen3;
}

// The CPU text decoder of a checkpoint: the whole model, or split over ranks (--tensor-parallel, threads of this
// process joined by all-reduces).
Result<std::unique_ptr<model::TextDecoder>> cpu_text_decoder(const io::SafeTensors& st, const io::ModelConfig& cfg,
                                                             const model::ParallelOptions& par) {
  if (par.tensor_parallel <= 1 && !par.expert_parallel) return model::architecture(cfg.arch).cpu_decoder(st, cfg);
  ZEST_ASSIGN_OR_RETURN(model::DecoderWeights w, model::collect_decoder_weights(st, cfg));
  ZEST_ASSIGN_OR_RETURN(auto d, model::ParallelDecoder::create_cpu(w, par.tensor_parallel, par.expert_parallel));
  return std::unique_ptr<model::TextDecoder>(std::move(d));
}

}  // namespace

Result<std::shared_ptr<ModelBundle>> ModelBundle::load(const std::string& dir, model::Backend backend,
                                                       const model::DeviceDecodeOptions& decode,
                                                       const model::ParallelOptions& parallel) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return not_found("model directory '" + dir + "' does not exist (pass --model with a Hugging Face model folder)");
  auto m = std::make_shared<ModelBundle>();
  m->dir = dir;
  auto cfg = io::load_model_config(dir);
  if (!cfg.ok()) return cfg.status().with_context(dir + "/config.json");
  m->config = std::move(cfg).value();
  auto gen = io::load_generation_defaults(dir);
  if (!gen.ok()) return gen.status().with_context(dir + "/generation_config.json");
  m->generation = std::move(gen).value();
  auto tok = text::Tokenizer::load(dir);
  if (!tok.ok()) return tok.status().with_context("tokenizer in " + dir);
  m->tokenizer = std::move(tok).value();
  m->chat_template = template_kind(m->config.arch);
  auto st = io::SafeTensors::open(dir);
  if (!st.ok()) return st.status().with_context("weights in " + dir);
  m->weights = std::move(st).value();
  Status scales = m->weights.bind_fp8_scales(m->config.fp8 ? &*m->config.fp8 : nullptr);
  if (!scales.is_ok()) return scales.with_context("weights in " + dir);
  m->backend = backend;
  if (backend == model::Backend::kCuda) {
    Status init = kernels::cuda_init(0);
    if (!init.is_ok()) return init.with_context("--device cuda");
    auto dev = model::make_cuda_decoder(m->weights, m->config, decode, parallel);
    if (!dev.ok()) return dev.status().with_context("CUDA text decoder of " + dir);
    m->text_decoder = std::move(dev).value();
  } else {
    auto text = cpu_text_decoder(m->weights, m->config, parallel);
    if (!text.ok()) return text.status().with_context("text decoder of " + dir);
    m->text_decoder = std::move(text).value();
  }
  if (m->config.vision) {
    auto pre = io::load_preprocessor_config(dir);
    if (!pre.ok()) return pre.status().with_context(dir + "/preprocessor_config.json");
    m->preprocessor = std::move(pre).value();
    Status vs = load_vision_tower(*m);
    if (!vs.is_ok()) return vs.with_context("vision tower of " + dir);
    auto layer = load_score_layer(dir + "/visionzip.json", m->config.vision->depth);
    if (!layer.ok()) return layer.status();
    m->calibrated_score_layer = *layer;
    if (*layer) m->vision_prune.score_layer = **layer;
  }
  return m;
}

Result<std::optional<int64_t>> load_score_layer(const std::string& file, int64_t depth) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::optional<int64_t>();
  std::ifstream f(file);
  if (!f) return not_found("cannot open '" + file + "'");
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return corrupt("'" + file + "' is not a JSON object");
  if (j.value("format", "") != "zest-visionzip/1")
    return corrupt("'" + file + "': format must be \"zest-visionzip/1\" (written by zest calibrate-visionzip)");
  const auto it = j.find("score_layer");
  if (it == j.end() || !it->is_number_integer()) return corrupt("'" + file + "': score_layer must be an integer");
  const int64_t layer = it->get<int64_t>();
  if (layer < -depth || layer >= depth)
    return corrupt("'" + file + "': score_layer " + std::to_string(layer) + " is outside the tower's " +
                   std::to_string(depth) + " blocks");
  return std::optional<int64_t>(layer);
}

Result<std::shared_ptr<ModelBundle>> ModelBundle::random(const RandomModelOptions& o, model::Backend backend,
                                                         const model::DeviceDecodeOptions& decode,
                                                         const model::ParallelOptions& parallel) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto m = std::make_shared<ModelBundle>();
  const bool from_file = fs::is_regular_file(o.config, ec) || fs::is_directory(o.config, ec);
  if (from_file) {
    auto cfg = io::load_model_config(o.config);
    if (!cfg.ok()) return cfg.status().with_context("--config " + o.config);
    m->config = std::move(cfg).value();
    if (o.layers < 0) return invalid_argument("the layer count must be positive (0 = the model's)");
    if (o.layers > 0) m->config.text.num_layers = o.layers;
    const fs::path p(o.config);
    m->dir = "random-" + (fs::is_directory(p, ec) ? p.filename() : p.parent_path().filename()).string();
  } else {
    auto cfg = model::named_model_config(o.config, o.layers);
    if (!cfg.ok()) return cfg.status().with_context("--config (a named shape, or a config.json path)");
    m->config = std::move(cfg).value();
    m->dir = o.config;
  }
  const io::TextConfig& tc = m->config.text;
  auto tok = text::Tokenizer::load(o.tokenizer);
  if (!tok.ok()) return tok.status().with_context("tokenizer " + o.tokenizer);
  m->tokenizer = std::move(tok).value();
  if (m->tokenizer.size() > tc.vocab_size)
    return invalid_argument("the tokenizer " + o.tokenizer + " has " + std::to_string(m->tokenizer.size()) +
                            " tokens but the model's vocabulary only " + std::to_string(tc.vocab_size));
  m->chat_template = template_kind(m->config.arch);
  m->backend = backend;
  m->random_seed = o.seed;
  if (o.router_skew < 0.f) return invalid_argument("the router skew must not be negative");
  m->random_router_skew = o.router_skew;

  if (backend == model::Backend::kCuda) {
    Status init = kernels::cuda_init(0);
    if (!init.is_ok()) return init.with_context("--device cuda");
    {
      model::RandomTensors store(o.seed);
      model::DecoderWeights w = model::random_decoder_weights(tc, store, o.distinct_layers, 0, o.router_skew);
      if (o.fp8) m->config.fp8 = model::quantize_fp8_blockwise(w, store);
      auto dev = model::create_cuda_parallel_decoder(w, parallel, decode);  // one GPU unless --tensor-parallel
      if (!dev.ok()) return dev.status().with_context("CUDA text decoder with random weights");
      m->text_decoder = std::move(dev).value();
    }
    if (m->config.vision) {
      const uint64_t seed = o.seed;
      auto enc = vision::create_cuda_vision_encoder(
          *m->config.vision, [seed](const std::string& name, const std::vector<int64_t>& shape) -> Result<Tensor> {
            return model::random_vision_tensor(name, shape, seed);
          });
      if (!enc.ok()) return enc.status().with_context("CUDA vision tower with random weights");
      m->vision = std::move(enc).value();
      m->encoder_cache = std::make_shared<EncoderCache>();
    }
    return m;
  }

  // CPU: through a checkpoint file (unlinked once mapped) and the ordinary loaders.
  if (o.fp8)
    return unsupported("random FP8 weights are made for device backends only (--device cuda); the CPU backend runs "
                       "FP8 checkpoints from disk");
  const double f32_bytes =
      4.0 * static_cast<double>(model::text_parameters(tc) +
                                (m->config.vision ? model::vision_parameters(*m->config.vision) : 0));
  if (f32_bytes > 16.0 * (1ull << 30))
    return invalid_argument("random weights of '" + o.config + "' need " +
                            std::to_string(static_cast<int64_t>(f32_bytes / (1ull << 30))) +
                            " GiB of f32 on the CPU backend (at most 16 GiB): pass fewer layers or use --device cuda");
  static std::atomic<int> counter{0};
  const fs::path file = fs::temp_directory_path(ec) / ("zest-random-" + std::to_string(::getpid()) + "-" +
                                                       std::to_string(counter++) + ".safetensors");
  Status ws = model::write_random_checkpoint(m->config, file.string(), o.seed, o.router_skew);
  if (!ws.is_ok()) {
    fs::remove(file, ec);
    return ws.with_context("random checkpoint");
  }
  auto st = io::SafeTensors::open_file(file.string());
  fs::remove(file, ec);
  if (!st.ok()) return st.status().with_context("random checkpoint");
  m->weights = std::move(st).value();
  auto text = cpu_text_decoder(m->weights, m->config, parallel);
  if (!text.ok()) return text.status().with_context("text decoder with random weights");
  m->text_decoder = std::move(text).value();
  if (m->config.vision) {
    Status vs = load_vision_tower(*m);
    if (!vs.is_ok()) return vs.with_context("vision tower with random weights");
  }
  return m;
}

std::vector<int32_t> ModelBundle::eos_ids() const {
  std::vector<int32_t> ids;
  for (int64_t e : generation.eos_token_ids) ids.push_back(static_cast<int32_t>(e));
  if (ids.empty())
    for (const char* t : {"<|im_end|>", "<|endoftext|>"}) {
      const int32_t id = tokenizer.token_to_id(t);
      if (id >= 0) ids.push_back(id);
    }
  return ids;
}

}  // namespace zest::engine
