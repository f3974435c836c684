// A random Qwen3-MoE checkpoint for the CUDA decoder tests: the tiny fixture's config with head_dim 128 (hidden 64,
// 4 query / 2 kv heads, 8 experts of width 64, top-2, two layers, vocabulary 512), weights drawn from N(0, 1) scaled
// per tensor and stored as F32 in dir/model.safetensors: the shapes where the fast decode and prefill attention and
// the tensor-core MoE kernels apply.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace zest::cuda::test {

struct RandomCheckpoint {
  io::ModelConfig config;
  std::string file;  // the safetensors file written
};

// Shape overrides (the defaults are the ones above).
struct RandomShape {
  int hidden = 64, heads = 4, kv_heads = 2, vocab = 512;
};

inline Result<RandomCheckpoint> write_random_moe_checkpoint(const std::filesystem::path& dir, uint32_t seed,
                                                            RandomShape shape = {}) {
  namespace fs = std::filesystem;
  std::ifstream f(fs::path(ZEST_FIXTURES_DIR) / "models" / "qwen3_moe_tiny" / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(f);
  cfg["hidden_size"] = shape.hidden;
  cfg["head_dim"] = 128;
  cfg["num_attention_heads"] = shape.heads;
  cfg["num_key_value_heads"] = shape.kv_heads;
  cfg["num_experts"] = 8;
  cfg["num_local_experts"] = 8;
  cfg["num_experts_per_tok"] = 2;
  cfg["moe_intermediate_size"] = 64;
  cfg["num_hidden_layers"] = 2;
  cfg["max_window_layers"] = 2;
  cfg["vocab_size"] = shape.vocab;
  auto parsed = io::parse_model_config(cfg.dump());
  if (!parsed.ok()) return parsed.status();
  RandomCheckpoint out;
  out.config = *parsed;
  const io::TextConfig& c = out.config.text;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float offset) {
    Tensor t = Tensor::empty(shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = offset + scale * nd(rng);
    tensors.emplace_back(name, t);
  };
  const int64_t H = c.hidden_size, D = c.head_dim, E = c.num_experts, I = c.moe_intermediate_size;
  const float lin = 1.f / std::sqrt(static_cast<float>(H));
  add("model.embed_tokens.weight", {c.vocab_size, H}, 1.f, 0.f);
  add("model.norm.weight", {H}, 0.1f, 1.f);
  add("lm_head.weight", {c.vocab_size, H}, 2.f * lin, 0.f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, 0.1f, 1.f);
    add(p + "post_attention_layernorm.weight", {H}, 0.1f, 1.f);
    add(p + "self_attn.q_proj.weight", {c.num_heads * D, H}, lin, 0.f);
    add(p + "self_attn.k_proj.weight", {c.num_kv_heads * D, H}, lin, 0.f);
    add(p + "self_attn.v_proj.weight", {c.num_kv_heads * D, H}, lin, 0.f);
    add(p + "self_attn.o_proj.weight", {H, c.num_heads * D}, 1.f / std::sqrt(static_cast<float>(c.num_heads * D)), 0.f);
    add(p + "self_attn.q_norm.weight", {D}, 0.1f, 1.f);
    add(p + "self_attn.k_norm.weight", {D}, 0.1f, 1.f);
    add(p + "mlp.gate.weight", {E, H}, 3.f * lin, 0.f);
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      add(ep + "gate_proj.weight", {I, H}, lin, 0.f);
      add(ep + "up_proj.weight", {I, H}, lin, 0.f);
      add(ep + "down_proj.weight", {H, I}, 1.f / std::sqrt(static_cast<float>(I)), 0.f);
    }
  }
  fs::create_directories(dir);
  out.file = (dir / "model.safetensors").string();
  if (Status s = io::write_safetensors(out.file, tensors); !s.is_ok()) return s;
  return out;
}

}  // namespace zest::cuda::test
