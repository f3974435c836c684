// Row-norm pieces shared by the norm kernels (elementwise.cu) and the small-M GEMM that folds the MoE combine into
// its prologue (rows_mma.cu): a CTA-wide sum, 8-element bf16 loads / stores, the RMSNorm store, and one thread's
// 8-column chunk of the MoE combine. One definition keeps both paths bit-identical.
#pragma once
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

// Sum over the CTA of one value per thread (every thread gets the total): warp sums, then the warps' sums.
__device__ __forceinline__ float row_block_sum(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  float t = lane < nw ? red[lane] : 0.f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}

__device__ __forceinline__ void row_load8(const bf16* p, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const bf16* b = reinterpret_cast<const bf16*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(b[i]);
}

__device__ __forceinline__ void row_store8(bf16* p, const float* v) {
  uint4 u;
  bf16* b = reinterpret_cast<bf16*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = __float2bfloat16(v[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

// Stores 8 values of y = w * bf16(v * inv) (w: 8 weights packed in a uint4).
__device__ __forceinline__ void row_norm_store8(const float* v, float inv, const uint4& wv, bf16* y) {
  const bf16* wb = reinterpret_cast<const bf16*>(&wv);
  uint4 o;
  bf16* ob = reinterpret_cast<bf16*>(&o);
#pragma unroll
  for (int i = 0; i < 8; ++i) ob[i] = __float2bfloat16(bf16_round(v[i] * inv) * __bfloat162float(wb[i]));
  *reinterpret_cast<uint4*>(y) = o;
}

// One thread's 8 columns [c, c + 8) of the MoE combine of row `row`: v (x's 8 values on entry) becomes
// bf16(x + bf16(sum_k slot_out[row, k])) over the slots with ids >= 0, in slot order; every slot row's loads issued
// at once (8 slots per group).
__device__ __forceinline__ void row_combine8(const float* __restrict__ slot_out, const int32_t* __restrict__ ids, int K,
                                             int row, int hidden, int c, float* v) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int k0 = 0; k0 < K; k0 += 8) {
    float4 a[8], b[8];
    int id[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int k = k0 + u;
      id[u] = k < K ? ids[row * K + k] : -1;
      const float4* sp =
          reinterpret_cast<const float4*>(slot_out + (static_cast<size_t>(row) * K + (k < K ? k : 0)) * hidden + c);
      a[u] = sp[0];
      b[u] = sp[1];
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (id[u] < 0) continue;
      acc[0] += a[u].x; acc[1] += a[u].y; acc[2] += a[u].z; acc[3] += a[u].w;
      acc[4] += b[u].x; acc[5] += b[u].y; acc[6] += b[u].z; acc[7] += b[u].w;
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = bf16_round(v[i] + bf16_round(acc[i]));
}

}  // namespace zest::cuda
