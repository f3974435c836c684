#include "engine/model_bundle.h"

#include <filesystem>

#include "engine/vision_encode.h"
#include "kernels/backend.h"

namespace zest::engine {

Result<std::shared_ptr<ModelBundle>> ModelBundle::load(const std::string& dir, model::Backend backend) {
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
  m->chat_template = m->config.arch == io::Arch::kQwen3Moe ? text::TemplateKind::kQwen3 : text::TemplateKind::kQwen3VL;
  auto st = io::SafeTensors::open(dir);
  if (!st.ok()) return st.status().with_context("weights in " + dir);
  m->weights = std::move(st).value();
  m->backend = backend;
  if (backend == model::Backend::kCuda) {
    Status init = kernels::cuda_init(0);
    if (!init.is_ok()) return init.with_context("--device cuda");
    auto dev = model::make_cuda_decoder(m->weights, m->config);
    if (!dev.ok()) return dev.status().with_context("CUDA text decoder of " + dir);
    m->device_text = std::move(dev).value();
  } else {
    auto text = model::Qwen3TextModel::load(m->weights, m->config);
    if (!text.ok()) return text.status().with_context("text decoder of " + dir);
    m->text = std::move(text).value();
  }
  if (m->config.vision) {
    auto pre = io::load_preprocessor_config(dir);
    if (!pre.ok()) return pre.status().with_context(dir + "/preprocessor_config.json");
    m->preprocessor = std::move(pre).value();
    Status vs = load_vision_tower(*m);
    if (!vs.is_ok()) return vs.with_context("vision tower of " + dir);
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
