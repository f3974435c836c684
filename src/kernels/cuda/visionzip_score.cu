// VisionZip attention-received scores on tensor cores: one CTA per (64-key tile, segment) computes the
// transposed logits K Q^T for every head and query tile of its segment (mma.sync bf16), turns them into
// softmax probabilities with the saved row lse and sums them per key in registers. Every key's sum is
// reduced in one fixed order (head, query tile, query column, then a fixed 4-lane shuffle), so the
// scores are bit-identical run to run; the 2x2 merge-group sum is fused into the epilogue.
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

using namespace vmma;

constexpr float kLog2e = 1.4426950408889634f;

template <int DP>
constexpr size_t score_smem_bytes() {
  return static_cast<size_t>(4) * kTile * row_stride(DP) * sizeof(bf16) + 2 * kTile * sizeof(float) +
         kTile * sizeof(float);  // Q x2, K x2, lse x2, per-key scores
}

// Loads the lse values of rows [row0, row0 + kTile) of head h (zero beyond row_end).
__device__ __forceinline__ void load_lse(float* dst, const float* lse, int N, int h, int row0, int row_end) {
  for (int i = threadIdx.x; i < kTile / 4; i += kThreads) {
    const int r = row0 + i * 4;
    const float* src = lse + static_cast<size_t>(h) * N + r;
    if (r + 4 <= row_end && (reinterpret_cast<uintptr_t>(src) % 16 == 0)) {
      cp_async16(dst + i * 4, src, true);
    } else {
      for (int e = 0; e < 4; ++e) dst[i * 4 + e] = r + e < row_end ? src[e] : 0.f;
    }
  }
}

template <int DP>
__global__ void __launch_bounds__(kThreads)
    score_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, int stride, const float* __restrict__ lse,
                 const int32_t* __restrict__ cu_seqlens, int N, int heads, int D, float scale_log2, int group,
                 float* __restrict__ token_scores, float* __restrict__ patch_scores) {
  constexpr int S = row_stride(DP), KS = DP / 16, NT = kTile / 8;
  pdl_wait();
  const int seg = blockIdx.y;
  const int s0 = cu_seqlens[seg], s1 = cu_seqlens[seg + 1];
  const int k0 = s0 + blockIdx.x * kTile;
  if (k0 >= s1) return;
  extern __shared__ uint4 smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + 2 * kTile * S;
  float* sL = reinterpret_cast<float*>(sK + 2 * kTile * S);
  float* sA = sL + 2 * kTile;
  zero_pad_columns<S, DP>(sQ, 4 * kTile, D);

  const int n_qt = (s1 - s0 + kTile - 1) / kTile, total = heads * n_qt;
  // Stage `it` = (head it / n_qt, query tile it % n_qt): its Q tile, its lse, and the head's K tile at qt 0.
  auto load_stage = [&](int it) {
    const int h = it / n_qt, qt = it % n_qt, b = it & 1;
    load_tile<S>(sQ + b * kTile * S, q + h * D, stride, s0 + qt * kTile, s1, D);
    load_lse(sL + b * kTile, lse, N, h, s0 + qt * kTile, s1);
    if (qt == 0) load_tile<S>(sK + (h & 1) * kTile * S, k + h * D, stride, k0, s1, D);
  };
  load_stage(0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  uint32_t ka[KS][4];
  float acc[2] = {0.f, 0.f};  // keys warp*16 + g and + g + 8
  for (int it = 0; it < total; ++it) {
    const int h = it / n_qt, qt = it % n_qt, b = it & 1;
    if (it + 1 < total) load_stage(it + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (qt == 0) {
      const bf16* tK = sK + (h & 1) * kTile * S;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) ldsm_x4(ka[kk], tK + (warp * 16 + lane % 16) * S + kk * 16 + (lane / 16) * 8);
    }
    const bf16* tQ = sQ + b * kTile * S;
    const float* tL = sL + b * kTile;
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        uint32_t bq[4];
        ldsm_x4(bq, tQ + ((jp * 2 + lane / 16) * 8 + lane % 8) * S + kk * 16 + ((lane / 8) % 2) * 8);
        mma16816(s[2 * jp], ka[kk], bq[0], bq[1]);
        mma16816(s[2 * jp + 1], ka[kk], bq[2], bq[3]);
      }
    }
    const int qbase = s0 + qt * kTile;
    const bool partial = qbase + kTile > s1;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * t + (e & 1);
        float p = exp2f(fmaf(s[j][e], scale_log2, -tL[col] * kLog2e));
        if (partial && qbase + col >= s1) p = 0.f;
        acc[e / 2] += p;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
  }
  if (t == 0) {
    const int g = lane / 4;
    sA[warp * 16 + g] = acc[0] / static_cast<float>(heads);
    sA[warp * 16 + g + 8] = acc[1] / static_cast<float>(heads);
  }
  __syncthreads();
  const int valid = min(kTile, s1 - k0);
  if (patch_scores) {
    for (int j = threadIdx.x; j < valid; j += kThreads) patch_scores[k0 + j] = sA[j];
  }
  for (int c = threadIdx.x; c < valid / group; c += kThreads) {
    float sum = 0.f;
    for (int e = 0; e < group; ++e) sum += sA[c * group + e];
    token_scores[k0 / group + c] = sum;
  }
}

template <int DP>
Status launch_scores(const bf16* q, const bf16* k, int stride, const float* lse, const int32_t* cu, int nseg,
                     int max_seqlen, int N, int heads, int D, float scale, int group, float* token_scores,
                     float* patch_scores, cudaStream_t stream) {
  constexpr size_t smem = score_smem_bytes<DP>();
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(score_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "visionzip_scores smem attribute"));
  const dim3 grid((max_seqlen + kTile - 1) / kTile, nseg);
  return launch("visionzip_scores", score_kernel<DP>, grid, dim3(kThreads), smem, stream, q, k, stride, lse, cu, N,
                heads, D, scale * kLog2e, group, token_scores, patch_scores);
}

}  // namespace

Status visionzip_scores(const bf16* q, const bf16* k, int stride, const float* lse, const int32_t* cu_seqlens, int nseg,
                        int max_seqlen, int N, int heads, int head_dim, float scale, int group, float* token_scores,
                        float* patch_scores, cudaStream_t stream) {
  if (nseg <= 0 || max_seqlen <= 0 || N <= 0 || heads <= 0)
    return invalid_argument("visionzip_scores: nseg, max_seqlen, N and heads must be positive");
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 128)
    return invalid_argument("visionzip_scores: head_dim " + std::to_string(head_dim) +
                            " must be a multiple of 8 in [8, 128]");
  if (stride % 8 != 0 || stride < heads * head_dim)
    return invalid_argument("visionzip_scores: row stride " + std::to_string(stride) +
                            " must be a multiple of 8 and >= heads * head_dim");
  if (group <= 0 || kTile % group != 0)
    return invalid_argument("visionzip_scores: merge group " + std::to_string(group) + " must divide 64");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k)) % 16 != 0)
    return invalid_argument("visionzip_scores: q and k must be 16-byte aligned");
  if (!lse || !token_scores) return invalid_argument("visionzip_scores: lse and token_scores are required");
  if (head_dim <= 32)
    return launch_scores<32>(q, k, stride, lse, cu_seqlens, nseg, max_seqlen, N, heads, head_dim, scale, group,
                             token_scores, patch_scores, stream);
  if (head_dim <= 80)
    return launch_scores<80>(q, k, stride, lse, cu_seqlens, nseg, max_seqlen, N, heads, head_dim, scale, group,
                             token_scores, patch_scores, stream);
  return launch_scores<128>(q, k, stride, lse, cu_seqlens, nseg, max_seqlen, N, heads, head_dim, scale, group,
                            token_scores, patch_scores, stream);
}

}  // namespace zest::cuda
