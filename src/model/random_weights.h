// Random-weight models: named real model shapes (text decoder and vision tower) and host synthesis of
// random weights for them, so that benchmarks and load tests run a model of the right size without its
// checkpoint. Values come from a counter-based hash of (seed, tensor name, element index): the same
// seed and name always give the same tensor, whatever the order of synthesis or the thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/decoder.h"

namespace zest::model {

// The names named_model_config knows: qwen3-30b-a3b (text only), qwen3-vl-30b-a3b, qwen3-vl-235b-a22b
// (MoE), qwen3-vl-32b (dense) and qwen3-8b (dense, text only); the CUDA benchmarks take theirs from here too.
std::vector<std::string> named_model_configs();

// The config of a named shape; layers > 0 overrides the decoder's layer count. Unknown names and
// negative layer counts -> kInvalidArgument listing the known names.
Result<io::ModelConfig> named_model_config(const std::string& name, int64_t layers = 0);

// Host bf16 tensors of random values; the views handed out stay valid while the store lives.
class RandomTensors {
 public:
  explicit RandomTensors(uint64_t seed) : seed_(seed) {}
  // Approximately N(0, stddev^2) (Irwin-Hall sum of four uniforms, so |x| < 3.47 stddev).
  io::TensorView normal(const std::string& name, std::vector<int64_t> shape, float stddev);
  // Uniform in [lo, hi).
  io::TensorView uniform(const std::string& name, std::vector<int64_t> shape, float lo, float hi);
  // The block-wise FP8 form of a 2-D bf16 view, as the official -FP8 checkpoints store a weight: per block of
  // `block` x `block` (edge blocks partial) the scale amax / 448 (f32; 1 for an all-zero block) and float8_e4m3fn
  // values round(w / scale); the view's `scale` is bound to that grid, so the real weight is fp8 * scale.
  io::TensorView fp8_blockwise(const io::TensorView& w, int64_t block = 128);
  // Host bytes held.
  size_t bytes() const { return bytes_; }
  uint64_t seed() const { return seed_; }

 private:
  io::TensorView make(const std::string& name, std::vector<int64_t> shape, bool normal, float a, float b);
  uint64_t seed_;
  size_t bytes_ = 0;
  std::vector<std::unique_ptr<uint16_t[]>> bufs_;
  std::vector<std::unique_ptr<uint8_t[]>> fp8_bufs_;
  std::vector<std::unique_ptr<float[]>> scale_bufs_;
};

// Random text-decoder weights of `cfg` as views into `store`: embeddings N(0, 1), every matrix
// N(0, 1/fan_in) in the per-expert nn.Linear layout, norm weights uniform in [0.9, 1.1). Only the first
// `distinct_layers` layers get tensors of their own (0 or >= num_layers: every layer); layer l >= that
// views the tensors of layer l % distinct_layers, so a deep model costs the host memory of a few layers
// while the device decoder still gets (and uploads) every layer. Likewise within an MoE layer, expert
// e >= distinct_experts views expert e % distinct_experts (0: every expert its own).
//
// Routing and the next token follow the current token, not the layers' computation: a deep random network
// makes the hidden states of different tokens alike (and greedy decoding then repeats a few tokens), which
// would route a whole batch onto a few experts, far from a trained model. So hidden coordinates
// [0, 1 + K), K = token_channels(hidden), are reserved: attention and the experts ignore them
// (input_layernorm weight 0 there, their columns of gate/up zero) and the layers do not write them (their
// rows of o_proj and down_proj are zero), except that layer 0's attention adds the context to 1..K (its
// o_proj rows there, scaled up 3x; layers sharing layer 0's tensors get an o_proj without them).
// Coordinate 0 holds sqrt(hidden) in every embedding row, coordinates 1..K start as the token's random
// embedding values. Router row e reads only these: a unit-norm random vector over the
// K token channels (an N(0, 1) logit for a random token) and column 0, which adds bias_e; every other
// router column is zero. The final norm keeps only the token channels, so the next token is a random
// function of the current one. Up to a common positive scale, the router logits are N(0, 1)-like per token
// plus bias_e at every depth. The layers' work is the same as with any other weights.
//
// router_skew > 0 makes expert popularity Zipf-like, as the synthetic decoder's router bias does: bias_e =
// -router_skew * ln(rank_e + 1) (random_router_bias); 0 = no bias.
DecoderWeights random_decoder_weights(const io::TextConfig& cfg, RandomTensors& store, int64_t distinct_layers = 0,
                                      int64_t distinct_experts = 0, float router_skew = 0.f);

// The weights as an official block-wise FP8 checkpoint holds them: every attention projection (q, k, v, o) and every
// expert or dense-MLP matrix replaced by its RandomTensors::fp8_blockwise form (views shared between layers or experts
// stay shared); embeddings, lm_head, norms and the router stay bf16 (the checkpoints' modules_to_not_convert). The
// returned config is `w.config`'s block size for io::ModelConfig::fp8.
io::Fp8Config quantize_fp8_blockwise(DecoderWeights& w, RandomTensors& store, int64_t block = 128);

// Token channels random_decoder_weights reserves: min(64, (hidden - 1) / 2), 0 below hidden 8.
int64_t token_channels(int64_t hidden);

// The router bias random_decoder_weights aims at with router_skew: -skew * ln(rank_e + 1) for a random
// permutation rank of the experts (from `seed`).
std::vector<float> random_router_bias(int64_t experts, float skew, uint64_t seed);

// One vision-tower tensor (name relative to the tower prefix, as vision::VisionTensorSource asks for it)
// as CPU f32: matrices uniform with variance 1/fan_in (fan_in = product of all dims but the first),
// biases uniform in [-0.02, 0.02), norm weights in [0.9, 1.1), position embeddings N(0, 0.02^2)-like.
Tensor random_vision_tensor(const std::string& name, const std::vector<int64_t>& shape, uint64_t seed);

// Every tensor the Qwen3-VL vision tower loads (names relative to the tower prefix) with its shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> vision_tensor_shapes(const io::VisionConfig& cfg);

// Random SERE similarity: per MoE layer a symmetric [E, E] f32 matrix with unit diagonal and off-diagonal
// entries uniform in [0, 1) (as the synthetic decoder draws them); empty for dense layers.
std::vector<std::vector<float>> random_sere_similarity(const io::TextConfig& cfg, uint64_t seed);

// Writes a whole random checkpoint of `cfg` (text decoder and, for VL models, the vision tower, in the
// official tensor names) to one .safetensors file: text tensors bf16, vision tensors f32. For the CPU
// backend, which loads checkpoints through io::SafeTensors; meant for small shapes.
Status write_random_checkpoint(const io::ModelConfig& cfg, const std::string& file, uint64_t seed,
                               float router_skew = 0.f);

// Parameters of the text decoder (embeddings and lm_head included) and of the vision tower.
int64_t text_parameters(const io::TextConfig& cfg);
int64_t vision_parameters(const io::VisionConfig& cfg);

}  // namespace zest::model
