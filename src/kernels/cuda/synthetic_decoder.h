// A Qwen3-shaped text decoder with random bf16 weights generated on the GPU, for decode benchmarks of the
// CUDA kernels (CUDA-side header). A decode step for a batch is captured once into a CUDA graph and
// replayed: no host synchronisation or allocation inside a step. Every replay writes the new token's K/V
// at the same position, so the attended context stays at `context + 1` tokens.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

struct SyntheticConfig {
  std::string name;
  int layers = 0, hidden = 0, q_heads = 0, kv_heads = 0, head_dim = 128;
  int experts = 0, top_k = 0, expert_inter = 0;  // experts == 0: dense SwiGLU MLP of width dense_inter
  int dense_inter = 0;
  int vocab = 0;
  float rope_theta = 1e6f;
  bool mrope = false;  // interleaved M-RoPE with sections [24, 20, 20] (Qwen3-VL)
};

// Named shapes come from model::named_model_config through backend/cuda/synthetic_shape.h (kernels know no models).

struct SyntheticOptions {
  int max_batch = 64;
  int context = 1024;          // tokens already in every sequence's KV cache
  float skew = 0.f;            // Zipf exponent of the router bias (0: no bias)
  int sere_primary = 0;        // SERE S (0: off)
  float sere_threshold = 0.f;  // SERE rho
  uint64_t seed = 1;
};

class SyntheticDecoder {
 public:
  // Allocates and fills the model, the KV cache (filled to options.context) and the step buffers.
  static Result<std::unique_ptr<SyntheticDecoder>> create(const SyntheticConfig& cfg, const SyntheticOptions& opt);
  ~SyntheticDecoder();
  SyntheticDecoder(const SyntheticDecoder&) = delete;
  SyntheticDecoder& operator=(const SyntheticDecoder&) = delete;

  // Enqueues one decode step for `batch` sequences (with SERE when `sere`) on the decoder's stream.
  Status enqueue_step(int batch, bool sere);
  // Captures (once per (batch, sere)) and launches the step's CUDA graph.
  Status replay(int batch, bool sere);
  cudaStream_t stream() const { return stream_; }

  // Resets / reads the per-layer count of distinct experts (summed over steps since the reset).
  Status reset_expert_counts();
  // Mean distinct experts per MoE layer per step over `steps` steps since the reset.
  Result<double> mean_distinct_experts(int steps);
  // Bytes one step must read at least: weights touched (non-expert weights, `distinct_experts` experts per
  // layer, the batch's embedding rows, lm_head) plus the KV cache of the batch.
  double bytes_per_step(int batch, double distinct_experts) const;
  const SyntheticConfig& config() const { return cfg_; }
  // GPU time per operation of one eagerly launched step, from events recorded between launches, summed over
  // layers, in first-launch order: (operation, milliseconds). Synchronises; outside timed regions only. With
  // `sampling`, the step's logits also go through the serving decoder's sample_rows once per mode (greedy,
  // temperature, top-50, 1024 candidates), labelled "(serving) ...": not part of the step.
  Result<std::vector<std::pair<std::string, double>>> profile_step(int batch, bool sere, bool sampling = false);
  // Argmax token ids of the last step, [batch] (synchronises; outside timed regions only).
  Result<std::vector<int32_t>> last_tokens(int batch);
  // Ablation for benchmarks: the operation with this profile label (e.g. "decode attention") is left out of
  // later steps ("" = none); its outputs keep the previous step's values. Clears the captured graphs.
  void set_skip(const std::string& op);
  // Drops the captured graphs (after changing decode options, so that the next replay captures them again).
  void clear_graphs();
  // Profile labels of the operations of one step, in launch order.
  std::vector<std::string> op_labels(bool sere) const;

 private:
  SyntheticDecoder() = default;
  Status init(const SyntheticConfig& cfg, const SyntheticOptions& opt);
  bf16* carve(size_t elems);

  struct Layer {
    bf16 *in_norm, *post_norm, *q_norm, *k_norm, *wqkv, *wo, *router, *gate_up, *down, *k_cache, *v_cache;
    float *router_bias, *sim;
  };
  SyntheticConfig cfg_;
  SyntheticOptions opt_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  char* arena_ = nullptr;
  size_t arena_used_ = 0, arena_size_ = 0;
  std::vector<Layer> layers_;
  bf16 *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
  // step buffers
  int32_t *ids_ = nullptr, *out_ids_ = nullptr, *pos_ = nullptr, *slots_ = nullptr, *block_table_ = nullptr,
          *ctx_lens_ = nullptr, *route_ids_ = nullptr, *step_counter_ = nullptr;
  float *route_w_ = nullptr, *slot_out_ = nullptr;
  unsigned* combine_done_ = nullptr;  // the folded MoE combine's exit counter (zero between launches)
  bf16 *x_ = nullptr, *xn_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *o_ = nullptr, *router_logits_ = nullptr,
       *h_ = nullptr, *gu_ = nullptr, *logits_ = nullptr;
  std::map<int, void*> attn_ws_;  // decode-attention workspace per batch size
  void* plan_buf_ = nullptr;
  MoePlan plan_;
  int64_t* expert_counts_ = nullptr;
  int blocks_per_seq_ = 0;
  std::map<std::pair<int, bool>, cudaGraphExec_t> graphs_;
  bool profile_ = false, profile_sampling_ = false;
  std::string skip_;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
  // Profiled steps only: the serving decoder's sampling summaries of the same logits, one plan per mode (greedy,
  // temperature, top-50 candidates, 1024 candidates as top-p asks), [4][max_batch] specs and their outputs.
  SampleRowSpec* samp_spec_ = nullptr;
  SampleRowOut* samp_out_ = nullptr;
  int32_t* cand_ids_ = nullptr;
  float* cand_logits_ = nullptr;
};

}  // namespace zest::cuda
