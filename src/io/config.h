// Hugging Face model configuration (config.json, generation_config.json, preprocessor_config.json).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace zest::io {

// The architectures zest runs (a line each in config.cpp's table and in model/architecture.cpp's).
enum class Arch { kQwen3Moe, kQwen3VLMoe, kQwen3VL, kQwen3 };
// config.json's model_type of `a` ("qwen3_moe", ...).
const char* arch_name(Arch a);
// Whether `a` is a vision-language model (a text_config and a vision_config).
bool has_vision(Arch a);

// Text decoder hyper-parameters (the text_config of the VL models).
struct TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;      // dense SwiGLU width (qwen3_vl)
  int64_t moe_intermediate_size = 0;  // expert width (MoE models)
  int64_t num_experts = 0;            // 0 = dense model
  int64_t num_experts_per_tok = 0;
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  std::vector<int64_t> mrope_section;  // empty = 1-D RoPE; e.g. {24, 20, 20}
  // Qwen3-VL (always set for it): rotary frequency j of head_dim/2 uses the H position when
  // j % 3 == 1 && j < 3 * mrope_section[1], the W position when j % 3 == 2 && j < 3 * mrope_section[2],
  // else the T position.
  bool mrope_interleaved = false;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  // MoE layers: every layer unless listed in mlp_only_layers or off the decoder_sparse_step grid.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool is_moe_layer(int64_t layer) const;
};

struct VisionConfig {
  int64_t depth = 0;
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t intermediate_size = 0;
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t in_channels = 3;
  int64_t out_hidden_size = 0;
  int64_t num_position_embeddings = 0;
  std::string hidden_act = "gelu_pytorch_tanh";
  std::vector<int64_t> deepstack_visual_indexes;
};

// Block-wise FP8 weights (config.json quantization_config with quant_method "fp8", fmt "e4m3",
// weight_block_size [128, 128], activation_scheme "dynamic": the format of Qwen's official -FP8 checkpoints
// and of transformers' FineGrainedFP8Config). Linear weights are float8_e4m3fn with an f32 (or bf16)
// "<weight>_scale_inv" per block; embeddings, norms, routers and the modules listed in
// modules_to_not_convert stay in their bf16 form.
struct Fp8Config {
  int64_t block_rows = 128, block_cols = 128;  // weight_block_size [output rows, input columns]
  std::vector<std::string> modules_to_not_convert;
  // Whether `module` (a tensor name without its last component, e.g. "model.layers.0.mlp.gate") is
  // listed as not converted, matched as transformers does: an entry that is a prefix of the name (as a
  // regular expression anchored at the start, or literally) or a suffix of it.
  bool not_converted(const std::string& module) const;
};

struct ModelConfig {
  Arch arch = Arch::kQwen3Moe;
  std::string model_type;  // as written in config.json
  TextConfig text;
  std::optional<VisionConfig> vision;  // set for the VL models
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  std::optional<Fp8Config> fp8;  // set for block-wise FP8 checkpoints
  bool is_moe() const { return text.num_experts > 0; }
};

// Parses DIR/config.json (or a file path). Unknown model_type / architectures -> kUnsupported;
// missing or ill-typed fields -> kCorrupt naming the field; inconsistent sizes
// (kv heads not dividing heads, experts per token > experts, vision out_hidden_size != hidden_size,
// deepstack index >= depth, ...) -> kCorrupt; RoPE scaling other than "default", attention biases and
// sliding-window layers -> kUnsupported.
// Optional fields take the transformers 5.17 class defaults; RoPE settings are read from
// rope_parameters (transformers 5) or rope_scaling + rope_theta (4.x). A quantization_config other than
// block-wise FP8 (Fp8Config) -> kUnsupported naming the method or the field; a malformed one -> kCorrupt.
Result<ModelConfig> load_model_config(const std::string& path);
Result<ModelConfig> parse_model_config(const std::string& json_text);

// Sampling defaults from generation_config.json (all optional).
struct GenerationDefaults {
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  std::vector<int64_t> eos_token_ids;
};
// Reads DIR/generation_config.json; a missing file yields empty defaults, a malformed one kCorrupt.
// "do_sample": false sets the default temperature to 0 (greedy), as transformers' generate does.
Result<GenerationDefaults> load_generation_defaults(const std::string& model_dir);

// Image processor settings from preprocessor_config.json (Qwen3-VL values as defaults).
struct PreprocessorConfig {
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_pixels = 65536;
  int64_t max_pixels = 16777216;
  float image_mean[3] = {0.5f, 0.5f, 0.5f};
  float image_std[3] = {0.5f, 0.5f, 0.5f};
};
// Reads DIR/preprocessor_config.json ("size": {shortest_edge, longest_edge} or min/max_pixels);
// a missing file yields the defaults above.
Result<PreprocessorConfig> load_preprocessor_config(const std::string& model_dir);

}  // namespace zest::io
