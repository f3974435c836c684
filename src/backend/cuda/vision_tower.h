// The Qwen3-VL vision tower on CUDA (CUDA-side header): bf16 weights on the device, a forward over the
// pixel_values of all images of a request (patch embedding, resampled position embedding, 2-D rotary
// attention per frame, pre-LayerNorm blocks, DeepStack mergers, final 2x2 merger), the attention
// statistics of one score layer for VisionZip, and the VisionZip scores from them.
// Numerics: GEMMs bf16 in / fp32 accumulate (cuBLASLt through cuda::gemm), the residual stream in fp32,
// every other activation bf16, LayerNorm/GELU/softmax/rotary in fp32.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "kernels/cuda/kernels.h"
#include "vision/preprocess.h"

namespace zest::cuda {

// Device outputs of the last forward (owned by the tower, valid until the next forward).
struct VisionTowerOutput {
  const bf16* embeds = nullptr;        // [tokens, out_hidden]
  std::vector<const bf16*> deepstack;  // one [tokens, out_hidden] per deepstack index
  int patches = 0, tokens = 0;
  std::vector<int64_t> tokens_per_image;
  // Score-layer capture (set when forward was given a score layer): q at column 0 and k at column
  // hidden of rows of qkv_stride bf16, after rotary; lse [heads, patches] fp32 (natural log).
  int score_layer = -1;
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  int qkv_stride = 0;
  const float* lse = nullptr;
  const int32_t* cu_seqlens = nullptr;  // device [nseg + 1], frames
  int nseg = 0, max_seqlen = 0;
};

class VisionTowerCuda {
 public:
  // Reads one host tensor by its name relative to the tower prefix (e.g. "blocks.0.attn.qkv.weight")
  // with the expected shape; returns it as CPU f32.
  using TensorSource = std::function<Result<Tensor>(const std::string& name, const std::vector<int64_t>& shape)>;

  // A tower with random bf16 weights (uniform, scaled by 1/sqrt(fan_in)) from a counter hash of `seed`.
  static Result<std::unique_ptr<VisionTowerCuda>> create_random(const io::VisionConfig& cfg, uint64_t seed);
  // A tower with weights read through `source` (the tensor names and shapes of transformers' Qwen3-VL
  // vision model, as src/vision/tower.cpp loads them), converted to bf16.
  static Result<std::unique_ptr<VisionTowerCuda>> create_from(const io::VisionConfig& cfg, const TensorSource& source);
  ~VisionTowerCuda();
  VisionTowerCuda(const VisionTowerCuda&) = delete;
  VisionTowerCuda& operator=(const VisionTowerCuda&) = delete;

  // Runs the tower on device pixel_values [sum of patches, in_features()] bf16 for `grids` (several images
  // in one pass). score_layer in [0, depth) captures that block's q, k and lse; -1 captures nothing.
  // Grows the activation buffers when needed (cudaMalloc, outside steady state); otherwise asynchronous.
  Status forward(const bf16* pixel_values, const std::vector<vision::GridTHW>& grids, int score_layer,
                 cudaStream_t stream);
  const VisionTowerOutput& output() const { return out_; }

  // VisionZip scores of the last forward's score layer: token_scores [tokens] (2x2 group sums of the
  // head-averaged attention each patch receives), patch_scores [patches] when not nullptr.
  Status scores(float* token_scores, float* patch_scores, cudaStream_t stream) const;

  // Per-op timing of one block at the shapes of the last forward: each op launched `iters` times on the
  // tower's buffers (CUDA events; the outputs of the last forward are overwritten). Rows of
  // (op name, ms per launch, FLOPs per launch).
  struct OpTime {
    std::string name;
    double ms = 0, flops = 0;
  };
  Result<std::vector<OpTime>> profile_block(int iters, cudaStream_t stream);

  // Bias (qkv) and bias + tanh GELU (fc1) in the GEMM epilogues and timed cuBLASLt algorithms for proj and fc2
  // (default on; a shape cuBLASLt has no fused algorithm for falls back to the separate kernels either way).
  void set_fused_epilogues(bool on) { fused_epilogues_ = on; }

  // Floating-point operations of one forward over `grids` (GEMMs and attention, 2 per multiply-add).
  double flops(const std::vector<vision::GridTHW>& grids) const;
  const io::VisionConfig& config() const { return cfg_; }
  int in_features() const;
  int head_dim() const { return static_cast<int>(cfg_.hidden_size / cfg_.num_heads); }

 private:
  VisionTowerCuda() = default;
  struct Block {
    bf16 *norm1_w, *norm1_b, *norm2_w, *norm2_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
  };
  struct Merger {
    bf16 *norm_w, *norm_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
  };
  // One named weight: its element count, its fan-in (random init scale) and its init kind.
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    bf16** slot;
    int kind;  // 0: matrix, 1: norm weight, 2: bias, 3: position table
  };
  Status init(const io::VisionConfig& cfg);
  std::vector<Param> params();
  Status ensure_buffers(int N, int nseg, int n_images, bool capture);
  Status run_merger(const Merger& m, bool postshuffle, bf16* out, cudaStream_t stream);
  // y = x W^T (the timed-algorithm GEMM when fused epilogues are on, else cuda::gemm).
  Status linear(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream);
  // qkv = rotary(u_ W_qkv^T + b) into `qkv`; h_ = gelu(u_ W_fc1^T + b) (fused epilogues when on).
  Status qkv_rope(const Block& k, bf16* qkv, cudaStream_t stream);
  Status fc1_gelu(const Block& k, cudaStream_t stream);

  io::VisionConfig cfg_;
  int side_ = 0;
  bf16 *patch_w_ = nullptr, *patch_b_ = nullptr, *pos_ = nullptr;
  std::vector<Block> blocks_;
  Merger merger_{};
  std::vector<Merger> deepstack_;
  void* weights_ = nullptr;
  size_t weights_bytes_ = 0;

  // activations (capacity in patches / segments / images)
  int cap_N_ = 0, cap_seg_ = 0, cap_img_ = 0;
  bool cap_capture_ = false;
  void* act_ = nullptr;
  float* x_ = nullptr;
  float2* rope_ = nullptr;
  float* lse_ = nullptr;
  bf16 *u_ = nullptr, *qkv_ = nullptr, *qkv_score_ = nullptr, *attn_ = nullptr, *tmp_ = nullptr, *h_ = nullptr;
  bf16* embeds_ = nullptr;
  std::vector<bf16*> ds_out_;
  int32_t *coords_ = nullptr, *grids_dev_ = nullptr, *cu_dev_ = nullptr;
  std::vector<int32_t> host_meta_;
  int N_ = 0;
  bool fused_epilogues_ = true;
  VisionTowerOutput out_;
};

// Loads the tower of a checkpoint (tensors under `prefix`, e.g. "model.visual.") to the device.
inline Result<std::unique_ptr<VisionTowerCuda>> load_vision_tower_cuda(const io::SafeTensors& st,
                                                                       const io::VisionConfig& cfg,
                                                                       const std::string& prefix = "model.visual.") {
  return VisionTowerCuda::create_from(
      cfg, [&](const std::string& name, const std::vector<int64_t>& shape) -> Result<Tensor> {
        ZEST_ASSIGN_OR_RETURN(io::TensorView v, st.get(prefix + name, shape));
        return v.to_f32();
      });
}

}  // namespace zest::cuda
