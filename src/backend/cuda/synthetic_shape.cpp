#include "backend/cuda/synthetic_shape.h"

#include "model/random_weights.h"

namespace zest::cuda {

SyntheticConfig synthetic_config_of(const std::string& name, const io::TextConfig& t) {
  SyntheticConfig c;
  c.name = name;
  c.layers = static_cast<int>(t.num_layers);
  c.hidden = static_cast<int>(t.hidden_size);
  c.q_heads = static_cast<int>(t.num_heads);
  c.kv_heads = static_cast<int>(t.num_kv_heads);
  c.head_dim = static_cast<int>(t.head_dim);
  c.experts = static_cast<int>(t.num_experts);
  c.top_k = static_cast<int>(t.num_experts_per_tok);
  c.expert_inter = static_cast<int>(t.moe_intermediate_size);
  c.dense_inter = t.num_experts > 0 ? 0 : static_cast<int>(t.intermediate_size);
  c.vocab = static_cast<int>(t.vocab_size);
  c.rope_theta = static_cast<float>(t.rope_theta);
  c.mrope = !t.mrope_section.empty();
  return c;
}

Result<SyntheticConfig> synthetic_config(const std::string& name, int layers) {
  if (layers < 0) return invalid_argument("--layers must be positive");
  ZEST_ASSIGN_OR_RETURN(io::ModelConfig cfg, model::named_model_config(name, layers));
  return synthetic_config_of(name, cfg.text);
}

}  // namespace zest::cuda
