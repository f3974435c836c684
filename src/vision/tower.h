// The Qwen3-VL vision tower on CPU in f32 (spec §2): patch embedding, bilinearly resampled learned
// position embedding, 2-D rotary attention restricted to each image (each frame of a video),
// pre-LayerNorm blocks with a tanh-GELU MLP, DeepStack mergers and the final 2x2 patch merger.
// Follows transformers 5.17's modeling_qwen3_vl.py (fp32 position-embedding taps, one cast).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "vision/preprocess.h"

namespace zest::vision {

// Attention statistics of one block, for VisionZip scoring. Per image (rows = t*h*w patches in
// pixel_values order): q and k after rotary [rows, heads, head_dim], and lse [heads, rows] where
// lse[h][i] = log sum_j exp(q_i.k_j / sqrt(head_dim)) over the keys of query i's segment.
struct AttentionCapture {
  int64_t layer = -1;
  std::vector<Tensor> q;
  std::vector<Tensor> k;
  std::vector<Tensor> lse;
};

struct VisionOutput {
  Tensor embeds;                      // [sum of merged tokens, out_hidden] f32, images in order
  std::vector<Tensor> deepstack;      // one per deepstack_visual_indexes entry, same rows as embeds
  std::vector<int64_t> tokens_per_image;
  std::vector<GridTHW> grids;
  std::optional<AttentionCapture> attention;  // set when forward() was given a score layer
};

class VisionTower {
 public:
  // Loads every vision tensor under `prefix` as f32 and checks each shape against cfg
  // (kCorrupt naming the tensor and both shapes; kNotFound for a missing tensor; kInvalidArgument
  // for an inconsistent config).
  static Result<VisionTower> load(const io::SafeTensors& weights, const io::VisionConfig& cfg,
                                  const std::string& prefix = "model.visual.");

  // Runs the tower on pixel_values [sum of patches, in_channels * temporal_patch * patch^2] for the
  // given grids (several images in one pass). score_layer, when set, captures that block's
  // attention statistics (0-based block index < depth).
  Result<VisionOutput> forward(const Tensor& pixel_values, const std::vector<GridTHW>& grids,
                               std::optional<int64_t> score_layer = std::nullopt) const;

  const io::VisionConfig& config() const { return cfg_; }
  int64_t head_dim() const { return cfg_.hidden_size / cfg_.num_heads; }

 private:
  struct Block {
    Tensor norm1_w, norm1_b, norm2_w, norm2_b, qkv_w, qkv_b, proj_w, proj_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  struct Merger {
    Tensor norm_w, norm_b, fc1_w, fc1_b, fc2_w, fc2_b;
    bool postshuffle_norm = false;
  };
  // Merger forward: x [n, hidden] -> [n / merge^2, out_hidden].
  Tensor run_merger(const Merger& m, const float* x, int64_t n) const;

  io::VisionConfig cfg_;
  int64_t pos_side_ = 0;  // the learned position table is pos_side_ x pos_side_
  Tensor patch_w_, patch_b_, pos_embed_;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
};

}  // namespace zest::vision
