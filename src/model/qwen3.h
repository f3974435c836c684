// The Qwen3 text decoder (Qwen3-MoE, and the language model of Qwen3-VL-MoE / dense Qwen3-VL) on the
// CPU backend in f32: embedding, pre-norm layers with GQA attention (per-head q/k RMSNorm, RoPE or
// interleaved M-RoPE, paged KV cache), MoE (softmax router, top-k, renormalise, SwiGLU experts) or a
// dense SwiGLU MLP, final norm and lm_head.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/kv_cache.h"
#include "model/parallel.h"

namespace zest::model {

class Qwen3TextModel : public TextDecoder {
 public:
  // Binds the decoder weights. `prefix` is "model." (qwen3_moe) or "model.language_model." (VL);
  // expert tensors in either layout (per-expert nn.Linear or fused input-major).
  static Result<Qwen3TextModel> load(const io::SafeTensors& st, const io::ModelConfig& cfg);
  // The same from collected weights: the whole model's, or one rank's shard (shard_decoder_weights; experts another
  // rank holds stay empty and are skipped).
  static Result<Qwen3TextModel> from_weights(const DecoderWeights& w);
  // A rank of a parallel decoder (TextDecoder::set_communicator).
  Status set_communicator(Communicator* comm) override {
    comm_ = comm;
    return Status::ok();
  }

  Backend backend() const override { return Backend::kCpu; }
  const io::TextConfig& config() const override { return cfg_; }
  // A KV cache sized for `num_blocks` blocks of `block_size` tokens.
  PagedKVCache make_cache(int64_t num_blocks, int64_t block_size = 16) const;
  Result<PagedKVCache> allocate_cache(int64_t num_blocks, int64_t block_size) const override {
    return make_cache(num_blocks, block_size);
  }

  // Runs one forward step. Writes K/V of every token into the cache and returns logits [R, vocab],
  // R = sum over chunks of (all_logits ? length : 1), in chunk order.
  Result<Tensor> forward(const ForwardBatch& batch, PagedKVCache& cache,
                         const MoeHooks* hooks = nullptr) const override;

  Status run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const override;

 private:
  struct Layer {
    Tensor in_norm, post_norm, wq, wk, wv, wo, q_norm, k_norm;
    Tensor router;              // [E, H]
    std::vector<Tensor> gate_up;  // per expert [2I, H] (gate rows first); dense: one entry
    std::vector<Tensor> down;     // per expert [H, I]; dense: one entry
    bool moe = false;
  };
  void attention(const Layer& L, int64_t layer, const ForwardBatch& b, PagedKVCache& cache, const float* x,
                 float* out) const;
  // Expert `expert` of an MoE layer on x [n, hidden]: its un-weighted output [n, hidden] into y.
  void expert_ffn(const Layer& L, int64_t expert, const float* x, int64_t n, float* y) const;
  // The layer's MLP or experts; under several ranks rank 0 calls the hooks and broadcasts their re-routing.
  Status mlp(const Layer& L, int64_t layer, const ForwardBatch& b, const float* x, float* out,
           const MoeHooks* hooks) const;
  // cos/sin tables [T, head_dim/2] for the batch positions.
  void rope_tables(const ForwardBatch& b, std::vector<float>& cos, std::vector<float>& sin) const;

  io::TextConfig cfg_;
  Tensor embed_, final_norm_, lm_head_;  // lm_head_ may share embed_ storage (tied)
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  std::vector<int8_t> freq_axis_;  // M-RoPE axis (0 t, 1 h, 2 w) of each frequency
  Communicator* comm_ = nullptr;
};

}  // namespace zest::model
