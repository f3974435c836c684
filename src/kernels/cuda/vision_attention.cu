// Varlen non-causal attention of the vision tower (FlashAttention-2 style, mma.sync bf16): one CTA per
// (64-query tile, segment, head), 4 warps of 16 query rows, K/V tiles of 64 keys double-buffered with
// cp.async, fp32 online softmax in base 2, optional per-row log-sum-exp output.
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

using namespace vmma;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int DP>
constexpr size_t attention_smem_bytes() {
  return static_cast<size_t>(5) * kTile * row_stride(DP) * sizeof(bf16);  // Q, K x2, V x2
}

template <int DP>
__global__ void __launch_bounds__(kThreads)
    attention_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, int stride,
                     const int32_t* __restrict__ cu_seqlens, int N, int heads, int D, float scale_log2,
                     bf16* __restrict__ out, float* __restrict__ lse) {
  constexpr int S = row_stride(DP), KS = DP / 16, NT = kTile / 8, DT = DP / 8;
  pdl_wait();
  const int seg = blockIdx.y, h = blockIdx.z;
  const int s0 = cu_seqlens[seg], s1 = cu_seqlens[seg + 1];
  const int q0 = s0 + blockIdx.x * kTile;
  if (q0 >= s1) return;
  extern __shared__ uint4 smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kTile * S;
  bf16* sV = sK + 2 * kTile * S;
  zero_pad_columns<DP>(sQ, 5, D);

  const bf16* qh = q + h * D;
  const bf16* kh = k + h * D;
  const bf16* vh = v + h * D;
  load_tile<DP>(sQ, qh, stride, q0, s1, D);
  load_tile<DP>(sK, kh, stride, s0, s1, D);
  load_tile<DP>(sV, vh, stride, s0, s1, D);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t qa[KS][4];
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int n_kt = (s1 - s0 + kTile - 1) / kTile;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_kt) {
      const int nb = buf ^ 1;
      load_tile<DP>(sK + nb * kTile * S, kh, stride, s0 + (kt + 1) * kTile, s1, D);
      load_tile<DP>(sV + nb * kTile * S, vh, stride, s0 + (kt + 1) * kTile, s1, D);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) ldsm_x4(qa[kk], sQ + (warp * 16 + lane % 16) * S + kk * 16 + (lane / 16) * 8);
    }
    const bf16* tK = sK + buf * kTile * S;
    const bf16* tV = sV + buf * kTile * S;

    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        uint32_t b[4];
        ldsm_x4(b, tK + ((jp * 2 + lane / 16) * 8 + lane % 8) * S + kk * 16 + ((lane / 8) % 2) * 8);
        mma16816(s[2 * jp], qa[kk], b[0], b[1]);
        mma16816(s[2 * jp + 1], qa[kk], b[2], b[3]);
      }
    }
    const int k0 = s0 + kt * kTile;
    const bool partial = k0 + kTile > s1;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * scale_log2;
        if (partial && k0 + j * 8 + 2 * t + (e & 1) >= s1) x = -INFINITY;
        s[j][e] = x;
        mx[e / 2] = fmaxf(mx[e / 2], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r]);
      alpha[r] = exp2f(m[r] - mn);
      m[r] = mn;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[0];
      o[i][2] *= alpha[1];
      o[i][3] *= alpha[1];
    }
    uint32_t pa[kTile / 16][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float p0 = exp2f(s[j][0] - m[0]), p1 = exp2f(s[j][1] - m[0]);
      const float p2 = exp2f(s[j][2] - m[1]), p3 = exp2f(s[j][3] - m[1]);
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      pa[j / 2][(j % 2) * 2] = pack_bf16(p0, p1);
      pa[j / 2][(j % 2) * 2 + 1] = pack_bf16(p2, p3);
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < DT / 2; ++np) {
        uint32_t b[4];
        ldsm_x4_trans(b, tV + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * S + (np * 2 + lane / 16) * 8);
        mma16816(o[2 * np], pa[kk], b[0], b[1]);
        mma16816(o[2 * np + 1], pa[kk], b[2], b[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int row_stride_out = heads * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + r * 8;
    if (row >= s1) continue;
    const float inv = 1.f / l[r];
    bf16* orow = out + static_cast<size_t>(row) * row_stride_out + h * D;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      const int col = i * 8 + 2 * t;
      if (i * 8 < D) *reinterpret_cast<uint32_t*>(orow + col) = pack_bf16(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
    }
    if (lse && t == 0) lse[static_cast<size_t>(h) * N + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}

template <int DP>
Status launch_attention(const bf16* q, const bf16* k, const bf16* v, int stride, const int32_t* cu, int nseg,
                        int max_seqlen, int N, int heads, int D, float scale, bf16* out, float* lse,
                        cudaStream_t stream) {
  constexpr size_t smem = attention_smem_bytes<DP>();
  static const cudaError_t attr =
      cudaFuncSetAttribute(attention_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "vision_attention smem attribute"));
  const dim3 grid((max_seqlen + kTile - 1) / kTile, nseg, heads);
  return launch("vision_attention", attention_kernel<DP>, grid, dim3(kThreads), smem, stream, q, k, v, stride, cu, N,
                heads, D, scale * kLog2e, out, lse);
}

}  // namespace

Status vision_attention(const bf16* q, const bf16* k, const bf16* v, int stride, const int32_t* cu_seqlens, int nseg,
                        int max_seqlen, int N, int heads, int head_dim, float scale, bf16* out, float* lse,
                        cudaStream_t stream) {
  if (nseg <= 0 || max_seqlen <= 0 || N <= 0 || heads <= 0)
    return invalid_argument("vision_attention: nseg, max_seqlen, N and heads must be positive");
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 128)
    return invalid_argument("vision_attention: head_dim " + std::to_string(head_dim) +
                            " must be a multiple of 8 in [8, 128]");
  if (stride % 8 != 0 || stride < heads * head_dim)
    return invalid_argument("vision_attention: row stride " + std::to_string(stride) +
                            " must be a multiple of 8 and >= heads * head_dim");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
       reinterpret_cast<uintptr_t>(out)) %
          16 !=
      0)
    return invalid_argument("vision_attention: q, k, v and out must be 16-byte aligned");
  if (head_dim <= 32)
    return launch_attention<32>(q, k, v, stride, cu_seqlens, nseg, max_seqlen, N, heads, head_dim, scale, out, lse,
                                stream);
  if (head_dim <= 80)
    return launch_attention<80>(q, k, v, stride, cu_seqlens, nseg, max_seqlen, N, heads, head_dim, scale, out, lse,
                                stream);
  return launch_attention<128>(q, k, v, stride, cu_seqlens, nseg, max_seqlen, N, heads, head_dim, scale, out, lse,
                               stream);
}

}  // namespace zest::cuda
