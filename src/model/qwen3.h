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
#include "model/kv_cache.h"

namespace zest::model {

// One sequence's chunk inside a forward batch.
struct SeqChunk {
  std::vector<int32_t>* block_table = nullptr;  // the sequence's KV blocks (reserved by the caller)
  int64_t start = 0;        // tokens of this sequence already in the KV cache
  int64_t length = 0;       // tokens in this chunk
  bool all_logits = false;  // logits for every token of the chunk instead of only the last
  bool reroute = true;      // the sequence takes part in expert re-routing (SERE) when it is on
};

// A batch of chunks (prefill and decode mixed), flattened: tokens of seqs[0], then seqs[1], ...
struct ForwardBatch {
  std::vector<int32_t> tokens;     // [T]
  std::vector<int32_t> positions;  // [3 * T]: rows t, h, w (all equal for text tokens)
  std::vector<SeqChunk> seqs;
  // Multimodal input: row r of mm_embeds replaces the embedding of token mm_index[r]; deepstack[l]
  // row r is added to that token's hidden state after decoder layer l.
  Tensor mm_embeds;
  std::vector<int64_t> mm_index;
  std::vector<Tensor> deepstack;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

// Callbacks into the MoE layers (expert re-routing, calibration, statistics).
struct MoeHooks {
  // After top-k + renormalisation: ids/weights [n, k] of the tokens in `active` order may be rewritten;
  // `active[i]` says whether token i takes part (padding and opted-out sequences do not).
  std::function<void(int64_t layer, int32_t* ids, float* weights, int64_t n, int64_t k,
                     const std::vector<uint8_t>& active)> route;
  // The normalised MoE input of a layer, x [n, hidden] f32 (for calibration).
  std::function<void(int64_t layer, const float* x, int64_t n)> moe_input;
};

class Qwen3TextModel {
 public:
  // Binds the decoder weights. `prefix` is "model." (qwen3_moe) or "model.language_model." (VL);
  // expert tensors in either layout (per-expert nn.Linear or fused input-major).
  static Result<Qwen3TextModel> load(const io::SafeTensors& st, const io::ModelConfig& cfg);

  const io::TextConfig& config() const { return cfg_; }
  // A KV cache sized for `num_blocks` blocks of `block_size` tokens.
  PagedKVCache make_cache(int64_t num_blocks, int64_t block_size = 16) const;

  // Runs one forward step. Writes K/V of every token into the cache and returns logits [R, vocab],
  // R = sum over chunks of (all_logits ? length : 1), in chunk order.
  Result<Tensor> forward(const ForwardBatch& batch, PagedKVCache& cache, const MoeHooks* hooks = nullptr) const;

  // Whether decoder layer `layer` has an MoE block.
  bool is_moe_layer(int64_t layer) const { return layers_[layer].moe; }
  // Runs expert `expert` of MoE layer `layer` on x [n, hidden] (the normalised MoE input) and writes
  // its un-weighted output [n, hidden] to y (SERE calibration).
  void run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const;

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
  void mlp(const Layer& L, int64_t layer, const ForwardBatch& b, const float* x, float* out,
           const MoeHooks* hooks) const;
  // cos/sin tables [T, head_dim/2] for the batch positions.
  void rope_tables(const ForwardBatch& b, std::vector<float>& cos, std::vector<float>& sin) const;

  io::TextConfig cfg_;
  Tensor embed_, final_norm_, lm_head_;  // lm_head_ may share embed_ storage (tied)
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  std::vector<int8_t> freq_axis_;  // M-RoPE axis (0 t, 1 h, 2 w) of each frequency
};

}  // namespace zest::model
