// CUDA kernels of the Qwen3-VL vision tower and of VisionZip (CUDA-side header: only code built with the
// CUDA backend includes it). Same conventions as kernels/cuda/kernels.h: bf16 storage, fp32 accumulation,
// device pointers, asynchronous launches on `stream` that allocate nothing, sizes checked on the host.
//
// Patch layout: the N patch rows of a request are the images back to back, each image's rows in the
// tower's 2x2-block order (spec §1.4). `grids` arrays on the device hold 4 int32 per image:
// {first patch row, t, h, w}. Attention segments are frames (one per image per temporal pair):
// cu_seqlens [nseg + 1] int32, prefix sums of h * w repeated t times.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// ---- tower elementwise ops -------------------------------------------------------------------------

// LayerNorm per row of fp32 x [rows, dim]: y = bf16((x - mean) * rsqrt(var + eps) * w + b), fp32 statistics.
Status vision_layernorm(const float* x, const bf16* w, const bf16* b, bf16* y, int rows, int dim, float eps,
                        cudaStream_t stream);

// Residual update fused with the next LayerNorm: x += float(delta) + float(bias) (bias [dim], may be
// nullptr), then y = layernorm(x) with w, b (x updated in place, fp32).
Status vision_residual_layernorm(float* x, const bf16* delta, const bf16* bias, const bf16* w, const bf16* b, bf16* y,
                                 int rows, int dim, float eps, cudaStream_t stream);

// In place h = bf16(gelu(float(h) + float(bias))) over h [rows, cols] (bias [cols], may be nullptr);
// tanh = true: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); false: exact 0.5 x (1 + erf(x / sqrt 2)).
Status vision_bias_gelu(bf16* h, const bf16* bias, int rows, int cols, bool tanh, cudaStream_t stream);

// In place y = bf16(float(y) + float(bias)) over y [rows, cols].
Status vision_bias_add(bf16* y, const bf16* bias, int rows, int cols, cudaStream_t stream);

// Elementwise y = bf16(x) for n values.
Status vision_f32_to_bf16(const float* x, bf16* y, size_t n, cudaStream_t stream);

// Patch coordinates and 2-D rotary tables for all N patch rows: coords [N, 2] int32 = (row, col) in the
// un-merged patch grid (block order of merge x merge groups, repeated per frame); rope_cs [N, head_dim / 2]
// float2 = (cos, sin) of angle row * theta^(-2k/(head_dim/2)) for k < head_dim/4 and
// col * theta^(-2(k - head_dim/4)/(head_dim/2)) after. head_dim % 4 == 0.
Status vision_patch_coords(const int32_t* grids, int n_images, int N, int merge, int head_dim, float theta,
                           int32_t* coords, float2* rope_cs, cudaStream_t stream);

// Patch embedding epilogue: x[r, :] = float(pe[r, :]) + float(bias) + bilinear(pos_table) where the learned
// side x side table [side * side, dim] is sampled with align-corners bilinear taps at the patch's (row, col)
// scaled to its image's (h, w) grid (fp32 weights, one rounding). x fp32 [N, dim].
Status vision_pos_embed_add(const bf16* pe, const bf16* bias, const bf16* pos_table, int side, const int32_t* grids,
                            int n_images, const int32_t* coords, float* x, int N, int dim, cudaStream_t stream);

// qkv [N, 3 * heads * head_dim] (q heads, k heads, v heads) in place: adds the bias [3 * heads * head_dim]
// (may be nullptr), then rotates q and k with rotate-half pairs (d, d + head_dim/2) using rope_cs, fp32 math.
// head_dim % 8 == 0, qkv 16-byte aligned.
Status vision_qkv_rope(bf16* qkv, const bf16* bias, const float2* rope_cs, int N, int heads, int head_dim,
                       cudaStream_t stream);

// ---- GEMM with a fused epilogue ------------------------------------------------------------------------

// kNone: y = bf16(x W^T) (bias unused, may be nullptr); kBias: y = bf16(x W^T + bias); kBiasGeluTanh:
// y = bf16(gelu_tanh(x W^T + bias)) with gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)));
// fp32 accumulation and epilogue, one rounding.
enum class VisionEpilogue { kNone, kBias, kBiasGeluTanh };

// Row-major y[M, N] = epilogue(x[M, K] W[N, K]^T) through cuBLASLt, bias [N] bf16. kUnsupported when cuBLASLt
// offers no fused algorithm for the shape (callers then use gemm + an elementwise kernel). The first call of
// a shape times the heuristic's best few algorithms on its own buffers and keeps the fastest (one stream
// synchronisation per shape).
Status vision_gemm_epilogue(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int M, int N, int K,
                            VisionEpilogue ep, cudaStream_t stream);

// ---- attention -------------------------------------------------------------------------------------------

// Non-causal attention inside each segment (all images of a request in one launch), tensor cores
// (mma.sync bf16 m16n8k16, head_dim zero-padded to a multiple of 16), fp32 online softmax.
// q/k/v rows at q + t * stride (heads * head_dim contiguous per row), out [N, heads * head_dim].
// When lse != nullptr it receives lse[h * N + t] = ln sum_j exp(scale q_t . k_j) (fp32).
// head_dim % 8 == 0 and <= 128; stride % 8 == 0; 16-byte aligned pointers.
Status vision_attention(const bf16* q, const bf16* k, const bf16* v, int stride, const int32_t* cu_seqlens, int nseg,
                        int max_seqlen, int N, int heads, int head_dim, float scale, bf16* out, float* lse,
                        cudaStream_t stream);

// ---- VisionZip -----------------------------------------------------------------------------------------

// Attention-received scores of every patch from q, k and the row lse of vision_attention:
// a_j = (1/H) sum_h sum_{i in seg(j)} exp(scale q_i . k_j - lse[h, i]); token_scores[m] =
// ((a_{4m} + a_{4m+1}) + a_{4m+2}) + a_{4m+3} for group = 4 patches (group = merge^2; segment lengths must be
// multiples of it). patch_scores [N] receives a_j when not nullptr. Deterministic: one CTA per key tile
// reduces every head and query tile in a fixed order, no atomics. Same layout limits as vision_attention.
Status visionzip_scores(const bf16* q, const bf16* k, int stride, const float* lse, const int32_t* cu_seqlens, int nseg,
                        int max_seqlen, int N, int heads, int head_dim, float scale, int group, float* token_scores,
                        float* patch_scores, cudaStream_t stream);

// Token selection on the device, the same result as accel::select_vision_tokens (kNone density, the
// contextual fraction ignored): rate and mode read like accel::VisionPruneOptions.
struct VisionZipSelect {
  float rate = 0.f;
  bool global = false;      // false: per-image top-k_i; true: one budget over all images
  int64_t budget = -1;      // global only: absolute budget, -1 = floor((1 - rate) * sum M_i)
  int64_t min_tokens = 16;  // floor per image
};

// Host-side plan of one selection: the counts that do not depend on scores, the workspace size and the
// number of kept tokens (known before launch, so the gathers need no host sync).
struct VisionZipPlan {
  std::vector<int64_t> tokens;   // M_i
  std::vector<int64_t> offsets;  // first token of image i in the flat score array
  std::vector<int64_t> floors;   // min(M_i, min_tokens)
  std::vector<int64_t> counts;   // uniform: k_i; global: the floors (the rest is decided on the device)
  int64_t total = 0;             // sum M_i
  int64_t kept = 0;              // tokens kept over all images
  int64_t extra = 0;             // global: budget - sum floors
  bool global = false;
  size_t workspace_bytes = 0;
};

// The plan itself: visionzip_plan (backend/cuda/visionzip_plan.h). Bytes of the workspace that visionzip_select
// needs for `tokens` tokens over `images` images.
size_t visionzip_workspace_bytes(int64_t tokens, int64_t images);

// Selects on the device from token_scores [total] (finite and >= 0; NaN ranks last): kept_index
// [plan.kept] int32 receives the global kept token indices (image offset + local index), ascending;
// kept_counts [n_images] int32 (device) the tokens each image keeps. workspace: plan.workspace_bytes bytes.
// When host_counts != nullptr the counts are copied to it and the stream is synchronised (the one
// device-to-host copy of a request); otherwise nothing waits.
Status visionzip_select(const float* token_scores, const VisionZipPlan& plan, void* workspace, int32_t* kept_index,
                        int32_t* kept_counts, int64_t* host_counts, cudaStream_t stream);

// dst[n, :] = src[index[n], :] for n < n_out, rows of `dim` bf16 (embeddings, deepstack features).
Status visionzip_gather_rows(const bf16* src, int dim, const int32_t* index, int n_out, bf16* dst, cudaStream_t stream);

// dst[r, n] = src[r, index[n] + index_offset] for r < rows, n < n_out: columns of a row-major
// [rows, src_cols] int32 matrix (the [3, seq] M-RoPE positions); dst is [rows, n_out].
Status visionzip_gather_columns(const int32_t* src, int rows, int src_cols, const int32_t* index, int index_offset,
                                int n_out, int32_t* dst, cudaStream_t stream);

}  // namespace zest::cuda
